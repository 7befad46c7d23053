#include "check/analyze.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "core/parallel.hpp"
#include "references/fp_env.hpp"

namespace ulpgate {
namespace {

// |x| of a reference value as the nearest double (for relative errors and norms).
double magnitude_of(const DoubleDouble& dd) { return std::fabs(dd.hi + dd.lo); }

// d - x for a double d and a double-double x, accurate to a few units of the result.
double signed_error(double d, const DoubleDouble& x) {
  const double s = d - x.hi;
  const double bv = s - d, e = (d - (s - bv)) + (-x.hi - bv);  // TwoSum(d, -hi)
  return s + (e - x.lo);
}

// x_e as a double-double, clamped to +-max finite where D saturates (see the header).
DoubleDouble target(Format f, const RefValue& x) {
  DoubleDouble xd = x.double_double();
  if (output_overflow(f) == Overflow::Saturate) {
    const double mx = info(f).max_finite();
    if (std::fabs(xd.hi) > mx) xd = {std::copysign(mx, xd.hi), 0.0};
  }
  return xd;
}

// How element e's pair (d_e, r_e) is classified (see the header); r is r_e.
enum class Class { Compared, Expected, Overflowed, UnexpectedNan, UnexpectedInf, Missed, Mismatched, Unwritten, Unreferenced };

double accumulated_at(const OutputComparison& cmp, std::size_t e) {
  const auto& acc = cmp.accumulated.empty() ? cmp.condition : cmp.accumulated;
  return e < acc.size() ? acc[e] : 0.0;
}

double condition_at(const OutputComparison& cmp, std::size_t e) {
  return e < cmp.condition.size() ? cmp.condition[e] : 0.0;
}

double input_abs_at(const OutputComparison& cmp, std::size_t e) {
  return e < cmp.input_abs.size() ? cmp.input_abs[e] : 0.0;
}

Class classify(const OutputComparison& cmp, std::size_t e, Code r) {
  if (e < cmp.unwritten.size() && cmp.unwritten[e]) return Class::Unwritten;
  const Format f = cmp.format;
  if (e < cmp.unreferenced.size() && cmp.unreferenced[e]) {  // no x_e: only a non-finite d_e is judged
    if (is_finite(f, cmp.got[e]) || accumulated_at(cmp, e) * cmp.accumulated_growth > cmp.accumulator_max) return Class::Unreferenced;
    if (is_nan(f, cmp.got[e]) && e < cmp.nan_allowed.size() && cmp.nan_allowed[e]) return Class::Unreferenced;
    return is_nan(f, cmp.got[e]) ? Class::UnexpectedNan : Class::UnexpectedInf;
  }
  const Code g = cmp.got[e];
  const bool g_finite = is_finite(f, g), r_finite = is_finite(f, r);
  const RefValue& x = cmp.exact[e];
  const bool exact_finite = x.kind == RefValue::Kind::Finite || x.kind == RefValue::Kind::Zero;  // no NaN/Inf input
  if (accumulated_at(cmp, e) * cmp.accumulated_growth > cmp.accumulator_max) {
    // Finite or not, what a correct kernel returns here is anything: the element is counted
    // as overflowed and kept out of the error statistics (its error says nothing).
    if (exact_finite) return Class::Overflowed;
    // An Inf input meets an accumulator that overflowed the other way: Inf - Inf.
    if (x.kind == RefValue::Kind::Inf && is_nan(f, g)) return Class::Overflowed;
  }
  if (g_finite && r_finite) return Class::Compared;
  if (exact_finite && is_inf(f, r)) {  // x_e beyond D's range
    if (is_nan(f, g)) return Class::Overflowed;
    if (g == ((r & info(f).sign_mask()) | info(f).max_finite_code)) return Class::Overflowed;  // rounded toward zero
  }
  if (!g_finite && !r_finite) {
    const bool same = (is_nan(f, g) && is_nan(f, r)) ||
                      (is_inf(f, g) && is_inf(f, r) && is_negative(f, g) == is_negative(f, r));
    return same ? Class::Expected : Class::Mismatched;
  }
  if (!g_finite && is_nan(f, g) && e < cmp.nan_allowed.size() && cmp.nan_allowed[e]) return Class::Expected;
  if (!g_finite) return is_nan(f, g) ? Class::UnexpectedNan : Class::UnexpectedInf;
  if (cmp.relu_output && x.kind == RefValue::Kind::NaN && g == 0) return Class::Expected;  // max(NaN, 0) = +0
  return Class::Missed;
}

std::string show(Format f, Code c) { return fmt::format("{} ({})", hex_code(f, c), hex_float(decode(f, c))); }

}  // namespace

Overflow output_overflow(Format f) {
  return is_fp8(f) ? Overflow::Saturate : Overflow::NoSaturate;
}

int ulp_histogram_bin(double a) {
  if (!(a > 0.5)) return 0;  // [0, 0.5] (and NaN, which never reaches here)
  if (a > 0x1p30) return kUlpHistogramBins - 1;
  // (2^(k-1), 2^k] -> bin k + 1 for k = 0 .. 30
  int k = std::ilogb(a);
  if (std::ldexp(1.0, k) < a) ++k;
  return k + 1;
}

std::pair<double, double> ulp_histogram_edges(int bin) {
  if (bin == 0) return {0.0, 0.5};
  if (bin == kUlpHistogramBins - 1) return {0x1p30, INFINITY};
  return {std::ldexp(1.0, bin - 2), std::ldexp(1.0, bin - 1)};
}

namespace {

// What one stretch of elements adds to analyze's metrics; stretches are merged in order, so
// the metrics do not depend on how many threads took them (and an output of one stretch
// sums exactly as a single loop does).
struct Stretch {
  ErrorMetrics m;  // counts, maxima and histogram
  double sum_abs = 0, sum_rel = 0, sum_norm = 0, sum_ulp = 0, sum_signed_ulp = 0, sum_err2 = 0, sum_x2 = 0;
  std::int64_t rel_count = 0, norm_count = 0;
  std::int64_t worst = -1;  // the first non-finite failure, else the first largest normalised error
  bool worst_nonfinite = false;
  double worst_norm = -1;
  std::vector<double> cells;  // the error map's maxima (NaN: a non-finite failure there)
};

// What one stretch adds to judge's verdict, merged in order likewise.
struct Pass {
  std::map<std::string, bool> interior;  // check -> some failing element off the edge
  std::int64_t first_nonfinite = -1, first_unwritten = -1, worst_beyond = -1;  // Verdict::worst_element
  std::int64_t nan = 0, inf = 0, missed = 0, mismatched = 0, over = 0;
  double worst_ratio = 0;
  double sum_z = 0, sum_w = 0, worst_zw = -1, worst_beyond_ratio = 0;
  std::int64_t n_precision = 0, worst_precision = -1, misrounded = 0, worst_misrounded = -1;
};

constexpr std::int64_t kStretch = std::int64_t{1} << 16;

// 2^e for e in the normal range of doubles (the units of the formats' ulps), without ldexp.
double pow2(int e) {
  if (e < -1022 || e > 1023) return std::ldexp(1.0, e);
  return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52);
}

// ulp of the format at the binade of the exact value (RefValue keeps floor(log2|x|)).
double ulp_at(Format f, const RefValue& x) {
  const auto& fi = info(f);
  if (x.kind != RefValue::Kind::Finite) return fi.min_subnormal();
  const int e = std::min(std::max<int>(x.exponent, fi.emin()), fi.emax());
  return pow2(e - fi.frac_bits);
}

// The error map's geometry (analyze.hpp): GEMM {batch, M, N} folds batches; attention
// {b, h, i, d} has rows b*h*i.
ErrorMap map_geometry(const OutputComparison& cmp) {
  const auto n = static_cast<std::int64_t>(cmp.got.size());
  ErrorMap map;
  map.cols = cmp.shape.empty() ? n : cmp.shape.back();
  map.rows = cmp.shape.size() == 3 ? cmp.shape[1] : (map.cols ? n / map.cols : 0);
  map.cell_rows = std::max<std::int64_t>(1, (map.rows + 63) / 64);
  map.cell_cols = std::max<std::int64_t>(1, (map.cols + 63) / 64);
  map.grid_rows = (map.rows + map.cell_rows - 1) / map.cell_rows;
  map.grid_cols = (map.cols + map.cell_cols - 1) / map.cell_cols;
  map.max_normalised.assign(map.grid_rows * map.grid_cols, 0.0);
  return map;
}

// judge()'s constants for one comparison, tolerance and reduction length.
struct JudgeTerms {
  const OutputComparison& cmp;
  const ToleranceModel& tol;
  std::int64_t n;
  Format f;
  const FormatInfo& fi;
  // Where the failing elements of each check lie (the region of the signature): edge when
  // all of them are in the output's last row or last column.
  std::int64_t rows, cols;
  // An Inf where r_e is finite, or a finite d_e where x_e overflows D, is within tolerance
  // when the tolerance interval around x_e crosses D's overflow threshold (RNE: max finite
  // plus half its unit) on d_e's side: the kernel's unrounded result may lie beyond it.
  double threshold, u_out, u_acc;
  bool precision;  // the precision rule's sums (analyze.hpp) apply
  ToleranceModel::Terms terms;

