// The ops' case generators (check/ops, without a kernel): valid cases, full coverage
// (printed as RapidCheck's RC_TAG report), fillable cases, and shrinking to the exact
// boundary with simple values.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "core/tensor.hpp"
#include "distributions/fill.hpp"
#include "check/check.hpp"
#include "check/ops/gemm.hpp"
#include "check/ops/op.hpp"
#include "kernels/emulated/gemm_models.hpp"

using namespace ulpgate;

namespace {

// Fixed RapidCheck seed and case count, so CI runs are reproducible (RapidCheck reads
// RC_PARAMS lazily, on first use); an RC_PARAMS set by the user (e.g. a reproduce string)
// takes precedence.
const bool kFixedRapidCheckParams = setenv("RC_PARAMS", "seed=20261129 max_success=300", 0) == 0;

// Every op's cases, K and seq_kv up to 65536, GELU included.
const GenLimits kLimits{65536, true};
rc::Gen<Case> gemm_case() { return op_module(Op::Gemm).generate("", nullptr, kLimits); }
rc::Gen<Case> attention_case() { return op_module(Op::Attention).generate("", nullptr, kLimits); }
rc::Gen<Case> combine_case() { return op_module(Op::AttentionCombine).generate("", nullptr, kLimits); }
rc::Gen<Case> any_case() { return rc::gen::oneOf(gemm_case(), attention_case(), combine_case()); }

std::string primary(const Case& c) { return primary_input(c.op); }
std::string family_of(const Case& c, const std::string& op) {
  auto it = c.dist.find(op);
  return it == c.dist.end() ? "normal" : parse_dist(it->second).family;
}

}  // namespace

RC_GTEST_PROP(CaseGen, GeneratedCasesValidateAndParse, ()) {
  const Case c = *any_case();
  validate(c);  // throws (fails the property) if not
  for (const auto& [op, spec] : c.dist) parse_dist(spec);
  RC_ASSERT(c.seed == c.seed);
}

TEST(CaseGen, CoverageOfEveryFamilyAndFormat) {
  // Two RapidCheck runs whose RC_TAG reports (printed below) show how often each family and
  // each format comes up as the primary operand's (A or Q); then every one must have.
  std::set<std::string> families, formats, shapes;
  const bool ok_families = rc::check("family of A / Q (coverage report)", [&] {
    const Case c = *any_case();
    const std::string f = family_of(c, primary(c));
    families.insert(f);
    if (c.op == Op::AttentionCombine) families.insert(family_of(c, "LSE_part"));  // the lse family's only operand
    RC_TAG(f);
  });
  const bool ok_formats = rc::check("format of A / Q (coverage report)", [&] {
    const Case c = *any_case();
    const std::string f(name(c.types.at(primary(c))));
    formats.insert(f);
    formats.insert(std::string(name(c.types.at("compute"))));  // TF32 is a compute type
    if (c.op == Op::Gemm) {
      if (c.gemm.batch > 1) shapes.insert("batch>1");
      if (c.gemm.k >= 65536) shapes.insert("K=65536");
      if (c.gemm.lda || c.gemm.ldb) shapes.insert("padded ld");
      if (c.alpha != 1 && c.alpha != 0) shapes.insert("alpha other");
      if (c.beta != 0 && c.beta != 1) shapes.insert("beta other");
      for (std::int64_t d : {c.gemm.m, c.gemm.n, c.gemm.k})
        if (d == 1 || d == 15 || d == 17 || d == 63 || d == 65 || d == 127 || d == 129) shapes.insert("tile edge " + std::to_string(d));
    } else if (c.op == Op::AttentionCombine) {
      if (c.attention.splits == 129) shapes.insert("splits 129");
      if (c.attention.lse_base2) shapes.insert("LSE base 2");
    } else {
      if (c.attention.causal) shapes.insert("causal");
      if (!c.attention.kv_lengths.empty()) shapes.insert("kv padding");
      if (c.attention.head_dim == 80 || c.attention.head_dim == 96 || c.attention.head_dim == 111)
        shapes.insert("head_dim " + std::to_string(c.attention.head_dim));
      if (c.attention.seq_kv % 64 != 0) shapes.insert("seq_kv not a multiple of 64");
    }
    RC_TAG(f);
  });
  EXPECT_TRUE(ok_families && ok_formats);
  for (const FamilyInfo& f : all_families()) EXPECT_TRUE(families.count(std::string(f.name))) << f.name << " never generated";
  for (Format f : kAllFormats) EXPECT_TRUE(formats.count(std::string(name(f)))) << name(f) << " never generated";
  for (const char* s : {"batch>1", "K=65536", "padded ld", "alpha other", "beta other", "tile edge 1", "tile edge 17",
                        "tile edge 63", "tile edge 129", "causal", "kv padding", "head_dim 80", "head_dim 96",
                        "head_dim 111", "seq_kv not a multiple of 64", "splits 129", "LSE base 2"})
    EXPECT_TRUE(shapes.count(s)) << s << " never generated";
}

