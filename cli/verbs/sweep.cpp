// `ulpgate sweep`: error against K (GEMM) or seq_kv (attention) for kernels x input
// distributions, with the fitted growth exponent and (GEMM) the effective accumulator
// precision; every point in a worker process; writes a run record.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "campaign/isolate.hpp"
#include "campaign/sweep.hpp"
#include "check/ops/attention.hpp"
#include "check/ops/attention_backward.hpp"
#include "check/ops/attention_combine.hpp"
#include "check/ops/op.hpp"
#include "cli/memory.hpp"
#include "cli/mpi.hpp"
#include "cli/options.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"
#include "distributions/spec.hpp"

namespace ulpgate {
namespace {

struct SweepArgs {
  std::vector<std::string> kernels;
  std::string dtype;      ///< empty: implied by each kernel's name
  std::string out_dtype;  ///< empty: fp32 (fp64 for fp64)
  std::string vary = "K=256:65536:4";
  std::string lse_base = "e", lse_dist = "lse(mean=4,std=4,empty=0.1)";  ///< --vary splits
  std::vector<std::string> dists = {"normal(0,1)"};
  std::string metric = "mean_normalised";
  std::int64_t mn = 64;
  std::uint64_t seed = 1;
  std::string out_dir;
  std::int64_t seq_q = 16;  ///< attention sweeps: queries per case
  ServedVariantSpecs variants;  ///< attention sweeps: --window, --softcap, --alibi, --sinks, --page-size (core/case.hpp)
  std::string kv_cache;         ///< attention sweeps: --kv-cache FORMAT[:FRAC][:head]
  std::string output;       ///< the output swept (attention backward: dQ, dK or dV); empty: the main one
  std::uint64_t max_memory = 0;  ///< bytes a point may need (--max-memory; 0: the default)
  std::vector<std::string> plugins;
  bool in_process = false;  ///< run the points in this process (default: a worker process)
  double timeout = 600;     ///< seconds per point before the worker is killed
};

// One kernel x distribution of a sweep.
struct Series {
  Kernel* kernel;
  std::string dtype, dist;
  SweepOptions options;
  std::optional<std::string> unsupported;  ///< the kernel's answer for the first point
};

// A sweep planned: its series, and where their points run.
struct SweepPlan {
  std::vector<Series> series;
  std::unique_ptr<IsolatedEvaluator> isolated;  ///< null: --in-process
  Registry registry;
  SweepVary vary;
  bool gemm = true;
  bool combine = false;  ///< --vary splits: attention_combine cases
};

// Under mpirun: the points the ranks checked, by (series, point), and the ranks that failed.
struct SharedPoints {
  std::map<std::pair<std::size_t, std::size_t>, CaseResult> results;
  std::string lost;  ///< the ranks that failed, for points nobody checked
  int failed_ranks = 0;
};

// Bad input before anything runs or is written: a kernel of the other op (an attention
// kernel with --vary K, a GEMM one with --vary seq_kv), or no series any kernel takes.
void check_plan(const std::vector<Series>& plan, const std::vector<Kernel*>& kernels, bool gemm, const std::string& parameter) {
  const OpModule& other = op_module(gemm ? Op::Attention : Op::Gemm);
  for (Kernel* k : kernels) {
    const auto of_k = [&](const Series& s) { return s.kernel == k; };
    const auto first = std::find_if(plan.begin(), plan.end(), of_k);
    if (first == plan.end() || std::any_of(plan.begin(), plan.end(), [&](const Series& s) { return of_k(s) && !s.unsupported; }))
      continue;
    const auto dtypes = other.dtypes();
    if (std::count(dtypes.begin(), dtypes.end(), first->dtype) && other.supported_output(*k, first->dtype))
      throw InputError(fmt::format("--kernel '{}' is {} kernel: --vary {} sweeps {} cases (--vary {} sweeps {})", k->name(),
                                   gemm ? "an attention" : "a GEMM", parameter, gemm ? "GEMM" : "attention",
                                   gemm ? "seq_kv" : "K", gemm ? "attention" : "GEMM"));
  }
  if (std::any_of(plan.begin(), plan.end(), [](const Series& s) { return !s.unsupported; })) return;
  std::vector<std::string> why;
  for (const Series& s : plan) why.push_back(fmt::format("{} {}: not supported ({})", s.kernel->name(), s.dtype, *s.unsupported));
  throw InputError(fmt::format("sweep: no requested kernel takes the sweep's cases: {}", fmt::join(why, "; ")));
}

// Kernel k's series on one distribution, its largest point held to the case caps and to
// max_memory before the first point of any series runs.
Series plan_series(const SweepArgs& a, const SweepPlan& p, const std::optional<Format>& out, Kernel* k,
                   const std::string& dist, std::uint64_t max_memory) {
  const std::string dtype = a.dtype.empty() ? default_dtype(k->name()) : a.dtype;
  const SweepVary& vary = p.vary;
  SweepOptions o;
  if (p.gemm) {
    if (!a.kv_cache.empty()) throw InputError("sweep: --kv-cache applies to attention sweeps (--vary seq_kv=...)");
    if (a.variants.any())
      throw InputError("sweep: --window, --softcap, --alibi, --sinks and --page-size apply to attention sweeps (--vary seq_kv=...)");
    o.base = dtype_gemm_case(dtype, a.mn, a.mn, vary.values.front(), out);
    o.base.dist = {{"A", dist}, {"B", dist}};
  } else if (p.combine) {
    if (!a.kv_cache.empty() || a.variants.any())
      throw InputError("sweep: --kv-cache, --window, --softcap, --alibi, --sinks and --page-size apply to attention sweeps "
                       "(--vary seq_kv=...)");
    if (a.lse_base != "e" && a.lse_base != "2") throw InputError(fmt::format("--lse-base '{}': e or 2", a.lse_base));
    o.base = dtype_attention_combine_case(dtype, out);
    AttentionShape& at = o.base.attention;
    at.seq_q = a.seq_q, at.head_dim = 64, at.splits = vary.values.front();
    at.lse_base2 = a.lse_base == "2";
    o.base.types["LSE"] = Format::FP32;
    o.base.dist = {{"O_part", dist}, {"LSE_part", a.lse_dist}};
  } else {
    // A kernel that takes backward cases and no forward ones sweeps the backward.
    const bool backward = !op_module(Op::Attention).supported_output(*k, dtype) &&
                          op_module(Op::AttentionBackward).supported_output(*k, dtype);
    o.base = backward ? dtype_attention_backward_case(dtype) : dtype_attention_case(dtype);
    o.base.attention.seq_q = a.seq_q, o.base.attention.head_dim = 64, o.base.attention.seq_kv = vary.values.front();
    apply_served_variants(o.base.attention, a.variants);
    if (out && !backward) o.base.types["O"] = *out;
    if (out && backward)
      for (const char* g : {"dQ", "dK", "dV"}) o.base.types[g] = *out;
    // A family of Q and K together (logits, sink, masked) draws K with Q.
    const auto fam = find_family(parse_dist(dist).family);
    o.base.dist = fam && fam->scope == Scope::AttnQK ? std::map<std::string, std::string>{{"Q", dist}, {"V", "normal(0,1)"}}
                                                     : std::map<std::string, std::string>{{"Q", dist}, {"K", dist}, {"V", dist}};
    if (backward) o.base.dist["dO"] = "normal(0,1)";
    if (!a.kv_cache.empty()) apply_kv_cache(o.base, a.kv_cache, fam && fam->scope == Scope::AttnQK);
  }
  o.base.seed = a.seed;
  o.base.kernel = k->name();
  o.parameter = vary.parameter;
  o.values = vary.values;
  o.metric = a.metric;
  o.output = a.output;
  Case largest = o.base;
  try {
    largest = sweep_point(o, o.values.size() - 1);
    check_memory_need(largest, max_memory);
  } catch (const InputError& e) {
    throw InputError(fmt::format("sweep point {} = {}: {}", vary.parameter, vary.values.back(), e.what()));
  }
  Series s{k, dtype, dist, std::move(o), std::nullopt};
  s.unsupported = k->unsupported(s.options.base);
  return s;
}

// Every flag and every series is checked before the first point runs.
void prepare(SweepPlan& p, const SweepArgs& a, const LocalRegistry& local) {
  if (a.kernels.empty()) throw InputError("sweep: --kernel is required");
  p.vary = parse_vary(a.vary);
  p.gemm = p.vary.parameter == "K";
  p.combine = p.vary.parameter == "splits";
  if (!a.dtype.empty()) check_dtype(a.dtype);
  check_timeout(a.timeout);
  if (!a.out_dir.empty()) check_out_dir(a.out_dir);
  const std::uint64_t max_memory = a.max_memory ? a.max_memory : default_max_memory();
  std::optional<Format> out;
  if (!a.out_dtype.empty()) {
    out = parse_format(a.out_dtype);
    if (!out) throw InputError(fmt::format("--out-dtype '{}': unknown format (see ulpgate list)", a.out_dtype));
  }
  // Isolated (the default): the points and every supports() query run in a worker.
  if (!a.in_process) {
    IsolationOptions iso;
    iso.plugins = a.plugins;
    iso.timeout_seconds = a.timeout;
    p.isolated = std::make_unique<IsolatedEvaluator>(iso);
    p.registry = worker_registry(*p.isolated, a.kernels);
  } else {
    p.registry = local();
  }
  std::vector<Kernel*> kernels;
  for (const auto& name : a.kernels) {
    Kernel* k = p.registry.resolve(name);
    if (!k) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", name));
    kernels.push_back(k);
  }
  for (Kernel* k : kernels)
    for (const auto& dist : a.dists) p.series.push_back(plan_series(a, p, out, k, dist, max_memory));
  if (!p.combine) check_plan(p.series, kernels, p.gemm, p.vary.parameter);
  else check_plan(p.series, {}, false, p.vary.parameter);  // no op of a kernel's other kind sweeps splits
}

// Point p of series si: checked here, or (under mpirun) looked up among the ranks' results.
CaseResult check_point(SweepPlan& p, std::size_t si, std::size_t point, const Case& c, const EvaluationOptions& eo,
                       const SharedPoints* shared) {
  Kernel* k = p.series[si].kernel;
  if (shared) {
    const auto it = shared->results.find({si, point});
    return it != shared->results.end() ? it->second : failed_result(k->name(), c, Disposition::Failed, shared->lost);
  }
  return p.isolated ? p.isolated->evaluate(c.kernel, c, eo) : check_case(*k, c, eo, &p.registry);
}

// Series si's points in order, with a progress line per point where stderr is not a
// terminal (logs of long sweeps).
SweepOutcome run_series(SweepPlan& p, std::size_t si, const SharedPoints* shared, bool tty) {
  const Series& series = p.series[si];
  std::size_t point = 0;  // run_sweep checks the points in order
  const PointChecker check = [&](const Case& c, const EvaluationOptions& eo) { return check_point(p, si, point++, c, eo, shared); };
  const auto series_start = std::chrono::steady_clock::now();
  const SweepOutcome s = run_sweep(series.options, check, [&](std::size_t i, std::size_t n) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - series_start).count();
    std::fprintf(stderr, tty ? "\r  %s %s %s: %zu/%zu points, %.1f s" : "  %s %s %s: %zu/%zu points, %.1f s\n",
                 series.kernel->name().c_str(), series.dtype.c_str(), series.dist.c_str(), i, n, seconds);
  });
  if (tty) std::fprintf(stderr, "\r\033[K");
  return s;
}