  JudgeTerms(const OutputComparison& c, const ToleranceModel& t, std::int64_t reduction)
      : cmp(c), tol(t), n(reduction), f(c.format), fi(info(c.format)),
        rows(c.shape.size() >= 2 ? c.shape[c.shape.size() - 2] : 1),
        cols(c.shape.empty() ? static_cast<std::int64_t>(c.got.size()) : c.shape.back()),
        threshold(fi.max_finite() + ulp_of(f, fi.max_finite()) / 2), u_out(std::ldexp(1.0, -(fi.frac_bits + 1))),
        // the unit of the accumulator the result leaves from: FP32 where a narrow one is
        // promoted into it
        u_acc(std::ldexp(1.0, 1 - (t.promote > 0 ? std::max(t.accumulator_bits, 24) : t.accumulator_bits))),
        precision(!c.precision_scale.empty()),
        terms(t.terms(c.format, reduction)) {}

  // The tolerance of element e: cmp.allowed when the op gives it, else tol.bound with n.
  double bound(std::size_t e, double exact_abs) const {
    if (cmp.allowed.empty()) return terms.bound(condition_at(cmp, e), exact_abs, input_abs_at(cmp, e));
    return cmp.allowed[e] + u_out * exact_abs + fi.min_subnormal() / 2;  // as bound()'s output terms
  }
  void failing(Pass& p, const char* check, std::size_t e) const {
    if (p.first_nonfinite < 0 && std::string_view(check) != "tolerance") p.first_nonfinite = static_cast<std::int64_t>(e);
    const std::int64_t col = cols ? static_cast<std::int64_t>(e) % cols : 0;
    const std::int64_t row = cols && rows ? (static_cast<std::int64_t>(e) / cols) % rows : 0;
    bool& in = p.interior[check];
    in = in || (row != rows - 1 && col != cols - 1);
  }
};

// What analyze and judge both need of a compared element.
struct Compared {
  std::size_t e;
  Code got, rounded;         // the kernel's code; the exact value rounded to nearest even
  double d;                  // got, decoded
  double err_signed, err;    // d - x_e and its magnitude
  double xabs;               // |x_e|
  double c;                  // the element's condition (sum of |terms|)
};

// analyze's metrics of a compared element.
inline void measure(const OutputComparison& cmp, const Compared& x, const RefValue& exact, std::int64_t cell,
                    std::int64_t e, Stretch& s) {
  const Format f = cmp.format;
  ErrorMetrics& m = s.m;
  ++m.compared;
  const double ulp = x.err_signed / ulp_at(f, exact);
  const auto dist = ulp_distance(f, x.got, x.rounded);
  if (dist && *dist == 0) ++m.exact_matches;
  m.max_ulp_distance = std::max<std::uint64_t>(m.max_ulp_distance, dist.value_or(0));
  m.max_abs = std::max(m.max_abs, x.err);
  s.sum_abs += x.err;
  if (x.xabs > 0) {
    const double rel = x.err / x.xabs;
    m.max_rel = std::max(m.max_rel, rel);
    s.sum_rel += rel;
    ++s.rel_count;
  }
  const double norm = x.c > 0 ? x.err / x.c : (x.err == 0 ? 0.0 : INFINITY);
  m.max_normalised = std::max(m.max_normalised, norm);
  s.sum_norm += norm;
  ++s.norm_count;
  if (x.c <= cmp.ulp_fair_condition * x.xabs) {  // kUlpFairBits: ULPs measure the kernel here
    ++m.ulp_fair;
    m.max_ulp = std::max(m.max_ulp, std::fabs(ulp));
    s.sum_ulp += std::fabs(ulp);
    s.sum_signed_ulp += ulp;
    m.ulp_histogram[ulp_histogram_bin(std::fabs(ulp))]++;
  }
  s.sum_err2 += x.err * x.err;
  s.sum_x2 += x.xabs * x.xabs;
  if (!std::isnan(s.cells[cell])) s.cells[cell] = std::max(s.cells[cell], norm);
  if (!s.worst_nonfinite && norm > s.worst_norm) s.worst_norm = norm, s.worst = e;
}

// The precision rule's sums of a compared element, and the rounding test: d_e on the wrong
// side of a rounding boundary of D, further beyond it than the declared arithmetic's error
// reaches.
inline void judge_precision(const OutputComparison& cmp, const JudgeTerms& jt, const Compared& x, std::int64_t e,
                            Pass& p) {
  const Format f = cmp.format;
  const double scale = cmp.precision_scale[x.e];
  const double z = std::max(0.0, x.err - jt.u_out * std::fabs(x.d) - jt.fi.min_subnormal() / 2) / x.c, w = scale / x.c;
  p.sum_z += z, p.sum_w += w, ++p.n_precision;
  const double zw = w > 0 ? z / w : z > 0 ? INFINITY : 0;
  if (zw > p.worst_zw) p.worst_zw = zw, p.worst_precision = e;
  if (x.got == x.rounded || x.d == decode(f, x.rounded)) return;
  const Code toward = x.err_signed < 0 ? next_up(f, x.got) : next_down(f, x.got);
  const double beyond = x.err - std::fabs(decode(f, toward) - x.d) / 2;  // dist(x_e, R(d_e)); NaN: no neighbour
  const double reach = kMisroundReach * scale + 4 * jt.u_acc * x.c;
  if (beyond > reach) {
    ++p.misrounded;
    if (beyond / reach > p.worst_beyond_ratio) p.worst_beyond_ratio = beyond / reach, p.worst_misrounded = e;
  }
}

// judge's sums of a compared element: the tolerance, and the precision rule where it applies.
inline void judge_compared(const OutputComparison& cmp, const JudgeTerms& jt, const Compared& x, std::int64_t e,
                           Pass& p) {
  if (jt.precision && x.c > 0 && std::isfinite(cmp.precision_scale[x.e])) judge_precision(cmp, jt, x, e, p);
  const double b = jt.bound(x.e, x.xabs);
  if (x.err > b) {
    ++p.over;
    if (p.worst_beyond < 0 || x.err / b > p.worst_ratio) p.worst_beyond = e;
    p.worst_ratio = std::max(p.worst_ratio, x.err / b);
    jt.failing(p, "tolerance", x.e);
  }
}

// analyze's counts of an element that is not compared (a NaN, an Inf, unwritten, ...).
inline void measure_class(Class k, std::int64_t cell, std::int64_t e, Stretch& s) {
  ErrorMetrics& m = s.m;
  switch (k) {
    case Class::Expected: m.expected_nonfinite++; break;
    case Class::Overflowed: m.overflowed++; break;
    case Class::UnexpectedNan: m.unexpected_nan++; break;
    case Class::UnexpectedInf: m.unexpected_inf++; break;
    case Class::Missed: m.missed_nonfinite++; break;
    case Class::Mismatched: m.mismatched_nonfinite++; break;
    case Class::Unwritten:  // counted by the runner (ErrorMetrics::unwritten)
    case Class::Unreferenced:
    case Class::Compared: break;
  }
  if (k != Class::Expected && k != Class::Overflowed && k != Class::Unreferenced) {
    s.cells[cell] = NAN;
    if (!s.worst_nonfinite) s.worst = e, s.worst_nonfinite = true;
  }
}

// judge's counts of an element that is not compared.
inline void judge_class(const OutputComparison& cmp, const JudgeTerms& jt, Class k, std::size_t ue, std::int64_t e,
                        Pass& p) {
  const Format f = cmp.format;
  if (k == Class::Unwritten) {  // the write audit's failure (m.unwritten), not a value
    if (p.first_unwritten < 0) p.first_unwritten = e;
  } else if (k == Class::UnexpectedNan) {
    ++p.nan;
    jt.failing(p, "unexpected_nan", ue);
  } else if (k == Class::Mismatched) {
    ++p.mismatched;
    jt.failing(p, "mismatched_nonfinite", ue);
  } else if (k == Class::UnexpectedInf || k == Class::Missed) {
    const Code g = cmp.got[ue];
    const DoubleDouble xd = cmp.exact[ue].double_double();
    const double b = jt.bound(ue, magnitude_of(xd));
    if (k == Class::UnexpectedInf) {
      const double toward = is_negative(f, g) ? -(xd.hi + xd.lo) : xd.hi + xd.lo;
      if (toward + b < jt.threshold) ++p.inf, jt.failing(p, "unexpected_inf", ue);
    } else if (!(std::fabs(signed_error(decode(f, g), xd)) <= b)) {  // NaN (x_e infinite): missed
      ++p.missed, jt.failing(p, "missed_nonfinite", ue);
    }
  }
}

// One pass over elements [from, to): analyze's metrics into s (kMetrics), judge's sums into
// p (kVerdict), or both, sharing what both need of an element (its correct rounding, its
// class, the exact value as a double-double, the error).
template <bool kMetrics, bool kVerdict>
void scan(const OutputComparison& cmp, const ErrorMap& map, const JudgeTerms* jt, std::int64_t from, std::int64_t to,
          Stretch& s, Pass& p) {
  const Format f = cmp.format;
  if constexpr (kMetrics) s.cells.assign(map.max_normalised.size(), 0.0);
  for (std::int64_t e = from; e < to; ++e) {
    const auto ue = static_cast<std::size_t>(e);
    const Code g = cmp.got[ue];
    const RefValue& x = cmp.exact[ue];
    const Code r = x.round_to(f, Rounding::NearestEven, output_overflow(f));
    const Class k = classify(cmp, ue, r);
    std::int64_t cell = 0;
    if constexpr (kMetrics)
      cell = map.cols ? ((e / map.cols) % std::max<std::int64_t>(map.rows, 1)) / map.cell_rows * map.grid_cols +
                            (e % map.cols) / map.cell_cols
                      : 0;
    if (k == Class::Compared) {
      const double d = decode(f, g);
      const DoubleDouble xd = target(f, x);
      const double err_signed = signed_error(d, xd);
      const Compared el{ue, g, r, d, err_signed, std::fabs(err_signed), magnitude_of(xd), condition_at(cmp, ue)};
      if constexpr (kMetrics) measure(cmp, el, x, cell, e, s);
      if constexpr (kVerdict) judge_compared(cmp, *jt, el, e, p);
      continue;
    }
    if constexpr (kMetrics) measure_class(k, cell, e, s);
    if constexpr (kVerdict) judge_class(cmp, *jt, k, ue, e, p);
  }
}

// The stretches' scan on several threads for large outputs (each stretch on one thread).
template <bool kMetrics, bool kVerdict>
void scan_all(const OutputComparison& cmp, const ErrorMap& map, const JudgeTerms* jt, std::vector<Stretch>& stretches,
              std::vector<Pass>& passes) {
  const auto n = static_cast<std::int64_t>(cmp.got.size());
  const std::int64_t count = std::max<std::int64_t>(1, (n + kStretch - 1) / kStretch);
  stretches.resize(static_cast<std::size_t>(count));
  passes.resize(static_cast<std::size_t>(count));
  parallel_for(count, [&](std::int64_t i) {
    const auto ui = static_cast<std::size_t>(i);
    scan<kMetrics, kVerdict>(cmp, map, jt, i * kStretch, std::min(n, (i + 1) * kStretch), stretches[ui], passes[ui]);
  }, threads_for(static_cast<double>(n), 2.0 * kStretch));
}

// analyze()'s metrics from its stretches, merged in order.
ErrorMetrics merge_metrics(const OutputComparison& cmp, ErrorMap map, const std::vector<Stretch>& part) {
  ErrorMetrics m;
  m.format = cmp.format;
  m.elements = static_cast<std::int64_t>(cmp.got.size());
  Stretch all;
  all.cells = map.max_normalised;
  for (const Stretch& s : part) {
    const ErrorMetrics& p = s.m;
    m.compared += p.compared, m.exact_matches += p.exact_matches, m.ulp_fair += p.ulp_fair;
    m.expected_nonfinite += p.expected_nonfinite, m.overflowed += p.overflowed;
    m.unexpected_nan += p.unexpected_nan, m.unexpected_inf += p.unexpected_inf;
    m.missed_nonfinite += p.missed_nonfinite, m.mismatched_nonfinite += p.mismatched_nonfinite;
    m.max_ulp_distance = std::max(m.max_ulp_distance, p.max_ulp_distance);
    m.max_abs = std::max(m.max_abs, p.max_abs), m.max_rel = std::max(m.max_rel, p.max_rel);
    m.max_normalised = std::max(m.max_normalised, p.max_normalised), m.max_ulp = std::max(m.max_ulp, p.max_ulp);
    for (std::size_t b = 0; b < m.ulp_histogram.size(); ++b) m.ulp_histogram[b] += p.ulp_histogram[b];
    all.sum_abs += s.sum_abs, all.sum_rel += s.sum_rel, all.sum_norm += s.sum_norm, all.sum_ulp += s.sum_ulp;
    all.sum_signed_ulp += s.sum_signed_ulp, all.sum_err2 += s.sum_err2, all.sum_x2 += s.sum_x2;
    all.rel_count += s.rel_count, all.norm_count += s.norm_count;
    for (std::size_t c = 0; c < all.cells.size(); ++c)
      all.cells[c] = std::isnan(all.cells[c]) || std::isnan(s.cells[c]) ? NAN : std::max(all.cells[c], s.cells[c]);
    if (!all.worst_nonfinite) {
      if (s.worst_nonfinite) all.worst = s.worst, all.worst_nonfinite = true;
      else if (s.worst_norm > all.worst_norm) all.worst_norm = s.worst_norm, all.worst = s.worst;
    }
  }
  map.max_normalised = all.cells;
  m.map = std::move(map);
  if (m.compared) m.mean_abs = all.sum_abs / m.compared;
  if (m.ulp_fair) {
    m.mean_ulp = all.sum_ulp / m.ulp_fair;
    m.bias_ulp = all.sum_signed_ulp / m.ulp_fair;
  }
  if (all.rel_count) m.mean_rel = all.sum_rel / all.rel_count;
  if (all.norm_count) m.mean_normalised = all.sum_norm / all.norm_count;
  m.normwise = all.sum_x2 > 0 ? std::sqrt(all.sum_err2) / std::sqrt(all.sum_x2) : (all.sum_err2 > 0 ? INFINITY : 0.0);

  if (all.worst >= 0) m.worst = describe_element(cmp, all.worst);
  return m;
}

// The bias test's sums (analyze.hpp) over the elements it applies to.
struct BiasStatistics {
  std::int64_t n = 0;
  double signed_sum = 0, zero_sum = 0, allowed = 0;
  // The same against the exact result of the unrounded inputs (x_e): a kernel may keep its
  // inputs as given where it may round them (cuBLAS in TF32 mode runs small problems on
  // FP32 units). Only where the op gives an input-rounding shift.
  bool has_raw = false;
  double raw_signed_sum = 0, raw_zero_sum = 0;
  double mean(double sum) const { return n ? sum / static_cast<double>(n) : NAN; }
};

BiasStatistics bias_statistics(const JudgeTerms& jt) {
  const OutputComparison& cmp = jt.cmp;
  BiasStatistics b;
  const Format f = jt.f;
  // Where D is coarser than the accumulator its own rounding sets the errors, and the
  // rounding test judges their direction (analyze.hpp).
  if (cmp.bias_allowance.empty() || jt.fi.precision() < jt.tol.accumulator_bits) return b;
  std::vector<double> values;
  double systematic = 0, random2 = 0, floor = 0;
  for (std::size_t e = 0; e < cmp.got.size(); ++e) {
    const double beta = cmp.bias_allowance[e], c = condition_at(cmp, e);
    if (!std::isfinite(beta) || !(c > 0)) continue;
    const RefValue& x = cmp.exact[e];
    if (classify(cmp, e, x.round_to(f, Rounding::NearestEven, output_overflow(f))) != Class::Compared) continue;
    const DoubleDouble xd = target(f, x);
    const double xabs = magnitude_of(xd);
    if (cmp.relu_output && xabs <= jt.bound(e, xabs)) continue;  // the clamp may decide the sign
    const double shift = e < cmp.bias_shift.size() ? cmp.bias_shift[e] : 0.0;
    const double err = signed_error(decode(f, cmp.got[e]), xd);
    const double t = (err - shift) / c, toward = xd.hi + shift;
    b.signed_sum += t;
    b.zero_sum += toward > 0 ? t : toward < 0 ? -t : 0.0;
    if (!cmp.bias_shift.empty()) {
      const double t_raw = err / c;
      b.has_raw = true;
      b.raw_signed_sum += t_raw;
      b.raw_zero_sum += xd.hi > 0 ? t_raw : xd.hi < 0 ? -t_raw : 0.0;
    }
    systematic += beta / c;
    const double rho = e < cmp.bias_spread.size() ? cmp.bias_spread[e] : 0.0, ulp = ulp_at(f, x), epi = 2 * jt.u_acc * xabs;
    random2 += (rho * rho + ulp * ulp / 12 + epi * epi) / (c * c);
    floor += jt.fi.min_subnormal() / 2 / c;
    values.push_back(xd.hi);
    ++b.n;
  }
  std::sort(values.begin(), values.end());
  const auto distinct = static_cast<double>(std::unique(values.begin(), values.end()) - values.begin());
  if (b.n) b.allowed = kBiasKappa * systematic + 6 * std::sqrt(random2 * static_cast<double>(b.n) / distinct) + floor;
  return b;
}

// The bias test's verdict (analyze.hpp) from its sums.
void judge_bias(const BiasStatistics& b_in, const std::string& out, Verdict& v) {
  BiasStatistics b = b_in;
  // Of the two hypotheses (inputs rounded as declared, inputs kept), the one the errors fit.
  const auto worst = [](double s, double z) { return std::max(std::fabs(s), std::fabs(z)); };
  if (b.has_raw && worst(b.raw_signed_sum, b.raw_zero_sum) < worst(b.signed_sum, b.zero_sum))
    b.signed_sum = b.raw_signed_sum, b.zero_sum = b.raw_zero_sum;
  v.bias = b.mean(std::fabs(b.zero_sum) >= std::fabs(b.signed_sum) ? b.zero_sum : b.signed_sum);
  v.bias_allowed = b.mean(b.allowed);
  if (b.n < kBiasMinElements) return;
  const bool zero = std::fabs(b.zero_sum) >= std::fabs(b.signed_sum);
  const double sum = zero ? b.zero_sum : b.signed_sum;
  if (!(std::fabs(sum) > b.allowed)) return;
  v.fail(out + ":biased",
         fmt::format("biased {}: the mean error over {} elements is {:.3g} of sum |terms| ({:.3g}x what the declared "
                     "arithmetic's systematic and random errors reach, {:.3g}): a systematic deviation inside the "
                     "tolerance (a directed rounding of inputs or output, a dropped correction term)",
                     zero ? (sum < 0 ? "toward zero" : "away from zero") : (sum < 0 ? "negative" : "positive"), b.n,
                     b.mean(sum), std::fabs(sum) / b.allowed, b.mean(b.allowed)));
}

// judge()'s verdict from its passes (merged in order: a first index from the first stretch
// that has one, a worst one from the first stretch holding the largest; ties: the earlier,
// as one loop keeps it) and the metrics (write audit, baseline rule).
Verdict verdict_of(const JudgeTerms& jt, const std::vector<Pass>& parts, const ErrorMetrics& m, const BiasStatistics& bias,
                   double baseline_max_normalised, const BaselineRule& rule) {
  Verdict v;
  const std::string out = m.output.empty() ? "out" : m.output;
  if (m.unwritten) v.fail(out + ":unwritten", fmt::format("{} output elements never written", m.unwritten));
  if (m.padding_written)
    v.fail(out + ":padding_written", fmt::format("{} padding elements of the output overwritten", m.padding_written));
  Pass all;
  for (const Pass& q : parts) {
    for (const auto& [check, in] : q.interior) all.interior[check] = all.interior[check] || in;
    if (all.first_nonfinite < 0) all.first_nonfinite = q.first_nonfinite;
    if (all.first_unwritten < 0) all.first_unwritten = q.first_unwritten;
    if (q.worst_beyond >= 0 && (all.worst_beyond < 0 || q.worst_ratio > all.worst_ratio)) all.worst_beyond = q.worst_beyond;
    all.worst_ratio = std::max(all.worst_ratio, q.worst_ratio);
    all.nan += q.nan, all.inf += q.inf, all.missed += q.missed, all.mismatched += q.mismatched, all.over += q.over;
    all.sum_z += q.sum_z, all.sum_w += q.sum_w, all.n_precision += q.n_precision;
    if (q.worst_zw > all.worst_zw) all.worst_zw = q.worst_zw, all.worst_precision = q.worst_precision;
    all.misrounded += q.misrounded;
    if (q.worst_beyond_ratio > all.worst_beyond_ratio)
      all.worst_beyond_ratio = q.worst_beyond_ratio, all.worst_misrounded = q.worst_misrounded;
  }
  const ToleranceModel& tol = jt.tol;
  const Format f = jt.f;
  const auto token = [&](const char* check) {
    const char* region = jt.rows < 2 || jt.cols < 2 ? "any" : all.interior[check] ? "interior" : "edge";
    return fmt::format("{}:{}@{}", out, check, region);
  };
  v.worst_element = all.first_nonfinite >= 0 ? all.first_nonfinite
                    : all.worst_beyond >= 0  ? all.worst_beyond
                                             : all.first_unwritten;
  if (all.n_precision > 0) {
    const double nn = static_cast<double>(all.n_precision), mean_z = all.sum_z / nn, mean_w = all.sum_w / nn;
    const double factor = kPrecisionKappa + kPrecisionLambda / std::sqrt(nn);
    const double allowed = factor * mean_w + 4 * jt.u_acc;
    v.precision_ratio = mean_z / allowed;
    if (mean_z > allowed) {
      if (v.worst_element < 0) v.worst_element = all.worst_precision;
      v.fail(out + ":precision",
             fmt::format("mean normalised error {:.3g} over {} elements is {:.3g}x what the declared arithmetic allows "
                         "({:.3g} = {:.3g} x the scale of a correct {}-bit {} accumulation {:.3g} + 4 ulp)",
                         mean_z, all.n_precision, mean_z / allowed, allowed, factor, tol.accumulator_bits,
                         tol.nearest ? "round-to-nearest" : "nearest or truncating", mean_w));
    }
    const std::int64_t most = misrounded_allowance(all.n_precision);
    v.misrounded = all.misrounded, v.misrounded_allowed = most;
    if (all.misrounded > most) {
      if (v.worst_element < 0) v.worst_element = all.worst_misrounded;
      v.fail(out + ":misrounded",
             fmt::format("{} of {} elements are rounded to the wrong side of a {} rounding boundary, further beyond it than "
                         "the declared arithmetic's error reaches ({} x its scale + 4 ulp; worst {:.3g}x); a correct kernel "
                         "rounding to nearest has at most {}",
                         all.misrounded, all.n_precision, name(f), kMisroundReach, all.worst_beyond_ratio, most));
    }
  }
  judge_bias(bias, out, v);
  if (all.nan) v.fail(token("unexpected_nan"), fmt::format("{} unexpected NaN", all.nan));
  if (all.inf) v.fail(token("unexpected_inf"), fmt::format("{} unexpected Inf", all.inf));
  if (all.missed)
    v.fail(token("missed_nonfinite"), fmt::format("{} missed NaN/Inf (the exact result is not finite)", all.missed));
  if (all.mismatched)
    v.fail(token("mismatched_nonfinite"), fmt::format("{} wrong non-finite values (NaN vs Inf or wrong sign)", all.mismatched));
  if (all.over)
    v.fail(token("tolerance"),
           fmt::format("{} elements exceed the tolerance (worst {:.3g}x the bound of {}; {})", all.over, all.worst_ratio,
                       tol.rule.empty() ? std::string("the declared arithmetic")
                                        : "the loosest admitted arithmetic, " + tol.rule,
                       !jt.cmp.tolerance_note.empty()
                           ? jt.cmp.tolerance_note
                           : fmt::format("accumulator {} bits{}, n = {}", tol.accumulator_bits,
                                         tol.input_bits ? fmt::format(", inputs {} bits", tol.input_bits) : "", jt.n)));
  if (baseline_max_normalised >= 0) {
    // The model computes the epilogue exactly and rounds once: a declared activation error
    // and an admitted rounding before the bias come on top, as in the bound.
    const double epilogue = tol.activation_error / 2 + tol.epilogue_rounding;
    const double allowed = rule.factor * baseline_max_normalised + jt.u_out + epilogue;
    if (m.max_normalised > allowed)
      v.fail(out + ":baseline_rule", fmt::format("max normalised error {:.3g} is above {} x {} ({:.3g}) + u_D{}",
                                                 m.max_normalised, rule.factor, rule.model, baseline_max_normalised,
                                                 epilogue > 0 ? fmt::format(" + the epilogue's {:.3g}", epilogue) : ""));
  }
  return v;
}

}  // namespace