RC_GTEST_PROP(CaseGen, GeneratedCasesFill, ()) {
  Case c = *any_case();
  const auto tensors = fill_inputs(c);
  for (const std::string& op : c.inputs()) RC_ASSERT(tensors.count(op) == 1u);
  validate(c);  // still valid after fill wrote scales / kv_lengths
}

// The transposition relation judges the transposed problem against the first run's
// reference moved from (b, i, j) to (b, j, i): it must equal that problem's own reference in
// every exact value, condition term and bound (TF32 cases have the input-rounding terms).
RC_GTEST_PROP(CaseGen, TransposedReferenceIsTheTransposedProblemsReference, ()) {
  Case c = *op_module(Op::Gemm).generate("", nullptr, GenLimits{512, false});
  RC_PRE(!has_bias(c.epilogue));
  const Inputs in = fill_inputs(c);
  const Case tc = transposed_gemm_case(c);
  Inputs tin{{"A", in.at("B")}, {"B", in.at("A")}};
  if (c.beta != 0) tin.emplace("C", in.at("C"));
  const OpModule& op = op_module(Op::Gemm);
  const Tensor d = make_output(c, "D", false), td = make_output(tc, "D", false);
  const OutputComparison moved = transposed_reference(op.compare(c, in, {{"D", d}}, nominal_tolerance(c)).front());
  const OutputComparison own = op.compare(tc, tin, {{"D", td}}, nominal_tolerance(tc)).front();
  RC_ASSERT(moved.shape == own.shape);
  RC_ASSERT(moved.exact == own.exact);
  const auto same = [](const std::vector<double>& x, const std::vector<double>& y) {  // NaN equals NaN
    return std::equal(x.begin(), x.end(), y.begin(), y.end(),
                      [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); });
  };
  RC_ASSERT(same(moved.condition, own.condition));
  RC_ASSERT(same(moved.accumulated, own.accumulated));
  RC_ASSERT(same(moved.input_abs, own.input_abs));
  RC_ASSERT(moved.accumulator_max == own.accumulator_max);
  RC_TAG(c.types.at("compute") == Format::TF32 ? "tf32" : "other", c.beta != 0 ? "beta" : "no beta");
}

TEST(CaseGen, GemmFailureShrinksToTheBoundaryAndSimpleValues) {
  // A "kernel" that breaks for M > 37: the minimal failing case is M = 38 with everything
  // else at its simplest.
  Case last_failure;
  const bool passed = rc::check("expected to fail: M > 37 (shrinking demo)", [&] {
    const Case c = *gemm_case();
    if (c.gemm.m > 37) {
      last_failure = c;
      RC_FAIL("M > 37");
    }
  });
  ASSERT_FALSE(passed) << "no generated case had M > 37";
  const Case& c = last_failure;
  EXPECT_EQ(c.gemm.m, 38);
  EXPECT_EQ(c.gemm.n, 1);
  EXPECT_EQ(c.gemm.k, 1);
  EXPECT_EQ(c.gemm.batch, 1);
  EXPECT_EQ(c.gemm.layout, Layout::RowMajor);
  EXPECT_FALSE(c.gemm.trans_a);
  EXPECT_TRUE(c.gemm.trans_b);  // B stored N x K, the "TN" form every library takes
  EXPECT_EQ(c.gemm.lda + c.gemm.ldb + c.gemm.ldc + c.gemm.ldd, 0);
  EXPECT_EQ(c.alpha, 1.0);
  EXPECT_EQ(c.beta, 0.0);
  EXPECT_EQ(c.epilogue, Epilogue::None);
  EXPECT_EQ(c.types.at("A"), Format::FP32);
  EXPECT_EQ(c.dist.at("A"), "normal(0,1)");
  EXPECT_EQ(c.dist.at("B"), "normal(0,1)");
  EXPECT_EQ(c.seed, 0u);
}

TEST(CaseGen, AttentionFailureShrinksToTheBoundary) {
  Case last_failure;
  const bool passed = rc::check("expected to fail: head_dim > 100 with causal (shrinking demo)", [&] {
    const Case c = *attention_case();
    if (c.attention.head_dim > 100 && c.attention.causal) {
      last_failure = c;
      RC_FAIL("head_dim > 100 and causal");
    }
  });
  ASSERT_FALSE(passed);
  const auto& a = last_failure.attention;
  EXPECT_EQ(a.head_dim, 101);
  EXPECT_TRUE(a.causal);
  EXPECT_EQ(a.seq_q, 1);
  EXPECT_EQ(a.seq_kv, 1);
  EXPECT_EQ(a.batch, 1);
  EXPECT_EQ(a.heads, 1);
  EXPECT_TRUE(a.kv_lengths.empty());
  EXPECT_EQ(last_failure.dist.at("Q"), "normal(0,1)");
}

namespace {

// The CPU model, or the CPU model with cuBLASLt's FP8 rule (K a multiple of 16).
class Fp8K16 final : public Kernel {
 public:
  std::string name() const override { return "test.fp8_k16"; }
  std::string description() const override { return "cpu.fp32_seq, FP8 needs K % 16 == 0"; }
  KernelTraits traits() const override { return inner_->traits(); }
  std::optional<std::string> unsupported(const Case& c) const override {
    const Format a = c.types.at("A");
    if ((a == Format::E4M3 || a == Format::E5M2) && c.gemm.k % 16 != 0) return std::string("fp8 needs K % 16 == 0");
    return inner_->unsupported(c);
  }
  void run(const Case& c, const KernelIo& io, RunNotes& n) override { inner_->run(c, io, n); }

