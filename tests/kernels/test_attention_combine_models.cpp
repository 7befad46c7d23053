// The attention combine CPU models (kernels/emulated/attention_combine_models.hpp): the
// correct one against the combine computed in long double, bit for bit on inputs where FP32
// is exact; each planted bug caught on a case made to expose it, and harmless where it does
// not bite.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/builtin.hpp"
#include "kernels/emulated/attention_combine_models.hpp"
#include "tests/kernels/combine_cases.hpp"

using namespace ulpgate;
using namespace ulpgate::test_support;

namespace {

constexpr AttentionLayout kBhsd = AttentionLayout::BHSD, kBshd = AttentionLayout::BSHD;

std::unique_ptr<Kernel> model(const std::string& name) {
  return make_emulated_attention_combine(*AttentionCombineModel::parse(name));
}

double ulp32(double x) { return ulp_of(Format::FP32, x); }

template <class Fn>
void for_rows(const Case& c, Fn&& fn) {
  for (std::int64_t b = 0; b < c.attention.batch; ++b)
    for (std::int64_t h = 0; h < c.attention.heads; ++h)
      for (std::int64_t i = 0; i < c.attention.seq_q; ++i) fn(b, h, i);
}

/// How far a run is from the exact combine, and whether it is within the FP32 bound.
struct Distance {
  double o_ulps = 0;    ///< max |O - exact| in ulps of the row's magnitude sum w_s |O_s| / l (FP32)
  double lse_abs = 0;   ///< max |LSE - exact|
  std::string failure;  ///< the first element out of bounds, empty if none
};

// An FP32 combine that sums in split order with FMA (n non-empty splits) is within
// (2n + 3) ulps of the magnitude M = sum w_s |O_s| / l of the exact combine before O is
// rounded to its format: each w_s within about an ulp (expf, exp2f), n roundings of the
// accumulator (each at most an ulp of l M), n - 1 of l, one of the division. Its LSE is within
// an ulp of the exact one plus (n + 4) 2^-22 (log of l, l within (n + 1) 2^-24).
Distance distance_from_exact(const Case& c, const std::map<std::string, Tensor>& in, const CombineOutputs& out) {
  const AttentionView ov = attention_view(c, "O"), lv = attention_view(c, "LSE");
  const Format fo = c.types.at("O");
  const ExactCombine x = exact_combine(c, in);
  Distance dist;
  const auto fail = [&](std::string why) {
    if (dist.failure.empty()) dist.failure = std::move(why);
  };
  if (out.unwritten) fail(fmt::format("{} output elements not written", out.unwritten));
  for_rows(c, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    const std::string where = fmt::format("row b{} h{} i{}", b, h, i);
    const auto row = static_cast<std::size_t>(lv.offset(b, h, i, 0));
    const double n = x.splits_used[row];
    for (std::int64_t d = 0; d < c.attention.head_dim; ++d) {
      const auto at = static_cast<std::size_t>(ov.offset(b, h, i, d));
      const double got = decode(fo, out.o.code(at));
      if (n == 0) {
        if (out.o.code(at) != 0) fail(fmt::format("{} d{}: no split, O = {} (+0 expected)", where, d, hex_float(got)));
        continue;
      }
      const double exact = static_cast<double>(x.o[at]), scale = static_cast<double>(x.magnitude[at]);
      const double err = std::fabs(got - exact);
      const double bound = (2 * n + 3) * ulp32(scale) + 0x1p-126 +
                           (fo == Format::FP32 ? 0 : 0.5 * ulp_of(fo, std::max(std::fabs(exact), std::fabs(got))));
      dist.o_ulps = std::max(dist.o_ulps, std::isnan(err) ? INFINITY : err / ulp32(scale));
      if (!(err <= bound))
        fail(fmt::format("{} d{}: O = {}, exact {} ({:.3g} ulps of the magnitude {}, bound {:.3g})", where, d, hex_float(got),
                         hex_float(exact), err / ulp32(scale), hex_float(scale), bound / ulp32(scale)));
    }
    if (out.lse.size() == 0) return;
    const double got = out.lse.value(row), exact = static_cast<double>(x.lse[row]);
    if (n == 0) {
      if (got != -INFINITY) fail(fmt::format("{}: no split, LSE = {} (-inf expected)", where, hex_float(got)));
      return;
    }
    const double err = std::fabs(got - exact);
    dist.lse_abs = std::max(dist.lse_abs, std::isnan(err) ? INFINITY : err);
    if (!(err <= ulp32(exact) + (n + 4) * 0x1p-22)) fail(fmt::format("{}: LSE = {}, exact {}", where, hex_float(got), hex_float(exact)));
  });
  return dist;
}