// GEMM: the fit, the effective accumulator precision, the spread of the per-point
// estimates and how they were made (the last point's family).
void print_gemm_fit(const SweepOutcome& s) {
  double lo = INFINITY, hi = -INFINITY;
  for (const double b : s.effective_bits_per_point)
    if (std::isfinite(b)) lo = std::min(lo, b), hi = std::max(hi, b);
  std::string how;
  for (const auto& r : s.cases)
    if (const auto f = r.notes.find("effective_bits_family"); f != r.notes.end()) how = f->second;
  std::printf("  growth exponent %.3f +- %.3f, effective accumulator precision%s%s%s\n", s.series.fit.exponent,
              s.series.fit.exponent_stderr,
              std::isnan(s.series.effective_bits) ? ": no estimate (no point gave a result)"
                                                  : fmt::format(" {:.2f} bits", s.series.effective_bits).c_str(),
              hi >= lo ? fmt::format(" (spread {:.2f} across the points)", hi - lo).c_str() : "",
              how.empty() ? "" : fmt::format(", estimated with {}", how).c_str());
}

// One series' table, its failed points and its fit; returns how many points failed.
std::int64_t print_series(const Series& series, const SweepOutcome& s, const SweepArgs& a, const SweepPlan& p) {
  const std::string measured = a.output.empty() ? a.metric : a.output + " " + a.metric;
  std::printf("\n  %s  %s  %s  (%s)\n  %8s  %16s  %14s\n", series.kernel->name().c_str(), series.dtype.c_str(),
              series.dist.c_str(), measured.c_str(), p.vary.parameter.c_str(), a.metric.c_str(), "effective bits");
  for (std::size_t i = 0; i < s.series.x.size(); ++i)
    std::printf("  %8.0f  %16.4g  %14.2f\n", s.series.x[i], s.series.y[i], s.effective_bits_per_point[i]);
  std::int64_t failed_points = 0;
  for (const auto& r : s.cases)  // every point is judged like any case
    if (!r.verdict.passed) {
      ++failed_points;
      std::printf("  FAIL %s=%lld: %s\n", p.vary.parameter.c_str(),
                  static_cast<long long>(p.gemm ? r.spec.gemm.k : p.combine ? r.spec.attention.splits : r.spec.attention.seq_kv),
                  r.verdict.reasons.empty() ? std::string(name(r.status)).c_str() : r.verdict.reasons.front().c_str());
    }
  if (p.gemm) print_gemm_fit(s);
  else
    std::printf("  growth exponent %.3f +- %.3f (error ~ %s^exponent)\n", s.series.fit.exponent,
                s.series.fit.exponent_stderr, p.vary.parameter.c_str());
  std::fflush(stdout);
  return failed_points;
}

