// Metrics and the tolerance model against cases with known answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "check/analyze.hpp"
#include "core/format_mpfr.hpp"

using namespace ulpgate;

namespace {

RefValue ref(double x) {
  if (std::isnan(x)) return RefValue::nan();
  if (std::isinf(x)) return RefValue::infinity(x < 0);
  Mpfr m(53, x);
  return RefValue::from_exact(m);
}

// A 1 x 1 x n FP16 output with the given kernel values, exact values and conditions.
OutputComparison fp16(std::vector<double> got, std::vector<double> exact, std::vector<double> cond = {}) {
  OutputComparison c;
  c.format = Format::FP16;
  c.shape = {1, 1, static_cast<std::int64_t>(got.size())};
  for (double g : got) c.got.push_back(encode(Format::FP16, g));
  for (double x : exact) c.exact.push_back(ref(x));
  c.condition = cond.empty() ? std::vector<double>(got.size(), 1.0) : cond;
  return c;
}

}  // namespace

TEST(Analyze, CorrectlyRoundedOutputIsPerfect) {
  const double t = 1.0 + 0x1p-11 + 0x1p-20;  // just above a tie: rounds up
  const auto cmp = fp16({1.0 + 0x1p-10, 2.0, -3.0}, {t, 2.0, -3.0});
  const ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.elements, 3);
  EXPECT_EQ(m.compared, 3);
  EXPECT_EQ(m.exact_matches, 3);
  EXPECT_EQ(m.max_ulp_distance, 0u);
  EXPECT_EQ(m.max_ulp, 0.5 - 0x1p-10);  // (1 + 2^-10 - t) / 2^-10
  EXPECT_EQ(m.max_abs, 0x1p-11 - 0x1p-20);
  EXPECT_EQ(m.ulp_histogram[0], 3);
  EXPECT_TRUE(judge(cmp, m, ToleranceModel{}, 1).passed);
}

TEST(Analyze, KnownErrors) {
  // element 0: exact 1 + 2^-12, got 1 - 2^-11 (one ulp below 1): error -(2^-11 + 2^-12)
  // element 1: exact 8, got 8 + 3 ulps (ulp 2^-7), condition 16
  const auto cmp = fp16({1.0 - 0x1p-11, 8.0 + 3 * 0x1p-7}, {1.0 + 0x1p-12, 8.0}, {2.0, 16.0});
  const ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.exact_matches, 0);
  EXPECT_EQ(m.max_abs, 3 * 0x1p-7);
  EXPECT_EQ(m.mean_abs, (0x1p-11 + 0x1p-12 + 3 * 0x1p-7) / 2);
  EXPECT_EQ(m.max_rel, 3 * 0x1p-7 / 8);
  EXPECT_EQ(m.max_normalised, 3 * 0x1p-11);  // element 1: 3 * 2^-7 / 16 (element 0: 3 * 2^-12 / 2)
  EXPECT_EQ(m.max_ulp, 3.0);
  EXPECT_EQ(m.bias_ulp, (-(0x1p-11 + 0x1p-12) / 0x1p-10 + 3.0) / 2);
  EXPECT_EQ(m.max_ulp_distance, 3u);  // element 1; element 0 is one code below its rounding, 1.0
  EXPECT_EQ(m.ulp_histogram[ulp_histogram_bin(0.75)], 1);
  EXPECT_EQ(m.ulp_histogram[ulp_histogram_bin(3.0)], 1);
  EXPECT_EQ(m.worst.index, (std::vector<std::int64_t>{0, 0, 1}));  // largest normalised error
  EXPECT_EQ(m.worst.got, "0x4803 (0x1.00cp+3)");
  EXPECT_EQ(m.worst.expected, "0x4800 (0x1p+3)");
  EXPECT_EQ(m.worst.exact, "0x1p+3 + 0x0p+0");
  EXPECT_EQ(m.worst.condition, 16.0);
  EXPECT_EQ(m.worst.ulp, 3.0);
  const double normwise = std::sqrt(std::pow(0x1p-11 + 0x1p-12, 2) + std::pow(3 * 0x1p-7, 2)) /
                          std::sqrt(std::pow(1.0 + 0x1p-12, 2) + 64.0);
  EXPECT_DOUBLE_EQ(m.normwise, normwise);
}