bool same_bits(const CombineOutputs& x, const CombineOutputs& y) {
  if (x.o.size() != y.o.size() || x.lse.size() != y.lse.size()) return false;
  for (std::size_t e = 0; e < x.o.size(); ++e)
    if (x.o.code(e) != y.o.code(e)) return false;
  for (std::size_t e = 0; e < x.lse.size(); ++e)
    if (x.lse.code(e) != y.lse.code(e)) return false;
  return true;
}

Format format_of(int k) { return k == 0 ? Format::FP32 : k == 1 ? Format::FP16 : Format::BF16; }

}  // namespace

TEST(AttentionCombineModels, Names) {
  EXPECT_EQ(AttentionCombineModel{}.name(), "cpu.attn_combine");
  AttentionCombineModel m;
  m.drop_last = m.no_max_shift = true;
  EXPECT_EQ(m.name(), "cpu.attn_combine:no_max_shift,drop_last");
  for (const char* name : {"cpu.attn_combine", "cpu.attn_combine:no_empty_guard", "cpu.attn_combine:wrong_base",
                           "cpu.attn_combine:no_max_shift", "cpu.attn_combine:no_normalize", "cpu.attn_combine:bhsd_store",
                           "cpu.attn_combine:drop_last", "cpu.attn_combine:no_empty_guard,drop_last"}) {
    const auto parsed = AttentionCombineModel::parse(name);
    ASSERT_TRUE(parsed) << name;
    EXPECT_EQ(parsed->name(), name);
    EXPECT_EQ(parsed->planted(), std::string(name) != "cpu.attn_combine");
  }
  EXPECT_EQ(AttentionCombineModel::parse("cpu.attn_combine:drop_last,no_max_shift")->name(), m.name());  // canonical order
  EXPECT_FALSE(AttentionCombineModel::parse("cpu.attn_naive"));
  EXPECT_FALSE(AttentionCombineModel::parse("cpu.attn_combined"));
  EXPECT_THROW(AttentionCombineModel::parse("cpu.attn_combine:block=4"), InputError);
  EXPECT_THROW(AttentionCombineModel::parse("cpu.attn_combine:drop_last=on"), InputError);

  Registry reg = builtin_registry();
  ASSERT_NE(reg.find("cpu.attn_combine"), nullptr);  // registered by default; the planted ones by name only
  EXPECT_EQ(reg.find("cpu.attn_combine:drop_last"), nullptr);
  Kernel* planted = reg.resolve("cpu.attn_combine:drop_last,wrong_base");
  ASSERT_NE(planted, nullptr);
  EXPECT_EQ(planted->name(), "cpu.attn_combine:wrong_base,drop_last");
  EXPECT_EQ(reg.resolve("cpu.attn_combine:wrong_base,drop_last"), planted);
  EXPECT_NE(planted->description().find("planted bug"), std::string::npos);
  EXPECT_EQ(reg.find("cpu.attn_combine")->description().find("planted"), std::string::npos);
}

TEST(AttentionCombineModels, TraitsAndUnsupported) {
  auto k = model("cpu.attn_combine");
  const KernelTraits t = k->traits();
  EXPECT_EQ(t.memory, Memory::Host);
  EXPECT_TRUE(t.thread_safe && t.writes_lse && t.rounds_to_nearest && t.deterministic);
  EXPECT_EQ(t.accumulator_bits, 0);  // FP32, the compute format
  Case c = combine_case(1, 1, 1, 8, 2, kBhsd, false, Format::FP16, Format::FP32);
  EXPECT_EQ(k->unsupported(c), std::nullopt);
  Case attention;
  attention.op = Op::Attention;
  EXPECT_NE(k->unsupported(attention), std::nullopt);
  Case gemm;
  EXPECT_NE(k->unsupported(gemm), std::nullopt);
  Case fp8 = c;
  fp8.types["O"] = Format::E4M3;
  ASSERT_TRUE(k->unsupported(fp8));
  EXPECT_NE(k->unsupported(fp8)->find("O in e4m3"), std::string::npos) << *k->unsupported(fp8);
  Case fp64 = c;
  fp64.types["compute"] = Format::FP64;
  EXPECT_NE(k->unsupported(fp64), std::nullopt);
}

