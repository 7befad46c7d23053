// fill_inputs: values depend on logical coordinates only, padding is poisoned, joint
// constructions (gendot, amax, attention logits / sink / masking, exact) do what they say.
#include <gtest/gtest.h>

#include <bit>

#include <cstdlib>
#include <cstring>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "fill_test_util.hpp"
#include "distributions/case_gen.hpp"
#include "distributions/gendot.hpp"
#include "distributions/sampling.hpp"
#include "core/error.hpp"
#include "core/format_mpfr.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

// A fixed RapidCheck seed, so CI runs are reproducible; an RC_PARAMS set by the user (e.g. a
// reproduce string) takes precedence.
const bool kFixedRapidCheckParams = setenv("RC_PARAMS", "seed=20261129 max_success=300", 0) == 0;

std::string fill_error(Case c) {
  try {
    fill_inputs(c);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Fill, ValuesDependOnLogicalCoordinatesOnly) {
  for (const char* spec : {"normal(0,1)", "gendot(cond=1e6,pairs=3)", "specials(nan=0.1,inf=0.1,negzero=0.1)",
                           "softmax", "activations(rate=0.2)"}) {
    Case base = gemm_case(17, 9, 33, Format::FP16, spec, "", 2);
    base.beta = 0.5;
    base.types["C"] = Format::FP16;
    auto ref = fill_inputs(base);
    const auto a0 = logical_gemm(base, ref, "A"), b0 = logical_gemm(base, ref, "B"),
               c0 = logical_gemm(base, ref, "C");
    for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (std::int64_t pad : {0, 3}) {
            Case c = base;
            c.gemm.layout = layout, c.gemm.trans_a = ta, c.gemm.trans_b = tb;
            if (pad) {
              c.gemm.lda = c.gemm.packed_ld(c.gemm.a_rows(), c.gemm.a_cols()) + pad;
              c.gemm.ldb = c.gemm.packed_ld(c.gemm.b_rows(), c.gemm.b_cols()) + pad;
              c.gemm.ldc = c.gemm.packed_ld(c.gemm.m, c.gemm.n) + pad;
            }
            validate(c);
            auto t = fill_inputs(c);
            EXPECT_TRUE(same_bits(logical_gemm(c, t, "A"), a0)) << spec << " layout " << name(layout) << ta << tb << pad;
            EXPECT_TRUE(same_bits(logical_gemm(c, t, "B"), b0)) << spec << " layout " << name(layout) << ta << tb << pad;
            EXPECT_TRUE(same_bits(logical_gemm(c, t, "C"), c0)) << spec << " layout " << name(layout) << ta << tb << pad;
            // Every padding element holds the poison NaN, every other one does not.
            for (const char* op : {"A", "B", "C"}) {
              const MatrixView v = gemm_view(c, op);
              const Tensor& x = t.at(op);
              ASSERT_EQ(static_cast<std::int64_t>(x.size()), v.elements());
              std::int64_t poisoned = 0;
              for (std::int64_t e = 0; e < v.elements(); ++e) {
                const bool is_poison = x.code(static_cast<std::size_t>(e)) == padding_poison(Format::FP16);
                poisoned += is_poison;
                if (v.is_padding(e)) { ASSERT_TRUE(is_poison) << op << " element " << e; }
              }
              EXPECT_EQ(poisoned, v.elements() - v.batch * v.rows * v.cols) << op;
            }
          }
  }
}

TEST(Fill, AttentionLayoutsAgree) {
  for (const char* spec : {"normal(0,1)", "logits(std=3)", "sink(logit=20,key=2)"}) {
    Case c = attention_case(2, 3, 5, 7, 16, Format::BF16, spec);
    auto t1 = fill_inputs(c);
    Case d = c;
    d.attention.layout = AttentionLayout::BSHD;
    auto t2 = fill_inputs(d);
    for (const char* op : {"Q", "K", "V"})
      EXPECT_TRUE(same_bits(logical_attention(c, t1, op), logical_attention(d, t2, op))) << spec << op;
  }
}

TEST(Fill, RoundedFromTheFp64DrawOfTheSameCoordinates) {
  // The stored FP16 bits are the FP64 sample rounded once: the generator is the sampler.
  Case c = gemm_case(6, 5, 7, Format::FP16, "student_t(3)", "uniform(-9,9)");
  auto t = fill_inputs(c);
  const auto a = logical_gemm(c, t, "A");
  sampling::Sampler s;
  s.kind = sampling::Kind::StudentT, s.a = 3, s.b = 1;
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i], round_to(Format::FP16, sampling::sample(s, c.seed, kStreamA, i, i % 7))) << i;
  // Different operands and seeds give different data.
  EXPECT_NE(logical_gemm(c, t, "A"), logical_gemm(c, t, "B"));
  Case c2 = c;
  c2.seed = 99;
  auto t2 = fill_inputs(c2);
  EXPECT_NE(logical_gemm(c2, t2, "A"), a);
}