TEST(Analyze, HistogramBins) {
  EXPECT_EQ(ulp_histogram_bin(0.0), 0);
  EXPECT_EQ(ulp_histogram_bin(0.5), 0);
  EXPECT_EQ(ulp_histogram_bin(0.51), 1);
  EXPECT_EQ(ulp_histogram_bin(1.0), 1);
  EXPECT_EQ(ulp_histogram_bin(1.5), 2);
  EXPECT_EQ(ulp_histogram_bin(2.0), 2);
  EXPECT_EQ(ulp_histogram_bin(1024.0), 11);
  EXPECT_EQ(ulp_histogram_bin(1e12), kUlpHistogramBins - 1);
  for (int b = 0; b < kUlpHistogramBins; ++b) {
    const auto [lo, hi] = ulp_histogram_edges(b);
    if (b > 0) { EXPECT_EQ(ulp_histogram_bin(std::nextafter(lo, INFINITY)), b) << b; }
    if (std::isfinite(hi)) { EXPECT_EQ(ulp_histogram_bin(hi), b) << b; }
  }
}

TEST(Analyze, NonFiniteClassification) {
  const double inf = INFINITY, nan = NAN;
  //            expected NaN, overflow->Inf, unexp NaN, unexp Inf, missed, mismatched
  const auto cmp = fp16({nan, inf, nan, -inf, 1.0, -inf}, {nan, 70000.0, 1.0, 1.0, inf, inf});
  const ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.expected_nonfinite, 2);
  EXPECT_EQ(m.unexpected_nan, 1);
  EXPECT_EQ(m.unexpected_inf, 1);
  EXPECT_EQ(m.missed_nonfinite, 1);
  EXPECT_EQ(m.mismatched_nonfinite, 1);
  EXPECT_EQ(m.compared, 0);
  EXPECT_EQ(m.worst.index[2], 2);  // the first non-finite mismatch
  const Verdict v = judge(cmp, m, ToleranceModel{}, 1);
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.reasons.size(), 4u);
  // A finite exact value beyond FP16's range that the kernel returns as Inf is right.
  const auto ok = fp16({inf, -inf}, {65520.0, -1e9});
  EXPECT_TRUE(judge(ok, analyze(ok), ToleranceModel{}, 1).passed);
}

// An exact value that is infinite (an Inf input; attention's LSE of a row without a key) is
// missed by any finite output, however the op's per-element bound is given (ToleranceModel
// terms, or OutputComparison::allowed): the bound's u_D |x_e| term is infinite there and
// must not accept it.
TEST(Analyze, FiniteOutputForAnInfiniteExactValueIsMissed) {
  for (const bool allowed : {false, true}) {
    auto cmp = fp16({0.0, -65504.0, 1.0}, {0.0, 0.0, 1.0});
    cmp.exact[0] = RefValue::infinity(true), cmp.exact[1] = RefValue::infinity(true);
    if (allowed) cmp.allowed = {0.5, 0.5, 0.5};
    const ErrorMetrics m = analyze(cmp);
    EXPECT_EQ(m.missed_nonfinite, 2) << allowed;
    const Verdict v = judge(cmp, m, ToleranceModel{}, 1);
    EXPECT_FALSE(v.passed) << allowed;
    ASSERT_EQ(v.checks.size(), 1u) << allowed;
    EXPECT_EQ(v.checks[0].rfind("out:missed_nonfinite", 0), 0u) << v.checks[0];
  }
}

// A ReLU's max(x, 0) may return +0 for x = NaN (IEEE 754-2008 maxNum, CUDA's fmaxf:
// cuBLASLt's RELU epilogue on the H200) or propagate the NaN (PyTorch): both are right for
// a ReLU output. Any other finite value for a NaN is still a missed NaN, and without a ReLU
// +0 is one too.
TEST(Analyze, ReluOutputMayTurnNanIntoPositiveZero) {
  const double nan = NAN;
  auto cmp = fp16({0.0, nan, -0.0, 1.0}, {nan, nan, nan, nan});
  EXPECT_EQ(analyze(cmp).missed_nonfinite, 3);
  cmp.relu_output = true;
  const ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.expected_nonfinite, 2);  // +0 and NaN
  EXPECT_EQ(m.missed_nonfinite, 2);    // -0 and 1.0
  EXPECT_FALSE(judge(cmp, m, ToleranceModel{}, 1).passed);
  const auto ok = [&] {
    auto c = fp16({0.0, nan}, {nan, nan});
    c.relu_output = true;
    return c;
  }();
  EXPECT_TRUE(judge(ok, analyze(ok), ToleranceModel{}, 1).passed);
}