// On inputs where FP32 is exact (combine_cases.hpp: exact_by_construction) O is the exact
// quotient rounded to FP32 once, then to O's format: bit for bit, whatever the centre.
TEST(AttentionCombineModels, ExactWhereFp32IsExact) {
  auto k = model("cpu.attn_combine");
  int cases = 0;
  for (const bool base2 : {true, false})
    for (const AttentionLayout layout : {kBhsd, kBshd})
      for (int fp = 0; fp < 3; ++fp)
        for (int fo = 0; fo < 3; ++fo) {
          const Case c = combine_case(2, 3, 2, 17, 1 + cases % 16, layout, base2, format_of(fp), format_of(fo));
          validate(c);
          const auto in = exact_by_construction(c, 20261201 + cases);
          const CombineOutputs out = run_combine(*k, c, in);
          EXPECT_EQ(distance_from_exact(c, in, out).failure, "");
          const ExactCombine x = exact_combine(c, in);
          for (std::size_t at = 0; at < x.o.size(); ++at)
            ASSERT_EQ(out.o.code(at), encode(format_of(fo), static_cast<float>(x.o[at]))) << to_json(c).dump() << " O[" << at << "]";
          ++cases;
        }
  EXPECT_EQ(cases, 36);
}

// Random cases: both bases and layouts, every O_part and O format, 1 to 40 splits, empty
// splits (garbage rows) and empty rows, LSE_s centred anywhere in +-1e4 and spread over up
// to 30: within the FP32 bound of the long-double combine.
RC_GTEST_PROP(AttentionCombineModels, MatchesLongDouble, ()) {
  const Case c = combine_case(*rc::gen::inRange<std::int64_t>(1, 3), *rc::gen::inRange<std::int64_t>(1, 4),
                              *rc::gen::inRange<std::int64_t>(1, 4), *rc::gen::inRange<std::int64_t>(1, 41),
                              *rc::gen::inRange<std::int64_t>(1, 41), *rc::gen::element(kBhsd, kBshd), *rc::gen::arbitrary<bool>(),
                              format_of(*rc::gen::inRange(0, 3)), format_of(*rc::gen::inRange(0, 3)), *rc::gen::arbitrary<bool>());
  CombineFill fill;
  fill.centre = *rc::gen::element(0.0, 10.0, 100.0, 1e4);
  fill.spread = *rc::gen::element(0.5, 3.0, 30.0);
  fill.p_empty = *rc::gen::element(0.0, 0.3, 0.9);
  if (*rc::gen::arbitrary<bool>()) fill.lo = 0;  // positive rows: no cancellation, the bound is on |O|
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << to_json(c).dump() << fmt::format(" centre {} spread {} p_empty {} lo {} seed {}\n", fill.centre, fill.spread,
                                               fill.p_empty, fill.lo, seed);
  validate(c);
  const auto in = combine_inputs(c, fill, seed);
  auto k = model("cpu.attn_combine");
  const Distance dist = distance_from_exact(c, in, run_combine(*k, c, in));
  RC_ASSERT(dist.failure == "");
}

