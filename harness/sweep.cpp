#include "harness/sweep.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "distributions/fill.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"

namespace ulpgate {

PowerFit fit_power(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> lx, ly;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    if (x[i] > 0 && y[i] > 0 && std::isfinite(y[i])) lx.push_back(std::log(x[i])), ly.push_back(std::log(y[i]));
  PowerFit f;
  f.points = static_cast<std::int64_t>(lx.size());
  if (f.points < 2) return f;
  const double n = static_cast<double>(f.points);
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < lx.size(); ++i) mx += lx[i], my += ly[i];
  mx /= n, my /= n;
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < lx.size(); ++i) sxx += (lx[i] - mx) * (lx[i] - mx), sxy += (lx[i] - mx) * (ly[i] - my);
  if (sxx == 0) return f;
  f.exponent = sxy / sxx;
  f.intercept = my - f.exponent * mx;
  if (f.points > 2) {
    double ssr = 0;
    for (std::size_t i = 0; i < lx.size(); ++i) {
      const double r = ly[i] - (f.intercept + f.exponent * lx[i]);
      ssr += r * r;
    }
    f.exponent_stderr = std::sqrt(ssr / (n - 2) / sxx);
  }
  return f;
}

double calibration_dot(const double* a, const double* b, std::int64_t k, int bits) {
  auto round_bits = [bits](double v) {
    if (v == 0 || !std::isfinite(v)) return v;
    const int e = std::ilogb(v);
    return std::ldexp(std::nearbyint(std::ldexp(v, bits - 1 - e)), e - bits + 1);  // RNE (default mode)
  };
  double acc = 0;
  for (std::int64_t i = 0; i < k; ++i) acc = round_bits(acc + a[i] * b[i]);
  return acc;
}

double metric_value(const ErrorMetrics& m, const std::string& metric) {
  if (metric == "max_normalised") return m.max_normalised;
  if (metric == "mean_normalised") return m.mean_normalised;
  if (metric == "max_ulp") return m.max_ulp;
  if (metric == "mean_ulp") return m.mean_ulp;
  if (metric == "max_rel") return m.max_rel;
  if (metric == "mean_rel") return m.mean_rel;
  if (metric == "normwise") return m.normwise;
  throw InputError(fmt::format("unknown metric '{}' (max_normalised, mean_normalised, max_ulp, mean_ulp, max_rel, "
                               "mean_rel, normwise)",
                               metric));
}

namespace {

// The calibrator's mean normalised error on the same inputs at `bits`, before any output
// rounding (so that only its accumulation shows): mean over elements of |cal_e - x_e| / c_e.
double calibration_mean_normalised(const std::vector<double>& arows, const std::vector<double>& bcols, std::int64_t M,
                                   std::int64_t N, std::int64_t K, const GemmReference& ref, int bits) {
  std::vector<double> err(M * N, 0.0);
  parallel_for(M, [&](std::int64_t i) {
    for (std::int64_t j = 0; j < N; ++j) {
      const double cal = calibration_dot(&arows[i * K], &bcols[j * K], K, bits);
      const DoubleDouble x = ref.values[ref.index(0, i, j)].double_double();
      const double cond = ref.magnitude[ref.index(0, i, j)];
      err[i * N + j] = cond > 0 ? std::fabs((cal - x.hi) - x.lo) / cond : 0.0;
    }
  });
  double sum = 0;
  for (double e : err) sum += e;
  return sum / static_cast<double>(err.size());
}

// effective bits at one sweep point: the highest calibration precision (from
// kCalibrationBits down) at which the calibrator is not exact on this data and its n u
// stays small (<= 1/16), so that its errors still behave like independent roundings.
double point_effective_bits(const Case& c, const std::map<std::string, Tensor>& inputs, const GemmReference& ref,
                            double kernel_mean) {
  if (!(kernel_mean > 0)) return NAN;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B");
  const std::int64_t M = c.gemm.m, N = c.gemm.n, K = c.gemm.k;
  std::vector<double> arows(M * K), bcols(N * K);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t k = 0; k < K; ++k) arows[i * K + k] = inputs.at("A").value(op_a_offset(c, av, 0, i, k));
  for (std::int64_t j = 0; j < N; ++j)
    for (std::int64_t k = 0; k < K; ++k) bcols[j * K + k] = inputs.at("B").value(op_b_offset(c, bv, 0, k, j));
  for (int bits = kCalibrationBits; bits >= 12; bits -= 4) {
    if (std::ldexp(static_cast<double>(K), -bits) > 1.0 / 16) break;
    const double cal = calibration_mean_normalised(arows, bcols, M, N, K, ref, bits);
    if (cal > 0) return bits + std::log2(cal / kernel_mean);
  }
  return NAN;
}

}  // namespace

