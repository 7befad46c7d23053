// Statistics of every per-element family on large samples (fixed seeds). Tolerances are
// 5 standard errors derived from the sample size: a rate p over n draws is checked to within
// 5 sqrt(p (1 - p) / n), a mean to within 5 sigma / sqrt(n), a variance to within
// 5 var sqrt((kurtosis - 1) / n). At 5 sigma a correct generator fails about once in 1.7
// million checks; a wrong one (wrong scale, rate or transform) is off by far more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "fill_test_util.hpp"
#include "distributions/sampling.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

constexpr std::int64_t kRows = 400, kCols = 500;  // 200000 samples per family
constexpr double kSigmas = 5.0;

// The values of op(A) for a spec, in format f.
std::vector<double> draw(const std::string& spec, Format f = Format::FP64, std::uint64_t seed = 7) {
  Case c = gemm_case(kRows, 4, kCols, f, spec, "", 1, seed);
  auto t = fill_inputs(c);
  return logical_gemm(c, t, "A");
}

double fraction(const std::vector<double>& v, const std::function<bool(double)>& pred) {
  return static_cast<double>(std::count_if(v.begin(), v.end(), pred)) / static_cast<double>(v.size());
}

void expect_rate(const std::vector<double>& v, const std::function<bool(double)>& pred, double p,
                 const char* what) {
  const double n = static_cast<double>(v.size());
  const double tol = kSigmas * std::sqrt(p * (1 - p) / n);
  EXPECT_NEAR(fraction(v, pred), p, tol) << what;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double var_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / static_cast<double>(v.size() - 1);
}

void expect_mean(const std::vector<double>& v, double mu, double sigma, const char* what) {
  EXPECT_NEAR(mean_of(v), mu, kSigmas * sigma / std::sqrt(static_cast<double>(v.size()))) << what;
}

void expect_var(const std::vector<double>& v, double var, double kurtosis, const char* what) {
  EXPECT_NEAR(var_of(v), var, kSigmas * var * std::sqrt((kurtosis - 1) / static_cast<double>(v.size())))
      << what;
}

}  // namespace

TEST(Stats, Uniform) {
  const auto v = draw("uniform(-2,3)");
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double x) { return x >= -2 && x < 3; }));
  expect_mean(v, 0.5, std::sqrt(25.0 / 12), "mean");
  expect_var(v, 25.0 / 12, 1.8, "variance");
  expect_rate(v, [](double x) { return x < 0; }, 0.4, "P(x < 0)");
  expect_rate(v, [](double x) { return x >= 2.5; }, 0.1, "P(x >= 2.5)");
}

TEST(Stats, Normal) {
  const auto v = draw("normal(1,2)");
  expect_mean(v, 1, 2, "mean");
  expect_var(v, 4, 3, "variance");
  expect_rate(v, [](double x) { return std::fabs(x - 1) > 2 * 1.959963984540054; }, 0.05, "P(|z| > 1.96)");
  expect_rate(v, [](double x) { return x - 1 > 2 * 3.0; }, 0.0013498980316301, "P(z > 3)");
  expect_rate(v, [](double x) { return x - 1 < -2 * 2.5758293035489; }, 0.005, "P(z < -2.576)");
}

TEST(Stats, LogNormal) {
  const auto v = draw("lognormal(0.5,0.8)");
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double x) { return x > 0; }));
  expect_rate(v, [](double x) { return x < std::exp(0.5); }, 0.5, "median e^mu");
  std::vector<double> logs;
  for (double x : v) logs.push_back(std::log(x));
  expect_mean(logs, 0.5, 0.8, "mean of log");
  expect_var(logs, 0.64, 3, "variance of log");
}

TEST(Stats, StudentT) {
  // Two-sided quantiles of t with 5 degrees of freedom: t_0.975 = 2.570582, t_0.995 = 4.032143.
  const auto v = draw("student_t(5)");
  expect_rate(v, [](double x) { return std::fabs(x) > 2.570581835636314; }, 0.05, "P(|t5| > t_.975)");
  expect_rate(v, [](double x) { return std::fabs(x) > 4.032142983557536; }, 0.01, "P(|t5| > t_.995)");
  expect_rate(v, [](double x) { return x < 0; }, 0.5, "symmetric");
  // nu = 1 is Cauchy: P(|t| > 1) = 1/2; nu = 30 is nearly normal: P(|t| > 2.042272) = 0.05.
  expect_rate(draw("student_t(1)"), [](double x) { return std::fabs(x) > 1; }, 0.5, "t1");
  expect_rate(draw("student_t(30,2)"), [](double x) { return std::fabs(x) > 2 * 2.042272456301238; },
              0.05, "t30, scale 2");
}

