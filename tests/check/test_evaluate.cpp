// Evaluation of a kernel on a case: what the kernel's declared precision implies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>

#include <fmt/format.h>

#include "core/parallel.hpp"
#include "distributions/fill.hpp"
#include "check/check.hpp"
#include "campaign/record.hpp"
#include "check/ops/gemm.hpp"
#include "check/ops/op.hpp"
#include "kernels/emulated/attention_models.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "kernels/builtin.hpp"

using namespace ulpgate;

namespace {

// The test kernels' shared GEMM: row-major, no transposes or leading dimensions, one batch;
// D[i][j] = finish(sum of fma(in(a_ik), in(b_kj)) in FP32, sequentially).
bool plain_row_major(const Case& c) {
  return c.beta == 0.0 && !c.gemm.trans_a && !c.gemm.trans_b && c.gemm.layout == Layout::RowMajor && c.gemm.batch == 1 &&
         !c.gemm.lda && !c.gemm.ldb && !c.gemm.ldd && c.types.at("D") == Format::FP32;
}
template <class In, class Finish>
void plain_gemm(const Case& c, const KernelIo& io, In in, Finish finish) {
  const auto* a = static_cast<const float*>(io.in.at("A"));
  const auto* b = static_cast<const float*>(io.in.at("B"));
  auto* d = static_cast<float*>(io.out.at("D"));
  const auto& g = c.gemm;
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < g.k; ++k) acc = std::fma(in(a[i * g.k + k]), in(b[k * g.n + j]), acc);
      d[i * g.n + j] = finish(acc);
    }
}

// A TF32 tensor-core model: FP32 inputs rounded to TF32 exactly as core/format defines it
// (to nearest by default, as the hardware conversion does; ties away as cvt.rna.tf32.f32;
// or truncated), products and sums in FP32. Row-major, no transposes, beta = 0.
class Tf32Model final : public Kernel {
 public:
  explicit Tf32Model(Rounding r = Rounding::NearestEven) : rounding_(r) {}
  std::string name() const override { return "test.tf32"; }
  std::string description() const override { return "inputs rounded to TF32, FP32 FMA"; }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Host, true};
    t.input_rounding = rounding_;  // as it rounds them (the bias test holds it to that)
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.types.at("compute") != Format::TF32 || !plain_row_major(c) || c.epilogue != Epilogue::None) return "not this case";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    plain_gemm(c, io, [&](float v) { return static_cast<float>(round_to(Format::TF32, v, rounding_)); },
               [&](float acc) { return static_cast<float>(c.alpha) * acc; });
  }

 private:
  Rounding rounding_;
};

Case tf32_case(std::int64_t m, std::int64_t n, std::int64_t k) {
  Case c = dtype_gemm_case("tf32", m, n, k);
  c.gemm.trans_b = false;
  c.kernel = "test.tf32";
  return c;
}

}  // namespace

// An FP32 input within half a TF32 unit of FLT_MAX rounds to Inf in TF32: the D elements it
// reaches may be Inf although the exact result is finite. Accepted as an overflow for a
// kernel that rounds its inputs (tolerance input_bits), an unexpected Inf otherwise.
TEST(Evaluate, InputRoundingThatOverflowsIsAnOverflow) {
  Case c;
  c.gemm.m = 1, c.gemm.n = 2, c.gemm.k = 2;
  c.types = {{"A", Format::FP32}, {"B", Format::FP32}, {"D", Format::FP32}, {"compute", Format::TF32}};
  Tensor a(Format::FP32, 2), b(Format::FP32, 4);
  a.set_value(0, 0.25), a.set_value(1, 0.5);
  b.set_value(0, FLT_MAX), b.set_value(1, 1.0);  // row 0 of B: FLT_MAX rounds to Inf in TF32
  b.set_value(2, 1.0), b.set_value(3, 2.0);
  const std::map<std::string, Tensor> in{{"A", a}, {"B", b}};
  Tf32Model k;
  const Evaluation ev = evaluate_with_inputs(k, c, in, {});
  ASSERT_EQ(ev.tolerance.input_bits, 11);
  ASSERT_EQ(ev.metrics.size(), 1u);
  EXPECT_EQ(ev.metrics[0].overflowed, 1);  // D[0][0] = Inf, exact 0.25 FLT_MAX + 0.5
  EXPECT_EQ(ev.metrics[0].unexpected_inf, 0);
  EXPECT_TRUE(ev.verdict.passed) << ev.verdict.reasons.front();

  EvaluationOptions as_given;  // a model that says it uses its inputs as given
  as_given.tolerance = ToleranceModel{};
  const Evaluation strict = evaluate_with_inputs(k, c, in, as_given);
  EXPECT_EQ(strict.metrics[0].unexpected_inf, 1);
  EXPECT_FALSE(strict.verdict.passed);
}

// TF32 keeps FP32's exponent range with 10 fraction bits, so its subnormals are multiples of
// 2^-136: rounding an FP32 subnormal to TF32 moves it by up to 2^-137 (half that unit; a
// whole unit when truncating) whatever its size, an absolute error that 2 u_in sum|a b|
// cannot cover. Here a = 2^-137 + 2^-149 rounds to 2^-136 (to 0 truncated) and b = 2^100:
// the correct kernel is 2^-37 away from the exact 2^-37 + 2^-49 (512x the relative bound).
TEST(Evaluate, Tf32SubnormalInputRoundingIsNoFalseAlarm) {
  Case c = tf32_case(1, 1, 1);
  Tensor a(Format::FP32, 1), b(Format::FP32, 1);
  a.set_value(0, 0x1p-137 + 0x1p-149);
  b.set_value(0, 0x1p100);
  const std::map<std::string, Tensor> in{{"A", a}, {"B", b}};
  for (Rounding r : {Rounding::NearestEven, Rounding::NearestAway, Rounding::TowardZero}) {
    Tf32Model k(r);
    const Evaluation ev = evaluate_with_inputs(k, c, in, {});
    ASSERT_EQ(ev.metrics.size(), 1u);
    EXPECT_GT(ev.metrics[0].max_abs, 0x1p-38) << name(r);  // the input rounding shows
    EXPECT_TRUE(ev.verdict.passed) << name(r) << ": " << ev.verdict.reasons.front();
  }
  // The same absolute error where the input is exact in TF32 is a bug, still caught.
  a.set_value(0, 0x1p-136);
  Tf32Model k;
  const std::map<std::string, Tensor> exact_in{{"A", a}, {"B", b}};
  const Evaluation ok = evaluate_with_inputs(k, c, exact_in, {});
  EXPECT_TRUE(ok.verdict.passed);
  class Off final : public Kernel {
   public:
    std::string name() const override { return "test.off"; }
    std::string description() const override { return "D + 2^-37"; }
    KernelTraits traits() const override { return {}; }
    std::optional<std::string> unsupported(const Case&) const override { return std::nullopt; }
    void run(const Case& cc, const KernelIo& io, RunNotes& n) override {
      inner.run(cc, io, n);
      *static_cast<float*>(io.out.at("D")) += 0x1p-37f;
    }
    Tf32Model inner;
  } off;
  EXPECT_FALSE(evaluate_with_inputs(off, c, exact_in, {}).verdict.passed);
}