// Beyond D's range: FP16's max finite value (a round-toward-zero overflow) is an overflow,
// not a missed Inf, but only with the exact value's sign; FP8 outputs saturate, and the
// saturated value is judged as what it is: correctly rounded, error 0.
TEST(Analyze, SaturationAtTheTopOfTheRange) {
  const auto cmp = fp16({65504.0, -65504.0, 65504.0}, {1e6, -70000.0, -1e6});
  const ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.overflowed, 2);
  EXPECT_EQ(m.missed_nonfinite, 1);

  OutputComparison e;
  e.format = Format::E4M3;
  e.shape = {1, 1, 2};
  e.got = {encode(Format::E4M3, -448.0), encode(Format::E4M3, 448.0)};
  e.exact = {ref(-1444.0), ref(416.0)};
  e.condition = {3150.0, 416.0};
  const ErrorMetrics me = analyze(e);
  EXPECT_EQ(me.compared, 2);
  EXPECT_EQ(me.max_abs, 32.0);  // only the second element errs, by one E4M3 unit
  EXPECT_EQ(me.max_ulp_distance, 1u);
  const Verdict v = judge(e, me, ToleranceModel{}, 16);
  ASSERT_FALSE(v.passed);  // 416 -> 448 is a real error
  ASSERT_EQ(v.reasons.size(), 1u);
  EXPECT_NE(v.reasons[0].find("1 elements exceed"), std::string::npos) << v.reasons[0];
}

// An intermediate beyond the accumulator's range: Inf - Inf may give NaN, a saturating
// accumulator keeps going, and the epilogue (alpha, ReLU, GELU) makes anything of that. For a
// finite exact result, any d_e is then accepted where d_e or r_e is not finite; a NaN input
// (x_e NaN) is still judged.
TEST(Analyze, OverflowedAccumulator) {
  const double inf = INFINITY, nan = NAN;
  auto cmp = fp16({0.0, -0.0, inf, 0.0, 3.0, 0.0}, {1e6, 1e6, 1.0, 1e6, 1.0, nan});
  cmp.accumulated = {1e6, 1e6, 1e6, 100.0, 1e6, 1e6};  // the fourth one's terms fit FP16
  cmp.accumulator_max = 65504.0;
  ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.overflowed, 4);  // 3 for 1 as well: finite, but not an error worth measuring
  EXPECT_EQ(m.missed_nonfinite, 2);  // the fourth, and the NaN input's
  // Overflowed elements take no part in the error statistics (their max ULP errors of 1e78
  // would switch the gate's ULP check off).
  EXPECT_EQ(m.compared, 0);
  EXPECT_EQ(m.max_ulp, 0.0);
  EXPECT_EQ(m.max_normalised, 0.0);
  EXPECT_EQ(m.ulp_histogram[kUlpHistogramBins - 1], 0);
  const Verdict v = judge(cmp, m, ToleranceModel{}, 4);
  ASSERT_EQ(v.reasons.size(), 1u);
  EXPECT_EQ(v.reasons[0], "2 missed NaN/Inf (the exact result is not finite)");

  // An Inf input (x_e infinite): NaN is the overflow's Inf - Inf only where the finite terms
  // could overflow.
  auto in = fp16({nan, nan, 1.0}, {inf, inf, inf});
  in.accumulated = {1e6, 100.0, 1e6};
  in.accumulator_max = 65504.0;
  m = analyze(in);
  EXPECT_EQ(m.overflowed, 1);
  EXPECT_EQ(m.mismatched_nonfinite, 1);
  EXPECT_EQ(m.missed_nonfinite, 1);

  // FP64: the intermediate bound is a double, +Inf past DBL_MAX, which is above FP64's
  // accumulator_max (a NaN from FP64 terms that overflow is accepted).
  OutputComparison d;
  d.format = Format::FP64;
  d.shape = {1, 1, 1};
  d.got = {encode(Format::FP64, NAN)};
  d.exact = {ref(0x1.4p1023)};
  d.condition = d.accumulated = {INFINITY};
  d.accumulator_max = info(Format::FP64).max_finite();
  EXPECT_EQ(analyze(d).overflowed, 1);
}

// Near D's overflow threshold an ill-conditioned sum may land on either side: Inf where r_e
// is finite, or a finite d_e where x_e overflows, pass when the tolerance interval around
// x_e reaches across the threshold (65520 for FP16) on d_e's side, and fail otherwise.
TEST(Analyze, OverflowThresholdWithinTolerance) {
  const double inf = INFINITY;
  //                      crosses, wrong side, too far, finite near, finite far
  auto cmp = fp16({inf, -inf, inf, 65504.0, 60000.0}, {-0.5, -0.5, -0.5, 65536.0, 65536.0},
                  {1e9, 1e9, 1e3, 1e3, 1e3});
  const ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.unexpected_inf, 3);
  EXPECT_EQ(m.missed_nonfinite, 1);  // 65504 for 65536 is the saturated value: overflowed
  EXPECT_EQ(m.overflowed, 1);
  // FP32 accumulation, n = 1000: bound = gamma(1004, 2^-23) c + ... ~ 1.2e-4 c.
  const Verdict v = judge(cmp, m, ToleranceModel{}, 1000);
  ASSERT_EQ(v.reasons.size(), 2u);
  EXPECT_EQ(v.reasons[0], "1 unexpected Inf");  // the c = 1e3 one: 0.12 of reach
  EXPECT_EQ(v.reasons[1], "1 missed NaN/Inf (the exact result is not finite)");
}