TEST(Stats, Cauchy) {
  const auto v = draw("cauchy(3,2)");
  expect_rate(v, [](double x) { return std::fabs(x - 3) > 2; }, 0.5, "P(|x - loc| > scale)");
  expect_rate(v, [](double x) { return std::fabs(x - 3) > 2 * 12.706204736174698; }, 0.05, "P(|x| > tan(0.475 pi))");
  expect_rate(v, [](double x) { return x < 3; }, 0.5, "median");
}

TEST(Stats, ActivationsHaveOutlierChannels) {
  // 4000 channels (columns of op(A)), 50 rows each: a channel is an outlier w.p. rate.
  Case c = gemm_case(50, 4, 4000, Format::FP64, "activations(std=1,rate=0.05,scale=20)");
  auto t = fill_inputs(c);
  const auto v = logical_gemm(c, t, "A");
  std::vector<double> channel_rms(4000, 0.0), inliers, outliers;
  for (std::size_t i = 0; i < v.size(); ++i) channel_rms[i % 4000] += v[i] * v[i] / 50;
  for (std::size_t i = 0; i < v.size(); ++i) (channel_rms[i % 4000] > 25 ? outliers : inliers).push_back(v[i]);
  expect_rate(channel_rms, [](double r) { return r > 25; }, 0.05, "outlier channel rate");
  expect_var(inliers, 1.0, 3, "inlier channel variance");
  expect_var(outliers, 400.0, 3, "outlier channel variance");
}

TEST(Stats, WeightsScaleWithFanIn) {
  expect_var(draw("weights"), 1.0 / kCols, 3, "fan_in = K");
  expect_var(draw("weights(gain=2,fan_in=100)"), 4.0 / 100, 3, "explicit fan_in");
}

TEST(Stats, SoftmaxRowsAreProbabilities) {
  Case c = gemm_case(kRows, 4, kCols, Format::FP64, "softmax(std=2)");
  auto t = fill_inputs(c);
  const auto v = logical_gemm(c, t, "A");
  std::vector<double> centred_logs;
  for (std::int64_t r = 0; r < kRows; ++r) {
    double sum = 0, mean_log = 0;
    for (std::int64_t k = 0; k < kCols; ++k) {
      const double p = v[r * kCols + k];
      ASSERT_GT(p, 0.0);
      sum += p;
      mean_log += std::log(p) / kCols;
    }
    EXPECT_NEAR(sum, 1.0, 1e-13) << "row " << r;
    for (std::int64_t k = 0; k < kCols; ++k) centred_logs.push_back(std::log(v[r * kCols + k]) - mean_log);
  }
  // log p = logit - logsumexp: within a row the logits' variance 4 (times (K-1)/K) remains.
  expect_var(centred_logs, 4.0 * (kCols - 1) / kCols, 3, "logit variance");
}

TEST(Stats, SparseReluPositive) {
  const auto s = draw("sparse(density=0.2,std=3)");
  expect_rate(s, [](double x) { return x == 0; }, 0.8, "zeros of sparse");
  std::vector<double> nz;
  for (double x : s)
    if (x != 0) nz.push_back(x);
  expect_var(nz, 9.0, 3, "nonzero variance");
  const auto r = draw("relu");
  EXPECT_TRUE(std::all_of(r.begin(), r.end(), [](double x) { return x >= 0; }));
  expect_rate(r, [](double x) { return x == 0; }, 0.5, "zeros of relu");
  // max(0, z): mean 1/sqrt(2 pi), variance 1/2 - 1/(2 pi).
  expect_mean(r, 0.3989422804014327, std::sqrt(0.5 - 0.5 / M_PI), "relu mean");
  const auto p = draw("positive(3)");
  EXPECT_TRUE(std::all_of(p.begin(), p.end(), [](double x) { return x >= 0; }));
  expect_mean(p, 3 * std::sqrt(2 / M_PI), 3 * std::sqrt(1 - 2 / M_PI), "half-normal mean");
}