// Generated FP32 subnormal inputs (subnormal(rate): uniform subnormal codes), the TF32 model
// rounding them as core/format does, to nearest, ties away and toward zero: no false alarm.
TEST(Evaluate, Tf32ModelPassesSubnormalInputs) {
  int runs = 0, failed = 0;
  double worst_ratio = 0;
  std::string worst;
  for (Rounding r : {Rounding::NearestEven, Rounding::NearestAway, Rounding::TowardZero}) {
    Tf32Model k(r);
    for (std::int64_t kk : {1, 3, 16, 100})
      for (const char* bdist : {"normal(0,1)", "subnormal(rate=0.5)", "lognormal(0,8)"})
        for (std::uint64_t seed = 1; seed <= 12; ++seed) {
          Case c = tf32_case(4, 6, kk);
          c.dist = {{"A", "subnormal(rate=0.9)"}, {"B", bdist}};
          c.seed = seed;
          const Evaluation ev = evaluate(k, c, {});
          ++runs;
          if (!ev.verdict.passed) {
            ++failed;
            const std::string& why = ev.verdict.reasons.front();
            const auto at = why.find("worst ");
            const double ratio = at == std::string::npos ? 0.0 : std::stod(why.substr(at + 6));
            if (ratio >= worst_ratio)
              worst_ratio = ratio, worst = fmt::format("{} K={} B={} seed {}: {}", name(r), kk, bdist, seed, why);
          }
        }
  }
  EXPECT_EQ(failed, 0) << failed << " of " << runs << " runs failed; worst: " << worst;
}

namespace {

// A correct GEMM that says it is not deterministic (as split-K with atomics is): each run
// sums the products a_k b_k in FP32 in a fresh random order. Any layout, transposes and
// leading dimensions, inputs up to FP32, beta = 0, no epilogue, D FP32. `post` (if given)
// changes D afterwards: a planted bug.
class PermutedSum final : public Kernel {
 public:
  explicit PermutedSum(bool deterministic = false, std::function<float(float)> post = {})
      : deterministic_(deterministic), post_(std::move(post)) {}
  std::string name() const override { return "test.permuted_sum"; }
  std::string description() const override { return "FP32 sum in a random order each run"; }
  KernelTraits traits() const override {
    KernelTraits t;
    t.deterministic = deterministic_;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.beta != 0.0 || c.epilogue != Epilogue::None || c.types.at("D") != Format::FP32 ||
        c.types.at("compute") != Format::FP32 || c.types.at("A") == Format::FP64 || c.types.at("B") == Format::FP64)
      return "not this case";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const auto& g = c.gemm;
    const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
    const Format fa = c.types.at("A"), fb = c.types.at("B");
    std::mt19937_64 rng(deterministic_ ? 1 : ++runs_);
    std::vector<std::int64_t> order(static_cast<std::size_t>(g.k));
    for (std::int64_t b = 0; b < g.batch; ++b)
      for (std::int64_t i = 0; i < g.m; ++i)
        for (std::int64_t j = 0; j < g.n; ++j) {
          std::iota(order.begin(), order.end(), 0);
          std::shuffle(order.begin(), order.end(), rng);
          float acc = 0.0f;
          for (std::int64_t k : order)
            acc = std::fma(static_cast<float>(decode(fa, load_code(fa, io.in.at("A"), op_a_offset(c, av, b, i, k)))),
                           static_cast<float>(decode(fb, load_code(fb, io.in.at("B"), op_b_offset(c, bv, b, k, j)))), acc);
          float v = static_cast<float>(c.alpha) * acc;
          if (post_) v = post_(v);
          store_code(Format::FP32, io.out.at("D"), dv.offset(b, i, j), encode(Format::FP32, v));
        }
  }

 private:
  bool deterministic_;
  std::function<float(float)> post_;
  std::uint64_t runs_ = 0;
};

std::string relation_of(const Evaluation& ev) { return ev.relations.empty() ? "" : ev.relations.front().relation; }

}  // namespace

// The scaling relation compares D(2A) with 2 D(A) bit for bit, which a kernel that is not
// bitwise repeatable cannot promise: there D(2A) is judged against its own exact reference.
// A correct kernel that sums in a random order each run passes every relation.
TEST(Evaluate, NonDeterministicKernelPassesTheGemmRelations) {
  PermutedSum k;
  int runs = 0;
  for (const char* dtype : {"fp32", "bf16", "fp16"})
    for (std::uint64_t seed = 1; seed <= 4; ++seed) {
      Case c = dtype_gemm_case(dtype, 9, 7, 200);
      c.gemm.layout = seed % 2 ? Layout::RowMajor : Layout::ColMajor;
      c.kernel = k.name();
      c.seed = seed;
      const Evaluation ev = evaluate(k, c, {});
      ++runs;
      EXPECT_TRUE(ev.verdict.passed) << dtype << " seed " << seed << ": " << ev.verdict.reasons.front();
    }
  EXPECT_EQ(runs, 12);
}

// A deterministic kernel with an absolute offset of 2^-18 (a few ulps for |D| ~ 10, inside
// the tolerance) cannot double D exactly: the scaling relation still catches it bit for
// bit. A non-deterministic kernel that breaks on the doubled problem (it clamps |D| to 16,
// which only the doubled D reaches) fails the relation against its own reference.
TEST(Evaluate, ScalingRelationStillCatchesBrokenKernels) {
  Case c = dtype_gemm_case("fp32", 9, 7, 100);
  c.dist = {{"A", "uniform(0.5,1)"}, {"B", "uniform(0.1,0.2)"}};  // |D| in [5, 20]/... about 11
  c.seed = 3;
  PermutedSum offset(true, [](float v) { return v + 0x1p-18f; });
  c.kernel = offset.name();
  const Evaluation ev = evaluate(offset, c, {});
  EXPECT_GT(ev.metrics[0].max_ulp, 1.0);
  EXPECT_EQ(relation_of(ev), "scaling") << (ev.verdict.reasons.empty() ? "passed" : ev.verdict.reasons.front());

  PermutedSum clamp(false, [](float v) { return std::clamp(v, -16.0f, 16.0f); });
  const Evaluation cl = evaluate(clamp, c, {});
  EXPECT_EQ(relation_of(cl), "scaling") << (cl.verdict.reasons.empty() ? "passed" : cl.verdict.reasons.front());
}