TEST(Fill, PoisonIsANonCanonicalNaN) {
  for (Format f : kAllFormats) {
    EXPECT_TRUE(is_nan(f, padding_poison(f))) << name(f);
    if (f != Format::E4M3) { EXPECT_NE(padding_poison(f), canonical_nan(f)) << name(f); }
  }
}

TEST(Fill, GenDotMatrixHitsTheConditionNumber) {
  for (Format f : {Format::FP32, Format::BF16, Format::E4M3}) {
    const double cond = f == Format::FP32 ? 1e30 : f == Format::BF16 ? 1e10 : 100;
    const std::int64_t m = 5, n = 6, k = 64, pairs = 2;
    Case c = gemm_case(m, n, k, f, "gendot(cond=" + std::to_string(cond) + ",pairs=2)", "", 2);
    c.gemm.trans_a = true;
    auto t = fill_inputs(c);
    const auto a = logical_gemm(c, t, "A"), b = logical_gemm(c, t, "B");
    for (std::int64_t bt = 0; bt < 2; ++bt)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          std::vector<double> x, y;
          for (std::int64_t kk = 0; kk < k; ++kk) {
            x.push_back(a[(bt * m + i) * k + kk]);
            y.push_back(b[(bt * k + kk) * n + j]);
          }
          if (i % pairs != j % pairs) continue;
          const double r = exact_dot_condition(x, y) / cond;
          EXPECT_TRUE(r > 0.1 && r < 10) << name(f) << " C[" << bt << "][" << i << "][" << j << "] ratio " << r;
        }
  }
  // Mixed formats: one contains the other (FP16 values are FP32 values).
  Case mixed = gemm_case(3, 3, 40, Format::FP32, "gendot(cond=1e8)");
  mixed.types["B"] = Format::FP16;
  EXPECT_NO_THROW(fill_inputs(mixed));
}

// frac = 1 puts the largest value at max finite and never past it (E5M2 would give Inf,
// E4M3 NaN), whatever the seed.
TEST(Fill, AmaxNeverOverflowsFp8) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (std::uint64_t seed = 0; seed < 50; ++seed) {
      Case c = gemm_case(16, 16, 16, f, "amax(frac=1,base=normal(0,1000))");
      c.seed = seed;
      auto t = fill_inputs(c);
      double mx = 0;
      for (double x : logical_gemm(c, t, "A")) mx = std::max(mx, std::fabs(x));
      EXPECT_EQ(mx, info(f).max_finite()) << name(f) << " seed " << seed;
    }
  }
}

