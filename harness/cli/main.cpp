// ulpgate command-line tool. Exit codes (DESIGN.md): 0 ok, 1 a check failed / regression,
// 2 bad usage or bad input (one line on stderr), 3 internal error.
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "distributions/spec.hpp"
#include "harness/core/error.hpp"
#include "harness/core/format.hpp"
#include "harness/isolate.hpp"
#include "harness/record.hpp"
#include "kernels/device.hpp"
#include "kernels/kernel.hpp"
#include "kernels/plugin/loader.hpp"
#include "reports/report.hpp"

namespace {

constexpr int kExitOk = 0, kExitUsage = 2, kExitInternal = 3;

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "ulpgate: error: %s (see 'ulpgate --help')\n", msg.c_str());
  return kExitUsage;
}

void list_formats() {
  using namespace ulpgate;
  std::printf("formats:\n");
  std::printf("  %-5s %4s %4s %5s %5s %-13s %-13s %-13s %s\n", "name", "bits", "exp", "frac",
              "bias", "max", "min normal", "min subnorm", "description");
  for (Format f : kAllFormats) {
    const auto& fi = info(f);
    std::printf("  %-5s %4d %4d %5d %5d %-13.6g %-13.6g %-13.6g %s\n",
                std::string(fi.name).c_str(), fi.bits, fi.exp_bits, fi.frac_bits, fi.bias,
                fi.max_finite(), fi.min_normal(), fi.min_subnormal(),
                std::string(fi.description).c_str());
  }
  std::printf("roundings: rne (nearest even), rna (nearest, ties away), rz, ru, rd; "
              "overflow: nosat (IEEE), satfinite\n");
}

void list_kernels(const ulpgate::Registry& registry) {
  using namespace ulpgate;
  std::printf("kernels (device: %s):\n", device_description().c_str());
  for (const auto& k : registry.all())
    std::printf("  %-40s %-6s %s\n", k->name().c_str(), k->traits().memory == Memory::Host ? "host" : "device",
                k->description().c_str());
  if (!cuda_device_available())
    std::printf("  (cublas.* and cublaslt.* need a CUDA device; none here)\n");
  std::printf("  cpu.blockfma:block=B,frac=F,round=R builds any block-FMA model (B 1..512, F 1..52)\n");
}

/// `ulpgate report RUN.json [--html F] [--md F] [--junit F]`.
struct ReportArgs {
  std::string run, html, md, junit;
};

int report_command(const ReportArgs& a) {
  const ulpgate::RunRecord r = ulpgate::read_record_file(a.run);
  if (a.html.empty() && a.md.empty() && a.junit.empty()) {
    std::fputs(ulpgate::render_markdown(r).c_str(), stdout);
    return kExitOk;
  }
  // Everything is rendered before anything is written: a failure (gnuplot missing, say)
  // leaves no half-updated set of reports behind.
  std::vector<std::pair<std::string, std::string>> outputs;
  if (!a.md.empty()) outputs.emplace_back(a.md, ulpgate::render_markdown(r));
  if (!a.junit.empty()) outputs.emplace_back(a.junit, ulpgate::render_junit(r));
  if (!a.html.empty()) outputs.emplace_back(a.html, ulpgate::render_html(r));
  for (const auto& [path, text] : outputs) ulpgate::write_text_file_atomically(path, text);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ulpgate: numerical-precision validation and fuzzing for GPU GEMM and attention kernels",
               "ulpgate"};
  app.set_version_flag("--version", fmt::format("ulpgate {} (git {})", ULPGATE_VERSION, ULPGATE_GIT_REVISION));
  app.require_subcommand(1);
  app.fallthrough(true);  // global options may follow the verb
  std::vector<std::string> plugins;
  app.add_option("--plugin", plugins, "Load kernels from a plugin shared library (repeatable)");

  auto* list = app.add_subcommand("list", "Kernels, formats and distributions available here");
  // Hidden (no group): the isolation worker that runs kernels for fuzz (harness/isolate.hpp).
  auto* worker = app.add_subcommand("worker", "Evaluate cases sent as JSON lines on stdin")->group("");

  ReportArgs report_args;
  auto* report = app.add_subcommand("report", "Render a run record: Markdown summary (stdout when no file is "
                                              "named), self-contained HTML with plots, JUnit XML");
  report->add_option("RUN.json", report_args.run, "Run record written by fuzz, sweep, replay or check")->required();
  report->add_option("--html", report_args.html, "Write the HTML report (needs gnuplot) to this file");
  report->add_option("--md", report_args.md, "Write the Markdown summary to this file");
  report->add_option("--junit", report_args.junit, "Write JUnit XML to this file");

  // An unknown verb gets a message of its own rather than CLI11's "argument not expected".
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const auto* sub : app.get_subcommands({})) known |= sub->get_name() == argv[1];
    if (!known) return usage_error(fmt::format("unknown command '{}'", argv[1]));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    if (argc <= 1) {
      std::fputs(app.help().c_str(), stderr);
      return kExitUsage;
    }
    return usage_error(e.what());
  }

  try {
    if (report->parsed()) return report_command(report_args);  // needs no kernels
    ulpgate::Registry registry = ulpgate::builtin_registry();
    for (const auto& p : plugins) ulpgate::load_plugin(p, registry);
    if (worker->parsed()) return ulpgate::serve_worker(registry);
    if (list->parsed()) {
      list_kernels(registry);
      list_formats();
      std::fputs(ulpgate::describe_families().c_str(), stdout);
      return kExitOk;
    }
  } catch (const ulpgate::InputError& e) {
    std::fprintf(stderr, "ulpgate: error: %s\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ulpgate: internal error: %s\n", e.what());
    return kExitInternal;
  }
  return kExitOk;
}