namespace {

// A tensor-core-like FP16 unit that aligns its products by their inputs' exponents, with
// a subnormal input's exponent taken as the format's emin (its significand unnormalised),
// keeps 23 bits below the largest of a block of 4 and the accumulator (truncating), and
// stores the accumulator in FP32 toward zero. Correct to about FP32 truncation, but its
// alignment grid is absolute for subnormal inputs: doubling a subnormal does not double the
// truncated products. Row-major FP16, no transposes, beta = 0, no epilogue, D FP32.
class UnnormalisedSubnormals final : public Kernel {
 public:
  std::string name() const override { return "test.unnormalised_subnormals"; }
  std::string description() const override { return "FP16 block FMA aligned on unnormalised exponents"; }
  KernelTraits traits() const override { return {Memory::Host, true}; }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.types.at("A") != Format::FP16 || c.types.at("B") != Format::FP16 || c.types.at("D") != Format::FP32 ||
        c.beta != 0.0 || c.gemm.trans_a || c.gemm.trans_b || c.gemm.layout != Layout::RowMajor || c.gemm.batch != 1 ||
        c.gemm.lda || c.gemm.ldb || c.gemm.ldd || c.epilogue != Epilogue::None)
      return "not this case";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const auto* a = static_cast<const std::uint16_t*>(io.in.at("A"));
    const auto* b = static_cast<const std::uint16_t*>(io.in.at("B"));
    auto* d = static_cast<float*>(io.out.at("D"));
    const auto& g = c.gemm;
    const auto value = [](std::uint16_t h) { return decode(Format::FP16, h); };
    const auto nominal = [](double v) { return v == 0 ? -1000 : std::max(std::ilogb(v), -14); };
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        float acc = 0.0f;
        for (std::int64_t k0 = 0; k0 < g.k; k0 += 4) {
          double p[4] = {};
          int e = acc == 0.0f ? -1000 : std::ilogb(acc);
          for (std::int64_t k = k0; k < std::min(g.k, k0 + 4); ++k) {
            const double x = value(a[i * g.k + k]), y = value(b[k * g.n + j]);
            p[k - k0] = x * y;
            if (x != 0 && y != 0) e = std::max(e, nominal(x) + nominal(y));
          }
          const double unit = std::ldexp(1.0, e - 23);
          double sum = std::trunc(acc / unit) * unit;
          for (double q : p) sum += std::trunc(q / unit) * unit;
          acc = static_cast<float>(round_to(Format::FP32, sum, Rounding::TowardZero));
        }
        d[i * g.n + j] = static_cast<float>(c.alpha) * acc;
      }
  }
};

}  // namespace

// Hardware may align products on exponents that a subnormal input does not normalise (the
// H200's FP16 tensor cores through cuBLAS: D(2A) != 2 D(A) in 3 of 44 elements of a case
// with subnormal A, every element within the tolerance; this model: in 31-64 of 1024). So the scaling relation holds only
// where A is normal: a correct unit like that passes, as a planted absolute offset on
// normal data still fails it (ScalingRelationStillCatchesBrokenKernels).
TEST(Evaluate, ScalingRelationSkipsSubnormalInputsThatHardwareMayNotNormalise) {
  Case c = dtype_gemm_case("fp16", 16, 64, 255);
  c.gemm.trans_b = false;
  c.dist = {{"A", "subnormal(rate=0.9)"}, {"B", "lognormal(0,1)"}};
  UnnormalisedSubnormals k;
  c.kernel = k.name();
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    c.seed = seed;
    const Evaluation ev = evaluate(k, c, {});
    EXPECT_TRUE(ev.verdict.passed) << "seed " << seed << ": " << ev.verdict.reasons.front();
  }
  // On normal inputs the same unit is scale-invariant, and the relation runs and holds.
  c.dist = {{"A", "normal(0,1)"}, {"B", "lognormal(0,1)"}};
  const Evaluation normal = evaluate(k, c, {});
  EXPECT_TRUE(normal.verdict.passed) << normal.verdict.reasons.front();
}

// A relation's extra run that fails (the kernel throws, crashes, times out) fails the
// relation, naming the status: the doubled or transposed problem is one the kernel said
// it supports, so a run that gives nothing is a finding, not a relation skipped.
TEST(Evaluate, AGemmRelationRunThatFailsFailsTheRelation) {
  Case c = dtype_gemm_case("fp32", 9, 7, 100);
  c.dist = {{"A", "uniform(0.5,1)"}, {"B", "uniform(0.1,0.2)"}};  // |D| about 11; doubled about 22
  c.seed = 3;
  for (const bool deterministic : {true, false}) {
    PermutedSum breaks_doubled(deterministic, [](float v) {
      if (std::fabs(v) > 16) throw KernelError("planted: |D| above 16");
      return v;
    });
    c.kernel = breaks_doubled.name();
    const Evaluation ev = evaluate(breaks_doubled, c, {});
    EXPECT_EQ(relation_of(ev), "scaling") << "deterministic " << deterministic << ": "
                                          << (ev.verdict.reasons.empty() ? "passed" : ev.verdict.reasons.front());
    if (!ev.relations.empty()) {
      EXPECT_NE(ev.relations.front().problem.find("failed: planted"), std::string::npos) << ev.relations.front().problem;
    }
  }
  // The transposed problem is column-major where c is row-major.
  class BreaksColumnMajor final : public Kernel {
   public:
    std::string name() const override { return "test.breaks_col_major"; }
    std::string description() const override { return "FP32 sequential; throws on column-major problems"; }
    KernelTraits traits() const override { return {Memory::Host, true}; }
    std::optional<std::string> unsupported(const Case& cc) const override { return inner_.unsupported(cc); }
    void run(const Case& cc, const KernelIo& io, RunNotes& notes) override {
      if (cc.gemm.layout == Layout::ColMajor) throw KernelError("planted: column-major");
      inner_.run(cc, io, notes);
    }

   private:
    PermutedSum inner_{true};
  } breaks_transposed;
  c.kernel = breaks_transposed.name();
  c.gemm.layout = Layout::RowMajor;
  const Evaluation ev = evaluate(breaks_transposed, c, {});
  EXPECT_EQ(relation_of(ev), "transposition") << (ev.verdict.reasons.empty() ? "passed" : ev.verdict.reasons.front());
  if (!ev.relations.empty()) {
    EXPECT_NE(ev.relations.front().problem.find("failed: planted"), std::string::npos) << ev.relations.front().problem;
  }
}

// The write audit and what a failing case reports: a correct kernel is never "unwritten"
// because it wrote the poison's bit pattern (E4M3's only negative NaN is the poison
// 0xFF), an unwritten element is reported once (not also as an unexpected NaN), and the
// worst element of a failing case is one that fails.
namespace {

// The FP32 sequential CPU model with one change to what it leaves in D.
class Changed final : public Kernel {
 public:
  /// change(case, D buffer, D's contents before the run) runs after the model.
  using Change = std::function<void(const Case&, void* d, const std::vector<Code>& before)>;
  explicit Changed(Change change) : change_(std::move(change)) {}
  std::string name() const override { return "test.changed"; }
  std::string description() const override { return "cpu.fp32_seq, changed"; }
  KernelTraits traits() const override { return {}; }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_->unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const Format f = c.types.at("D");
    const MatrixView dv = gemm_view(c, "D");
    std::vector<Code> before(static_cast<std::size_t>(dv.elements()));
    for (std::size_t e = 0; e < before.size(); ++e) before[e] = load_code(f, io.out.at("D"), static_cast<std::int64_t>(e));
    inner_->run(c, io, notes);
    change_(c, io.out.at("D"), before);
  }