TEST(Analyze, ErrorMapLocatesTheBadTile) {
  OutputComparison c;
  c.format = Format::FP32;
  c.shape = {2, 128, 128};  // two batches: the map folds them
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 128; ++i)
      for (std::int64_t j = 0; j < 128; ++j) {
        const bool bad = b == 1 && i == 100 && j == 3;
        c.got.push_back(encode(Format::FP32, bad ? 1.5 : 1.0));
        c.exact.push_back(ref(1.0));
        c.condition.push_back(4.0);
      }
  const ErrorMetrics m = analyze(c);
  EXPECT_EQ(m.map.cell_rows, 2);
  EXPECT_EQ(m.map.cell_cols, 2);
  EXPECT_EQ(m.map.grid_rows, 64);
  ASSERT_EQ(m.map.max_normalised.size(), 64u * 64u);
  for (std::int64_t r = 0; r < 64; ++r)
    for (std::int64_t col = 0; col < 64; ++col)
      EXPECT_EQ(m.map.max_normalised[r * 64 + col], r == 50 && col == 1 ? 0.125 : 0.0) << r << "," << col;
  EXPECT_EQ(m.worst.index, (std::vector<std::int64_t>{1, 100, 3}));
  EXPECT_EQ(m.max_normalised, 0.125);
}

TEST(Analyze, ToleranceModelIsKAndFormatAware) {
  ToleranceModel t;  // FP32 accumulation: u_acc = 2^-23
  const double k = 4096 + 4, u = 0x1p-23;
  EXPECT_DOUBLE_EQ(t.bound(10.0, 2.0, Format::BF16, 4096), k * u / (1 - k * u) * 10.0 + 0x1p-8 * 2.0 + 0x1p-133 / 2);
  t.input_bits = 11;  // TF32 inputs
  const double ui = 0x1p-10;
  EXPECT_DOUBLE_EQ(t.bound(1.0, 0.0, Format::FP32, 4096), 2 * ui + ui * ui + k * u / (1 - k * u) + 0x1p-149 / 2);
  // The absolute part a_e of rounding subnormal inputs (2^-136 units in TF32), which the
  // accumulator then sums: (1 + gamma(K + 4)) a_e.
  EXPECT_DOUBLE_EQ(t.bound(0.0, 0.0, Format::FP32, 1, 0x1p-130),
                   (1 + 5 * u / (1 - 5 * u)) * 0x1p-130 + 5 * 0x1p-149 + 0x1p-150);
  t = ToleranceModel{};
  t.probabilistic = true;
  EXPECT_DOUBLE_EQ(t.bound(1.0, 0.0, Format::FP32, 4092), 4.0 * 64.0 * u + 0x1p-149 / 2);
  t = ToleranceModel{};
  t.accumulator_bits = 8;  // n u >= 1: no bound
  EXPECT_EQ(t.bound(1.0, 0.0, Format::FP32, 1000), INFINITY);
  // Underflow: K = 1 plus 4 epilogue operations, each up to one FP32 subnormal unit off.
  t = ToleranceModel{};
  EXPECT_EQ(t.bound(0.0, 0.0, Format::FP32, 1), 5 * 0x1p-149 + 0x1p-150);
  t.accumulator_eta = 0x1p-24;  // an FP16 accumulator, FP32 output
  EXPECT_EQ(t.bound(0.0, 0.0, Format::FP32, 12), 16 * 0x1p-24 + 0x1p-150);

  // An element just inside and one just outside the bound.
  ToleranceModel tight;
  tight.accumulator_bits = 24;
  const double c = 1.0, b = tight.bound(c, 1.0, Format::FP32, 12);  // ~16 * 2^-23
  const auto inside = [&](double err) {
    OutputComparison o;
    o.format = Format::FP32;
    o.shape = {1, 1, 1};
    o.got = {encode(Format::FP32, 1.0 + err)};
    o.exact = {ref(1.0)};
    o.condition = {c};
    return judge(o, analyze(o), tight, 12).passed;
  };
  EXPECT_TRUE(inside(std::ldexp(std::floor(std::ldexp(b, 23)), -23)));
  EXPECT_FALSE(inside(std::ldexp(std::floor(std::ldexp(b, 23)) + 1, -23)));
}