SweepOutcome run_sweep(Kernel& k, const SweepOptions& options, const Registry* registry,
                       const std::function<void(std::size_t, std::size_t)>& progress) {
  if (options.base.op != Op::Gemm) throw InputError("sweep: only GEMM sweeps over K are implemented");
  if (options.base.alpha != 1.0 || options.base.beta != 0.0 || options.base.epilogue != Epilogue::None)
    throw InputError("sweep: the calibrated precision estimate needs alpha = 1, beta = 0 and no epilogue");
  metric_value(ErrorMetrics{}, options.metric);  // validates the name up front
  SweepOutcome out;
  SweepSeries& s = out.series;
  s.kernel = k.name();
  s.format = std::string(name(options.base.types.at("A")));
  s.dist = options.base.dist.count("A") ? options.base.dist.at("A") : std::string(kDefaultDist);
  s.parameter = "K";
  s.metric = options.metric;
  for (std::size_t p = 0; p < options.values.size(); ++p) {
    Case c = options.base;
    c.gemm.k = options.values[p];
    c.gemm.lda = c.gemm.ldb = 0;  // packed: a fixed padding would not fit every K
    validate(c);
    const auto inputs = fill_inputs(c);
    Evaluation ev = evaluate_with_inputs(k, c, inputs, options.evaluation, registry);
    CaseResult r = to_case_result(k, c, ev, case_family(c));
    if (ev.run.status == Disposition::Ok && !ev.metrics.empty()) {
      const double y = metric_value(ev.metrics.front(), options.metric);
      s.x.push_back(static_cast<double>(c.gemm.k));
      s.y.push_back(y);
      out.effective_bits_per_point.push_back(
          point_effective_bits(c, inputs, *ev.reference, ev.metrics.front().mean_normalised));
    }
    out.cases.push_back(std::move(r));
    if (progress) progress(p + 1, options.values.size());
  }
  s.fit = fit_power(s.x, s.y);
  std::vector<double> bits;
  for (double b : out.effective_bits_per_point)
    if (std::isfinite(b)) bits.push_back(b);
  if (!bits.empty()) {
    std::sort(bits.begin(), bits.end());
    const std::size_t h = bits.size() / 2;
    s.effective_bits = bits.size() % 2 ? bits[h] : (bits[h - 1] + bits[h]) / 2;
  } else {
    s.effective_bits = INFINITY;  // no error at any point: more bits than the data can show
  }
  return out;
}

std::vector<std::int64_t> parse_vary(const std::string& text) {
  const auto bad = [&](const std::string& why) { return InputError(fmt::format("--vary '{}': {}", text, why)); };
  if (text.rfind("K=", 0) != 0) throw bad("expected K=FROM:TO[:FACTOR] (only K can vary for now)");
  std::vector<std::int64_t> parts;
  std::size_t pos = 2;
  while (pos <= text.size()) {
    const std::size_t colon = std::min(text.find(':', pos), text.size());
    const std::string num = text.substr(pos, colon - pos);
    char* end = nullptr;
    const long long v = std::strtoll(num.c_str(), &end, 10);
    if (num.empty() || *end || v < 1) throw bad(fmt::format("'{}' is not a positive integer", num));
    parts.push_back(v);
    pos = colon + 1;
  }
  if (parts.size() < 2 || parts.size() > 3) throw bad("expected K=FROM:TO[:FACTOR]");
  const std::int64_t from = parts[0], to = parts[1], factor = parts.size() == 3 ? parts[2] : 2;
  if (from > to) throw bad("FROM must be <= TO");
  if (factor < 2) throw bad("FACTOR must be >= 2");
  std::vector<std::int64_t> v;
  for (std::int64_t k = from; k <= to; k *= factor) v.push_back(k);
  if (v.back() != to) v.push_back(to);
  return v;
}

}  // namespace ulpgate