TEST(Fill, AmaxPutsTheMaxAtTheFormatsMax) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (double frac : {1.0, 0.5}) {
      Case c = gemm_case(30, 20, 50, f, "amax(frac=" + std::to_string(frac) + ",base=normal(0,3))",
                         "amax(base=uniform(0,1e-3))");
      auto t = fill_inputs(c);
      ASSERT_TRUE(c.scales.count("A") && c.scales.count("B"));
      for (const char* op : {"A", "B"}) {
        const double scale = c.scales.at(op);
        EXPECT_EQ(round_to(Format::FP32, scale), scale) << "an FP32 scale";
        const auto v = logical_gemm(c, t, op);
        double mx = 0;
        for (double x : v) mx = std::max(mx, std::fabs(x));
        const double target = std::string(op) == "A" ? frac : 1.0;
        // The largest stored value is the format's value nearest frac * max finite.
        EXPECT_EQ(mx, round_to(f, target * info(f).max_finite())) << name(f) << " " << op << " frac " << frac;
      }
      // Stored x scale reproduces the base data to the format's precision.
      Case plain = gemm_case(30, 20, 50, Format::FP64, "normal(0,3)");
      auto tp = fill_inputs(plain);
      const auto intended = logical_gemm(plain, tp, "A"), stored = logical_gemm(c, t, "A");
      for (std::size_t i = 0; i < stored.size(); ++i)
        ASSERT_NEAR(stored[i] * c.scales.at("A"), intended[i],
                    std::fabs(intended[i]) * info(f).epsilon() + info(f).min_subnormal() * c.scales.at("A"))
            << i;
    }
  }
  Case attn = attention_case(1, 1, 4, 4, 8, Format::E4M3, "amax");
  EXPECT_EQ(fill_error(attn), "case.dist.Q: amax is only for GEMM A, B, C and attention K, V (case.scales has no Q scale)");
}

// amax is FP8's storage step: on any other operand it stores its base unchanged and writes
// no scale (a plugin gets scale 1 there, include/ulpgate/plugin.h).
TEST(Fill, AmaxOnANonFp8OperandIsItsBase) {
  for (Format f : {Format::FP64, Format::FP32, Format::TF32, Format::FP16, Format::BF16}) {
    Case c = gemm_case(16, 9, 33, f, "amax(frac=0.5,base=normal(0,1000))", "amax(base=uniform(0,1e-3))");
    c.beta = 0.5;
    c.types["C"] = f;
    c.dist["C"] = "amax(base=student_t(3))";
    Case plain = c;
    plain.dist = {{"A", "normal(0,1000)"}, {"B", "uniform(0,1e-3)"}, {"C", "student_t(3)"}};
    const auto t = fill_inputs(c), tp = fill_inputs(plain);
    EXPECT_TRUE(c.scales.empty()) << name(f);
    for (const char* op : {"A", "B", "C"})
      EXPECT_TRUE(same_bits(logical_gemm(c, t, op), logical_gemm(plain, tp, op))) << name(f) << " " << op;
  }
  // Mixed formats: the FP8 A is scaled, the FP16 B is not.
  Case m = gemm_case(16, 9, 32, Format::E4M3, "amax(base=normal(0,3))", "amax(base=normal(0,3))");
  m.types["B"] = Format::FP16;
  fill_inputs(m);
  EXPECT_EQ(m.scales.count("A"), 1u);
  EXPECT_EQ(m.scales.count("B"), 0u);
}

// Over generated GEMM cases of every format mix (amax on about half of the inputs, any
// family the generators offer on the rest), filling writes scales on FP8 operands only,
// one on every amax FP8 operand, and the filled case still validates.
RC_GTEST_PROP(Fill, ScalesOnlyOnFp8Operands, ()) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = *rc::gen::inRange<std::int64_t>(1, 33);
  c.gemm.n = *rc::gen::inRange<std::int64_t>(1, 33);
  c.gemm.k = *rc::gen::inRange<std::int64_t>(1, 65);
  c.gemm.batch = *rc::gen::inRange<std::int64_t>(1, 3);
  for (const char* op : {"A", "B", "D"}) c.types[op] = *gen::pick(gen::kFormatsSimpleFirst);
  c.types["compute"] = Format::FP32;
  if (*rc::gen::arbitrary<bool>()) {
    c.beta = 0.5;
    c.types["C"] = *gen::pick(gen::kFormatsSimpleFirst);
  }
  c.seed = *rc::gen::arbitrary<std::uint64_t>();
  for (const std::string& op : c.inputs()) {
    if (op == "B" && c.dist["A"].rfind("gendot", 0) == 0) continue;  // built with A
    c.dist[op] = *rc::gen::arbitrary<bool>() && op != "bias"
                     ? fmt::format("amax(frac={},base={})", *gen::pick(std::vector<double>{1, 0.5, 1e-3}),
                                   *gen::detail::base_spec())
                     : *gen::dist_spec(c, op, op == "A");
  }
  fill_inputs(c);
  for (const auto& [op, s] : c.scales)
    if (!takes_scale(c.types.at(op))) RC_FAIL(fmt::format("scale {} on the {} operand {}", s, name(c.types.at(op)), op));
  for (const auto& [op, spec] : c.dist)
    if (spec.rfind("amax", 0) == 0 && takes_scale(c.types.at(op))) RC_ASSERT(c.scales.count(op) == 1u);
  validate(c);
}