TEST(Analyze, BaselineRule) {
  const auto cmp = fp16({1.0 + 0x1p-10}, {1.0}, {1.0});  // normalised error 2^-10
  const ErrorMetrics m = analyze(cmp);
  ToleranceModel loose;
  loose.accumulator_bits = 11;
  const BaselineRule rule{"cpu.fp32_seq", 8.0};
  // allowed = 8 * baseline + 2^-11
  EXPECT_TRUE(judge(cmp, m, loose, 1, 0x1p-14, rule).passed);   // 2^-11 + 2^-11 >= 2^-10
  EXPECT_FALSE(judge(cmp, m, loose, 1, 0x1p-15, rule).passed);  // 2^-12 + 2^-11 < 2^-10
  EXPECT_TRUE(judge(cmp, m, loose, 1).passed);                  // no baseline given
}

// The precision rule on known answers: an output whose every element is off by the same
// normalised error e fails exactly when e exceeds the rule's allowance.
TEST(PrecisionRule, FailsExactlyAboveTheAllowance) {
  for (const int n : {1, 100, 10000}) {
    OutputComparison cmp;
    cmp.format = Format::FP64;  // D's rounding does not blur the figures
    cmp.shape = {1, 1, n};
    const double c = 1.0, s = 0x1p-20;  // condition term and precision scale of every element
    const double allowed = (kPrecisionKappa + kPrecisionLambda / std::sqrt(n)) * s + 4 * 0x1p-23;
    for (const double factor : {0.99, 1.01}) {
      const double x = 1000.0, err = factor * allowed * c;
      cmp.got.assign(n, encode(Format::FP64, x + err));
      cmp.exact.assign(n, ref(x));
      cmp.condition.assign(n, c);
      cmp.precision_scale.assign(n, s);
      ToleranceModel tol;  // 24-bit accumulator; the worst-case bound at n = 2^20 lets 1e-1 through
      ErrorMetrics m = analyze(cmp);
      m.output = "D";
      const Verdict v = judge(cmp, m, tol, 1 << 20);
      EXPECT_EQ(v.passed, factor < 1) << "n " << n << " factor " << factor << ": " << failure_signature(v);
      if (!v.passed) {
        EXPECT_EQ(failure_signature(v), "D:precision");
      }
    }
  }
}

// The rounding test (analyze.hpp): BF16 outputs whose exact value lies t beyond the
// midpoint 1 + 2^-8 between 1 and 1 + 2^-7, returned as 1 (the wrong side). Each counts
// exactly when t > reach; the case fails exactly when more than misrounded_allowance(N)
// count; the precision rule's mean does not see them.
TEST(RoundingTest, FailsExactlyAboveTheAllowedCountOfMisroundings) {
  const double s = 0x1p-20, c = 1.0, reach = kMisroundReach * s + 4 * 0x1p-23 * c;
  for (const int n : {100, 10000}) {
    const std::int64_t most = misrounded_allowance(n);
    ASSERT_LT(static_cast<double>(most), 0.002 * n + 7);
    for (const double t_factor : {0.99, 1.01})
      for (const std::int64_t count : {most, most + 1}) {
        OutputComparison cmp;
        cmp.format = Format::BF16;
        cmp.shape = {1, 1, n};
        cmp.condition.assign(n, c);
        cmp.precision_scale.assign(n, s);
        cmp.got.assign(n, encode(Format::BF16, 1.5));
        cmp.exact.assign(n, ref(1.5));
        const double x = 1 + 0x1p-8 + t_factor * reach;  // RN_BF16(x) = 1 + 2^-7
        for (std::int64_t e = 0; e < count; ++e) cmp.got[e] = encode(Format::BF16, 1.0), cmp.exact[e] = ref(x);
        ErrorMetrics m = analyze(cmp);
        m.output = "D";
        const Verdict v = judge(cmp, m, ToleranceModel{}, 1024);
        const bool fails = t_factor > 1 && count > most;
        EXPECT_EQ(v.passed, !fails) << "n " << n << " t " << t_factor << " count " << count << ": " << failure_signature(v);
        if (fails) {
          EXPECT_EQ(failure_signature(v), "D:misrounded");
        }
      }
  }
}

// A BF16 output truncated instead of rounded to nearest fails the rounding test (and only
// it: every error is within the per-element bound); the same values rounded to nearest pass.
TEST(RoundingTest, TruncatedOutputFailsRoundedToNearestPasses) {
  const int n = 4096;
  for (const Rounding mode : {Rounding::NearestEven, Rounding::TowardZero}) {
    OutputComparison cmp;
    cmp.format = Format::BF16;
    cmp.shape = {1, 1, n};
    cmp.condition.assign(n, 1.0);
    cmp.precision_scale.assign(n, 0x1p-24);
    for (int e = 0; e < n; ++e) {
      // In [1.75, 2), where the worst-case bound u_D |x| is above 0.875 ulp: x sits 0.15 to
      // 0.85 ulp above a code, never near a midpoint, so truncation stays within the bound.
      const double x = 1.75 + std::ldexp(e % 31 + 0.15 + 0.7 * (e % 7) / 6, -7);
      cmp.exact.push_back(ref(x));
      cmp.got.push_back(encode(Format::BF16, x, mode));
    }
    ErrorMetrics m = analyze(cmp);
    m.output = "D";
    const Verdict v = judge(cmp, m, ToleranceModel{}, 1024);
    EXPECT_EQ(v.passed, mode == Rounding::NearestEven) << failure_signature(v);
    if (!v.passed) {
      EXPECT_EQ(failure_signature(v), "D:misrounded");
    }
  }
}

