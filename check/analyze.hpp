// Analyzers: how wrong a kernel's output is against the exact reference (analyze: the
// metrics) and whether that is within what its arithmetic allows (judge: the rules and the
// verdict). The notation (d_e, x_e, r_e, c_e, u_D), the metrics' definitions and the
// classification of NaN, Inf and overflow are in docs/concepts/precision.md; each rule's
// constants are documented where they are declared below.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/tensor.hpp"
#include "core/uninitialized.hpp"
#include "references/ref_value.hpp"

namespace ulpgate {

/// The overflow rule of the correct rounding of an output in format f (see r_e above).
Overflow output_overflow(Format f);

inline constexpr int kUlpHistogramBins = 33;  ///< [0,0.5], (0.5,1], (1,2], ..., (2^30, inf)
/// The histogram bin of an |ulp error| value (see above).
int ulp_histogram_bin(double abs_ulp);
/// Lower and upper edge of a bin ("(1, 2]" is {1, 2}; the last has upper = +inf).
std::pair<double, double> ulp_histogram_edges(int bin);

/// Max normalised error per cell of the output: a tile-sized grid that shows tile and
/// boundary bugs as a pattern. Rows and columns of the output (GEMM: M x N, max over
/// batches; attention: (batch*heads*seq_q) x head_dim_v) are grouped into cells of
/// cell_rows x cell_cols elements, at most 64 x 64 cells.
struct ErrorMap {
  std::int64_t rows = 0, cols = 0;            ///< output rows and columns
  std::int64_t cell_rows = 1, cell_cols = 1;  ///< elements per cell
  std::int64_t grid_rows = 0, grid_cols = 0;  ///< cells
  std::vector<double> max_normalised;         ///< grid_rows x grid_cols, row-major; NaN where
                                              ///< a cell holds a non-finite mismatch
};

/// The element a run is best shown by: where judge() found failing elements, the failing
/// one (Verdict::worst_element); otherwise the one with the largest normalised error
/// (non-finite mismatches rank first).
struct WorstElement {
  std::vector<std::int64_t> index;  ///< GEMM {b, i, j}; attention {b, h, i, d}
  std::string got;                  ///< the kernel's code and value, e.g. "0x3c01 (0x1.004p+0)"
  std::string expected;             ///< r_e, same form
  std::string exact;                ///< x_e as a hex double-double ("0x1.0028p+0 + 0x1.2p-60")
  double condition = 0;             ///< c_e
  double normalised = 0, ulp = 0;   ///< its errors
};

struct ErrorMetrics {
  std::string output;  ///< "D" or "O"
  Format format = Format::FP32;
  std::int64_t elements = 0, compared = 0, exact_matches = 0;
  double max_abs = 0, mean_abs = 0;
  double max_rel = 0, mean_rel = 0;
  double normwise = 0;
  double max_normalised = 0, mean_normalised = 0;
  /// ULP statistics and the histogram over the ULP-fair elements only (kUlpFairBits below):
  /// elsewhere cancellation, not the kernel, sets the ULP scale.
  double max_ulp = 0, mean_ulp = 0, bias_ulp = 0;
  std::int64_t ulp_fair = 0;  ///< how many compared elements the ULP statistics cover
  /// The bias test's statistics (below): the mean signed error against the declared
  /// arithmetic's exact result, normalised by c_e, plain and toward zero, and the most a
  /// correct kernel's mean reaches here; NaN where the test does not apply.
  double bias = NAN, bias_toward_zero = NAN, bias_allowed = NAN;
  std::uint64_t max_ulp_distance = 0;
  std::vector<std::int64_t> ulp_histogram = std::vector<std::int64_t>(kUlpHistogramBins, 0);
  std::int64_t expected_nonfinite = 0, unexpected_nan = 0, unexpected_inf = 0, missed_nonfinite = 0,
               mismatched_nonfinite = 0, overflowed = 0;
  std::int64_t unwritten = 0, padding_written = 0;  ///< copied from the runner
  WorstElement worst;
  ErrorMap map;  ///< empty in a passing case's record entry (check/check.hpp to_case_result)
};

/// What the metrics are computed from: per logical output element, the kernel's code, the
/// reference value and the condition term. Logical order: GEMM (b, i, j) row-major;
/// attention (b, h, i, d).
struct OutputComparison {
  Format format = Format::FP32;
  std::vector<std::int64_t> shape;  ///< GEMM {batch, M, N}; attention {batch, heads, seq_q, dv}
  UninitVector<Code> got;
  UninitVector<RefValue> exact;  ///< (resize leaves new elements unwritten)
  std::vector<double> condition;
  /// Largest finite value of the kernel's accumulator (FP32's for FP32 compute), and per
  /// element the largest intermediate it holds (see accumulated_e; empty: condition).
  double accumulator_max = INFINITY;
  std::vector<double> accumulated;
  /// How much a correct kernel's intermediate may exceed accumulated_e: 1 + the condition
  /// term's coefficient (input rounding, accumulation). An element may overflow where
  /// accumulated_e x accumulated_growth > accumulator_max.
  double accumulated_growth = 1.0;
  /// Per element, the error the op's tolerance model allows before the output's own
  /// rounding (check/ops: attention fills it); empty: ToleranceModel::bound's GEMM terms.
  std::vector<double> allowed;
  /// Per element, the absolute part a_e of the kernel's internal input rounding (see
  /// ToleranceModel: inputs below that precision's normal range); empty: 0 everywhere.
  std::vector<double> input_abs;
  /// Per element, 1 where the write audit found it unwritten (RunOutcome::unwritten_at):
  /// its code is the poison, not a value, so it is counted in ErrorMetrics::unwritten only
  /// (not as an unexpected NaN, nor in the statistics). Empty: every element written.
  std::vector<char> unwritten;
  /// Per element, 1 where the op computed no reference (attention's sampled query rows,
  /// check/ops/attention.cpp): the element is in no statistic and no check but one: a NaN
  /// or Inf there (where the op says the true value is finite, accumulated_e within the
  /// accumulator) is unexpected. Empty: every element has its reference.
  std::vector<char> unreferenced;
  /// Per element, 1 where a NaN is a correct kernel's answer although the reference is finite
  /// (attention: a non-finite V at a key the row does not see, which a kernel computing P V as
  /// a matrix product meets as 0 x Inf); a NaN there is expected, a finite value is judged as
  /// everywhere. Empty: nowhere.
  std::vector<char> nan_allowed;
  /// D is a ReLU's output: where x_e is NaN, +0 is right too (max(NaN, 0) is 0 under IEEE
  /// 754-2008 maxNum and CUDA's fmaxf, as cuBLASLt's RELU epilogue computes it).
  bool relu_output = false;
  /// How the reference was computed where it is worth saying (the GPU exact path: how many
  /// elements the CPU recomputed); goes into the case record's notes as "reference".
  std::string reference_note;
  /// What the tolerance was, for messages ("accumulator 24 bits, n = 512"); empty: from
  /// the ToleranceModel and n.
  std::string tolerance_note;
  /// Per element, s_e of the precision rule (below): the error scale of a correct
  /// accumulation of the declared arithmetic on these inputs, in D's units. Empty: the
  /// rule does not apply (attention; GELU epilogues).
  std::vector<double> precision_scale;
  /// The bias test (below), per element in D's units: beta_e, the systematic error a
  /// correct kernel of the declared arithmetic can make here (NaN or empty: the test skips
  /// the element); rho_e, the scale of its random error; delta_e = x'_e - x_e, where x'_e
  /// is the exact result of the inputs rounded as declared (empty: 0, no input rounding).
  std::vector<double> bias_allowance, bias_spread, bias_shift;
  /// The ULP-fair rule's bound (kUlpFairBits): 2^(accumulator bits - D's precision +
  /// kUlpFairBits), at least 2^kUlpFairBits; the op sets it from the tolerance.
  double ulp_fair_condition = 0x1p4;
};

/// ULP statistics (max, mean, bias in ULPs, the histogram) cover the elements whose
/// condition c_e / |x_e| is at most OutputComparison::ulp_fair_condition: where an error of
/// one unit of the accumulator in what was summed, u_acc c_e, is at most 2^kUlpFairBits
/// ULPs of D at x_e. Beyond it (cancellation, results near zero) ULPs measure the
/// cancellation rather than the kernel (an element whose exact value is 1e-40 after a sum
/// of 1e+0 terms is 1e+30 ULPs off for any FP32 kernel); such elements are judged and
/// summarised by the normalised error |d_e - x_e| / c_e.
inline constexpr int kUlpFairBits = 4;
double ulp_fair_condition(int accumulator_bits, Format out);

/// The precision rule: a statistic over a whole output, far sharper than the per-element
/// worst-case bound at large K (docs/concepts/precision.md). Over the N elements e that are
/// compared (d_e and r_e finite, no overflow) with c_e > 0 and s_e finite:
///   z_e = max(0, |d_e - x_e| - u_D |d_e| - ulp_D(0) / 2) / c_e
///         (the error that D's own rounding cannot explain: |round(v) - v| <= u_D |round(v)|)
///   w_e = s_e / c_e
/// and the case fails ("D:precision") when
///   mean(z) > (kPrecisionKappa + kPrecisionLambda / sqrt(N)) mean(w) + 4 u_acc,
/// u_acc = 2^(1 - accumulator_bits) (one ulp: the epilogue's up to four roundings,
/// truncating ones too). s_e (OutputComparison::precision_scale; check/ops/gemm.cpp) is
/// the scale of a sequential accumulation's error, computed from the exact partial sums
/// s_k and products p_k, with u = 2^-bits:
///   max(sigma, |seq - x|)  sigma = u sqrt(sum_k (s_k^2 + p_k^2) / 3), the random rounding
///                          model (Higham and Mary 2019: each rounding uniform in +-u);
///                          seq the sum a sequential round-to-nearest accumulation at `bits`
///                          really gives on these inputs (the model's independence fails
///                          where small terms are absorbed one-sidedly: heavy-tailed
///                          positive data)
///   + u |sum_k (s_k + p_k)|  (only when not ToleranceModel::nearest: round-toward-zero's
///                          mean error)
/// plus the same terms for the inputs' rounding when the kernel rounds them (TF32), times
/// |alpha sA sB sD|, plus (K + 4) eta_acc for underflow. Sequential order is the least
/// accurate of the usual orders (blocked, pairwise, split-K sum fewer large partial sums),
/// so a correct kernel's mean error is at most about 0.8 mean(w) (half-normal); kappa covers
/// other orders on adversarial data, lambda / sqrt(N) the sampling spread of a small output
/// (N = 1: 12 standard deviations). Calibrated in docs/results/precision_rule.md.
inline constexpr double kPrecisionKappa = 4.0;
inline constexpr double kPrecisionLambda = 8.0;

/// The rounding test, beside the precision rule and over the same N elements: sharp where
/// D is much coarser than the accumulator (BF16/FP16/FP8 outputs), whose rounding hides any
/// accumulation loss from a mean of errors. A kernel whose unrounded result y_e = x_e +
/// delta_e is rounded to nearest returns d_e = RN_D(y_e), so when d_e != RN_D(x_e) the
/// exact x_e lies outside d_e's rounding interval R(d_e) by at most |delta_e|:
///   beyond_e = |d_e - x_e| - gap_e / 2 = dist(x_e, R(d_e)) <= |delta_e|
/// (gap_e: from d_e to its neighbour on x_e's side). Element e is misrounded when
///   beyond_e > reach_e = kMisroundReach s_e + 4 u_acc c_e,
/// an accumulation error of twice the precision rule's kappa times its own scale (plus the
/// epilogue's 4 ulp), which a correct accumulation reaches with probability far below
/// kMisroundRate. The case fails ("D:misrounded") when more than misrounded_allowance(N)
/// elements are misrounded: N p + 6 sqrt(N p) + 6 with p = kMisroundRate, beyond what
/// that rate gives at six standard deviations. A kernel losing precision below D's own
/// (narrow split-K partials under a BF16 D) crosses boundaries at a rate of about
/// E|delta| / ulp_D, percents; a kernel truncating its output (not rounding to nearest)
/// misrounds about half of its elements.
inline constexpr double kMisroundReach = 2 * kPrecisionKappa;
inline constexpr double kMisroundRate = 0x1p-12;
inline std::int64_t misrounded_allowance(std::int64_t n) {
  const double np = static_cast<double>(n) * kMisroundRate;
  return static_cast<std::int64_t>(np + 6 * std::sqrt(np) + 6);
}

/// The bias test, beside the precision rule and over its N sampled elements (where
/// OutputComparison::bias_allowance is finite; for ReLU outputs those with |x_e| above their
/// tolerance, so that the clamp cannot decide a sign), where D keeps at least the
/// accumulator's precision (a coarser D's rounding sets the errors' size and direction on
/// discrete inputs, FP8 sums rounded to BF16 say; the rounding test judges those). A truncating input conversion, a wrong
/// rounding mode or a dropped correction term moves every element the same way, within the
/// tolerance of each: the mean shows it. With x'_e = x_e + delta_e (the exact result of the
/// declared input rounding) and t_e = (d_e - x'_e) / c_e, two sums:
///   T_signed = sum_e t_e        T_zero = sum_e t_e sign(x'_e)   (toward zero: negative)
/// A correct kernel's error is a systematic part, at most beta_e (absorption of small terms,
/// round-toward-zero accumulation, promotion; check/ops/gemm.cpp), and a random part of
/// scale rho_e (accumulation), ulp_D(x_e) / sqrt(12) (D's rounding) and 2 u_acc |x_e| (the
/// epilogue's). The case fails ("D:biased") when either |T| exceeds
///   kBiasKappa sum_e beta_e / c_e + 6 sqrt(N / N_distinct) sqrt(sum_e (rho_e^2 + ...) / c_e^2)
///   + sum_e (ulp_D(0) / 2) / c_e
/// with N_distinct the number of distinct x_e (equal results make equal errors: the
/// random parts are independent only across distinct ones). Six standard deviations of the
/// random part plus twice the systematic one: a correct kernel raises it with a probability
/// far below 10^-8 per case (docs: measured over 20 seeds of every CPU model).
inline constexpr double kBiasKappa = 2.0;
inline constexpr std::int64_t kBiasMinElements = 16;

ErrorMetrics analyze(const OutputComparison& cmp);
/// Element e (logical index) as WorstElement shows it.
WorstElement describe_element(const OutputComparison& cmp, std::int64_t e);

/// The dtype- and K-aware tolerance model. An element passes when
///   |d_e - x_e| <= (2 u_in + u_in^2 + gamma(n + 4, u_acc)) c_e + (1 + gamma(n + 4, u_acc)) a_e
///                  + u_D |x_e| + (n + 4) eta_acc + ulp_of(D, 0) / 2
/// where n is the reduction length (GEMM K; attention seq_kv for the P V product), the
/// + 4 covers the epilogue's operations (scale, alpha, beta C, bias), u_acc =
/// 2^(1 - accumulator_bits) is one unit in the last place of the accumulator (so a
/// truncating, RZ, accumulator is covered too), u_in = 2^(1 - input_bits) when the kernel
/// rounds its inputs internally (e.g. FP32 inputs on TF32 tensor cores: input_bits = 11),
/// else 0, eta_acc the accumulator's smallest subnormal (each operation's absolute error
/// where its result underflows: products and the epilogue's operations round there in
/// fixed units, up to a full one when truncating; 2^-149 for FP32), u_D is D's unit roundoff 2^-(frac_bits + 1), and gamma(n, u) = n u / (1 - n u)
/// (Higham's deterministic bound; +inf when n u >= 1), or, with probabilistic = true,
/// lambda sqrt(n) u with lambda = 4 (Higham & Mary 2019: holds with probability
/// >= 1 - 2 exp(-lambda^2 / 2) ~ 0.9993 per element, for independent rounding errors).
///
/// a_e (OutputComparison::input_abs, GEMM) is the input rounding's absolute part. Rounding
/// keeps the exponent range: an input below the normal range of input_bits moves by up to
/// eta_in = 2^(emin + 1 - input_bits) whatever its size (TF32 from FP32: 2^-136, twice the
/// 2^-137 of rounding to nearest, so truncation is covered), not by u_in times it. With
/// a' = a + alpha, |alpha| <= u_in |a| (a normal) or <= eta_in (a such a subnormal; 0 if it
/// is a multiple of eta_in, i.e. exact), and likewise b', a'b' - ab = alpha b + a beta +
/// alpha beta gives per product
///   |a'b' - ab| <= (2 u_in + u_in^2) |ab| + eta_in (1 + u_in) (s_a |b| + s_b |a|) + s_a s_b eta_in^2
/// (s_a = 1 where a is such a subnormal, else 0): c_e = sum |a b| cannot bound the last two
/// terms (a = 2^-137 + 2^-149, b = 2^100: |a'b' - ab| ~ 2^-37 = 2^9 u_in |ab|). a_e is their
/// sum over k, scaled as c_e; 1 + gamma since the accumulator sums the rounded products.
struct ToleranceModel {
  int accumulator_bits = 24;  ///< precision (incl. the implicit bit) of the running sum
  /// Products per promotion of the running sum to an FP32 accumulator (KernelTraits::
  /// promote); 0: never. gamma(n) is then that of chunks of `promote` at accumulator_bits,
  /// added in FP32.
  int promote = 0;
  /// The accumulation rounds to nearest (KernelTraits::rounds_to_nearest): the precision
  /// rule's scale has no round-toward-zero bias term.
  bool nearest = false;
  int input_bits = 0;         ///< 0: inputs used as given; else the internal input precision
  double accumulator_eta = 0x1p-149;  ///< the accumulator format's smallest subnormal
  int p_bits = 0;             ///< attention: the precision P is rounded to before P V (0: none)
  /// How the kernel rounds its inputs to input_bits (KernelTraits::input_rounding).
  Rounding input_rounding = Rounding::NearestAway;
  /// The rule that judges, named for reports: the admitted arithmetic the bound is that of
  /// (the loosest the default admits, or the kernel's declared one), e.g. "default: FP32
  /// accumulation in any order, P rounded to bf16".
  std::string rule;
  /// GEMM with a GELU epilogue: KernelTraits::activation_error, the absolute error of the
  /// kernel's tanh/erf; the bound adds activation_error c_e / 2 (c_e >= |v|, the
  /// activation's input). 0: none.
  double activation_error = 0;
  /// GEMM with a bias or a GELU into a narrow D: alpha acc + beta C may be rounded to D's
  /// format before the bias or the GELU (cuBLASLt, measured): D's unit roundoff times the
  /// activation's largest slope (1, GELU 1.13). The bound adds it times c_e (c_e >=
  /// |alpha acc + beta C|); 0: no such rounding.
  double epilogue_rounding = 0;
  bool probabilistic = false;
  double lambda = 4.0;
  /// gamma(n, u_acc) as above (or lambda sqrt(n) u_acc when probabilistic).
  double gamma(std::int64_t n) const;
  /// The bound for one element (input_abs: a_e).
  double bound(double condition, double exact_abs, Format out, std::int64_t n, double input_abs = 0) const;
  /// bound()'s coefficients for one output format and n, computed once for many elements:
  /// terms(out, n).bound(c, x, a) == bound(c, x, out, n, a), bit for bit.
  struct Terms {
    double condition = 0, input_abs = 0, exact_abs = 0, accumulator_floor = 0, output_floor = 0;
    double bound(double c, double x, double a = 0) const {
      return condition * c + (a > 0 ? input_abs * a : 0.0) + exact_abs * x + accumulator_floor + output_floor;
    }
  };
  Terms terms(Format out, std::int64_t n) const;
};

/// The baseline-relative rule: the kernel's max normalised error must be at most
/// factor x that of a CPU model at the kernel's nominal precision (e.g. cpu.fp32_seq) on
/// the same inputs, plus D's unit roundoff (so that an exact model does not demand an exact
/// kernel): max_normalised <= factor * model_max_normalised + u_D. A kernel worse than the
/// model by more than factor is worse than its nominal precision explains.
struct BaselineRule {
  std::string model = "cpu.fp32_seq";
  double factor = 8.0;
};

/// Pass/fail of one run with every reason it failed. Each reason has a check token next to
/// it (checks[i] for reasons[i]), what a failure's signature is made of:
///   OUTPUT:CHECK@REGION for element checks: CHECK one of tolerance, unexpected_nan,
///     unexpected_inf, missed_nonfinite, mismatched_nonfinite, baseline_rule; REGION edge
///     (every failing element in the output's last row or last column: a boundary or
///     remainder bug), interior (some failing element elsewhere) or any (the output has a
///     single row or column, so the two cannot be told apart)
///   OUTPUT:precision, OUTPUT:misrounded, OUTPUT:biased (the precision rule, the rounding
///   test and the bias test above:
///   statistics of the whole output)
///   OUTPUT:unwritten, OUTPUT:padding_written, inputs_modified (the write audit)
///   relation:NAME (a metamorphic relation that did not hold)
///   status:crashed, status:timed_out, status:failed (no output to judge)
struct Verdict {
  bool passed = true;
  std::vector<std::string> reasons;  ///< e.g. "3 elements exceed the tolerance (worst 41.2x)"
  std::vector<std::string> checks;   ///< e.g. "D:tolerance@interior", one per reason
  /// The failing element that shows the failure best (logical index; -1: no element
  /// failed): the first non-finite failure, else the one furthest beyond its bound (error /
  /// bound, not the normalised error, which a correctly rounded element can exceed), else
  /// the first unwritten one.
  std::int64_t worst_element = -1;
  /// The precision rule's mean(z) / allowance (analyze.hpp; > 1 fails), NaN where it does
  /// not apply: the margin a passing case had (records: notes["precision_ratio"]).
  double precision_ratio = NAN;
  /// The rounding test's count of misrounded elements and the most it allows (analyze.hpp;
  /// -1: the test does not apply; records: notes["misrounded"] = "count/allowed").
  std::int64_t misrounded = -1, misrounded_allowed = -1;
  /// The bias test's mean error (the larger of the plain and toward-zero statistics) and the
  /// most a correct kernel's reaches, per element normalised (NaN: not applied; records:
  /// notes["bias"] = "mean/allowed").
  double bias = NAN, bias_allowed = NAN;
  /// Records a failure: passed = false, the reason and its check token.
  void fail(std::string check, std::string reason) {
    passed = false;
    checks.push_back(std::move(check));
    reasons.push_back(std::move(reason));
  }
};

/// The signature of a verdict: its check tokens, sorted and unique, joined by " + " ("" for
/// a pass). Two failures are the same failure when their tokens agree check for check, a
/// region "any" agreeing with every region, leaving out the statistical checks (precision,
/// misrounded) beside other ones; two failures of statistical checks only are the same when
/// they name the same outputs (see same_failure).
std::string failure_signature(const Verdict& v);
/// Whether signatures a and b name the same failure (above).
bool same_failure(const std::string& a, const std::string& b);

/// Applies the tolerance model (element by element: cmp.allowed when the op gives it, else
/// tol.bound with n), the NaN/Inf rules, and the write audit (unwritten or padding-written
/// elements fail). baseline_max_normalised < 0: no baseline rule.
Verdict judge(const OutputComparison& cmp, const ErrorMetrics& m, const ToleranceModel& tol, std::int64_t n,
              double baseline_max_normalised = -1.0, const BaselineRule& rule = {});

/// analyze() and judge() in one pass over the elements, what the check path calls (an
/// element's rounding, class and error are found once for both): metrics equal to
/// analyze(cmp) with output, unwritten and padding_written taken from audit, and the verdict
/// judge(cmp, those metrics, tol, n, baseline_max_normalised, rule) gives.
struct Assessment {
  ErrorMetrics metrics;
  Verdict verdict;
};
Assessment analyze_and_judge(const OutputComparison& cmp, const ToleranceModel& tol, std::int64_t n,
                             const ErrorMetrics& audit, double baseline_max_normalised = -1.0,
                             const BaselineRule& rule = {});

}  // namespace ulpgate
