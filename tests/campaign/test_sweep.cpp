// Sweeps: the power fit, --vary parsing, and the effective-precision estimate on CPU models
// whose precision is known.
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>

#include <cmath>

#include "core/error.hpp"
#include "campaign/sweep.hpp"
#include "kernels/emulated/gemm_models.hpp"

using namespace ulpgate;

TEST(Sweep, PowerFitKnownAnswers) {
  std::vector<double> x, y;
  for (double k : {256.0, 1024.0, 4096.0, 16384.0}) x.push_back(k), y.push_back(3.0 * std::sqrt(k));
  PowerFit f = fit_power(x, y);
  EXPECT_NEAR(f.exponent, 0.5, 1e-12);
  EXPECT_NEAR(f.intercept, std::log(3.0), 1e-12);
  EXPECT_NEAR(f.exponent_stderr, 0.0, 1e-12);
  EXPECT_EQ(f.points, 4);
  y = {1.0, 2.1, 3.9, 8.3};  // noisy: a positive standard error
  f = fit_power({1, 2, 4, 8}, y);
  EXPECT_NEAR(f.exponent, 1.0, 0.05);
  EXPECT_GT(f.exponent_stderr, 0.0);
  EXPECT_EQ(fit_power({1, 2, 4}, {0.0, 1.0, 0.0}).points, 1);  // zero errors are not on a log scale
}

