#include "campaign/sweep.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "check/runner.hpp"
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

std::optional<PrecisionCliff> precision_cliff(const std::vector<double>& bits, double drop) {
  const auto far_below = [&](std::size_t i, double best) { return std::isfinite(bits[i]) && bits[i] < best - drop; };
  double best = -INFINITY;
  std::size_t best_at = 0;
  for (std::size_t p = 0; p < bits.size(); ++p) {
    if (!std::isfinite(bits[p])) continue;
    if (far_below(p, best)) {  // never before a first estimate: nothing is below -inf
      std::size_t next = p + 1;  // the next point with an estimate
      while (next < bits.size() && !std::isfinite(bits[next])) ++next;
      if (next == bits.size() || far_below(next, best)) {
        PrecisionCliff c;
        c.start = p, c.best = best_at;
        for (std::size_t q = p; q < bits.size(); ++q)
          if (far_below(q, best)) c.below.push_back(q);
        return c;
      }
    }
    if (bits[p] > best) best = bits[p], best_at = p;
  }
  return std::nullopt;
}

std::string sweep_parameter(Op op) {
  return op == Op::Gemm ? "K" : op == Op::AttentionCombine ? "splits" : "seq_kv";
}

Case sweep_point(const SweepOptions& options, std::size_t p) {
  Case c = options.base;
  if (c.op == Op::Gemm) {
    c.gemm.k = options.values.at(p);
    c.gemm.lda = c.gemm.ldb = 0;  // packed: a fixed padding would not fit every K
  } else if (c.op == Op::AttentionCombine) {
    c.attention.splits = options.values.at(p);
  } else {
    c.attention.seq_kv = options.values.at(p);
    c.attention.kv_lengths.clear();
    if (c.attention.paged()) page_kv(c.attention, c.attention.page_size, 0);  // pages for this seq_kv
  }
  validate(c);
  return c;
}

EvaluationOptions sweep_evaluation(const SweepOptions& options) {
  EvaluationOptions eo = options.evaluation;
  eo.effective_bits = true;
  eo.relations = false;
  return eo;
}

SweepOutcome run_sweep(const SweepOptions& options, const PointChecker& check,
                       const std::function<void(std::size_t, std::size_t)>& progress) {
  const bool gemm = options.base.op == Op::Gemm;
  if (options.parameter != sweep_parameter(options.base.op))
    throw InputError(fmt::format("sweep: {} cases vary {}, not {}", name(options.base.op), sweep_parameter(options.base.op),
                                 options.parameter));
  if (gemm && (options.base.alpha != 1.0 || options.base.beta != 0.0 || options.base.epilogue != Epilogue::None))
    throw InputError("sweep: the calibrated precision estimate needs alpha = 1, beta = 0 and no epilogue");
  metric_value(ErrorMetrics{}, options.metric);  // validates the name up front
  const std::vector<std::string> outputs = outputs_of(options.base);
  const auto swept = options.output.empty() ? outputs.begin() : std::find(outputs.begin(), outputs.end(), options.output);
  if (swept == outputs.end())
    throw InputError(fmt::format("sweep: --output {}: {} cases have {}", options.output, name(options.base.op),
                                 fmt::join(outputs, ", ")));
  const auto out_index = static_cast<std::size_t>(swept - outputs.begin());
  const EvaluationOptions eo = sweep_evaluation(options);
  SweepOutcome out;
  SweepSeries& s = out.series;
  std::vector<std::size_t> point_case;  // per point with a result: its entry in out.cases
  const std::string first = primary_input(options.base.op);
  s.kernel = options.base.kernel;
  s.format = std::string(name(options.base.types.at(first)));
  s.dist = options.base.dist.count(first) ? options.base.dist.at(first) : std::string(kDefaultDist);
  s.parameter = options.parameter;
  s.metric = options.metric;
  for (std::size_t p = 0; p < options.values.size(); ++p) {
    CaseResult r = check(sweep_point(options, p), eo);
    if (r.status == Disposition::Ok && r.metrics.size() > out_index) {
      point_case.push_back(out.cases.size());
      s.x.push_back(static_cast<double>(options.values[p]));
      s.y.push_back(metric_value(r.metrics[out_index], options.metric));
      const auto bits = r.notes.find("effective_bits");
      out.effective_bits_per_point.push_back(bits == r.notes.end() ? NAN : std::strtod(bits->second.c_str(), nullptr));
    }
    out.cases.push_back(std::move(r));
    if (progress) progress(p + 1, options.values.size());
  }
  s.fit = fit_power(s.x, s.y);
  if (const auto cliff = precision_cliff(out.effective_bits_per_point)) {
    const auto& bits = out.effective_bits_per_point;
    for (std::size_t q : cliff->below) {
      CaseResult& r = out.cases[point_case[q]];
      r.verdict.fail("sweep:precision_cliff",
                     fmt::format("precision cliff: effective accumulator precision {:.2f} bits at {}={:.0f}, more than {:g} "
                                 "bits below the {:.2f} bits at {}={:.0f} (the drop starts at {}={:.0f})",
                                 bits[q], s.parameter, s.x[q], kPrecisionCliffBits, bits[cliff->best], s.parameter,
                                 s.x[cliff->best], s.parameter, s.x[cliff->start]));
      stamp(r);
    }
  }
  std::vector<double> bits;
  for (double b : out.effective_bits_per_point)
    if (std::isfinite(b)) bits.push_back(b);
  if (!bits.empty()) {
    std::sort(bits.begin(), bits.end());
    const std::size_t h = bits.size() / 2;
    s.effective_bits = bits.size() % 2 ? bits[h] : (bits[h - 1] + bits[h]) / 2;
  } else {
    // GEMM points without an error: more bits than the data can show. No point with a result
    // (all crashed, say), or attention: no estimate.
    s.effective_bits = gemm && !s.x.empty() ? INFINITY : NAN;
  }
  return out;
}

