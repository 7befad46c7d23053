// `ulpgate sweep`: error against K for kernels x input distributions, with the fitted
// growth exponent and the effective accumulator precision; writes a run record.
#include "harness/cli/commands.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.hpp"
#include "harness/sweep.hpp"

namespace ulpgate {

int sweep_command(const SweepArgs& a, Registry& registry, const std::string& command_line) {
  if (a.kernels.empty()) throw InputError("sweep: --kernel is required");
  const std::vector<std::int64_t> ks = parse_vary(a.vary);
  std::optional<Format> out;
  if (!a.out_dtype.empty()) {
    out = parse_format(a.out_dtype);
    if (!out) throw InputError(fmt::format("--out-dtype '{}': unknown format (see ulpgate list)", a.out_dtype));
  }
  std::vector<Kernel*> kernels;
  for (const auto& name : a.kernels) {
    Kernel* k = registry.resolve(name);
    if (!k) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", name));
    kernels.push_back(k);
  }
  const bool tty = isatty(STDERR_FILENO);
  RunRecord record;
  record.kind = "sweep";
  record.seed = a.seed;
  record.command = command_line;
  record.environment = capture_environment();
  std::printf("ulpgate sweep: seed %llu, %s, M = N = %lld, K = %lld..%lld\n", static_cast<unsigned long long>(a.seed),
              record.environment.device.c_str(), static_cast<long long>(a.mn), static_cast<long long>(ks.front()),
              static_cast<long long>(ks.back()));
  for (Kernel* k : kernels)
    for (const auto& dist : a.dists) {
      const std::string dtype = a.dtype.empty() ? default_dtype(k->name()) : a.dtype;
      SweepOptions o;
      o.base = dtype_gemm_case(dtype, a.mn, a.mn, ks.front(), out);
      o.base.seed = a.seed;
      o.base.kernel = k->name();
      o.base.dist = {{"A", dist}, {"B", dist}};
      o.values = ks;
      o.metric = a.metric;
      if (auto why = k->unsupported(o.base)) {
        std::printf("  %s %s: not supported (%s)\n", k->name().c_str(), dtype.c_str(), why->c_str());
        continue;
      }
      const SweepOutcome s = run_sweep(*k, o, &registry, [&](std::size_t i, std::size_t n) {
        if (tty) std::fprintf(stderr, "\r  %s %s %s: %zu/%zu points", k->name().c_str(), dtype.c_str(), dist.c_str(), i, n);
      });
      if (tty) std::fprintf(stderr, "\r\033[K");
      std::printf("\n  %s  %s  %s  (%s)\n  %8s  %16s  %14s\n", k->name().c_str(), dtype.c_str(), dist.c_str(),
                  a.metric.c_str(), "K", a.metric.c_str(), "effective bits");
      for (std::size_t i = 0; i < s.series.x.size(); ++i)
        std::printf("  %8.0f  %16.4g  %14.2f\n", s.series.x[i], s.series.y[i], s.effective_bits_per_point[i]);
      for (const auto& r : s.cases)
        if (r.status != Disposition::Ok) std::printf("  K=%lld: %s: %s\n", static_cast<long long>(r.spec.gemm.k),
                                                      std::string(name(r.status)).c_str(), r.message.c_str());
      std::printf("  growth exponent %.3f +- %.3f, effective accumulator precision %.2f bits\n", s.series.fit.exponent,
                  s.series.fit.exponent_stderr, s.series.effective_bits);
      record.sweeps.push_back(s.series);
      for (const auto& r : s.cases) record.cases.push_back(r);
    }
  if (!a.out_dir.empty()) {
    std::filesystem::create_directories(a.out_dir);
    const std::string path = (std::filesystem::path(a.out_dir) / "sweep.json").string();
    write_record_file(path, record);
    std::printf("\nrun record: %s (render with: ulpgate report %s --html report.html)\n", path.c_str(), path.c_str());
  }
  return 0;
}

}  // namespace ulpgate
