// ulpgate command-line tool. Exit codes (DESIGN.md): 0 ok, 1 a check failed / regression,
// 2 bad usage or bad input (one line on stderr), 3 internal error.
#include <malloc.h>
#include <unistd.h>
#include <cctype>
#include <cstring>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "distributions/spec.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "references/gemm_reference.hpp"
#include "campaign/bench.hpp"
#include "campaign/isolate.hpp"
#include "campaign/gate.hpp"
#include "campaign/probe.hpp"
#include "campaign/record.hpp"
#include "cli/commands.hpp"
#include "cli/crash_guard.hpp"
#include "cli/memory.hpp"
#include "cli/mpi.hpp"
#include "cli/options.hpp"
#include "core/file_io.hpp"
#include "kernels/device.hpp"
#include "kernels/kernel.hpp"
#include "kernels/plugin/loader.hpp"
#include "reports/report.hpp"
#include "kernels/builtin.hpp"

namespace {

constexpr int kExitOk = 0, kExitUsage = 2, kExitInternal = 3;
constexpr const char* kMaxMemoryHelp =
    "Refuse a case that needs more memory than this, e.g. 12GB or 512MiB (default: half of this machine's memory)";

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
    std::printf("  (cublas.*, cublaslt.* and ladder.* need a CUDA device; none here)\n");
  std::printf("  cpu.blockfma:block=B,frac=F,round=R[,promote=N] builds any block-FMA model (B 1..512, F 1..52; promoted to FP32 every N products, N a multiple of B)\n");
}

/// `ulpgate report RUN.json [--html F] [--md F] [--junit F]`.
struct ReportArgs {
  std::string run, html, md, junit;
};

// A bench report (`ulpgate bench --json`): its Markdown table and HTML with the plots.
int bench_report_command(const ReportArgs& a, const ulpgate::BenchReport& r) {
  if (!a.junit.empty()) throw ulpgate::InputError(fmt::format("--junit: {} is a bench report, which has no test cases", a.run));
  if (a.html.empty() && a.md.empty()) {
    std::fputs(ulpgate::bench_markdown(r).c_str(), stdout);
    return kExitOk;
  }
  std::vector<std::pair<std::string, std::string>> outputs;
  if (!a.md.empty()) outputs.emplace_back(a.md, ulpgate::bench_markdown(r));
  if (!a.html.empty()) outputs.emplace_back(a.html, ulpgate::render_bench_html(r));
  for (const auto& [path, text] : outputs) ulpgate::write_text_file_atomically(path, text);
  return kExitOk;
}