// The statistical checks (precision, misrounded) depend on the output's size: beside other
// checks they are left out of the comparison, alone they match each other per output.
TEST(SameFailure, StatisticalChecksFollowTheOtherChecks) {
  EXPECT_TRUE(same_failure("D:misrounded + D:tolerance@interior", "D:tolerance@interior"));
  EXPECT_TRUE(same_failure("D:precision + D:tolerance@any", "D:misrounded + D:tolerance@edge"));
  EXPECT_TRUE(same_failure("D:misrounded", "D:precision"));
  EXPECT_TRUE(same_failure("D:misrounded", "D:misrounded + D:precision"));
  EXPECT_FALSE(same_failure("D:misrounded", "D:tolerance@interior"));
  EXPECT_FALSE(same_failure("D:misrounded", "O:misrounded"));
  EXPECT_FALSE(same_failure("D:misrounded + D:tolerance@interior", "D:tolerance@interior + D:unexpected_nan@edge"));
  EXPECT_FALSE(same_failure("D:tolerance@interior", "D:tolerance@edge"));
  EXPECT_TRUE(same_failure("D:tolerance@any", "D:tolerance@edge"));
}

// Elements without a reference (attention's sampled queries): no statistic counts them and
// no value of theirs fails, but a NaN or Inf there still does, unless their accumulator
// may have overflowed.
TEST(Analyze, UnreferencedElementsAreJudgedOnlyForNaNAndInf) {
  const double inf = INFINITY, nan = NAN;
  //                 ref'd, far off, NaN, -Inf, NaN (overflow marked)
  auto cmp = fp16({1.0, 123.0, nan, -inf, nan}, {1.0, 0.0, 0.0, 0.0, 0.0});
  cmp.unreferenced = {0, 1, 1, 1, 1};
  cmp.accumulated = {1.0, 1.0, 1.0, 1.0, 1e6};
  cmp.accumulator_max = 65504.0;
  const ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.compared, 1);
  EXPECT_EQ(m.max_normalised, 0.0);  // 123 against no reference is no error
  EXPECT_EQ(m.unexpected_nan, 1);
  EXPECT_EQ(m.unexpected_inf, 1);
  EXPECT_EQ(m.overflowed, 0);
  const Verdict v = judge(cmp, m, ToleranceModel{}, 1);
  EXPECT_FALSE(v.passed);
  ASSERT_EQ(v.reasons.size(), 2u);
  // The same without the non-finite ones passes: the far-off value is not judged.
  auto fine = fp16({1.0, 123.0}, {1.0, 0.0});
  fine.unreferenced = {0, 1};
  EXPECT_TRUE(judge(fine, analyze(fine), ToleranceModel{}, 1).passed);
  fine.unreferenced.clear();  // with its reference (0), 123 fails
  EXPECT_FALSE(judge(fine, analyze(fine), ToleranceModel{}, 1).passed);
}