 private:
  Change change_;
  std::unique_ptr<Kernel> inner_ = make_emulated_gemm(AccumulationModel{});
};

// FP32 A (2 x 3, a NaN in row 0) and B (3 x 4): D's row 0 is NaN, row 1 finite.
std::map<std::string, Tensor> nan_row_inputs(const Case& c) {
  Tensor a(Format::FP32, 6), b(Format::FP32, 12);
  for (int e = 0; e < 6; ++e) a.set_value(e, 0.25 * (e + 1));
  for (int e = 0; e < 12; ++e) b.set_value(e, 0.5 - 0.125 * e);
  a.set_value(gemm_view(c, "A").offset(0, 0, 1), NAN);
  return {{"A", a}, {"B", b}};
}

const Format kOutputs[] = {Format::FP32, Format::FP16, Format::BF16, Format::E4M3, Format::E5M2};

// Where the result is NaN the kernel writes the poison's code: a NaN, so correct (for
// E4M3 it is the only negative NaN, 0xFF, and a sign-keeping conversion writes it).
void nan_as_poison(const Case& c, void* d, const std::vector<Code>&) {
  const Format f = c.types.at("D");
  const MatrixView dv = gemm_view(c, "D");
  for (std::int64_t i = 0; i < c.gemm.m; ++i)
    for (std::int64_t j = 0; j < c.gemm.n; ++j)
      if (is_nan(f, load_code(f, d, dv.offset(0, i, j)))) store_code(f, d, dv.offset(0, i, j), poison_code(f));
}

}  // namespace

TEST(WriteAudit, ANaNWrittenAsThePoisonCodeIsWritten) {
  for (Format f : kOutputs) {
    Case c = dtype_gemm_case("fp32", 2, 4, 3, f);
    c.gemm.trans_b = false;
    const auto in = nan_row_inputs(c);
    Changed k(nan_as_poison);
    const Evaluation ev = evaluate_with_inputs(k, c, in, {});
    ASSERT_EQ(ev.metrics.size(), 1u) << name(f);
    EXPECT_EQ(ev.metrics[0].unwritten, 0) << name(f);
    EXPECT_EQ(ev.metrics[0].expected_nonfinite, 4) << name(f);
    EXPECT_TRUE(ev.verdict.passed) << name(f) << ": " << ev.verdict.reasons.front();
  }
}

// An element the kernel never wrote is unwritten, and only that: not also an unexpected
// NaN, whatever its exact value (finite at (1, 2), NaN at (0, 1)) and whatever the kernel
// writes elsewhere (the poison's code where the result is NaN).
TEST(WriteAudit, AnUnwrittenElementIsReportedOnce) {
  for (Format f : kOutputs) {
    Case c = dtype_gemm_case("fp32", 2, 4, 3, f);
    c.gemm.trans_b = false;
    const auto in = nan_row_inputs(c);
    Changed k([](const Case& cc, void* d, const std::vector<Code>& before) {
      nan_as_poison(cc, d, before);
      const Format fd = cc.types.at("D");
      const MatrixView dv = gemm_view(cc, "D");
      for (const auto& [i, j] : {std::pair{1, 2}, std::pair{0, 1}})
        store_code(fd, d, dv.offset(0, i, j), before[static_cast<std::size_t>(dv.offset(0, i, j))]);
    });
    const Evaluation ev = evaluate_with_inputs(k, c, in, {});
    ASSERT_EQ(ev.metrics.size(), 1u) << name(f);
    const ErrorMetrics& m = ev.metrics[0];
    EXPECT_EQ(m.unwritten, 2) << name(f);
    EXPECT_EQ(m.unexpected_nan, 0) << name(f);
    EXPECT_EQ(m.expected_nonfinite, 3) << name(f);  // row 0 but (0, 1)
    EXPECT_EQ(m.compared, 3) << name(f);            // row 1 but (1, 2)
    EXPECT_EQ(std::set<std::string>(ev.verdict.checks.begin(), ev.verdict.checks.end()), std::set<std::string>{"D:unwritten"})
        << name(f) << ": " << (ev.verdict.reasons.empty() ? "passed" : ev.verdict.reasons.front());
  }
}

// D in FP16 from FP32 inputs, K = 2: D[0][0] = 1 + 2^-12 correctly rounded to 1 (normalised
// error 2^-12, the largest), D[0][1] = 2^-20 (cancellation, sum|a b| = 2) written as 2^-18:
// 3 2^-20 off, beyond the bound, with a normalised error of only 1.5 2^-20. The worst
// element shown is the failing one.
TEST(WriteAudit, TheWorstElementOfAFailingCaseFails) {
  Case c = dtype_gemm_case("fp32", 1, 2, 2, Format::FP16);
  c.gemm.trans_b = false;
  Tensor a(Format::FP32, 2), b(Format::FP32, 4);
  a.set_value(0, 1.0), a.set_value(1, 1.0);
  b.set_value(0, 1.0), b.set_value(1, 1.0);                // k = 0: (1, 1)
  b.set_value(2, 0x1p-12), b.set_value(3, -1.0 + 0x1p-20);  // k = 1
  const std::map<std::string, Tensor> in{{"A", a}, {"B", b}};
  Changed k([](const Case& cc, void* d, const std::vector<Code>&) {
    store_code(Format::FP16, d, gemm_view(cc, "D").offset(0, 0, 1), encode(Format::FP16, 0x1p-18));
  });
  const Evaluation ev = evaluate_with_inputs(k, c, in, {});
  ASSERT_FALSE(ev.verdict.passed);
  const ErrorMetrics& m = ev.metrics[0];
  EXPECT_EQ(m.max_normalised, 0x1p-12 / (1 + 0x1p-12));  // element (0, 0), correctly rounded
  EXPECT_EQ(m.worst.index, (std::vector<std::int64_t>{0, 0, 1}));
  EXPECT_EQ(m.worst.got, "0x0040 (0x1p-18)");

  // A passing case shows its largest normalised error.
  Changed same([](const Case&, void*, const std::vector<Code>&) {});
  const Evaluation ok = evaluate_with_inputs(same, c, in, {});
  ASSERT_TRUE(ok.verdict.passed) << ok.verdict.reasons.front();
  EXPECT_EQ(ok.metrics[0].worst.index, (std::vector<std::int64_t>{0, 0, 0}));
}