int report_command(const ReportArgs& a) {
  // Every output path is checked before anything is written: none is left half done.
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--md", a.md}, {"--junit", a.junit}, {"--html", a.html}})
    if (!path.empty()) ulpgate::check_output_file(flag, path);
  // Read and parsed once: a run record, or a bench report.
  const nlohmann::json j = ulpgate::read_json_file(a.run, "run record");
  const auto convert = [&](const auto& from_json) {
    try {
      return from_json(j);
    } catch (const ulpgate::InputError& e) {
      throw ulpgate::InputError(a.run + ": " + e.what());
    }
  };
  if (j.is_object() && j.contains("ulpgate_bench"))
    return bench_report_command(a, convert([](const nlohmann::json& x) { return ulpgate::bench_from_json(x); }));
  const ulpgate::RunRecord r = convert([](const nlohmann::json& x) { return ulpgate::record_from_json(x); });
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

// glibc reads its tunables once, at start-up: where transparent huge pages are given on
// request (madvise mode), start again once with malloc asking for them. A 4096^2 sweep
// point touches gigabytes of fresh memory; in 4 KiB pages the faults alone took a third
// of its time. ULPGATE_NO_REEXEC=1 keeps the first process (debuggers, valgrind).
void restart_with_huge_pages(char** argv) {
  if (std::getenv("ULPGATE_NO_REEXEC")) return;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.hugetlb")) return;
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return;
  char mode[128] = {};
  const bool madvise = std::fgets(mode, sizeof mode, f) && std::strstr(mode, "[madvise]");
  std::fclose(f);
  if (!madvise) return;
  const std::string value = tunables && *tunables ? std::string(tunables) + ":glibc.malloc.hugetlb=1" : "glibc.malloc.hugetlb=1";
  if (::setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
}

}  // namespace

int main(int argc, char** argv) {
  restart_with_huge_pages(argv);
  // Large cases allocate and free vectors of 10^7-10^8 elements at every step (reference,
  // comparison, analysis). glibc serves each from a fresh mmap, whose pages the kernel
  // zeroes on first touch: a quarter of a 4096^2 sweep point went to that. From the heap,
  // and never trimmed, freed blocks are reused instead (the high-water mark stays mapped).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  CLI::App app{"ulpgate: numerical-precision validation and fuzzing for GPU GEMM and attention kernels",
               "ulpgate"};
  app.set_version_flag("--version", fmt::format("ulpgate {} (git {})", ULPGATE_VERSION, ulpgate::git_revision()));
  app.require_subcommand(1);
  app.fallthrough(true);  // global options may follow the verb
  std::vector<std::string> plugins;
  // One value per --plugin (repeat the flag), so that it may stand before a positional argument.
  app.add_option("--plugin", plugins, "Load kernels from a plugin shared library (repeatable)")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  std::string reference_path;
  app.add_option("--reference", reference_path,
                 "Where GEMM references compute their exact dot products: auto (default: the GPU's int8 digit "
                 "products for cases of 2^29 terms or more where a CUDA device is present, else the CPU), cpu, gpu "
                 "(sets ULPGATE_REFERENCE for worker processes)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}));

  auto* list = app.add_subcommand("list", "Kernels, formats and distributions available here");
  // Hidden (no group): the isolation worker that runs kernels for fuzz (campaign/isolate.hpp).
  auto* worker = app.add_subcommand("worker", "Evaluate cases sent as JSON lines on stdin")->group("");
  unsigned worker_threads = 0;
  worker->add_option("--threads", worker_threads, "Threads for the exact references (sets ULPGATE_THREADS)");
  unsigned worker_jobs = 1;
  worker->add_option("--jobs", worker_jobs, "Submitted cases checked at once")->check(CLI::Range(1u, 1024u));

  ulpgate::SweepArgs sweep_args;
  auto* sweep = app.add_subcommand("sweep", "Error against K (GEMM) or seq_kv (attention) for kernels x input "
                                            "distributions, with the fitted growth exponent and (GEMM) the effective "
                                            "accumulator precision");
  sweep->add_option("--kernel", sweep_args.kernels, "Kernel (repeatable; see ulpgate list)")->required();
  sweep->add_option("--dtype", sweep_args.dtype, "Input type: fp64, fp32, tf32, fp16, bf16, e4m3, e5m2 (default: "
                                                 "implied by the kernel)");
  sweep->add_option("--out-dtype", sweep_args.out_dtype, "D's format (default fp32)");
  sweep->add_option("--vary", sweep_args.vary, "K=FROM:TO[:FACTOR] (GEMM; default K=256:65536:4) or "
                                               "seq_kv=FROM:TO[:FACTOR] (attention)");
  sweep->add_option("--seq-q", sweep_args.seq_q, "Attention: queries per case (default 16)")->check(CLI::Range(1, 1 << 20));
  sweep->add_flag("--in-process", sweep_args.in_process, "Run the kernels in this process (default: a worker process)");
  sweep->add_option("--timeout", sweep_args.timeout, "Seconds per point before the worker is killed (default 600)");
  sweep->add_option("--dist", sweep_args.dists, "Input distribution of A and B (repeatable; default normal(0,1))");
  sweep->add_option("--metric", sweep_args.metric, "mean_normalised (default), max_normalised, mean_ulp, max_ulp, ...");
  sweep->add_option("--mn", sweep_args.mn, "M = N of every case (default 64)")->check(CLI::Range(1, 1 << 20));
  std::string sweep_seed = "1", sweep_max_memory;
  sweep->add_option("--seed", sweep_seed, "Seed (default 1)");
  sweep->add_option("--out", sweep_args.out_dir, "Directory for the run record (sweep.json)");
  sweep->add_option("--max-memory", sweep_max_memory, kMaxMemoryHelp);

  ulpgate::FuzzArgs fuzz_args;
  auto* fuzz = app.add_subcommand("fuzz", "Fuzz kernels x input types with generated cases (RapidCheck), shrink "
                                          "failures into a corpus, write the run record and reports");
  fuzz->add_option("--kernel", fuzz_args.kernels, "Kernel (repeatable; default: every kernel here)");
  fuzz->add_option("--dtype", fuzz_args.dtypes, "Input type (repeatable; default: every one each kernel supports)");
  fuzz->add_option("--cases", fuzz_args.cases, "Cases per (kernel, dtype) (default 10)");
  fuzz->add_option("--time", fuzz_args.seconds, "Budget in seconds for the whole campaign (default 300; 0: none)");
  std::string fuzz_seed = "1", fuzz_max_memory;
  fuzz->add_option("--seed", fuzz_seed, "Campaign seed (default 1)");
  fuzz->add_option("--max-memory", fuzz_max_memory, kMaxMemoryHelp);
  fuzz->add_option("--max-k", fuzz_args.max_k, "Largest K (attention: seq_kv) of the small regime (default 1024)")
      ->check(CLI::Range(1, 1 << 20));
  fuzz->add_option("--sizes", fuzz_args.sizes,
                   "Size schedule: small (small regime only), realistic (default: every fifth case from the large "
                   "regime: K up to 65536, M and N up to 4096, batch up to 16), large (every case)");
  fuzz->add_option("--out", fuzz_args.out_dir, "Output directory (default ulpgate-out)");
  fuzz->add_option("--corpus", fuzz_args.corpus_dir, "Corpus of saved failures, replayed first (default <out>/corpus)");
  fuzz->add_flag("--no-metamorphic", fuzz_args.no_metamorphic, "Skip the repeatability, scaling and transpose checks");
  fuzz->add_flag("--in-process", fuzz_args.in_process, "Run kernels in this process (default: a worker process)");
  fuzz->add_option("--timeout", fuzz_args.timeout, "Seconds per case before the worker is killed (default 300)");
  fuzz->add_option("--jobs", fuzz_args.jobs, "Cases checked at once, by threads of one worker process (default: one per "
                                             "core, at most 16; results do not depend on it)")
      ->check(CLI::Range(1, 256));
  fuzz->add_flag("--resume", fuzz_args.resume, "Continue an interrupted campaign from <out>/journal.jsonl");
  fuzz->add_flag("--allow-partial", fuzz_args.allow_partial,
                 "Exit 0 although --time cut the campaign short (what did not run is recorded either way)");
  fuzz->add_flag("--no-html", fuzz_args.no_html,
                 "Write no report.html (it needs gnuplot; `ulpgate report fuzz.json --html F` draws it later)");
  fuzz->add_option("--shard", fuzz_args.shard,
                   "Run shard INDEX of COUNT (0-based, e.g. 2/8): every COUNT-th target; `ulpgate merge` joins the "
                   "shards' records into the whole campaign's");

  std::vector<std::string> merge_runs;
  std::string merge_out = "ulpgate-out";
  bool merge_no_html = false, merge_allow_partial = false;
  auto* merge = app.add_subcommand("merge", "Join the records of a campaign's shards (fuzz --shard) into its record and "
                                            "reports");
  merge->add_option("RUN.json", merge_runs, "The shards' fuzz.json files, every shard once")->required();
  merge->add_option("--out", merge_out, "Output directory (default ulpgate-out)");
  merge->add_flag("--no-html", merge_no_html, "Write no report.html (it needs gnuplot)");
  merge->add_flag("--allow-partial", merge_allow_partial, "Exit 0 although a time budget cut a shard short");

  std::string replay_case, replay_out;
  auto* replay = app.add_subcommand("replay", "Rerun one case file on its kernel and print its analysis");
  replay->add_option("CASE.json", replay_case, "Case file (from a fuzz corpus or written by hand)")->required();
  replay->add_option("--out", replay_out, "Also write the run record here");
  bool replay_in_process = false;
  double replay_timeout = 600;
  replay->add_flag("--in-process", replay_in_process, "Run the kernel in this process (default: a worker process)");
  replay->add_option("--timeout", replay_timeout, "Seconds before the worker is killed (default 600)");
  std::string replay_max_memory;
  replay->add_option("--max-memory", replay_max_memory, kMaxMemoryHelp);

  std::string export_case, export_dir, export_max_memory;
  bool export_force = false;
  auto* export_ = app.add_subcommand("export", "Write a case's inputs as .npy files (the buffers a kernel gets, padding "
                                               "included) and DIR/manifest.json, for a kernel run elsewhere");
  export_->add_option("CASE.json", export_case, "Case file")->required();
  export_->add_option("--dir", export_dir, "Directory for <operand>.npy and manifest.json")->required();
  export_->add_flag("--force", export_force, "Replace an earlier export in --dir");
  export_->add_option("--max-memory", export_max_memory, kMaxMemoryHelp);

  std::string check_case, check_out, check_max_memory;
  std::vector<std::string> check_outputs;
  auto* check = app.add_subcommand("check", "Judge outputs computed elsewhere (.npy) against the case's exact reference, "
                                            "as replay judges a kernel run");
  check->add_option("CASE.json", check_case, "Case file (the one exported)")->required();
  check->add_option("--outputs", check_outputs, "Output file named by its output (D.npy, O.npy) or NAME=FILE.npy (repeatable)")
      ->required()
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  check->add_option("--out", check_out, "Also write the run record here");
  check->add_option("--max-memory", check_max_memory, kMaxMemoryHelp);
  int check_p_bits = 0;
  check->add_option("--p-bits", check_p_bits,
                    "Attention: the kernel rounds P to this many bits before P V (11: FP16, 8: BF16, as FlashAttention "
                    "and cuDNN do; 24: P kept in FP32, the tighter rule); 0 (default): undeclared, P in the inputs' 16-bit "
                    "format admitted");

  std::vector<std::string> probe_kernels;
  int probe_max_block = 512, probe_max_promote = 4096;
  auto* probe = app.add_subcommand(
      "probe", "How each GEMM kernel accumulates FP32 dot products (block size, fraction bits after alignment, "
               "rounding, promotion), from known-answer M x N x K cases (D[0][0] the dot product) run in this process");
  probe->add_option("--kernel", probe_kernels, "Kernel to probe (repeatable)");
  std::vector<std::string> probe_instructions;
  probe->add_option("--instruction", probe_instructions,
                    "Tensor-core instruction to probe (repeatable): mma.f16, mma.bf16, mma.tf32, mma.e4m3, mma.e5m2, mma.f16.f16acc, "
                    "wgmma.f16, wgmma.bf16, wgmma.tf32, wgmma.e4m3, wgmma.e5m2 "
                    "(a chain of mma.sync on the device, D fed back as C)");
  std::int64_t probe_validate = -1;
  probe->add_option("--validate", probe_validate, "Random dot products the inferred model must reproduce bit for bit "
                                                  "(default 1000 for kernels, 1000000 for instructions)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 32));
  std::string probe_json;
  probe->add_option("--json", probe_json, "Write the probed models here (one object per unit)");
  probe->add_option("--max-block", probe_max_block, "Largest block size tried (default 512)")->check(CLI::Range(2, 65536));
  probe->add_option("--max-promote", probe_max_promote, "Largest promotion length tried (default 4096)")
      ->check(CLI::Range(1, 1 << 20));
  std::string probe_dtype;
  probe->add_option("--dtype", probe_dtype, "Input type of the probe's cases: fp32, tf32, fp16, bf16, e4m3, e5m2 "
                                            "(default: implied by each kernel's name)")
      ->check(CLI::IsMember({"fp32", "tf32", "fp16", "bf16", "e4m3", "e5m2"}));
  std::string probe_dump;
  probe->add_option("--dump", probe_dump, "Also write each unit's results on random dot products to DIR/UNIT.dots "
                                          "(format in campaign/probe.hpp, dump_batched), for offline study");
  std::int64_t probe_dump_count = 20000, probe_dump_span = 263;
  probe->add_option("--dump-count", probe_dump_count, "Dot products per dump (default 20000)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 26));
  probe->add_option("--dump-span", probe_dump_span, "Longest dot product of a dump (default 263)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  std::int64_t probe_mn = 1;
  probe->add_option("--mn", probe_mn, "M = N of the probe's cases: its dot product is D[0][0], every other input "
                                      "zero; a library takes the path of that shape (default 1)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{16384}));

  ulpgate::BenchArgs bench_args;
  auto* bench = app.add_subcommand(
      "bench", "Time kernels on GEMM or attention shapes (CUDA events, L2 evicted, median of --reps runs) and check "
               "each timed output against the exact reference, in this process");
  bench->add_option("--kernel", bench_args.kernels, "Kernel to time (repeatable; a name ending in '.' takes every kernel "
                                                   "with that prefix, e.g. ladder.)");
  bench->add_option("--baseline", bench_args.baseline, "Kernel timed first on each case: the others' % of its TFLOP/s "
                                                       "(e.g. cublas.fp32)");
  bench->add_option("--gemm", bench_args.gemm_shapes, "GEMM shape MxNxK (repeatable)");
  bench->add_option("--shapes", bench_args.shapes_preset, "GEMM shape preset: square (1024..8192) or llm")
      ->check(CLI::IsMember({"square", "llm"}));
  bench->add_option("--attention", bench_args.attention_shapes, "Attention shape BxHxSqxSkvxD (repeatable)");
  bench->add_flag("--causal", bench_args.causal, "Attention: causal mask (FLOPs count the visible pairs only)");
  bench->add_option("--layout", bench_args.layout, "Attention layout: bhsd (default) or bshd");
  bench->add_option("--dtype", bench_args.dtype, "Input type (default: implied by the first kernel's name)");
  bench->add_option("--reps", bench_args.reps, "Timed runs per kernel and case (default 20)")->check(CLI::Range(1, 100000));
  bench->add_option("--warmup", bench_args.warmup, "Untimed runs first (default 3)")->check(CLI::Range(0, 1000));
  bench->add_flag("--no-flush", bench_args.no_flush, "Do not evict L2 before each timed run");
  bench->add_flag("--no-check", bench_args.no_check, "Do not check the outputs against the exact reference");
  bench->add_option("--seed", bench_args.seed, "Seed of the inputs (default 1)");
  bench->add_option("--json", bench_args.json, "Write the results as JSON here");
  bench->add_option("--md", bench_args.md, "Write the Markdown table here too");
  bench->add_option("--html", bench_args.html, "Write an HTML page with a speed-vs-size plot per kernel here (needs gnuplot)");

  std::string gate_baseline, gate_run, gate_junit;
  auto* gate = app.add_subcommand("gate", "Compare a run record with a baseline: exit 0 pass, 1 regression");
  gate->add_option("--baseline", gate_baseline, "Baseline file (ulpgate baseline update)")->required();
  gate->add_option("RUN.json", gate_run, "Run record")->required();
  gate->add_option("--junit", gate_junit, "Write the gate's JUnit XML here");
  ulpgate::GateOptions gate_options;
  gate->add_flag("--allow-missing", gate_options.allow_missing,
                 "Baseline cases missing from the run, or not run in its time budget, do not fail the gate");
  gate->add_flag("--allow-different-campaign", gate_options.allow_different_campaign,
                 "Compare a run of another campaign definition (seed, cases, kernels, ...) instead of refusing (exit 2)");

  std::string base_run, base_out;
  double base_slack = 0.25;
  auto* baseline = app.add_subcommand("baseline", "Baselines for the gate");
  auto* baseline_update = baseline->add_subcommand("update", "Write a baseline from a run record");
  baseline->require_subcommand(1);
  baseline_update->add_option("RUN.json", base_run, "Run record")->required();
  baseline_update->add_option("--out", base_out, "Baseline file to write")->required();
  baseline_update->add_option("--slack", base_slack, "Allowed relative growth of each error (default 0.25)");
  double base_slack_ulp = 1.0;
  baseline_update->add_option("--slack-ulp", base_slack_ulp,
                              "Absolute floor of the allowed growth, in ULPs of the output (default 1)");

  ReportArgs report_args;
  auto* report = app.add_subcommand("report", "Render a run record: Markdown summary (stdout when no file is "
                                              "named), self-contained HTML with plots, JUnit XML");
  report->add_option("RUN.json", report_args.run, "Run record written by fuzz, sweep, replay or check, or a bench --json report")->required();
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
    if (!reference_path.empty()) {
      ::setenv("ULPGATE_REFERENCE", reference_path.c_str(), 1);  // worker processes inherit it
      ulpgate::set_reference_path(*ulpgate::parse_reference_path(reference_path));
      if (reference_path == "gpu" && !ulpgate::gpu_reference_available())
        return usage_error("--reference gpu: no CUDA device here (or a build without CUDA)");
    }
    plugins = ulpgate::resolve_plugins(plugins);  // "" refused, "foo.so" here found
    const auto max_memory = [](const std::string& text) {
      return text.empty() ? ulpgate::default_max_memory() : ulpgate::parse_memory_size(text);
    };
    // Kernels are loaded into this process only by `list`, `worker` and --in-process runs;
    // fuzz, sweep and replay otherwise leave every kernel call to a worker process.
    const ulpgate::LocalRegistry local = [&] {
      ulpgate::Registry r = ulpgate::builtin_registry();
      for (const auto& p : plugins) ulpgate::load_plugin(p, r);
      return r;
    };
    if (worker->parsed()) {
      if (worker_threads > 0) ::setenv("ULPGATE_THREADS", std::to_string(worker_threads).c_str(), 1);
      ulpgate::Registry registry = local();
      return ulpgate::serve_worker(registry, worker_jobs);
    }
    if (list->parsed()) {
      const ulpgate::Registry registry = local();
      list_kernels(registry);
      list_formats();
      std::fputs(ulpgate::describe_families().c_str(), stdout);
      return kExitOk;
    }
    if (bench->parsed()) {
      if (!bench_args.json.empty()) ulpgate::check_output_file("--json", bench_args.json);
      if (!bench_args.md.empty()) ulpgate::check_output_file("--md", bench_args.md);
      if (!bench_args.html.empty()) ulpgate::check_output_file("--html", bench_args.html);
      return ulpgate::bench_command(bench_args, local);
    }
    if (probe->parsed()) {  // a model mismatch is a finding (exit 1); a bad kernel or case, exit 2
      if (probe_kernels.empty() && probe_instructions.empty())
        throw ulpgate::InputError("probe: give at least one --kernel or --instruction");
      if (!probe_dump.empty()) {
        ulpgate::check_out_dir(probe_dump);
        ulpgate::create_out_dir(probe_dump);
      }
      ulpgate::Registry registry = local();
      // One unit's result: its lines, its JSON object, its exit code (0, or 1: not a
      // block-FMA unit).
      struct Probed {
        std::string text;
        nlohmann::json model;
        int rc = kExitOk;
      };
      const auto model_json = [&](const std::string& unit, const std::string& dtype, const ulpgate::ProbedAccumulation& p,
                                  const std::string& problem) {
        nlohmann::json j{{"unit", unit}, {"input", dtype}};
        if (problem.empty()) {
          j["block"] = p.block;
          if (p.frac) j["frac_bits"] = *p.frac;
          else j["frac_bits_at_least"] = p.frac_at_least;
          j["rounding"] = p.rounding ? std::string(ulpgate::name(*p.rounding)) : std::string("not observable");
          j["promote"] = p.promote;
          if (p.align_inputs) j["align"] = *p.align_inputs ? "inputs" : "product";
          if (p.align_format) j["align_format"] = std::string(ulpgate::name(*p.align_format));
          j["out_bits"] = p.out;
          j["accumulator"] = std::string(ulpgate::name(p.accumulator));
          if (p.interleave) j["interleave"] = p.interleave;
          j["rounding_moot"] = p.rounding_moot;
          j["validated"] = p.validated;
          j["summary"] = p.describe();
          if (p.known()) j["model"] = p.model(*ulpgate::parse_format(dtype)).name();
        } else {
          j["problem"] = problem;
        }
        return j;
      };
      // The experiments, the alignment and the validation in batches, then a line and a JSON
      // object; a unit outside the block-FMA model is a finding (exit 1), a case the unit
      // does not take, exit 2 (InputError).
      const auto probe_unit = [&](const std::string& unit, ulpgate::Format input, const ulpgate::ProbeDot& dot,
                                  const ulpgate::ProbeBatch& batch, std::int64_t default_validate) {
        Probed out;
        const std::string dtype(ulpgate::name(input));
        if (!probe_dump.empty()) {
          std::string base = unit;  // a file name of letters, digits, '.', '_' and '-'
          for (char& ch : base)
            if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-') ch = '_';
          const std::string file = probe_dump + "/" + base + ".dots";
          const std::int64_t n = ulpgate::dump_batched(batch, unit, probe_dump_count, probe_dump_span, file);
          out.text += fmt::format("{}: {} random dot products written to {}\n", unit, n, file);
        }
        try {
          ulpgate::ProbedAccumulation p = ulpgate::probe_unit(dot, batch, probe_max_block, probe_max_promote);
          const std::int64_t n = probe_validate < 0 ? default_validate : probe_validate;
          std::string counts;
          if (n > 0 && p.known()) {
            const ulpgate::BatchValidation v = ulpgate::validate_batched(p, batch, input, n);
            p.validated = static_cast<int>(std::min<std::int64_t>(v.total(), INT32_MAX));
            counts = fmt::format(" ({} normal, {} cancelling, {} with subnormal inputs)", v.normal, v.cancelling, v.subnormal);
          }
          out.text += fmt::format("{} ({} inputs): {}{}\n", unit, dtype, p.describe(), counts);
          out.model = model_json(unit, dtype, p, "");
        } catch (const ulpgate::InputError&) {
          throw;
        } catch (const std::runtime_error& e) {
          out.text += fmt::format("{}: not a block-FMA unit: {}\n", unit, e.what());
          out.model = model_json(unit, dtype, {}, e.what());
          out.rc = 1;
        }
        return out;
      };
      // The units in the order given: instructions, then kernels (names checked first).
      std::vector<std::function<Probed()>> units;
      for (const std::string& inst : probe_instructions)
        units.push_back([&, inst] {
          const auto [dot, batch] = ulpgate::mma_unit(inst);  // unknown name or no device: exit 2
          return probe_unit(inst, batch.input, dot, batch, 1000000);
        });
      for (const std::string& name : probe_kernels) {
        ulpgate::Kernel* k = registry.resolve(name);
        if (!k) throw ulpgate::InputError(fmt::format("unknown kernel '{}' (see ulpgate list)", name));
        const std::string dtype = probe_dtype.empty() ? ulpgate::default_dtype(name) : probe_dtype;
        const ulpgate::Format input = *ulpgate::parse_format(dtype);
        // validated in batches: up to mn dot products per GEMM, on D's diagonal
        units.push_back([&, name, k, input] {
          const ulpgate::KernelCrashGuard guard("probe", name);
          return probe_unit(name, input, ulpgate::kernel_unit(*k, input, probe_mn), ulpgate::kernel_batch(*k, input, probe_mn), 1000);
        });
      }
      nlohmann::json models = nlohmann::json::array();
      int rc = kExitOk;
      const ulpgate::mpi::World world = ulpgate::mpi::join();
      if (world.size == 1) {
        for (const auto& unit : units) {
          const Probed r = unit();
          std::fputs(r.text.c_str(), stdout);
          std::fflush(stdout);
          models.push_back(r.model);
          rc = std::max(rc, r.rc);
        }
        if (!probe_json.empty()) ulpgate::write_text_file_atomically(probe_json, models.dump(2) + "\n");
        return rc;
      }
      // mpirun: the ranks (each with its own GPU where there are several) claim the units
      // as they become free; rank 0 prints them in the order given and writes the JSON.
      std::vector<std::string> failures;  // (a unit's errors are in its result)
      const std::vector<nlohmann::json> done = ulpgate::mpi::share_units(
          world, static_cast<std::int64_t>(units.size()),
          [&](std::int64_t u) {
            nlohmann::json j;
            try {
              const Probed r = units[static_cast<std::size_t>(u)]();
              j["text"] = r.text, j["model"] = r.model, j["rc"] = r.rc;
            } catch (const ulpgate::InputError& e) {
              j["error"] = e.what(), j["rc"] = kExitUsage;
            } catch (const std::exception& e) {
              j["error"] = std::string("internal error: ") + e.what(), j["rc"] = kExitInternal;
            }
            return j;
          },
          failures);
      if (world.rank == 0) {
        std::string errors;
        for (const auto& j : done) {
          if (j.contains("error")) {
            errors += fmt::format("ulpgate: error: {}\n", j["error"].get<std::string>());
          } else {
            std::fputs(j["text"].get<std::string>().c_str(), stdout);
            models.push_back(j["model"]);
          }
          rc = std::max(rc, j["rc"].get<int>());
        }
        std::fflush(stdout);
        std::fputs(errors.c_str(), stderr);
        if (!probe_json.empty()) ulpgate::write_text_file_atomically(probe_json, models.dump(2) + "\n");
      }
      rc = ulpgate::mpi::broadcast(world, rc);
      ulpgate::mpi::finish(world);
      return rc;
    }
    std::string command_line;
    for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
    if (fuzz->parsed()) {
      fuzz_args.plugins = plugins;
      fuzz_args.seed = ulpgate::parse_seed(fuzz_seed);
      fuzz_args.max_memory = max_memory(fuzz_max_memory);
      return ulpgate::fuzz_command(fuzz_args, local, command_line);
    }
    if (merge->parsed()) return ulpgate::merge_command(merge_runs, merge_out, merge_no_html, merge_allow_partial, command_line);
    if (replay->parsed()) {
      const std::uint64_t limit = max_memory(replay_max_memory);
      ulpgate::check_timeout(replay_timeout);
      if (!replay_out.empty()) ulpgate::check_output_file("--out", replay_out);
      std::optional<ulpgate::IsolationOptions> iso;
      if (!replay_in_process) {
        iso.emplace();
        iso->plugins = plugins;
        iso->timeout_seconds = replay_timeout;
      }
      return ulpgate::replay_command(replay_case, local, replay_out, iso, plugins, limit);
    }
    if (export_->parsed())
      return ulpgate::export_command(export_case, export_dir, export_force, max_memory(export_max_memory));
    if (check->parsed()) {
      if (!check_out.empty()) ulpgate::check_output_file("--out", check_out);
      return ulpgate::check_command(check_case, check_outputs, check_out, max_memory(check_max_memory), check_p_bits);
    }
    if (gate->parsed()) return ulpgate::gate_command(gate_baseline, gate_run, gate_junit, gate_options);
    if (baseline_update->parsed())
      return ulpgate::baseline_update_command(base_run, base_out, base_slack, base_slack_ulp);
    if (sweep->parsed()) {
      sweep_args.plugins = plugins;
      sweep_args.seed = ulpgate::parse_seed(sweep_seed);
      sweep_args.max_memory = max_memory(sweep_max_memory);
      return ulpgate::sweep_command(sweep_args, local, command_line);
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