double ulp_fair_condition(int accumulator_bits, Format out) {
  return std::ldexp(1.0, std::max(0, accumulator_bits - info(out).precision()) + kUlpFairBits);
}

ErrorMetrics analyze(const OutputComparison& cmp) {
  const ReferenceFpEnv env;  // the errors' and bounds' double arithmetic rounds to nearest
  const ErrorMap map = map_geometry(cmp);
  std::vector<Stretch> stretches;
  std::vector<Pass> passes;
  scan_all<true, false>(cmp, map, nullptr, stretches, passes);
  return merge_metrics(cmp, map, stretches);
}

WorstElement describe_element(const OutputComparison& cmp, std::int64_t e) {
  const ReferenceFpEnv env;  // the errors' and bounds' double arithmetic rounds to nearest
  const Format f = cmp.format;
  WorstElement w;
  std::int64_t rest = e;
  w.index.assign(cmp.shape.size(), 0);
  for (std::size_t k = cmp.shape.size(); k-- > 0;) {
    w.index[k] = rest % cmp.shape[k];
    rest /= cmp.shape[k];
  }
  const RefValue& x = cmp.exact[e];
  const DoubleDouble xd = x.double_double();
  const Code g = cmp.got[e];
  w.got = show(f, g);
  w.expected = show(f, x.round_to(f, Rounding::NearestEven, output_overflow(f)));
  w.exact = x.kind == RefValue::Kind::Finite ? fmt::format("{} + {}", hex_float(xd.hi), hex_float(xd.lo)) : to_string(x);
  w.condition = condition_at(cmp, static_cast<std::size_t>(e));
  const bool unwritten = static_cast<std::size_t>(e) < cmp.unwritten.size() && cmp.unwritten[e];
  if (!unwritten && is_finite(f, g) && x.kind != RefValue::Kind::NaN && x.kind != RefValue::Kind::Inf) {
    const double es = signed_error(decode(f, g), target(f, x));
    w.normalised = w.condition > 0 ? std::fabs(es) / w.condition : (es == 0 ? 0.0 : INFINITY);
    w.ulp = es / ulp_at(f, x);
  } else {
    w.normalised = w.ulp = NAN;
  }
  return w;
}