// Runs (or, under mpirun, collects) every series, prints them and writes the run record.
Exit report_sweep(SweepPlan& p, const SweepArgs& a, const std::string& command_line, const SharedPoints* shared) {
  const bool tty = isatty(STDERR_FILENO) && !shared;
  RunRecord record;
  record.kind = "sweep";
  record.seed = a.seed;
  record.command = command_line;
  record.environment = capture_environment();
  std::printf("ulpgate sweep: seed %llu, %s, %s, %s = %lld..%lld\n", static_cast<unsigned long long>(a.seed),
              record.environment.device.c_str(),
              p.gemm ? fmt::format("M = N = {}", a.mn).c_str() : fmt::format("seq_q = {}, head_dim 64", a.seq_q).c_str(),
              p.vary.parameter.c_str(), static_cast<long long>(p.vary.values.front()),
              static_cast<long long>(p.vary.values.back()));
  std::fflush(stdout);  // each series' table is flushed as it completes: logs show long sweeps' progress
  std::int64_t failed_points = 0;
  for (std::size_t si = 0; si < p.series.size(); ++si) {
    const Series& series = p.series[si];
    if (series.unsupported) {
      std::printf("  %s %s: not supported (%s)\n", series.kernel->name().c_str(), series.dtype.c_str(),
                  series.unsupported->c_str());
      continue;
    }
    const SweepOutcome s = run_series(p, si, shared, tty);
    failed_points += print_series(series, s, a, p);
    record.sweeps.push_back(s.series);
    for (const auto& r : s.cases) record.cases.push_back(r);
  }
  if (!a.out_dir.empty()) {
    create_out_dir(a.out_dir);
    const std::string path = (std::filesystem::path(a.out_dir) / "sweep.json").string();
    write_record_file(path, record);
    std::printf("\nrun record: %s (render with: ulpgate report %s --html report.html)\n", path.c_str(), path.c_str());
  }
  if (failed_points) std::printf("%lld sweep points failed their check\n", static_cast<long long>(failed_points));
  if (shared && shared->failed_ranks) {
    std::fprintf(stderr, "ulpgate: error: %d MPI ranks failed, their points are failed results: %s\n", shared->failed_ranks,
                 shared->lost.c_str());
    return Exit::Internal;
  }
  return failed_points ? Exit::Failed : Exit::Ok;
}