 private:
  std::unique_ptr<Kernel> inner_ = make_emulated_gemm(AccumulationModel{});
};

// The CPU model under cuBLASLt's whole FP8 rule set: TN form, K % 16, and every leading
// dimension a multiple of 16 bytes.
class Fp8Aligned final : public Kernel {
 public:
  std::string name() const override { return "test.fp8_aligned"; }
  std::string description() const override { return "cpu.fp32_seq, FP8 as cuBLASLt takes it"; }
  KernelTraits traits() const override { return inner_->traits(); }
  std::optional<std::string> unsupported(const Case& c) const override {
    const Format a = c.types.at("A");
    if (a == Format::E4M3 || a == Format::E5M2) {
      const bool tn = c.gemm.layout == Layout::RowMajor ? (!c.gemm.trans_a && c.gemm.trans_b) : (c.gemm.trans_a && !c.gemm.trans_b);
      if (!tn) return std::string("fp8 needs TN");
      if (c.gemm.k % 16 != 0) return std::string("fp8 needs K % 16 == 0");
      for (const char* op : {"A", "B", "C", "D"}) {
        if (std::string(op) == "C" && c.beta == 0.0) continue;
        if (gemm_view(c, op).ld * static_cast<std::int64_t>(storage_bytes(c.types.at(op))) % 16 != 0)
          return std::string("fp8 needs 16-byte leading dimensions");
      }
    }
    return inner_->unsupported(c);
  }
  void run(const Case& c, const KernelIo& io, RunNotes& n) override { inner_->run(c, io, n); }

 private:
  std::unique_ptr<Kernel> inner_ = make_emulated_gemm(AccumulationModel{});
};

struct LdCounts {
  int cases = 0, with_c = 0, padded_c = 0, padded_d = 0, k_not_16 = 0;
};

LdCounts count_generated(const Kernel& k, const char* dtype) {
  LdCounts n;
  const bool ok = rc::check(fmt::format("{} {} cases (ldc, ldd, K)", k.name(), dtype), [&] {
    const Case c = *op_module(Op::Gemm).generate(dtype, &k, GenLimits{512, false});
    RC_ASSERT(k.supports(c));
    const std::int64_t packed_ld = c.gemm.layout == Layout::RowMajor ? c.gemm.n : c.gemm.m;
    ++n.cases;
    if (c.beta != 0) ++n.with_c, n.padded_c += c.gemm.eff_ldc() > packed_ld;
    n.padded_d += c.gemm.eff_ldd() > packed_ld;
    n.k_not_16 += c.gemm.k % 16 != 0;
  });
  EXPECT_TRUE(ok);
  return n;
}

}  // namespace

// The GEMM generator pads C's leading dimension too (as it does A's, B's and D's), and
// draws FP8 K that are not multiples of 16 for a kernel that takes them (the CPU models),
// never for one that does not (cuBLASLt's FP8 rule).
TEST(CaseGen, GemmPadsCAndDrawsAnyFp8K) {
  const auto model = make_emulated_gemm(AccumulationModel{});
  for (const char* dtype : {"fp32", "e4m3", "e5m2"}) {
    const LdCounts n = count_generated(*model, dtype);
    std::printf("[ %s ] %d cases, %d with C (%d of them ldc padded), %d ldd padded, %d K %% 16 != 0\n", dtype, n.cases,
                n.with_c, n.padded_c, n.padded_d, n.k_not_16);
    EXPECT_GT(n.padded_c, n.with_c / 5) << dtype;
    EXPECT_GT(n.padded_d, n.cases / 5) << dtype;
    EXPECT_GT(n.k_not_16, n.cases / 2) << dtype;
  }
  Fp8K16 strict;
  EXPECT_EQ(count_generated(strict, "e4m3").k_not_16, 0);
  EXPECT_GT(count_generated(strict, "fp32").k_not_16, 0);  // the rule is FP8's only
}

// Under cuBLASLt's FP8 alignment rule (16-byte leading dimensions) every generated FP8 case
// is one the kernel takes (count_generated asserts it): M and N go to multiples of 16 and
// paddings to aligned ones, and padded outputs are still drawn. (On the H200, 39 of 40 FP8
// cases of a campaign were refused by cuBLASLt before the rule was declared.)
TEST(CaseGen, Fp8CasesRespectSixteenByteLeadingDimensions) {
  Fp8Aligned aligned;
  for (const char* dtype : {"e4m3", "e5m2"}) {
    const LdCounts n = count_generated(aligned, dtype);
    std::printf("[ %s aligned ] %d cases, %d ldd padded\n", dtype, n.cases, n.padded_d);
    EXPECT_EQ(n.k_not_16, 0) << dtype;
    EXPECT_GT(n.padded_d, 0) << dtype;
  }
}