double ToleranceModel::gamma(std::int64_t n) const {
  const auto one = [&](double u, double k) {
    if (probabilistic) return lambda * std::sqrt(k) * u;
    return k * u < 1 ? k * u / (1 - k * u) : INFINITY;
  };
  const double u_acc = std::ldexp(1.0, 1 - accumulator_bits);
  if (promote <= 0 || n <= promote || accumulator_bits >= 24) return one(u_acc, static_cast<double>(n));
  // Chunks of `promote` products at u_acc, their sums added to an FP32 accumulator (one
  // more rounding per chunk): (1 + gamma_acc(promote)) (1 + gamma_24(chunks)) - 1.
  const double chunks = std::ceil(static_cast<double>(n) / promote);
  const double inner = one(u_acc, static_cast<double>(promote)), outer = one(0x1p-23, chunks);
  return (1 + inner) * (1 + outer) - 1;
}

ToleranceModel::Terms ToleranceModel::terms(Format out, std::int64_t n) const {
  const double u_in = input_bits > 0 ? std::ldexp(1.0, 1 - input_bits) : 0.0;
  const auto& fo = info(out);
  const double g = gamma(n + 4);
  return {2 * u_in + u_in * u_in + g + activation_error / 2 + epilogue_rounding, 1 + g, std::ldexp(1.0, -(fo.frac_bits + 1)),
          static_cast<double>(n + 4) * accumulator_eta, fo.min_subnormal() / 2};
}