TEST(Fill, ExactByConstructionIsExact) {
  // Integers chosen so K * max_a * max_b fits the output precision: every dot product (and
  // every partial sum, in any order) is exact in FP32 and in the output format.
  for (Format f : {Format::FP16, Format::BF16, Format::E4M3, Format::FP32}) {
    for (std::int64_t k : {1, 16, 128, 1000}) {
      Case c = gemm_case(8, 8, k, f, "exact", "exact");
      auto t = fill_inputs(c);
      const auto a = logical_gemm(c, t, "A"), b = logical_gemm(c, t, "B");
      const double m = exact_auto_max(c, "A");
      const int p = info(f).precision();
      if (k * m * m > std::ldexp(1.0, p)) continue;  // stated bound does not hold: nothing to check
      for (std::int64_t i = 0; i < 8; ++i)
        for (std::int64_t j = 0; j < 8; ++j) {
          double sum = 0, sum_abs = 0;
          for (std::int64_t kk = 0; kk < k; ++kk) {
            const double prod = a[i * k + kk] * b[kk * 8 + j];
            sum += prod;
            sum_abs += std::fabs(prod);
          }
          EXPECT_LE(sum_abs, std::ldexp(1.0, p));
          EXPECT_EQ(round_to(f, sum), sum) << name(f) << " k=" << k;
          EXPECT_EQ(round_to(Format::FP32, sum), sum);
        }
      // Above E4M3 (4 bits: sums up to 16 only) the bound leaves room for integers beyond +-1.
      if (f != Format::E4M3) { EXPECT_GE(m, k <= 16 ? 2.0 : 1.0) << name(f) << " k=" << k; }
    }
  }
}

TEST(Fill, AttentionLogitsHaveTheRequestedSpread) {
  Case c = attention_case(2, 4, 64, 64, 64, Format::FP32, "logits(std=3)");
  auto t = fill_inputs(c);
  const auto q = logical_attention(c, t, "Q"), k = logical_attention(c, t, "K");
  const double scale = 1.0 / 8;
  double s2 = 0;
  int n = 0;
  for (int bh = 0; bh < 8; ++bh)
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        double dot = 0;
        for (int d = 0; d < 64; ++d) dot += q[(bh * 64 + i) * 64 + d] * k[(bh * 64 + j) * 64 + d];
        s2 += (scale * dot) * (scale * dot);
        ++n;
      }
  // 32768 logits, each with variance 9 (kurtosis of a sum of 64 normal products ~3.1):
  // tolerance 5 * 9 * sqrt(2.1 / n) ~ 0.36 (neighbouring logits share q or k, so use 2x).
  EXPECT_NEAR(s2 / n, 9.0, 0.72);
}

TEST(Fill, AttentionSinkDominates) {
  Case c = attention_case(1, 2, 32, 40, 64, Format::FP16, "sink(logit=20,key=3,std=1)");
  auto t = fill_inputs(c);
  const auto q = logical_attention(c, t, "Q"), k = logical_attention(c, t, "K");
  double mean_sink = 0, max_other = -1e9;
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 32; ++i)
      for (int j = 0; j < 40; ++j) {
        double dot = 0;
        for (int d = 0; d < 64; ++d) dot += q[(h * 32 + i) * 64 + d] * k[(h * 40 + j) * 64 + d];
        if (j == 3) mean_sink += dot / 8 / 64;
        else max_other = std::max(max_other, dot / 8);
      }
  EXPECT_NEAR(mean_sink, 20.0, 2.0);  // logit (1 + z/m): z/m has std 1/4 -> mean within 2
  EXPECT_LT(max_other, 10.0);
  Case bad = attention_case(1, 1, 4, 4, 8, Format::FP16, "sink(key=4)");
  EXPECT_EQ(fill_error(bad), "case.dist.K: sink key 4 is beyond seq_kv 4");
}