// The worst distances over a fixed set of cases, printed (ulps of the magnitude; the bound
// grows with the splits, the measured error far less).
TEST(AttentionCombineModels, MeasuredDistance) {
  auto k = model("cpu.attn_combine");
  for (const std::int64_t splits : {2, 8, 40, 129}) {
    Distance worst;
    for (int t = 0; t < 8; ++t) {
      const Case c = combine_case(2, 2, 3, 64, splits, t % 2 ? kBshd : kBhsd, t % 4 >= 2, Format::FP32, Format::FP32);
      CombineFill fill;
      fill.centre = t < 4 ? 20 : 1e4;
      const auto in = combine_inputs(c, fill, 1000 + t);
      const Distance d = distance_from_exact(c, in, run_combine(*k, c, in));
      EXPECT_EQ(d.failure, "") << to_json(c).dump();
      worst.o_ulps = std::max(worst.o_ulps, d.o_ulps), worst.lse_abs = std::max(worst.lse_abs, d.lse_abs);
    }
    std::printf("[ combine ] %3lld splits: O within %.2f ulps of the magnitude, LSE within %.3g\n", static_cast<long long>(splits),
                worst.o_ulps, worst.lse_abs);
    EXPECT_LE(worst.o_ulps, splits <= 8 ? 4.0 : 12.0);  // far inside (2n + 3)
  }
}

// ---------------------------------------------------------------------------------------
// Planted bugs: each caught (out of the FP32 bound of the exact combine, and not the correct
// model's bits) on a case made for it, and bit for bit the correct model's (or within the
// bound) where it does not bite.

namespace {

struct Planted {
  std::unique_ptr<Kernel> good = model("cpu.attn_combine"), bad;
  explicit Planted(const std::string& name) : bad(model(name)) {}
  /// The bug shows: the planted model's result is out of bounds and not the correct one's bits.
  void caught(const Case& c, const std::map<std::string, Tensor>& in) const {
    validate(c);
    const CombineOutputs g = run_combine(*good, c, in), p = run_combine(*bad, c, in);
    EXPECT_EQ(distance_from_exact(c, in, g).failure, "") << to_json(c).dump();
    const Distance d = distance_from_exact(c, in, p);
    EXPECT_NE(d.failure, "") << bad->name() << " passed " << to_json(c).dump();
    EXPECT_FALSE(same_bits(g, p)) << bad->name();
    std::printf("[ combine ] %s caught: %s\n", bad->name().c_str(), d.failure.c_str());
  }
  /// The bug does not bite: the planted model gives the correct one's bits.
  void harmless(const Case& c, const std::map<std::string, Tensor>& in) const {
    validate(c);
    EXPECT_TRUE(same_bits(run_combine(*good, c, in), run_combine(*bad, c, in))) << bad->name() << " " << to_json(c).dump();
  }
};

CombineFill no_empty() {
  CombineFill f;
  f.p_empty = f.p_empty_row = 0;
  return f;
}

}  // namespace

// FlashInfer #4051: without the guard, a row whose splits are all empty has max -inf and
// weights exp(-inf - -inf) = NaN; a partly empty row reads its empty splits' garbage (0 x NaN).
TEST(AttentionCombineModels, PlantedNoEmptyGuard) {
  const Planted t("cpu.attn_combine:no_empty_guard");
  for (const bool base2 : {false, true}) {
    const Case c = combine_case(1, 2, 2, 8, 3, kBhsd, base2, Format::FP32, Format::FP32);
    auto in = combine_inputs(c, no_empty(), 7);
    t.harmless(c, in);
    for (std::int64_t s = 0; s < 3; ++s) make_empty(c, in, s, 0, 1, 1);  // one empty row
    t.caught(c, in);
    CombineOutputs p = run_combine(*t.bad, c, in);
    EXPECT_TRUE(std::isnan(p.lse.value(static_cast<std::size_t>(attention_view(c, "LSE").offset(0, 1, 1, 0)))));
    auto partly = combine_inputs(c, no_empty(), 8);
    make_empty(c, partly, 1, 0, 0, 0);  // one empty split, its O_s NaN
    t.caught(c, partly);
  }
}

// exp where the LSE is base 2 (FlashInfer's convention read as natural), and the reverse.
TEST(AttentionCombineModels, PlantedWrongBase) {
  const Planted t("cpu.attn_combine:wrong_base");
  for (const bool base2 : {false, true}) {
    const Case c = combine_case(2, 2, 2, 16, 4, kBhsd, base2, Format::FP16, Format::FP16);
    t.caught(c, combine_inputs(c, no_empty(), 11));
    const Case one = combine_case(2, 2, 2, 16, 1, kBshd, base2, Format::BF16, Format::FP32);  // w = 1, log l = 0
    t.harmless(one, combine_inputs(one, {}, 12));
  }
}