double ToleranceModel::bound(double condition, double exact_abs, Format out, std::int64_t n, double input_abs) const {
  return terms(out, n).bound(condition, exact_abs, input_abs);
}

Verdict judge(const OutputComparison& cmp, const ErrorMetrics& m, const ToleranceModel& tol, std::int64_t n,
              double baseline_max_normalised, const BaselineRule& rule) {
  const ReferenceFpEnv env;  // the bounds' double arithmetic rounds to nearest
  const JudgeTerms jt(cmp, tol, n);
  std::vector<Stretch> stretches;
  std::vector<Pass> passes;
  scan_all<false, true>(cmp, ErrorMap{}, &jt, stretches, passes);
  return verdict_of(jt, passes, m, bias_statistics(jt), baseline_max_normalised, rule);
}

Assessment analyze_and_judge(const OutputComparison& cmp, const ToleranceModel& tol, std::int64_t n,
                             const ErrorMetrics& audit, double baseline_max_normalised, const BaselineRule& rule) {
  const ReferenceFpEnv env;  // the errors' and bounds' double arithmetic rounds to nearest
  const ErrorMap map = map_geometry(cmp);
  const JudgeTerms jt(cmp, tol, n);
  std::vector<Stretch> stretches;
  std::vector<Pass> passes;
  scan_all<true, true>(cmp, map, &jt, stretches, passes);
  Assessment a;
  a.metrics = merge_metrics(cmp, map, stretches);
  a.metrics.output = audit.output;
  a.metrics.unwritten = audit.unwritten;
  a.metrics.padding_written = audit.padding_written;
  const BiasStatistics bias = bias_statistics(jt);
  a.metrics.bias = bias.mean(bias.signed_sum);
  a.metrics.bias_toward_zero = bias.mean(bias.zero_sum);
  a.metrics.bias_allowed = bias.mean(bias.allowed);
  a.verdict = verdict_of(jt, passes, a.metrics, bias, baseline_max_normalised, rule);
  return a;
}