// A small case runs on the calling thread from filling to the last relation: starting a
// thread costs tens of microseconds, more than the whole case (on the 16-core H200 host
// the precision scale's two loops per case started 30 threads and took 4 ms a case).
TEST(Evaluate, SmallCasesStartNoThreads) {
  ::setenv("ULPGATE_THREADS", "16", 1);
  Registry registry = builtin_registry();
  for (const char* kernel : {"cpu.fp32_seq", "cpu.attn_flash:block=64,p=fp16"}) {
    Kernel* k = registry.resolve(kernel);
    ASSERT_NE(k, nullptr) << kernel;
    const Op op = std::string(kernel).find("attn") != std::string::npos ? Op::Attention : Op::Gemm;
    for (const char* dtype : {"fp32", "bf16"}) {
      Case c = op_module(op).basic_case(dtype);
      c.kernel = k->name();
      if (op == Op::Gemm) c.gemm.m = 16, c.gemm.n = 24, c.gemm.k = 64;  // the median fuzz case is smaller
      const std::uint64_t before = parallel_threads_started();
      const Evaluation ev = evaluate(*k, c, {});
      EXPECT_TRUE(ev.verdict.passed) << kernel << " " << dtype;
      EXPECT_EQ(parallel_threads_started(), before) << kernel << " " << dtype;
    }
  }
  ::unsetenv("ULPGATE_THREADS");
}

// Past kPrecisionTerms the precision rule and the effective-bits calibrator cover a sample
// of D's elements (check/ops/gemm.hpp precision_sample): rows, then columns when 16 full
// rows cost too much, each with the edges and tile boundaries, then indices spread evenly;
// every element below the threshold.
TEST(PrecisionSample, AllElementsUpToTheThresholdThenRowsThenColumnsWithTheEdges) {
  Case c = dtype_gemm_case("fp32", 64, 64, 1024);
  EXPECT_TRUE(precision_sample(c).all(c.gemm));
  c.gemm.m = 1000, c.gemm.n = 1000, c.gemm.k = 65536;  // 6.6e10 terms: 16 rows x 2^28 / (16 K) columns
  c.seed = 3;
  const PrecisionSample s = precision_sample(c);
  EXPECT_EQ(s.rows.size(), 16u);
  EXPECT_EQ(s.cols.size(), 256u);
  for (const auto* v : {&s.rows, &s.cols}) {
    EXPECT_TRUE(std::is_sorted(v->begin(), v->end()));
    for (std::int64_t i : {0, 1, 895, 896, 959, 960, 996, 997, 998, 999})
      EXPECT_TRUE(std::binary_search(v->begin(), v->end(), i)) << i;
  }
  c.gemm.m = 2000, c.gemm.n = 100, c.gemm.k = 10000;  // 2e9 terms: 2^28 / 1e6 = 268 full rows
  EXPECT_EQ(precision_sample(c).rows.size(), 268u);
  EXPECT_EQ(precision_sample(c).cols.size(), 100u);
  c.gemm.m = 4096, c.gemm.n = 4096, c.gemm.k = 1 << 20;  // the floors: 16 rows, 64 columns
  EXPECT_EQ(precision_sample(c).rows.size(), 16u);
  EXPECT_EQ(precision_sample(c).cols.size(), 64u);
}

// A case past the threshold: the correct model passes, its precision scale covers the
// sample only (16 of 64 rows x 64 columns), and the calibrator over it still measures
// FP32's 24 bits.
TEST(PrecisionSample, SampledRuleAndCalibratorOnAHugeCase) {
  Case c = dtype_gemm_case("fp32", 64, 64, 300000);  // 1.2e9 terms
  c.kernel = "cpu.fp32_seq";
  c.dist = {{"A", "normal(0,1)"}, {"B", "normal(0,1)"}};
  c.seed = 11;
  ASSERT_EQ(precision_sample(c).rows.size(), 16u);
  ASSERT_EQ(precision_sample(c).cols.size(), 64u);
  auto k = make_emulated_gemm(default_models()[0]);
  EvaluationOptions o;
  o.effective_bits = true;
  o.relations = false;
  const Evaluation ev = evaluate(*k, c, o);
  EXPECT_TRUE(ev.verdict.passed) << (ev.verdict.reasons.empty() ? "" : ev.verdict.reasons.front());
  EXPECT_NEAR(ev.effective_bits, 24.0, 0.5);
}

namespace {

// FP32 GEMM (row-major, no transposes, beta = 0) with a declarable arithmetic: sequential
// FP32 FMA whose result is flushed to zero where subnormal (as atomicAdd's FP32 results
// are), or a gelu_tanh epilogue with tanh off by `tanh_error` (as an approximate tanh).
class DeclaredArithmetic final : public Kernel {
 public:
  DeclaredArithmetic(KernelTraits t, bool flush, double tanh_error) : t_(t), flush_(flush), tanh_error_(tanh_error) {}
  std::string name() const override { return "test.declared"; }
  std::string description() const override { return "FP32 FMA, flushes or approximate tanh"; }
  KernelTraits traits() const override { return t_; }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.types.at("compute") != Format::FP32 || c.types.at("A") != Format::FP32 || !plain_row_major(c) ||
        (c.epilogue != Epilogue::None && c.epilogue != Epilogue::GeluTanh))
      return "not this case";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    plain_gemm(c, io, [](float v) { return v; }, [&](float acc) {
      if (flush_ && std::fabs(acc) < FLT_MIN) acc = std::copysign(0.0f, acc);
      float v = static_cast<float>(c.alpha) * acc;
      if (c.epilogue == Epilogue::GeluTanh) {
        const double t = std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * double(v) * v * v));
        v = static_cast<float>(0.5 * v * (1.0 + t + (t > 0 ? -tanh_error_ : tanh_error_)));
      }
      return v;
    });
  }

 private:
  KernelTraits t_;
  bool flush_;
  double tanh_error_;
};

Case fp32_case(std::int64_t m, std::int64_t n, std::int64_t k, const char* dist, std::uint64_t seed) {
  Case c = dtype_gemm_case("fp32", m, n, k);
  c.gemm.trans_b = false;
  c.kernel = "test.declared";
  c.dist = {{"A", dist}, {"B", "normal(0,1)"}};
  c.seed = seed;
  return c;
}

}  // namespace