// exp(LSE_s) without the max: Inf past LSE 88.7 (base 2: 128), 0 below about -104 (-150),
// and Inf / Inf or 0 / 0 is NaN. Within the bound for LSE near 0.
TEST(AttentionCombineModels, PlantedNoMaxShift) {
  const Planted t("cpu.attn_combine:no_max_shift");
  for (const bool base2 : {false, true}) {
    const Case c = combine_case(1, 2, 3, 32, 5, kBhsd, base2, Format::FP32, Format::FP32);
    for (const double centre : {1e4, -1e4}) {
      CombineFill big = no_empty();
      big.centre = centre, big.spread = 0.5;
      auto in = combine_inputs(c, big, 21);
      for_rows(c, [&](std::int64_t b, std::int64_t h, std::int64_t i) {  // every LSE_s past the overflow
        for (std::int64_t s = 0; s < c.attention.splits; ++s) {
          const auto at = static_cast<std::size_t>(attention_view(c, "LSE_part").offset(s * c.attention.batch + b, h, i, 0));
          in.at("LSE_part").set_value(at, (centre > 0 ? 200.0 : -200.0) * (base2 ? 2 : 1) + in.at("LSE_part").value(at) * 1e-4);
        }
      });
      t.caught(c, in);
    }
    CombineFill small;
    small.centre = 2, small.spread = 1;
    const auto in = combine_inputs(c, small, 22);
    EXPECT_EQ(distance_from_exact(c, in, run_combine(*t.bad, c, in)).failure, "");  // LSE near 0: within the bound
  }
}

// O = sum w_s O_s, never divided by l = sum w_s: wrong once two splits carry weight, exact
// when each row has one non-empty split (w = 1, l = 1).
TEST(AttentionCombineModels, PlantedNoNormalize) {
  const Planted t("cpu.attn_combine:no_normalize");
  const Case c = combine_case(2, 2, 2, 24, 3, kBshd, false, Format::FP32, Format::BF16);
  t.caught(c, combine_inputs(c, no_empty(), 31));
  auto one = combine_inputs(c, no_empty(), 32);
  for_rows(c, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    for (std::int64_t s = 0; s < 3; ++s)
      if (s != (b + h + i) % 3) make_empty(c, one, s, b, h, i);
  });
  t.harmless(c, one);
}

// FlagGems #5235: O stored at its bhsd offsets in a bshd case. Rows land transposed when
// heads > 1 and seq_q > 1; with either at 1 the two layouts are one.
TEST(AttentionCombineModels, PlantedBhsdStore) {
  const Planted t("cpu.attn_combine:bhsd_store");
  const Case bshd = combine_case(2, 3, 4, 16, 2, kBshd, true, Format::FP16, Format::FP32);
  t.caught(bshd, combine_inputs(bshd, {}, 41));
  for (const Case& c : {combine_case(2, 3, 4, 16, 2, kBhsd, true, Format::FP16, Format::FP32),
                        combine_case(2, 1, 4, 16, 2, kBshd, true, Format::FP16, Format::FP32),
                        combine_case(2, 3, 1, 16, 2, kBshd, true, Format::FP16, Format::FP32)})
    t.harmless(c, combine_inputs(c, {}, 42));
}

// The last split left out: wrong when it carries weight, harmless when it is empty in
// every row; a single split leaves nothing (O = 0, LSE = -inf).
TEST(AttentionCombineModels, PlantedDropLast) {
  const Planted t("cpu.attn_combine:drop_last");
  const Case c = combine_case(2, 2, 3, 8, 4, kBhsd, false, Format::FP32, Format::FP32);
  t.caught(c, combine_inputs(c, no_empty(), 51));
  auto last_empty = combine_inputs(c, {}, 52);
  for_rows(c, [&](std::int64_t b, std::int64_t h, std::int64_t i) { make_empty(c, last_empty, 3, b, h, i); });
  t.harmless(c, last_empty);
  const Case single = combine_case(1, 1, 2, 8, 1, kBhsd, false, Format::FP32, Format::FP32);
  t.caught(single, combine_inputs(single, no_empty(), 53));
}