TEST(Sweep, ParseVary) {
  EXPECT_EQ(parse_vary("K=256:4096").values, (std::vector<std::int64_t>{256, 512, 1024, 2048, 4096}));
  EXPECT_EQ(parse_vary("K=256:65536:4").values, (std::vector<std::int64_t>{256, 1024, 4096, 16384, 65536}));
  EXPECT_EQ(parse_vary("K=100:1000:4").values, (std::vector<std::int64_t>{100, 400, 1000}));
  EXPECT_EQ(parse_vary("seq_kv=128:1024:8").parameter, "seq_kv");
  EXPECT_EQ(parse_vary("seq_kv=128:1024:8").values, (std::vector<std::int64_t>{128, 1024}));
  auto msg = [](const char* t) {
    try {
      parse_vary(t);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(parse_vary("splits=1:64:4").parameter, "splits");
  EXPECT_EQ(parse_vary("splits=1:64:4").values, (std::vector<std::int64_t>{1, 4, 16, 64}));
  EXPECT_EQ(msg("N=1:2"), "--vary 'N=1:2': expected K=FROM:TO[:FACTOR] (GEMM), seq_kv=FROM:TO[:FACTOR] (attention) or "
                          "splits=FROM:TO[:FACTOR] (attention_combine)");
  EXPECT_EQ(msg("K=256"), "--vary 'K=256': expected K=FROM:TO[:FACTOR]");
  EXPECT_EQ(msg("K=4096:256"), "--vary 'K=4096:256': FROM must be <= TO");
  EXPECT_EQ(msg("K=1:x"), "--vary 'K=1:x': 'x' is not a positive integer");
  EXPECT_EQ(msg("K=1:8:1"), "--vary 'K=1:8:1': FACTOR must be >= 2");
}

// K=1:9223372036854775807 overflowed the doubling (signed overflow, then values without
// end: memory grew until bad_alloc). Values are case sizes (at most 2^31 - 1) and the
// points at most kMaxSweepPoints; a number beyond int64 is not clamped silently.
TEST(Sweep, ParseVaryBoundsValuesAndPoints) {
  auto msg = [](const std::string& t) {
    try {
      parse_vary(t);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(msg("K=1:9223372036854775807"), "--vary 'K=1:9223372036854775807': TO must be at most 2147483647");
  EXPECT_EQ(msg("K=1:99999999999999999999"), "--vary 'K=1:99999999999999999999': '99999999999999999999' is not a positive integer");
  EXPECT_EQ(msg("seq_kv=4294967296:4294967296"), "--vary 'seq_kv=4294967296:4294967296': TO must be at most 2147483647");
  EXPECT_EQ(parse_vary("K=1:2147483647").values.back(), 2147483647);
  EXPECT_EQ(parse_vary("K=1:2147483647").values.size(), 32u);
  // A factor whose product would overflow stops at TO.
  EXPECT_EQ(parse_vary("K=3:2000000000:9223372036854775807").values, (std::vector<std::int64_t>{3, 2000000000}));
  EXPECT_EQ(msg("K=1:100:1.5"), "--vary 'K=1:100:1.5': '1.5' is not a positive integer");
  EXPECT_EQ(msg("K=1:1000000:1000000:1"), "--vary 'K=1:1000000:1000000:1': expected K=FROM:TO[:FACTOR]");
  EXPECT_LE(parse_vary("K=1:2147483647:2").values.size(), kMaxSweepPoints);
}

TEST(Sweep, CalibratorRoundsToTheRequestedPrecision) {
  const double a[] = {1.0, 0x1p-12, 0x1p-12}, b[] = {1.0, 1.0, 1.0};
  EXPECT_EQ(calibration_dot(a, b, 3, 12), 1.0);  // each 2^-12 is a tie at 12 bits: to even
  EXPECT_EQ(calibration_dot(a, b, 3, 13), 1.0 + 0x1p-11);
}

namespace {
SweepOutcome sweep_model(const char* model, const char* dist) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = 16, c.gemm.n = 16;
  c.types = {{"A", Format::FP32}, {"B", Format::FP32}, {"D", Format::FP32}, {"compute", Format::FP32}};
  c.dist = {{"A", dist}, {"B", dist}};
  c.seed = 20261129;
  SweepOptions o;
  o.base = c;
  o.values = parse_vary("K=256:16384:4").values;
  auto k = make_emulated_gemm(*AccumulationModel::parse(model));
  return run_sweep(*k, o);
}
}  // namespace

// Known answers for the precision estimate: FP32 with RNE has 24 bits; a block-FMA
// accumulator that keeps 13 fraction bits after alignment (truncated) is a 14-bit-precision
// accumulator whose truncation costs about a bit: near 13.
TEST(Sweep, EffectiveBitsOfKnownModels) {
  const SweepOutcome seq = sweep_model("cpu.fp32_seq", "normal(0,1)");
  const SweepOutcome blk = sweep_model("cpu.blockfma:block=16,frac=13,round=rz", "normal(0,1)");
  for (const auto* o : {&seq, &blk}) {
    std::printf("[ sweep ] %-40s effective bits %.2f (per point:", o->series.kernel.c_str(), o->series.effective_bits);
    for (double b : o->effective_bits_per_point) std::printf(" %.2f", b);
    std::printf("), exponent %.3f +- %.3f\n", o->series.fit.exponent, o->series.fit.exponent_stderr);
  }
  EXPECT_NEAR(seq.series.effective_bits, 24.0, 1.0);
  EXPECT_NEAR(blk.series.effective_bits, 13.0, 1.0);
  EXPECT_EQ(seq.series.x.size(), 4u);
  EXPECT_EQ(seq.cases.size(), 4u);
  for (const auto& r : seq.cases) EXPECT_TRUE(r.verdict.passed) << r.verdict.reasons.front();
}

// The calibrator's rounding (fast for normal numbers) is its definition, bit for bit, on
// random doubles of every exponent, subnormals, ties at every precision and their
// neighbours, and values that round up to the next binade or to Inf.
TEST(Sweep, RoundToBitsIsRoundToNearestEvenAtThatPrecision) {
  const auto definition = [](double v, int bits) {
    if (v == 0 || !std::isfinite(v) || bits >= 53) return v;
    const int e = std::ilogb(v);
    return std::ldexp(std::nearbyint(std::ldexp(v, bits - 1 - e)), e - bits + 1);
  };
  std::mt19937_64 rng(20261201);
  std::int64_t checked = 0, ties = 0;
  for (int i = 0; i < 2000000; ++i) {
    std::uint64_t u = rng();
    const int bits = 1 + static_cast<int>(rng() % 53);
    if (bits < 53 && i % 4 == 0) {  // a tie: the first dropped bit 1, the rest 0 (and its neighbours)
      const int drop = 53 - bits;
      u = (u | (std::uint64_t{1} << (drop - 1))) & ~((std::uint64_t{1} << (drop - 1)) - 1);
      u += static_cast<std::uint64_t>(static_cast<int>(rng() % 3) - 1);
      ++ties;
    }
    if (i % 7 == 0) u |= 0x000fffffffffffffull;  // all ones: rounds up into the next binade
    double v;
    std::memcpy(&v, &u, sizeof v);
    const double want = definition(v, bits), got = round_to_bits(v, bits);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    ASSERT_EQ(std::memcmp(&want, &got, sizeof want), 0) << std::hexfloat << v << " at " << bits << " bits: " << got
                                                        << " instead of " << want;
    ++checked;
  }
  EXPECT_GT(checked, 1900000);
  EXPECT_GT(ties, 400000);
  EXPECT_EQ(round_to_bits(0x1.fffffffffffffp1023, 20), INFINITY);
  EXPECT_EQ(round_to_bits(-0x1.fffffp0, 20), -2.0);
  EXPECT_EQ(round_to_bits(0x1.00008p0, 17), 1.0);           // a tie to even
  EXPECT_EQ(round_to_bits(0x1.00018p0, 17), 0x1.0002p0);    // a tie to even, upwards
}

// The cliff rule on series with known answers: a persistent drop of more than 4 bits below
// the best estimate so far starts a cliff; a single-point dip, a 3.3-bit dip at the end (the
// FP8 series on the H200), a gradual 1.5-bit sag (cuBLASLt bf16) and a rise are not cliffs.
TEST(Sweep, PrecisionCliffKnownAnswers) {
  const auto cliff = [](std::vector<double> bits) { return precision_cliff(bits); };
  const auto c = cliff({24.1, 24.3, 24.2, 17.5, 17.1, 16.8});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->start, 3u);
  EXPECT_EQ(c->best, 1u);
  EXPECT_EQ(c->below, (std::vector<std::size_t>{3, 4, 5}));
  const auto last = cliff({24.0, 24.0, 24.0, 19.5});  // at the last point: nothing after it to confirm or deny
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->start, 3u);
  const auto gap = cliff({24.0, NAN, 19.0, NAN, 18.5});  // points without an estimate are skipped
  ASSERT_TRUE(gap.has_value());
  EXPECT_EQ(gap->start, 2u);
  EXPECT_EQ(gap->below, (std::vector<std::size_t>{2, 4}));
  EXPECT_FALSE(cliff({24.0, 24.2, 18.0, 24.1, 24.3}));  // one point: noise, not a path
  EXPECT_FALSE(cliff({10.59, 8.81, 10.16, 11.19, 12.30, 9.03}));
  EXPECT_FALSE(cliff({19.43, 19.28, 18.63, 17.99, 19.38, 20.25, 21.00, 21.46, 20.94}));
  EXPECT_FALSE(cliff({1.37, 4.18, 7.79, 10.10, 11.71, 12.70, 13.46, 14.22, 14.96}));
  EXPECT_FALSE(cliff({}));
  EXPECT_FALSE(cliff({NAN, NAN}));
}

namespace {
// A planted kernel that switches path with size: sequential FP32 below K = 2048, and from
// there an accumulator that keeps 16 fraction bits (the split-K partials of a narrower
// format): every element may well stay inside the tolerance, whose gamma(K) term grows
// with K, but the precision falls by about 8 bits at K = 2048 and stays down.
class PathSwitchAt2048 final : public Kernel {
 public:
  std::string name() const override { return "planted.path_switch_2048"; }
  std::string description() const override { return "FP32 below K = 2048, a 16-bit accumulator from there"; }
  KernelTraits traits() const override { return {}; }
  std::optional<std::string> unsupported(const Case& c) const override { return small_->unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    (c.gemm.k < 2048 ? small_ : large_)->run(c, io, notes);
  }

 private:
  std::unique_ptr<Kernel> small_ = make_emulated_gemm(*AccumulationModel::parse("cpu.fp32_seq"));
  std::unique_ptr<Kernel> large_ = make_emulated_gemm(*AccumulationModel::parse("cpu.blockfma:block=16,frac=16,round=rne"));
};
}  // namespace

// The sweep finds where the planted kernel's path switches and fails those points (the
// message names the value where the drop starts); a correct kernel's sweep over the same
// range has no cliff.
TEST(Sweep, PrecisionCliffFailsThePointsOfALessPrecisePath) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = 16, c.gemm.n = 16;
  c.types = {{"A", Format::FP32}, {"B", Format::FP32}, {"D", Format::FP32}, {"compute", Format::FP32}};
  c.dist = {{"A", "normal(0,1)"}, {"B", "normal(0,1)"}};
  c.seed = 20261202;
  SweepOptions o;
  o.base = c;
  o.values = parse_vary("K=256:16384").values;
  PathSwitchAt2048 planted;
  const SweepOutcome s = run_sweep(planted, o);
  ASSERT_EQ(s.cases.size(), o.values.size());
  for (std::size_t i = 0; i < s.cases.size(); ++i) {
    const CaseResult& r = s.cases[i];
    std::printf("[ sweep ] planted K=%lld: %.2f bits, %zu reason(s), the last: %s\n", static_cast<long long>(o.values[i]),
                s.effective_bits_per_point[i], r.verdict.reasons.size(),
                r.verdict.passed ? "passed" : r.verdict.reasons.back().c_str());
    const bool on_cliff = o.values[i] >= 2048;
    const bool cliff_check = std::find(r.verdict.checks.begin(), r.verdict.checks.end(), "sweep:precision_cliff") !=
                             r.verdict.checks.end();
    EXPECT_EQ(cliff_check, on_cliff) << "K=" << o.values[i];
    if (on_cliff) { EXPECT_NE(r.verdict.reasons.back().find("the drop starts at K=2048"), std::string::npos); }
  }
  for (const char* model : {"cpu.fp32_seq", "cpu.fp32_pairwise", "cpu.blockfma:block=16,frac=13,round=rz"}) {
    auto k = make_emulated_gemm(*AccumulationModel::parse(model));
    const SweepOutcome t = run_sweep(*k, o);
    for (const CaseResult& r : t.cases)
      EXPECT_TRUE(std::find(r.verdict.checks.begin(), r.verdict.checks.end(), "sweep:precision_cliff") ==
                  r.verdict.checks.end())
          << model << " K=" << r.spec.gemm.k << ": " << r.verdict.reasons.back();
  }
}