std::string failure_signature(const Verdict& v) {
  if (v.passed) return "";
  std::set<std::string> tokens(v.checks.begin(), v.checks.end());
  if (tokens.empty()) tokens.insert("unexplained");  // a failed verdict from before checks were recorded
  return fmt::format("{}", fmt::join(tokens, " + "));
}

bool same_failure(const std::string& a, const std::string& b) {
  // check -> region ("" for tokens without one)
  const auto parse = [](const std::string& s) {
    std::map<std::string, std::string> m;
    for (std::size_t at = 0; at <= s.size();) {
      std::size_t end = s.find(" + ", at);
      if (end == std::string::npos) end = s.size();
      const std::string t = s.substr(at, end - at);
      const std::size_t r = t.find('@');
      if (!t.empty()) m[t.substr(0, r)] = r == std::string::npos ? "" : t.substr(r + 1);
      at = end + 3;
    }
    return m;
  };
  // The statistical checks (precision rule, rounding test) judge a whole output and
  // depend on its size: they come and go with the number of elements. Beside a
  // per-element or other check they are left out of the comparison; alone, any of them
  // matches any other on the same outputs (a shrunk 1 x 1 case cannot show a rounding
  // test failure of 1,000 elements, and its per-element failure is the same bug).
  const auto statistical = [](const std::string& check) {
    const std::size_t colon = check.find(':');
    const std::string name = colon == std::string::npos ? check : check.substr(colon + 1);
    return name == "precision" || name == "misrounded" || name == "biased";
  };
  const auto split = [&](const std::map<std::string, std::string>& m) {
    std::map<std::string, std::string> other;
    std::set<std::string> outputs;  // of the statistical checks
    for (const auto& [check, region] : m)
      if (statistical(check)) outputs.insert(check.substr(0, check.find(':')));
      else other.emplace(check, region);
    return std::pair{other, outputs};
  };
  const auto [x, sx] = split(parse(a));
  const auto [y, sy] = split(parse(b));
  if (x.empty() && y.empty()) return sx == sy;
  if (x.size() != y.size()) return false;
  for (const auto& [check, region] : x) {
    const auto it = y.find(check);
    if (it == y.end()) return false;
    if (region != it->second && region != "any" && it->second != "any") return false;
  }
  return true;
}

}  // namespace ulpgate