// Under mpirun: the ranks claim (series, point) units as they become free and exchange
// the results; rank 0 then fits and reports the series from them, as one process would.
Exit sweep_over_ranks(const SweepArgs& a, const LocalRegistry& local, const std::string& command_line,
                      const mpi::World& world) {
  SweepPlan p;
  std::string error;
  const Exit status = mpi::attempt([&] { prepare(p, a, local); }, error);  // each rank plans the whole sweep
  if (const Exit failed = mpi::agree_on_setup(world, status, error); failed != Exit::Ok) return failed;
  std::vector<std::pair<std::size_t, std::size_t>> units;
  for (std::size_t si = 0; si < p.series.size(); ++si)
    if (!p.series[si].unsupported)
      for (std::size_t pt = 0; pt < p.series[si].options.values.size(); ++pt) units.emplace_back(si, pt);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> failures;
  const std::vector<nlohmann::json> results = mpi::share_units(
      world, static_cast<std::int64_t>(units.size()),
      [&](std::int64_t u) {
        const auto [si, pt] = units[static_cast<std::size_t>(u)];
        const Series& series = p.series[si];
        const Case c = sweep_point(series.options, pt);
        const EvaluationOptions eo = sweep_evaluation(series.options);
        const CaseResult r = check_point(p, si, pt, c, eo, nullptr);
        std::fprintf(stderr, "  rank %d: %s %s %s: %s = %lld (%.1f s)\n", world.rank, series.kernel->name().c_str(),
                     series.dtype.c_str(), series.dist.c_str(), p.vary.parameter.c_str(),
                     static_cast<long long>(series.options.values[pt]),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        return case_result_to_json(r);
      },
      failures);
  SharedPoints shared;
  for (std::size_t u = 0; u < units.size(); ++u)
    if (!results[u].is_null()) shared.results.emplace(units[u], case_result_from_json(results[u], "result"));
  for (const std::string& f : failures) shared.lost += (shared.lost.empty() ? "" : "; ") + f;
  shared.failed_ranks = static_cast<int>(failures.size());
  const Exit rc = mpi::rank0_decides(world, [&] {
    std::printf("ulpgate sweep: %d MPI ranks, %zu points shared as they went\n", world.size, units.size());
    return report_sweep(p, a, command_line, &shared);
  });
  mpi::finish(world);
  return rc;
}

Exit sweep_command(const SweepArgs& a, const LocalRegistry& local, const std::string& command_line) {
  const mpi::World world = mpi::join();
  if (world.size > 1) return sweep_over_ranks(a, local, command_line, world);
  SweepPlan p;
  prepare(p, a, local);
  return report_sweep(p, a, command_line, nullptr);
}

struct SweepFlags {
  SweepArgs args;
  std::string seed = "1", max_memory;
};

}  // namespace