namespace {
// A kernel that computes as `inner` does but declares other traits (a planted lie).
class Declaring final : public Kernel {
 public:
  Declaring(std::unique_ptr<Kernel> inner, KernelTraits t) : inner_(std::move(inner)), t_(std::move(t)) {}
  std::string name() const override { return "planted.declares_promotion"; }
  std::string description() const override { return "a block-FMA model declaring another promotion length"; }
  KernelTraits traits() const override { return t_; }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_->unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override { inner_->run(c, io, notes); }

 private:
  std::unique_ptr<Kernel> inner_;
  KernelTraits t_;
};

SweepOutcome sweep_kernel(Kernel& k) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = 16, c.gemm.n = 16;
  c.types = {{"A", Format::E4M3}, {"B", Format::E4M3}, {"D", Format::FP32}, {"compute", Format::FP32}};
  c.dist = {{"A", "normal(0,1)"}, {"B", "normal(0,1)"}};
  c.seed = 20261203;
  SweepOptions o;
  o.base = c;
  o.values = parse_vary("K=256:16384:4").values;
  return run_sweep(k, o);
}
}  // namespace

// A narrow accumulator promoted to FP32 every 128 products (as FP8 tensor-core GEMMs do),
// declared with its bit-accurate model: the model passes every point (the tolerance is that
// of 128-product chunks, finite at any K); a kernel declaring that model but never
// promoting is worse than its own model allows and fails the model rule at long K, while
// the precision rule alone (whose scale counts a rounding per product) does not see it.
TEST(Sweep, DeclaredPromotionIsTheToleranceOfItsChunksAndItsModelTheRule) {
  const char* promoting = "cpu.blockfma:block=32,frac=13,round=rz,promote=128";
  auto honest = make_emulated_gemm(*AccumulationModel::parse(promoting));
  EXPECT_EQ(honest->traits().promote, 128);
  KernelTraits claims = honest->traits();
  claims.accumulation_model = promoting;
  Declaring truthful(make_emulated_gemm(*AccumulationModel::parse(promoting)), claims);
  const SweepOutcome ok = sweep_kernel(truthful);
  ASSERT_EQ(ok.cases.size(), 4u);
  for (const CaseResult& r : ok.cases) EXPECT_TRUE(r.verdict.passed) << "K=" << r.spec.gemm.k << ": " << r.verdict.reasons.front();

  Declaring liar(make_emulated_gemm(*AccumulationModel::parse("cpu.blockfma:block=32,frac=13,round=rz")), claims);
  const SweepOutcome bad = sweep_kernel(liar);
  ASSERT_EQ(bad.cases.size(), 4u);
  const CaseResult& last = bad.cases.back();
  EXPECT_FALSE(last.verdict.passed) << "K=16384: a 14-bit accumulator over 16384 products passed as promoted";
  EXPECT_TRUE(std::find(last.verdict.checks.begin(), last.verdict.checks.end(), "D:baseline_rule") != last.verdict.checks.end())
      << (last.verdict.reasons.empty() ? "" : last.verdict.reasons.front());

  // without the declared model the same outputs pass: the precision rule cannot tell
  KernelTraits no_model = claims;
  no_model.accumulation_model.clear();
  Declaring unmodelled(make_emulated_gemm(*AccumulationModel::parse("cpu.blockfma:block=32,frac=13,round=rz")), no_model);
  EXPECT_TRUE(sweep_kernel(unmodelled).cases.back().verdict.passed);

  // the tolerance: finite at K = 16384 only with the promotion declared
  ToleranceModel t;
  t.accumulator_bits = 14;
  EXPECT_EQ(t.gamma(16384), INFINITY);
  t.promote = 128;
  const double inner = 128 * 0x1p-13 / (1 - 128 * 0x1p-13), outer = 128 * 0x1p-23 / (1 - 128 * 0x1p-23);
  EXPECT_DOUBLE_EQ(t.gamma(16384), (1 + inner) * (1 + outer) - 1);
  EXPECT_DOUBLE_EQ(t.gamma(100), 100 * 0x1p-13 / (1 - 100 * 0x1p-13));  // within one chunk
}