TEST(Fill, MaskedSetsFullyMaskedBatches) {
  for (std::uint64_t seed : {1, 2, 3}) {
    Case c = attention_case(8, 1, 4, 6, 8, Format::FP16, "masked(frac=0.25)", seed);
    fill_inputs(c);
    ASSERT_EQ(c.attention.kv_lengths.size(), 8u);
    EXPECT_GE(std::count(c.attention.kv_lengths.begin(), c.attention.kv_lengths.end(), 0), 1);
    validate(c);
    for (std::int64_t b = 0; b < 8; ++b)
      if (c.attention.kv_lengths[b] == 0) {
        for (std::int64_t i = 0; i < 4; ++i)
          for (std::int64_t j = 0; j < 6; ++j) EXPECT_FALSE(attention_visible(c, b, i, j));
      }
  }
}

TEST(Fill, CaseLevelErrorsNameTheOperand) {
  EXPECT_EQ(fill_error(gemm_case(4, 4, 4, Format::FP32, "normal(0,)")),
            "case.dist.A: dist \"normal(0,)\": empty argument 2");
  EXPECT_EQ(fill_error(gemm_case(4, 4, 4, Format::FP32, "logits")),
            "case.dist.A: logits is only for attention Q and K (it builds them together)");
  EXPECT_EQ(fill_error(gemm_case(4, 4, 4, Format::FP32, "gendot", "normal")),
            "case.dist.B: must be absent or \"gendot\": A and B are built together");
  EXPECT_EQ(fill_error(gemm_case(4, 4, 4, Format::FP32, "gendot(cond=1e5)", "gendot(cond=1e6)")),
            "case.dist.B: \"gendot(cond=1e6)\" must equal A's \"gendot(cond=1e5)\" (they are built together) or be absent");
  EXPECT_EQ(fill_error(gemm_case(4, 4, 4, Format::FP32, "gendot(cond=1e40)")),
            "case.dist.A: dist \"gendot(cond=1e40)\": gendot: cond=1e+40 is beyond what length 4 in fp32 reaches (max 5.49756e+11)");
  EXPECT_EQ(fill_error(gemm_case(4, 4, 4, Format::E4M3, "specials(inf=0.1)")),
            "case.dist.A: dist \"specials(inf=0.1)\": e4m3 has no Inf (inf must be 0)");
  Case mixed = gemm_case(4, 4, 64, Format::E4M3, "gendot(cond=100)");
  mixed.types["B"] = Format::E5M2;
  EXPECT_EQ(fill_error(mixed), "case.dist.A: gendot needs A and B formats where one contains the other, got e4m3 and e5m2");
}

// Large operands are filled on several threads: the same bits as on one, for every
// per-element family, modifiers and a padded, transposed layout.
TEST(Fill, SeveralThreadsGiveTheBitsOfOne) {
  for (const char* dist : {"normal(0,1)", "student_t(3)", "specials(nan=0.01,inf=0.01,negzero=0.1,base=lognormal(0,1))",
                           "outliers(rate=0.01,scale=1000,base=uniform(-1,1))", "softmax(std=2)"}) {
    Case c = gemm_case(300, 70, 450, Format::BF16, dist, dist);
    c.gemm.trans_a = true;
    c.gemm.lda = 300 + 5;
    Case one = c, many = c;
    ::setenv("ULPGATE_THREADS", "1", 1);
    const auto a = fill_inputs(one);
    ::setenv("ULPGATE_THREADS", "4", 1);
    const auto b = fill_inputs(many);
    ::unsetenv("ULPGATE_THREADS");
    for (const char* op : {"A", "B"}) {
      ASSERT_EQ(a.at(op).size_bytes(), b.at(op).size_bytes()) << dist;
      EXPECT_EQ(std::memcmp(a.at(op).data(), b.at(op).data(), a.at(op).size_bytes()), 0) << dist << " " << op;
    }
  }
}