Verb add_sweep(CLI::App& app) {
  auto f = std::make_shared<SweepFlags>();
  SweepArgs& a = f->args;
  auto* sweep = app.add_subcommand("sweep", "Error against K (GEMM) or seq_kv (attention) for kernels x input "
                                            "distributions, with the fitted growth exponent and (GEMM) the effective "
                                            "accumulator precision");
  set_help_footer(sweep,
                {
                 {"ulpgate sweep --kernel cpu.fp32_seq --vary K=256:65536:4", "error against K, the growth exponent, the effective precision"},
                 {"ulpgate sweep --kernel cpu.attn_online:block=64 --vary seq_kv=128:8192 --dist 'logits(std=3)'", "attention: error against seq_kv"},
                 {"ulpgate sweep --kernel cpu.attn_combine --vary splits=1:256", "split-KV combine: error against the number of splits"}},
                "0 every point ran and passed its check; 1 a point failed its check; 2 bad usage or bad input (one line on stderr); 3 an internal error");
  sweep->add_option("--kernel", a.kernels, "Kernel (repeatable; see ulpgate list)")->required();
  sweep->add_option("--dtype", a.dtype, "Input type: fp64, fp32, tf32, fp16, bf16, e4m3, e5m2 (default: "
                                        "implied by the kernel)");
  sweep->add_option("--out-dtype", a.out_dtype, "D's format (default fp32)");
  sweep->add_option("--vary", a.vary, "K=FROM:TO[:FACTOR] (GEMM; default K=256:65536:4), "
                                      "seq_kv=FROM:TO[:FACTOR] (attention) or splits=FROM:TO[:FACTOR] (attention_combine)");
  sweep->add_option("--lse-base", a.lse_base, "--vary splits: the LSEs' base, e (default) or 2");
  sweep->add_option("--lse-dist", a.lse_dist, "--vary splits: the partial LSEs' distribution (default lse(mean=4,std=4,empty=0.1))");
  sweep->add_option("--seq-q", a.seq_q, "Attention: queries per case (default 16)")->check(CLI::Range(1, 1 << 20));
  sweep->add_option("--softcap", a.variants.softcap, "Attention: soft cap, each score x becomes cap tanh(x / cap)");
  sweep->add_option("--alibi", a.variants.alibi, "Attention: ALiBi, flash or flashinfer (the form) with the standard slopes, or FORM:SLOPE or FORM:S1,S2,... per head");
  sweep->add_option("--sinks", a.variants.sinks, "Attention: one sink logit for every head, or S1,S2,... per head (-inf: none)");
  sweep->add_option("--kv-cache", a.kv_cache, "Attention: an FP8 K/V cache, e4m3 or e5m2 with amax scales, :FRAC of the range (default 1), :head for a scale per K/V head (docs/concepts/fp8-kv.md)");
  sweep->add_option("--page-size", a.variants.pages, "Attention: paged K/V, pages of this many keys in a shuffled order (docs/concepts/paged-kv.md)");
  sweep->add_option("--window", a.variants.window, "Attention: sliding window, e.g. hf:4096, flash:4095,0, flashinfer:4095 or cudnn:4096,0");
  sweep->add_flag("--in-process", a.in_process, "Run the kernels in this process (default: a worker process)");
  sweep->add_option("--timeout", a.timeout, "Seconds per point before the worker is killed (default 600)");
  sweep->add_option("--dist", a.dists, "Input distribution of A and B (repeatable; default normal(0,1))");
  sweep->add_option("--metric", a.metric, "mean_normalised (default), max_normalised, mean_ulp, max_ulp, ...");
  sweep->add_option("--output", a.output, "The output whose metric is swept: attention backward dQ (default), dK or dV");
  sweep->add_option("--mn", a.mn, "M = N of every case (default 64)")->check(CLI::Range(1, 1 << 20));
  sweep->add_option("--seed", f->seed, "Seed (default 1)");
  sweep->add_option("--out", a.out_dir, "Directory for the run record (sweep.json)");
  sweep->add_option("--max-memory", f->max_memory, kMaxMemoryHelp);
  return {sweep, [f](const Context& ctx) {
            SweepArgs a = f->args;
            a.plugins = ctx.plugins;
            a.seed = parse_seed(f->seed);
            a.max_memory = ctx.max_memory(f->max_memory);
            return sweep_command(a, ctx.local, ctx.command_line);
          }};
}

}  // namespace ulpgate