SweepOutcome run_sweep(Kernel& k, const SweepOptions& options, const Registry* registry) {
  SweepOptions o = options;
  o.base.kernel = k.name();
  return run_sweep(o, [&](const Case& c, const EvaluationOptions& eo) { return check_case(k, c, eo, registry); });
}

SweepVary parse_vary(const std::string& text) {
  const auto bad = [&](const std::string& why) { return InputError(fmt::format("--vary '{}': {}", text, why)); };
  const std::size_t eq = text.find('=');
  SweepVary v;
  v.parameter = text.substr(0, eq == std::string::npos ? 0 : eq);
  if (v.parameter != "K" && v.parameter != "seq_kv" && v.parameter != "splits")
    throw bad("expected K=FROM:TO[:FACTOR] (GEMM), seq_kv=FROM:TO[:FACTOR] (attention) or splits=FROM:TO[:FACTOR] "
              "(attention_combine)");
  std::vector<std::int64_t> parts;
  std::size_t pos = eq + 1;
  while (pos <= text.size()) {
    const std::size_t colon = std::min(text.find(':', pos), text.size());
    const std::string num = text.substr(pos, colon - pos);
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(num.c_str(), &end, 10);
    if (num.empty() || *end || x < 1 || errno == ERANGE) throw bad(fmt::format("'{}' is not a positive integer", num));
    parts.push_back(x);
    pos = colon + 1;
  }
  if (parts.size() < 2 || parts.size() > 3) throw bad(fmt::format("expected {}=FROM:TO[:FACTOR]", v.parameter));
  const std::int64_t from = parts[0], to = parts[1], factor = parts.size() == 3 ? parts[2] : 2;
  if (from > to) throw bad("FROM must be <= TO");
  if (to > kMaxCaseSize) throw bad(fmt::format("TO must be at most {}", kMaxCaseSize));
  if (factor < 2) throw bad("FACTOR must be >= 2");
  // k <= to / factor before multiplying: no overflow whatever FACTOR is.
  for (std::int64_t k = from;; k *= factor) {
    v.values.push_back(k);
    if (k > to / factor) break;
  }
  if (v.values.back() != to) v.values.push_back(to);
  if (v.values.size() > kMaxSweepPoints)
    throw bad(fmt::format("{} points, at most {} (a larger FACTOR takes fewer)", v.values.size(), kMaxSweepPoints));
  return v;
}

}  // namespace ulpgate