// A kernel whose atomics flush subnormal results (the ladder's split-K atomic kernel on the
// H200: D = +0 where the exact result is 2^-127) passes where it declares it
// (KernelTraits::flushes_subnormals) and fails where it does not; a kernel that declares it
// but is off by more than the smallest normal number still fails.
TEST(Evaluate, DeclaredSubnormalFlushingIsNoFalseAlarm) {
  KernelTraits plain{Memory::Host, true}, flushing = plain;
  flushing.flushes_subnormals = true;
  int undeclared_failed = 0, declared_failed = 0, runs = 0;
  for (std::uint64_t seed = 1; seed <= 8; ++seed)
    for (const std::int64_t k : {1, 3, 6}) {
      Case c = fp32_case(8, 8, k, "subnormal(rate=0.5)", seed), c2 = c;
      DeclaredArithmetic undeclared(plain, true, 0), declared(flushing, true, 0);
      undeclared_failed += !evaluate(undeclared, c, {}).verdict.passed;
      declared_failed += !evaluate(declared, c2, {}).verdict.passed;
      ++runs;
    }
  EXPECT_EQ(declared_failed, 0);
  EXPECT_GT(undeclared_failed, runs / 2);
  // 2^-120 off is beyond any flushing.
  class Off final : public Kernel {
   public:
    explicit Off(KernelTraits t) : inner(t, true, 0) {}
    std::string name() const override { return "test.declared"; }
    std::string description() const override { return "flushes, and D + 2^-120"; }
    KernelTraits traits() const override { return inner.traits(); }
    std::optional<std::string> unsupported(const Case& c) const override { return inner.unsupported(c); }
    void run(const Case& cc, const KernelIo& io, RunNotes& n) override {
      inner.run(cc, io, n);
      *static_cast<float*>(io.out.at("D")) += 0x1p-120f;
    }
    DeclaredArithmetic inner;
  } off(flushing);
  Case c = fp32_case(8, 8, 3, "subnormal(rate=0.5)", 1);
  EXPECT_FALSE(evaluate(off, c, {}).verdict.passed);
}

// A GELU epilogue with an approximate tanh (cuBLASLt's on the H200, about 2^-13 off) passes
// within its declared activation_error and fails without the declaration; a tanh off by
// more than declared fails too.
TEST(Evaluate, DeclaredActivationErrorCoversAnApproximateTanh) {
  KernelTraits plain{Memory::Host, true}, declared = plain;
  declared.activation_error = 0x1p-10;
  int fail_plain = 0, fail_declared = 0, fail_worse = 0, runs = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed)
    for (const std::int64_t k : {1, 4}) {
      Case c = fp32_case(16, 16, k, "normal(0,1)", seed);
      c.epilogue = Epilogue::GeluTanh;
      Case c2 = c, c3 = c;
      DeclaredArithmetic a(plain, false, 0x1p-12), b(declared, false, 0x1p-12), worse(declared, false, 0x1p-8);
      fail_plain += !evaluate(a, c, {}).verdict.passed;
      fail_declared += !evaluate(b, c2, {}).verdict.passed;
      fail_worse += !evaluate(worse, c3, {}).verdict.passed;
      ++runs;
    }
  EXPECT_EQ(fail_declared, 0);
  EXPECT_EQ(fail_plain, runs);
  EXPECT_EQ(fail_worse, runs);
}

// A kernel that declares a bit-accurate accumulation model and an approximate tanh (as the
// cuBLASLt FP8 kernels do) is compared with the model by the baseline rule: the model's GELU
// is exact, so the declared activation error joins the allowance (cuBLASLt FP8 GELU cases
// failed the rule at 30x the model's error).
TEST(Evaluate, BaselineRuleAllowsTheDeclaredActivationError) {
  KernelTraits declared{Memory::Host, true};
  declared.activation_error = 0x1p-10;
  declared.accumulation_model = "cpu.fp32_seq";
  Registry reg = builtin_registry();
  int failed = 0, worse_failed = 0, runs = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed)
    for (const std::int64_t k : {1, 4}) {
      Case c = fp32_case(16, 16, k, "normal(0,1)", seed);
      c.epilogue = Epilogue::GeluTanh;
      Case c2 = c;
      DeclaredArithmetic ok(declared, false, 0x1p-12), worse(declared, false, 0x1p-8);
      const Evaluation e = evaluate(ok, c, {}, &reg);
      failed += !e.verdict.passed;
      if (!e.verdict.passed) ADD_FAILURE() << "seed " << seed << " K " << k << ": " << e.verdict.reasons.front();
      worse_failed += !evaluate(worse, c2, {}, &reg).verdict.passed;
      ++runs;
    }
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(worse_failed, runs);
}

// Outputs computed elsewhere (`ulpgate check --outputs`) are judged as the run that computed
// them: the same reference and metrics, whatever their padding holds; a far-off element fails.
TEST(Evaluate, GivenOutputsAreJudgedAsTheRunThatComputedThem) {
  Case g;
  g.op = Op::Gemm;
  g.gemm = {13, 7, 40, 2, Layout::ColMajor, true, false, 0, 0, 0, 16};
  g.types = {{"A", Format::BF16}, {"B", Format::BF16}, {"D", Format::FP32}, {"compute", Format::FP32}};
  g.seed = 5;
  Case a;
  a.op = Op::Attention;
  a.attention.batch = 2, a.attention.heads = 2, a.attention.seq_q = 5, a.attention.seq_kv = 19, a.attention.head_dim = 16;
  a.attention.layout = AttentionLayout::BSHD;
  a.types = {{"Q", Format::FP16}, {"K", Format::FP16}, {"V", Format::FP16}, {"O", Format::FP16}, {"compute", Format::FP32}};
  a.seed = 6;
  Registry registry = builtin_registry();
  for (const auto& [c, kernel] : {std::pair{g, "cpu.fp32_seq"}, std::pair{a, "cpu.attn_naive"}}) {
    SCOPED_TRACE(kernel);
    Case filled = c;
    const Inputs inputs = fill_inputs(filled);
    EvaluationOptions options;
    options.relations = false;
    const Evaluation ev = evaluate_with_inputs(*registry.find(kernel), filled, inputs, options);
    ASSERT_TRUE(ev.verdict.passed);
    std::map<std::string, Tensor> outputs = ev.run.outputs;
    const std::string out = outputs_of(c).front();
    Tensor& t = outputs.at(out);
    if (c.op == Op::Gemm)  // ldd 16 pads D: what a kernel may not write there is not read
      for (std::size_t e = 0; e < t.size(); ++e)
        if (gemm_view(c, out).is_padding(static_cast<std::int64_t>(e))) t.set_value(e, 1.0);
    const CaseResult r = check_given_outputs(c, outputs, "external:test.npy");
    EXPECT_EQ(r.kernel, "external:test.npy");
    EXPECT_TRUE(r.verdict.passed) << fmt::format("{}", fmt::join(r.verdict.reasons, "; "));
    ASSERT_EQ(r.metrics.size(), 1u);
    EXPECT_EQ(r.metrics[0].elements, ev.metrics[0].elements);
    EXPECT_EQ(r.metrics[0].exact_matches, ev.metrics[0].exact_matches);
    EXPECT_EQ(r.metrics[0].max_normalised, ev.metrics[0].max_normalised);
    EXPECT_EQ(r.metrics[0].max_ulp, ev.metrics[0].max_ulp);
    EXPECT_EQ(r.metrics[0].padding_written, 0);
    const std::int64_t e = op_module(c.op).output_offsets(c, out)[5];
    t.set_value(static_cast<std::size_t>(e), t.value(static_cast<std::size_t>(e)) + 1000);
    EXPECT_FALSE(check_given_outputs(c, outputs, "external:planted.npy").verdict.passed);
    outputs.erase(out);
    EXPECT_THROW(check_given_outputs(c, outputs, "external:none"), InputError);
  }
}