// A large output is analysed and judged in stretches of 2^16 elements (several threads),
// merged in order: the counts, maxima, histogram, means, error map, regions and worst
// elements are those of one pass. Known answers on a 1000 x 200 output (four stretches):
// errors of 1, 2 and 3 ulps at known places in the last column and row, the largest twice
// (the first is the worst), then one off the edges, then a NaN, the first non-finite
// failure, beating every finite error.
TEST(Analyze, LargeOutputsMergeTheirStretchesInOrder) {
  const std::int64_t rows = 1000, cols = 200, n = rows * cols;
  const auto at = [&](std::int64_t i, std::int64_t j) { return static_cast<std::size_t>(i * cols + j); };
  std::vector<double> got(static_cast<std::size_t>(n), 1.0), exact(static_cast<std::size_t>(n), 1.0);
  got[at(5, 199)] = 1.0 + 0x1p-10;        // 1 ulp, stretch 0
  got[at(350, 199)] = 1.0 + 3 * 0x1p-10;  // 3 ulps, stretch 1: the worst
  got[at(700, 199)] = 1.0 + 3 * 0x1p-10;  // 3 ulps again, stretch 2: a tie, not the worst
  got[at(999, 10)] = 1.0 + 2 * 0x1p-10;   // 2 ulps, last row, stretch 3
  OutputComparison cmp = fp16(got, exact);
  cmp.shape = {1, rows, cols};
  const ErrorMetrics m = analyze(cmp);
  EXPECT_EQ(m.compared, n);
  EXPECT_EQ(m.exact_matches, n - 4);
  EXPECT_EQ(m.max_ulp, 3.0);
  EXPECT_EQ(m.max_abs, 3 * 0x1p-10);
  EXPECT_EQ(m.mean_ulp, 9.0 / static_cast<double>(n));
  EXPECT_EQ(std::accumulate(m.ulp_histogram.begin(), m.ulp_histogram.end(), std::int64_t{0}), n);
  EXPECT_GE(m.ulp_histogram[ulp_histogram_bin(3.0)], 2);
  EXPECT_EQ(m.worst.index, (std::vector<std::int64_t>{0, 350, 199}));
  double cells_max = 0;
  for (double c : m.map.max_normalised) cells_max = std::max(cells_max, c);
  EXPECT_EQ(cells_max, 3 * 0x1p-10);
  Verdict v = judge(cmp, m, ToleranceModel{}, 1);
  EXPECT_EQ(failure_signature(v), "out:tolerance@edge");
  EXPECT_EQ(v.worst_element, static_cast<std::int64_t>(at(350, 199)));

  cmp.got[at(900, 50)] = encode(Format::FP16, 1.0 + 2 * 0x1p-10);  // off the edges, stretch 2
  v = judge(cmp, analyze(cmp), ToleranceModel{}, 1);
  EXPECT_EQ(failure_signature(v), "out:tolerance@interior");
  EXPECT_EQ(v.worst_element, static_cast<std::int64_t>(at(350, 199)));

  // A NaN in stretch 2 (where the exact value is finite) is the worst element over any
  // finite error, and its map cell is NaN.
  cmp.got[at(950, 100)] = encode(Format::FP16, NAN);
  const ErrorMetrics w = analyze(cmp);
  EXPECT_EQ(w.unexpected_nan, 1);
  EXPECT_EQ(w.compared, n - 1);
  EXPECT_EQ(w.worst.index, (std::vector<std::int64_t>{0, 950, 100}));
  EXPECT_EQ(std::count_if(w.map.max_normalised.begin(), w.map.max_normalised.end(), [](double c) { return std::isnan(c); }), 1);
  v = judge(cmp, w, ToleranceModel{}, 1);
  EXPECT_EQ(v.worst_element, static_cast<std::int64_t>(at(950, 100)));
  EXPECT_NE(failure_signature(v).find("out:unexpected_nan@interior"), std::string::npos) << failure_signature(v);
}

namespace {

bool same_double(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void expect_same_metrics(const ErrorMetrics& a, const ErrorMetrics& b) {
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.elements, b.elements);
  EXPECT_EQ(a.compared, b.compared);
  EXPECT_EQ(a.exact_matches, b.exact_matches);
  for (const auto& [x, y] : {std::pair{a.max_abs, b.max_abs}, {a.mean_abs, b.mean_abs}, {a.max_rel, b.max_rel},
                             {a.mean_rel, b.mean_rel}, {a.normwise, b.normwise}, {a.max_normalised, b.max_normalised},
                             {a.mean_normalised, b.mean_normalised}, {a.max_ulp, b.max_ulp}, {a.mean_ulp, b.mean_ulp},
                             {a.bias_ulp, b.bias_ulp}})
    EXPECT_TRUE(same_double(x, y)) << x << " vs " << y;
  EXPECT_EQ(a.max_ulp_distance, b.max_ulp_distance);
  EXPECT_EQ(a.ulp_histogram, b.ulp_histogram);
  EXPECT_EQ(a.expected_nonfinite, b.expected_nonfinite);
  EXPECT_EQ(a.unexpected_nan, b.unexpected_nan);
  EXPECT_EQ(a.unexpected_inf, b.unexpected_inf);
  EXPECT_EQ(a.missed_nonfinite, b.missed_nonfinite);
  EXPECT_EQ(a.mismatched_nonfinite, b.mismatched_nonfinite);
  EXPECT_EQ(a.overflowed, b.overflowed);
  EXPECT_EQ(a.unwritten, b.unwritten);
  EXPECT_EQ(a.padding_written, b.padding_written);
  EXPECT_EQ(a.worst.index, b.worst.index);
  EXPECT_EQ(a.worst.got, b.worst.got);
  EXPECT_EQ(a.worst.expected, b.worst.expected);
  EXPECT_EQ(a.worst.exact, b.worst.exact);
  EXPECT_TRUE(same_double(a.worst.normalised, b.worst.normalised));
  EXPECT_TRUE(same_double(a.worst.ulp, b.worst.ulp));
  ASSERT_EQ(a.map.max_normalised.size(), b.map.max_normalised.size());
  for (std::size_t c = 0; c < a.map.max_normalised.size(); ++c)
    EXPECT_TRUE(same_double(a.map.max_normalised[c], b.map.max_normalised[c]));
}

}  // namespace

