// `ulpgate report RUN.json [--html F] [--md F] [--junit F]`: a run record (or a bench
// report) rendered; needs no kernels.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "campaign/bench.hpp"
#include "campaign/record.hpp"
#include "cli/options.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

struct ReportArgs {
  std::string run, html, md, junit;
};

// A bench report (`ulpgate bench --json`): its Markdown table and HTML with the plots.
Exit bench_report_command(const ReportArgs& a, const BenchReport& r) {
  if (!a.junit.empty()) throw InputError(fmt::format("--junit: {} is a bench report, which has no test cases", a.run));
  if (a.html.empty() && a.md.empty()) {
    std::fputs(bench_markdown(r).c_str(), stdout);
    return Exit::Ok;
  }
  std::vector<std::pair<std::string, std::string>> outputs;
  if (!a.md.empty()) outputs.emplace_back(a.md, bench_markdown(r));
  if (!a.html.empty()) outputs.emplace_back(a.html, render_bench_html(r));
  for (const auto& [path, text] : outputs) write_text_file_atomically(path, text);
  return Exit::Ok;
}

Exit report_command(const ReportArgs& a) {
  // Every output path is checked before anything is written: none is left half done.
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--md", a.md}, {"--junit", a.junit}, {"--html", a.html}})
    if (!path.empty()) check_output_file(flag, path);
  // Read and parsed once: a run record, or a bench report.
  const nlohmann::json j = read_json_file(a.run, "run record");
  const auto convert = [&](const auto& from_json) {
    try {
      return from_json(j);
    } catch (const InputError& e) {
      throw InputError(a.run + ": " + e.what());
    }
  };
  if (j.is_object() && j.contains("ulpgate_bench"))
    return bench_report_command(a, convert([](const nlohmann::json& x) { return bench_from_json(x); }));
  const RunRecord r = convert([](const nlohmann::json& x) { return record_from_json(x); });
  if (a.html.empty() && a.md.empty() && a.junit.empty()) {
    std::fputs(render_markdown(r).c_str(), stdout);
    return Exit::Ok;
  }
  // Everything is rendered before anything is written: a failure (gnuplot missing, say)
  // leaves no half-updated set of reports behind.
  std::vector<std::pair<std::string, std::string>> outputs;
  if (!a.md.empty()) outputs.emplace_back(a.md, render_markdown(r));
  if (!a.junit.empty()) outputs.emplace_back(a.junit, render_junit(r));
  if (!a.html.empty()) outputs.emplace_back(a.html, render_html(r));
  for (const auto& [path, text] : outputs) write_text_file_atomically(path, text);
  return Exit::Ok;
}

}  // namespace

Verb add_report(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  auto* report = app.add_subcommand("report", "Render a run record: Markdown summary (stdout when no file is "
                                              "named), self-contained HTML with plots, JUnit XML");
  set_help_footer(report,
                {
                 {"ulpgate report out/fuzz.json", "the Markdown summary on stdout"},
                 {"ulpgate report out/fuzz.json --html report.html --junit junit.xml", "HTML with plots (needs gnuplot) and JUnit XML"}},
                "0 written; 2 bad usage or bad input (one line on stderr); 3 an internal error");
  report->add_option("RUN.json", a->run, "Run record written by fuzz, sweep, replay or check, or a bench --json report")->required();
  report->add_option("--html", a->html, "Write the HTML report (needs gnuplot) to this file");
  report->add_option("--md", a->md, "Write the Markdown summary to this file");
  report->add_option("--junit", a->junit, "Write JUnit XML to this file");
  return {report, [a](const Context&) { return report_command(*a); }, /*uses_kernels=*/false, /*large_memory=*/false};
}

}  // namespace ulpgate