// cuDNN's SDPA on the H200 returns 0 for BF16 outputs near or below FP32's smallest normal
// (exact -0x1.04p-126 came back -0, 0x1.6p-129 came back +0): its FP32 arithmetic flushes
// subnormal results, as every kernel built with --use_fast_math does. The default rule admits
// it for attention: a kernel that flushes BF16 outputs below 2^-126 passes whether or not it
// declares it (KernelTraits::flushes_subnormals); one that also adds 2^-120 to an element
// fails either way.
TEST(Evaluate, DeclaredSubnormalFlushingCoversAttentionOutputs) {
  class Flushing final : public Kernel {
   public:
    Flushing(bool declared, double add) : declared_(declared), add_(add) {
      inner_ = make_emulated_attention(*AttentionModel::parse("cpu.attn_naive"));
    }
    std::string name() const override { return "test.flushing_attention"; }
    std::string description() const override { return "cpu.attn_naive, BF16 outputs below 2^-126 flushed to zero"; }
    KernelTraits traits() const override {
      KernelTraits t = inner_->traits();
      t.flushes_subnormals = declared_;
      return t;
    }
    std::optional<std::string> unsupported(const Case& c) const override { return inner_->unsupported(c); }
    void run(const Case& c, const KernelIo& io, RunNotes& n) override {
      inner_->run(c, io, n);
      const AttentionShape& a = c.attention;
      auto* o = static_cast<std::uint16_t*>(io.out.at("O"));
      for (std::int64_t e = 0; e < a.batch * a.heads * a.seq_q * a.eff_head_dim_v(); ++e)
        if ((o[e] & 0x7F80u) == 0) o[e] &= 0x8000u;
      if (add_ != 0) {
        float f;
        const std::uint32_t w = static_cast<std::uint32_t>(o[0]) << 16;
        std::memcpy(&f, &w, 4);
        f += static_cast<float>(add_);
        std::uint32_t back;
        std::memcpy(&back, &f, 4);
        o[0] = static_cast<std::uint16_t>(back >> 16);
      }
    }

   private:
    bool declared_;
    double add_;
    std::unique_ptr<Kernel> inner_;
  };
  int undeclared_failed = 0, declared_failed = 0, off_passed = 0, undeclared_off_passed = 0, runs = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    Case c;
    c.op = Op::Attention;
    c.attention.batch = 1, c.attention.heads = 2, c.attention.seq_q = 8, c.attention.seq_kv = 33, c.attention.head_dim = 16;
    c.types = {{"Q", Format::BF16}, {"K", Format::BF16}, {"V", Format::BF16}, {"O", Format::BF16}, {"compute", Format::FP32}};
    c.dist = {{"V", "subnormal(rate=0.9)"}};
    c.seed = seed;
    c.kernel = "test.flushing_attention";
    Flushing plain(false, 0), declared(true, 0), off(true, 0x1p-120), undeclared_off(false, 0x1p-120);
    undeclared_failed += !evaluate(plain, c, {}).verdict.passed;
    declared_failed += !evaluate(declared, c, {}).verdict.passed;
    off_passed += evaluate(off, c, {}).verdict.passed;
    undeclared_off_passed += evaluate(undeclared_off, c, {}).verdict.passed;
    ++runs;
  }
  EXPECT_EQ(declared_failed, 0);
  EXPECT_EQ(undeclared_failed, 0);
  EXPECT_EQ(off_passed, 0);
  EXPECT_EQ(undeclared_off_passed, 0);
}

namespace {

// cuBLASLt's epilogue with beta C and a bias into a 16-bit D: alpha acc + beta C rounded to
// `mid_bits` significant bits (D's precision as cuBLASLt does; fewer for a kernel beyond
// it) before the bias is added in FP32, then D rounded once more. Declares nothing.
class RoundedBeforeBias final : public Kernel {
 public:
  explicit RoundedBeforeBias(int mid_bits) : mid_bits_(mid_bits) {}
  std::string name() const override { return "test.rounded_before_bias"; }
  std::string description() const override { return "alpha acc + beta C rounded before the bias"; }
  KernelTraits traits() const override { return KernelTraits{Memory::Host, true}; }
  std::optional<std::string> unsupported(const Case&) const override { return std::nullopt; }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const GemmShape& g = c.gemm;
    const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), cv = gemm_view(c, "C"), dv = gemm_view(c, "D");
    const auto value = [&](const char* op, std::int64_t off) {
      return decode(c.types.at(op), load_code(c.types.at(op), io.in.at(op), off));
    };
    const AccumulationModel seq;
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        std::vector<double> x(g.k), y(g.k);
        for (std::int64_t k = 0; k < g.k; ++k) x[k] = value("A", op_a_offset(c, av, 0, i, k)), y[k] = value("B", op_b_offset(c, bv, 0, k, j));
        const float cval = c.beta != 0.0 ? static_cast<float>(value("C", cv.offset(0, i, j))) : 0.0f;
        float v = std::fma(static_cast<float>(c.beta), cval, static_cast<float>(c.alpha) * model_dot(seq, x.data(), y.data(), g.k));
        int e = 0;
        const double m = std::frexp(v, &e);
        v = static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, mid_bits_)), e - mid_bits_));
        if (has_bias(c.epilogue)) v += static_cast<float>(value("bias", j));
        if (has_gelu(c.epilogue))
          v = static_cast<float>(0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * double{v} * v * v))));
        store_code(c.types.at("D"), io.out.at("D"), dv.offset(0, i, j), encode(c.types.at("D"), v));
      }
  }

 private:
  int mid_bits_;
};

// Over BF16 and FP16 D, seeds 1-10 (beta 0, 1, -0.5; alpha 1, 0.1) and K 1, 5, 15 with the
// given epilogue: RoundedBeforeBias at D's precision passes every case, at 4 bits fails
// every case.
void expect_rounding_before_epilogue_admitted(Epilogue epilogue, const std::map<std::string, std::string>& dist) {
  int admitted_failed = 0, beyond_failed = 0, runs = 0;
  for (const char* dtype : {"bf16", "fp16"})
    for (std::uint64_t seed = 1; seed <= 10; ++seed)
      for (const std::int64_t k : {1, 5, 15}) {
        Case c = dtype_gemm_case(dtype, 16, 24, k, parse_format(dtype));
        c.gemm.trans_b = false;
        c.beta = seed % 3 == 0 ? 0.0 : seed % 3 == 1 ? 1.0 : -0.5;
        c.alpha = seed % 2 ? 1.0 : 0.1;
        c.epilogue = epilogue;
        c.dist = dist;
        if (has_bias(epilogue)) c.types["bias"] = c.types.at("D");
        if (c.beta != 0.0) c.types["C"] = c.types.at("D"), c.dist["C"] = "normal(0,1)";
        c.seed = seed;
        c.kernel = "test.rounded_before_bias";
        RoundedBeforeBias admitted(info(c.types.at("D")).precision()), beyond(4);
        const Evaluation a = evaluate(admitted, c, {}), b = evaluate(beyond, c, {});
        admitted_failed += !a.verdict.passed;
        beyond_failed += !b.verdict.passed;
        EXPECT_TRUE(a.verdict.passed) << dtype << " seed " << seed << " K " << k << ": " << a.verdict.reasons.front();
        ++runs;
      }
  EXPECT_EQ(admitted_failed, 0);
  EXPECT_EQ(beyond_failed, runs);
}

}  // namespace

