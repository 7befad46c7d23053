// `ulpgate sweep`: error against K (GEMM) or seq_kv (attention) for kernels x input
// distributions, with the fitted growth exponent and (GEMM) the effective accumulator
// precision; every point in a worker process; writes a run record.
#include "cli/commands.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "core/error.hpp"
#include "distributions/spec.hpp"
#include "cli/memory.hpp"
#include "cli/mpi.hpp"
#include "cli/options.hpp"
#include "campaign/isolate.hpp"
#include "check/ops/attention.hpp"
#include "check/ops/op.hpp"
#include "campaign/sweep.hpp"

namespace ulpgate {
namespace {

// One kernel x distribution of a sweep.
struct Series {
  Kernel* kernel;
  std::string dtype, dist;
  SweepOptions options;
  std::optional<std::string> unsupported;  ///< the kernel's answer for the first point
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

}  // namespace

int sweep_command(const SweepArgs& a, const LocalRegistry& local, const std::string& command_line) {
  // Under mpirun the ranks share the points (below); each plans the whole sweep first.
  const mpi::World world = mpi::join();
  std::vector<Series> plan;
  std::unique_ptr<IsolatedEvaluator> isolated;
  Registry registry;
  bool gemm = true;
  SweepVary vary;
  std::optional<Format> out;
  const auto prepare = [&] {
    if (a.kernels.empty()) throw InputError("sweep: --kernel is required");
    vary = parse_vary(a.vary);
    gemm = vary.parameter == "K";
    if (!a.dtype.empty()) check_dtype(a.dtype);
    check_timeout(a.timeout);
    if (!a.out_dir.empty()) check_out_dir(a.out_dir);
    const std::uint64_t max_memory = a.max_memory ? a.max_memory : default_max_memory();
    if (!a.out_dtype.empty()) {
      out = parse_format(a.out_dtype);
      if (!out) throw InputError(fmt::format("--out-dtype '{}': unknown format (see ulpgate list)", a.out_dtype));
    }
    // Isolated (the default): the points and every supports() query run in a worker.
    if (!a.in_process) {
      IsolationOptions iso;
      iso.plugins = a.plugins;
      iso.timeout_seconds = a.timeout;
      isolated = std::make_unique<IsolatedEvaluator>(iso);
      registry = worker_registry(*isolated, a.kernels);
    } else {
      registry = local();
    }
    std::vector<Kernel*> kernels;
    for (const auto& name : a.kernels) {
      Kernel* k = registry.resolve(name);
      if (!k) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", name));
      kernels.push_back(k);
    }
    // Every series is planned, and its largest point held to the case caps and to
    // --max-memory, before the first point runs.
    for (Kernel* k : kernels)
      for (const auto& dist : a.dists) {
        const std::string dtype = a.dtype.empty() ? default_dtype(k->name()) : a.dtype;
        SweepOptions o;
        if (gemm) {
          o.base = dtype_gemm_case(dtype, a.mn, a.mn, vary.values.front(), out);
          o.base.dist = {{"A", dist}, {"B", dist}};
        } else {
          o.base = dtype_attention_case(dtype);
          o.base.attention.seq_q = a.seq_q, o.base.attention.head_dim = 64, o.base.attention.seq_kv = vary.values.front();
          if (out) o.base.types["O"] = *out;
          // A family of Q and K together (logits, sink, masked) draws K with Q.
          const auto fam = find_family(parse_dist(dist).family);
          o.base.dist = fam && fam->scope == Scope::AttnQK ? std::map<std::string, std::string>{{"Q", dist}, {"V", "normal(0,1)"}}
                                                           : std::map<std::string, std::string>{{"Q", dist}, {"K", dist}, {"V", dist}};
        }
        o.base.seed = a.seed;
        o.base.kernel = k->name();
        o.parameter = vary.parameter;
        o.values = vary.values;
        o.metric = a.metric;
        Case largest = o.base;
        (gemm ? largest.gemm.k : largest.attention.seq_kv) = vary.values.back();
        try {
          validate(largest);
          check_memory_need(largest, max_memory);
        } catch (const InputError& e) {
          throw InputError(fmt::format("sweep point {} = {}: {}", vary.parameter, vary.values.back(), e.what()));
        }
        plan.push_back({k, dtype, dist, std::move(o), std::nullopt});
        plan.back().unsupported = k->unsupported(plan.back().options.base);
      }
    check_plan(plan, kernels, gemm, vary.parameter);
  };
  const bool tty = isatty(STDERR_FILENO) && world.size == 1;
  std::map<std::pair<std::size_t, std::size_t>, CaseResult> shared_points;
  std::string lost;  // the ranks that failed, for points nobody checked
  const auto sweep_report = [&](int failed_ranks) -> int {
    RunRecord record;
    record.kind = "sweep";
    record.seed = a.seed;
    record.command = command_line;
    record.environment = capture_environment();
    std::printf("ulpgate sweep: seed %llu, %s, %s, %s = %lld..%lld\n", static_cast<unsigned long long>(a.seed),
                record.environment.device.c_str(),
                gemm ? fmt::format("M = N = {}", a.mn).c_str() : fmt::format("seq_q = {}, head_dim 64", a.seq_q).c_str(),
                vary.parameter.c_str(), static_cast<long long>(vary.values.front()), static_cast<long long>(vary.values.back()));
    std::fflush(stdout);  // each series' table is flushed as it completes: logs show long sweeps' progress
    std::int64_t failed_points = 0;
    for (const Series& series : plan) {
      Kernel* k = series.kernel;
      const std::string& dtype = series.dtype;
      const std::string& dist = series.dist;
      const SweepOptions& o = series.options;
      if (series.unsupported) {
        std::printf("  %s %s: not supported (%s)\n", k->name().c_str(), dtype.c_str(), series.unsupported->c_str());
        continue;
      }
      std::size_t point = 0;  // run_sweep checks the points in order
      const std::size_t series_index = static_cast<std::size_t>(&series - plan.data());
      const PointChecker check = [&](const Case& c, const EvaluationOptions& eo) {
        const std::size_t p = point++;
        if (world.size > 1) {
          const auto it = shared_points.find({series_index, p});
          return it != shared_points.end() ? it->second : failed_result(k->name(), c, Disposition::Failed, lost);
        }
        return isolated ? isolated->evaluate(c.kernel, c, eo) : check_case(*k, c, eo, &registry);
      };
      // Progress: a line per point where stderr is not a terminal (logs of long sweeps).
      const auto series_start = std::chrono::steady_clock::now();
      const SweepOutcome s = run_sweep(o, check, [&](std::size_t i, std::size_t n) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - series_start).count();
        std::fprintf(stderr, tty ? "\r  %s %s %s: %zu/%zu points, %.1f s" : "  %s %s %s: %zu/%zu points, %.1f s\n",
                     k->name().c_str(), dtype.c_str(), dist.c_str(), i, n, seconds);
      });
      if (tty) std::fprintf(stderr, "\r\033[K");
      std::printf("\n  %s  %s  %s  (%s)\n  %8s  %16s  %14s\n", k->name().c_str(), dtype.c_str(), dist.c_str(),
                  a.metric.c_str(), vary.parameter.c_str(), a.metric.c_str(), "effective bits");
      for (std::size_t i = 0; i < s.series.x.size(); ++i)
        std::printf("  %8.0f  %16.4g  %14.2f\n", s.series.x[i], s.series.y[i], s.effective_bits_per_point[i]);
      for (const auto& r : s.cases)  // every point is judged like any case
        if (!r.verdict.passed) {
          ++failed_points;
          std::printf("  FAIL %s=%lld: %s\n", vary.parameter.c_str(),
                      static_cast<long long>(gemm ? r.spec.gemm.k : r.spec.attention.seq_kv),
                      r.verdict.reasons.empty() ? std::string(name(r.status)).c_str() : r.verdict.reasons.front().c_str());
        }
      if (gemm) {
        // the spread of the per-point estimates, and how they were made (the last point's family)
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
      } else {
        std::printf("  growth exponent %.3f +- %.3f (error ~ seq_kv^exponent)\n", s.series.fit.exponent,
                    s.series.fit.exponent_stderr);
      }
      std::fflush(stdout);
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
    if (failed_ranks) {
      std::fprintf(stderr, "ulpgate: error: %d MPI ranks failed, their points are failed results: %s\n", failed_ranks,
                   lost.c_str());
      return 3;
    }
    return failed_points ? 1 : 0;
  };
  // Under mpirun: the ranks claim (series, point) units as they become free and exchange
  // the results; rank 0 then fits and reports the series from them, as one process would.
  if (world.size > 1) {
    int status = 0;
    std::string error;
    try {
      prepare();
    } catch (const InputError& e) {
      status = 2, error = e.what();
    } catch (const std::exception& e) {
      status = 3, error = std::string("internal error: ") + e.what();
    }
    if (const int failed = mpi::agree_on_setup(world, status, error)) return failed;
    std::vector<std::pair<std::size_t, std::size_t>> units;
    for (std::size_t si = 0; si < plan.size(); ++si)
      if (!plan[si].unsupported)
        for (std::size_t p = 0; p < plan[si].options.values.size(); ++p) units.emplace_back(si, p);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::string> failures;
    const std::vector<nlohmann::json> results = mpi::share_units(
        world, static_cast<std::int64_t>(units.size()),
        [&](std::int64_t u) {
          const auto [si, p] = units[static_cast<std::size_t>(u)];
          const Series& series = plan[si];
          const Case c = sweep_point(series.options, p);
          const EvaluationOptions eo = sweep_evaluation(series.options);
          const CaseResult r = isolated ? isolated->evaluate(c.kernel, c, eo) : check_case(*series.kernel, c, eo, &registry);
          std::fprintf(stderr, "  rank %d: %s %s %s: %s = %lld (%.1f s)\n", world.rank, series.kernel->name().c_str(),
                       series.dtype.c_str(), series.dist.c_str(), vary.parameter.c_str(),
                       static_cast<long long>(series.options.values[p]),
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
          return case_result_to_json(r);
        },
        failures);
    for (std::size_t u = 0; u < units.size(); ++u)
      if (!results[u].is_null()) shared_points.emplace(units[u], case_result_from_json(results[u], "result"));
    for (const std::string& f : failures) lost += (lost.empty() ? "" : "; ") + f;
    const int failed_ranks = static_cast<int>(failures.size());
    int code = 0;
    if (world.rank == 0) {
      std::printf("ulpgate sweep: %d MPI ranks, %zu points shared as they went\n", world.size, units.size());
      try {
        code = sweep_report(failed_ranks);
      } catch (const InputError& e) {
        std::fprintf(stderr, "ulpgate: error: %s\n", e.what());
        code = 2;
      }
      std::fflush(stdout);
    }
    code = mpi::broadcast(world, code);
    mpi::finish(world);
    return code;
  }
  prepare();
  return sweep_report(0);
}

}  // namespace ulpgate