TEST(Stats, NearOverflowIsNearTheFormatsMax) {
  for (Format f : {Format::FP32, Format::FP16, Format::E4M3, Format::BF16}) {
    const double mx = info(f).max_finite();
    const auto v = draw("near_overflow(lo=0.5,hi=1)", f);
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [&](double x) {
      return std::fabs(x) >= 0.5 * mx && std::fabs(x) <= mx;
    })) << name(f);
    expect_rate(v, [](double x) { return x < 0; }, 0.5, "sign");
    if (f == Format::FP32) expect_rate(v, [&](double x) { return std::fabs(x) >= 0.75 * mx; }, 0.5, "uniform magnitude");
  }
}

TEST(Stats, SubnormalHeavy) {
  for (Format f : {Format::FP16, Format::FP32, Format::BF16, Format::E5M2, Format::FP64}) {
    const auto& fi = info(f);
    const auto v = draw("subnormal(rate=0.3)", f);
    expect_rate(v, [&](double x) { return x != 0 && std::fabs(x) < fi.min_normal(); }, 0.3, "subnormal rate");
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [&](double x) {
      return x != 0 && std::fabs(x) <= 16 * fi.min_normal();
    })) << name(f);
  }
}

TEST(Stats, SpecialsAppearAtTheRequestedRates) {
  for (Format f : {Format::FP32, Format::FP16, Format::BF16, Format::E5M2}) {
    const auto v = draw("specials(nan=0.01,inf=0.02,negzero=0.05)", f);
    expect_rate(v, [](double x) { return std::isnan(x); }, 0.01, "NaN");
    expect_rate(v, [](double x) { return std::isinf(x); }, 0.02, "Inf");
    expect_rate(v, [](double x) { return x == INFINITY; }, 0.01, "+Inf");
    expect_rate(v, [](double x) { return x == 0 && std::signbit(x); }, 0.05, "-0");
  }
  // E4M3 has no Inf: NaN and -0 only.
  const auto e = draw("specials(nan=0.001,inf=0,negzero=0.01)", Format::E4M3);
  expect_rate(e, [](double x) { return std::isnan(x); }, 0.001, "e4m3 NaN");
  expect_rate(e, [](double x) { return x == 0 && std::signbit(x); }, 0.01, "e4m3 -0");
}

TEST(Stats, OutliersAtRateAndScale) {
  // |100 z| > 10 iff |z| > 0.1: P = 0.920344; a plain normal never exceeds 10 here.
  const auto v = draw("outliers(rate=0.01,scale=100)");
  expect_rate(v, [](double x) { return std::fabs(x) > 10; }, 0.01 * 0.9203442744731237, "outliers");
  const auto u = draw("outliers(rate=0.02,scale=4,base=uniform(1,2))");
  expect_rate(u, [](double x) { return x >= 4; }, 0.02, "outliers of a uniform base");
}

TEST(Stats, ExactIsSmallIntegers) {
  const auto v = draw("exact(max=5)");
  for (double x : v) ASSERT_TRUE(x == std::floor(x) && std::fabs(x) <= 5) << x;
  expect_rate(v, [](double x) { return x == -5; }, 1.0 / 11, "uniform over -5..5");
  const auto w = draw("exact(max=3,frac=2)");
  for (double x : w) ASSERT_TRUE(x * 4 == std::floor(x * 4) && std::fabs(x) <= 0.75) << x;
}

TEST(Stats, TranscendentalHelpersAreAccurate) {
  // The hand-written log/exp/sincos are within a few ulps of glibc's (not bit-equal: that
  // is why they exist), over wide ranges.
  double worst = 0;
  for (int i = 1; i < 200000; ++i) {
    const double x = std::ldexp(1.0 + i * 1e-5, (i % 2000) - 1000);
    worst = std::max(worst, std::fabs(sampling::log_pos(x) - std::log(x)) / std::max(1.0, std::fabs(std::log(x))));
    const double y = (i - 100000) * 0.007;
    worst = std::max(worst, std::fabs(sampling::exp_rn(y) - std::exp(y)) / std::exp(y));
    double s, c;
    const double t = i / 200000.0;
    sampling::sincos_turns(t, s, c);
    worst = std::max({worst, std::fabs(s - std::sin(2 * M_PI * t)), std::fabs(c - std::cos(2 * M_PI * t))});
  }
  EXPECT_LT(worst, 1e-14);
}