// Effective bits that mean something for truncating accumulators: an
// FP8-tensor-core-like model (13 fraction bits in steps of 32, promoted every 128) through
// E4M3 inputs is measured by the block-FMA family fitted on the same inputs: within a bit of
// its 14 bits of precision at every K, spread under half a bit, with an uncertainty; an RNE
// calibrator on the same outputs (the kernel declared as rounding to nearest) drifts by
// several bits across K, as the H200's FP8 sweeps did (0.73 to 11.5 bits).
TEST(Sweep, FittedEffectiveBitsOfATruncatingAccumulatorAreStableAcrossK) {
  const char* fp8_like = "cpu.blockfma:block=32,frac=13,round=rz,promote=128";
  auto truncating = make_emulated_gemm(*AccumulationModel::parse(fp8_like));
  const SweepOutcome fit = sweep_kernel(*truncating);
  KernelTraits rne = truncating->traits();
  rne.rounds_to_nearest = true;
  Declaring as_rne(make_emulated_gemm(*AccumulationModel::parse(fp8_like)), rne);
  const SweepOutcome cal = sweep_kernel(as_rne);
  const auto spread = [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end());
  };
  std::printf("[ sweep ] fitted:");
  for (double b : fit.effective_bits_per_point) std::printf(" %.2f", b);
  std::printf(" (spread %.2f); RNE calibrator:", spread(fit.effective_bits_per_point));
  for (double b : cal.effective_bits_per_point) std::printf(" %.2f", b);
  std::printf(" (spread %.2f)\n", spread(cal.effective_bits_per_point));
  ASSERT_EQ(fit.effective_bits_per_point.size(), 4u);
  for (double b : fit.effective_bits_per_point) EXPECT_NEAR(b, 14.0, 1.0);
  EXPECT_LT(spread(fit.effective_bits_per_point), 0.5);
  EXPECT_GT(spread(cal.effective_bits_per_point), 2.0);
  for (const CaseResult& r : fit.cases) {
    ASSERT_TRUE(r.notes.count("effective_bits_uncertainty")) << "K=" << r.spec.gemm.k;
    EXPECT_LT(std::stod(r.notes.at("effective_bits_uncertainty")), 0.5);
    EXPECT_EQ(r.notes.at("effective_bits_family"), "cpu.blockfma:block=16,frac=F,round=rz,promote=128");
  }
  // declared (the probe's model), the family is the kernel's own: exact at every K
  KernelTraits declared = truncating->traits();
  declared.accumulation_model = fp8_like;
  Declaring modelled(make_emulated_gemm(*AccumulationModel::parse(fp8_like)), declared);
  for (double b : sweep_kernel(modelled).effective_bits_per_point) EXPECT_DOUBLE_EQ(b, 14.0);
}