// The check path's one pass (analyze_and_judge) gives the metrics and verdict of analyze()
// then judge(), field for field, on random outputs of several stretches with every kind of
// element: errors of 0 to hundreds of ulps, NaN and Inf on either side, overflow of the
// format and of the accumulator, unwritten and unreferenced elements, per-element allowances
// and input terms, a precision scale with gaps, and a baseline rule, in each output format.
TEST(Analyze, OnePassEqualsAnalyzeThenJudge) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (const Format f : {Format::FP32, Format::BF16, Format::FP16, Format::E4M3, Format::E5M2, Format::FP64}) {
    for (int variant = 0; variant < 4; ++variant) {
      const std::int64_t rows = 700, cols = 211, n = rows * cols;  // three stretches
      OutputComparison cmp;
      cmp.format = f;
      cmp.shape = {1, rows, cols};
      cmp.accumulator_max = variant == 1 ? 1e3 : INFINITY;
      cmp.relu_output = variant == 2;
      const double top = info(f).max_finite();
      for (std::int64_t e = 0; e < n; ++e) {
        const double kind = unit(rng);
        double x = (unit(rng) - 0.5) * std::ldexp(1.0, static_cast<int>(unit(rng) * 16) - 8);
        if (kind < 0.002) x = NAN;
        else if (kind < 0.004) x = unit(rng) < 0.5 ? INFINITY : -INFINITY;
        else if (kind < 0.006) x = top * (1.5 + unit(rng));  // beyond the format
        Code g = encode(f, std::isfinite(x) ? x : 1.0);
        const double off = unit(rng);
        if (off < 0.3) {
          for (int s = static_cast<int>(unit(rng) * 300); s > 0; --s) g = next_up(f, g);
        } else if (off < 0.301) {
          g = encode(f, NAN);
        } else if (off < 0.302 && info(f).has_inf) {
          g = encode(f, -INFINITY);
        } else if (!std::isfinite(x) && off < 0.8) {
          g = encode(f, x);
        }
        cmp.got.push_back(g);
        cmp.exact.push_back(ref(x));
        const double c = std::fabs(std::isfinite(x) ? x : 1.0) * (1 + 4 * unit(rng));
        cmp.condition.push_back(c);
        cmp.precision_scale.push_back(unit(rng) < 0.1 ? NAN : 0x1p-20 * c);
        if (variant == 1) cmp.accumulated.push_back(c * (unit(rng) < 0.01 ? 1e4 : 1.0));
        if (variant == 2) cmp.unwritten.push_back(unit(rng) < 0.001);
        if (variant == 3) {
          cmp.unreferenced.push_back(unit(rng) < 0.05);
          cmp.allowed.push_back(0x1p-10 * c);
          cmp.input_abs.push_back(unit(rng) < 0.5 ? 0.0 : 0x1p-30);
        }
      }
      if (variant == 0) cmp.input_abs.assign(static_cast<std::size_t>(n), 0x1p-40);
      ToleranceModel tol;
      tol.accumulator_bits = variant == 2 ? 11 : 24;
      tol.input_bits = variant == 0 ? 11 : 0;
      ErrorMetrics audit;
      audit.output = "D";
      audit.unwritten = variant == 2 ? 3 : 0;
      audit.padding_written = variant == 3 ? 1 : 0;
      const double baseline = variant == 1 ? 1e-3 : -1;
      const BaselineRule rule;
      ErrorMetrics m = analyze(cmp);
      m.output = audit.output, m.unwritten = audit.unwritten, m.padding_written = audit.padding_written;
      const Verdict v = judge(cmp, m, tol, 1000, baseline, rule);
      const Assessment a = analyze_and_judge(cmp, tol, 1000, audit, baseline, rule);
      SCOPED_TRACE(std::string(name(f)) + " variant " + std::to_string(variant));
      expect_same_metrics(a.metrics, m);
      EXPECT_EQ(a.verdict.passed, v.passed);
      EXPECT_EQ(a.verdict.reasons, v.reasons);
      EXPECT_EQ(a.verdict.checks, v.checks);
      EXPECT_EQ(a.verdict.worst_element, v.worst_element);
      EXPECT_TRUE(same_double(a.verdict.precision_ratio, v.precision_ratio));
      EXPECT_EQ(a.verdict.misrounded, v.misrounded);
      EXPECT_EQ(a.verdict.misrounded_allowed, v.misrounded_allowed);
      EXPECT_FALSE(v.passed);  // every variant has failing elements: the comparison covers the failure paths
    }
  }
}