// cuBLASLt rounds alpha acc + beta C to a 16-bit D's format before it adds the bias, with
// beta C or without (measured on the GPU: tests/kernels/test_library_gpu.cpp): the default
// rule admits it, with cancellation against the bias included; a kernel rounding to 4 bits
// there is beyond it.
TEST(Evaluate, EpilogueRoundedToDBeforeTheBiasIsAdmitted) {
  expect_rounding_before_epilogue_admitted(Epilogue::Bias,
                                           {{"A", "normal(0,1)"}, {"B", "normal(0,1)"}, {"bias", "normal(0,1)"}});
}

// The same rounding before a GELU without a bias (cuBLASLt at K = 878 into BF16 and FP16):
// admitted; rounding to 4 bits there is beyond it.
TEST(Evaluate, EpilogueRoundedToDBeforeTheActivationIsAdmitted) {
  expect_rounding_before_epilogue_admitted(Epilogue::GeluTanh, {{"A", "normal(0,1)"}, {"B", "normal(0,2)"}});
}

namespace {

// A host kernel that leaves FE_UPWARD set after computing its outputs under round to
// nearest, as one calling fesetround without restoring it does.
class LeavesUpward final : public Kernel {
 public:
  explicit LeavesUpward(std::unique_ptr<Kernel> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::string description() const override { return "leaves FE_UPWARD set"; }
  KernelTraits traits() const override { return inner_->traits(); }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_->unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    inner_->run(c, io, notes);
    std::fesetround(FE_UPWARD);
  }

 private:
  std::unique_ptr<Kernel> inner_;
};

// What a check decided and measured, without its timings.
nlohmann::json judged(const CaseResult& r) {
  const nlohmann::json j = case_result_to_json(r);
  return {j.at("status"), j.at("signature"), j.at("metrics"), j.at("verdict")};
}

}  // namespace

// The rounding mode a kernel leaves set, or the caller has set, changes neither the verdict
// nor a metric: the reference and the analysis run under round to nearest whatever it is.
TEST(Evaluate, RoundingModeLeftByAKernelOrTheCallerChangesNothing) {
  for (Op op : {Op::Gemm, Op::Attention}) {
    const auto make = [op] {
      return op == Op::Gemm ? make_emulated_gemm(AccumulationModel{}) : make_emulated_attention(AttentionModel{});
    };
    auto model = make();
    LeavesUpward leaves(make());
    for (std::uint64_t i = 0; i < 12; ++i) {
      Case c = op_module(op).generate("bf16", model.get(), GenLimits{300, true})(rc::Random(i), 60).value();
      const CaseResult nearest = check_case(*model, c, EvaluationOptions{});
      const CaseResult after_kernel = check_case(leaves, c, EvaluationOptions{});
      const bool left_upward = std::fegetround() == FE_UPWARD;
      std::fesetround(FE_UPWARD);
      const RunOutcome run = run_kernel(*model, c, fill_inputs(c));
      std::fesetround(FE_UPWARD);
      const CaseResult caller_upward = check_given_outputs(c, run.outputs, model->name(), model->traits());
      std::fesetround(FE_TONEAREST);
      EXPECT_FALSE(left_upward) << "the kernel's rounding mode outlived its run";
      EXPECT_EQ(judged(after_kernel), judged(nearest)) << name(op) << " case " << i;
      if (run.status == Disposition::Ok) {
        const CaseResult given = check_given_outputs(c, run.outputs, model->name(), model->traits());
        EXPECT_EQ(judged(caller_upward), judged(given)) << name(op) << " case " << i;
      }
    }
  }
}

// A correct TF32 kernel rounds a = (2 - 2^-12) 2^126 and b = 2 - 2^-11 up to 2^127 and 2:
// their product overflows FP32 although |a b| is below FP32's largest number. The overflow
// allowance covers what the declared input rounding and accumulation can add to the
// intermediate (a TF32 campaign's near_overflow A met it as an unexpected NaN: 0 x Inf with
// alpha = 0); a kernel returning Inf where even that growth stays finite still fails.
TEST(Evaluate, OverflowThroughTheInputRoundingIsAdmitted) {
  Registry reg = builtin_registry();
  Kernel* seq = reg.resolve("cpu.fp32_seq");
  ASSERT_NE(seq, nullptr);
  for (const double alpha : {1.0, 0.0}) {
    Case c = dtype_gemm_case("tf32", 1, 1, 1);
    c.gemm.trans_b = false;
    c.alpha = alpha;
    c.beta = 1.0;
    c.types["C"] = Format::FP32;
    Inputs in;
    in.emplace("A", Tensor(Format::FP32, 1));
    in.emplace("B", Tensor(Format::FP32, 1));
    in.emplace("C", Tensor(Format::FP32, 1));
    in.at("A").set_value(0, 0x1.fff8p126);
    in.at("B").set_value(0, 0x1.fffp0);
    in.at("C").set_value(0, 1.0);
    const Evaluation e = evaluate_with_inputs(*seq, c, in, {});
    EXPECT_TRUE(e.verdict.passed) << "alpha " << alpha << ": " << e.verdict.reasons.front();
    in.at("A").set_value(0, 0x1.8p126);  // rounds to itself: 1.5 x 2 x 2^126 stays finite
    in.at("B").set_value(0, 0x1.fp0);
    Case inf_case = c;
    class Infinite final : public Kernel {
     public:
      std::string name() const override { return "test.infinite"; }
      std::string description() const override { return "writes +Inf"; }
      KernelTraits traits() const override { return KernelTraits{Memory::Host, true}; }
      std::optional<std::string> unsupported(const Case&) const override { return std::nullopt; }
      void run(const Case& cc, const KernelIo& io, RunNotes&) override {
        store_code(Format::FP32, io.out.at("D"), gemm_view(cc, "D").offset(0, 0, 0), encode(Format::FP32, INFINITY));
      }
    } infinite;
    EXPECT_FALSE(evaluate_with_inputs(infinite, inf_case, in, {}).verdict.passed) << "alpha " << alpha;
  }
}