// The loop fill_inputs draws with runs a copy built with FMA instructions where the CPU has
// them: it must give the bits of the plain build (and of sampling::sample_core compiled
// here, with std::fma a library call) for every family and the modifiers' draws.
TEST(Fill, FmaBuildOfTheSamplersGivesTheSameBits) {
  using sampling::Kind;
  const auto make = [](Kind k, double a, double b, double c = 0, double d = 0) {
    sampling::Sampler s;
    s.kind = k, s.a = a, s.b = b, s.c = c, s.d = d;
    return s;
  };
  const sampling::Sampler families[] = {
      make(Kind::Uniform, -9, 9), make(Kind::Normal, 0.5, 3), make(Kind::LogNormal, 0, 2),
      make(Kind::StudentT, 3, 1), make(Kind::StudentT, 0.7, 2), make(Kind::Cauchy, 1, 0.5),
      make(Kind::Activations, 1, 0.05, 20), make(Kind::SoftmaxWeight, 2, 0), make(Kind::Sparse, 0.1, 1),
      make(Kind::Relu, 0, 1), make(Kind::Positive, 0, 1), make(Kind::NearOverflow, 0.25 * 448, 448),
      make(Kind::Subnormal, 0.5, 0x1p-24, 1024, 0x1p-14), make(Kind::Subnormal, 0.5, 0x1p-1074, 0x1p52, 0x1p-1022),
      make(Kind::Exact, 8, 0.25)};
  const std::int64_t n = 1 << 17, first = (std::int64_t{1} << 32) - 4096;  // crosses the 32-bit counter boundary
  std::vector<double> fast(n), plain(n);
  int kind = 0;
  for (const sampling::Sampler& s : families) {
    sample_core_range(s, 1234, 1, first, first + n, 1, 7, fast.data());
    sample_core_range(s, 1234, 1, first, first + n, 1, 7, plain.data(), false);
    for (std::int64_t i = 0; i < n; ++i) {
      const double here = sampling::sample_core(s, 1234, 1, static_cast<std::uint64_t>(first + i),
                                                static_cast<std::uint64_t>((first + i) % 7));
      ASSERT_EQ(std::bit_cast<std::uint64_t>(fast[i]), std::bit_cast<std::uint64_t>(plain[i])) << "family " << kind << " index " << i;
      ASSERT_EQ(std::bit_cast<std::uint64_t>(plain[i]), std::bit_cast<std::uint64_t>(here)) << "family " << kind << " index " << i;
    }
    ++kind;
  }
}

// A paged pool: every key holds the value of its logical coordinates (as the contiguous case
// has it) and a shared page its owner's keys; the slots past a page's keys hold the stale
// +-8, pages no row reads the padding poison.
TEST(Fill, PagedPoolHoldsTheLogicalKeys) {
  Case c = attention_case(2, 2, 3, 5, 4, Format::BF16, "normal(0,1)");
  AttentionShape& a = c.attention;
  a.page_size = 2, a.num_pages = 6;
  a.page_table = {4, 1, 3, 5, 4, 0, 2, 5};  // batch 1 shares page 4; page 5 is read by no row
  validate(c);
  Case flat = unpaged(c);
  auto paged = fill_inputs(c);
  auto packed = fill_inputs(flat);
  for (const char* op : {"K", "V"}) {
    const AttentionView pv = attention_view(c, op), fv = attention_view(flat, op);
    const Tensor &p = paged.at(op), &f = packed.at(op);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t h = 0; h < pv.heads; ++h)
        for (std::int64_t s = 0; s < 5; ++s)
          for (std::int64_t d = 0; d < pv.dim; ++d) {
            const std::int64_t from_b = b == 1 && s < 2 ? 0 : b;  // the shared page holds batch 0's keys
            EXPECT_EQ(p.code(pv.offset(b, h, s, d)), f.code(fv.offset(from_b, h, s, d))) << op << b << h << s << d;
          }
    for (std::int64_t h = 0; h < pv.heads; ++h)
      for (std::int64_t d = 0; d < pv.dim; ++d) {
        EXPECT_EQ(p.value(pv.pool_offset(3, h, 1, d)), -8.0);  // key 4's page, slot 1
        EXPECT_EQ(p.value(pv.pool_offset(2, h, 1, d)), -8.0);
        for (std::int64_t slot = 0; slot < 2; ++slot)
          EXPECT_EQ(p.code(pv.pool_offset(5, h, slot, d)), padding_poison(Format::BF16));
      }
  }
}
