// The superaccumulator against the MPFR oracle, bit for bit: the exact sum (all of it,
// not only its rounding), the 128-bit window, every format's rounding, the condition term.
#include <gtest/gtest.h>

#include <bit>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <sstream>

#include "core/format_mpfr.hpp"
#include "references/exact_dot.hpp"
#include "tests/references/dot_inputs.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

constexpr Rounding kRoundings[] = {Rounding::NearestEven, Rounding::NearestAway,
                                   Rounding::TowardZero, Rounding::Up, Rounding::Down};

bool same_number(mpfr_srcptr a, mpfr_srcptr b) {
  if (mpfr_nan_p(a) || mpfr_nan_p(b)) return mpfr_nan_p(a) && mpfr_nan_p(b);
  return mpfr_equal_p(a, b) && mpfr_signbit(a) == mpfr_signbit(b);
}

std::string show(mpfr_srcptr x) {
  char* s = nullptr;
  mpfr_asprintf(&s, "%Ra", x);
  std::string r(s);
  mpfr_free_str(s);
  return r;
}

/// Every check of one dot product; returns "" or what differs. prepared: through Operand
/// (the integer path where the CPU and the data allow it), else through spans.
std::string check_dot(const DotInput& d, ExactAccumulator& acc, MpfrOracle& oracle, bool deep,
                      bool split, bool prepared = false) {
  acc.clear();
  std::span<const float> x(d.x), y(d.y);
  const auto add = [&](std::span<const float> a, std::span<const float> b) {
    if (prepared) acc.add_products(Operand(a, acc.simd()), Operand(b, acc.simd()));
    else acc.add_products(a, b);
  };
  if (split && x.size() > 2) {  // two calls must add up like one
    const std::size_t h = x.size() / 3;
    add(x.first(h), y.first(h));
    add(x.subspan(h), y.subspan(h));
  } else {
    add(x, y);
  }
  Mpfr exact(2), fast(2);
  oracle.dot(exact, x, y);
  acc.exact_value(fast);
  if (!same_number(exact, fast)) return "exact sum: oracle " + show(exact) + ", fast " + show(fast);
  const RefValue v = acc.value();
  RefValue want = RefValue::from_exact(exact);
  Mpfr exact_down(2);  // the exact sum's sign rounding down (differs only for a zero)
  if (mpfr_zero_p(exact)) {
    oracle.dot(exact_down, x, y, MPFR_RNDD);
  } else {
    mpfr_set_prec(exact_down, mpfr_get_prec(exact));
    mpfr_set(exact_down, exact, MPFR_RNDN);
  }
  if (want.kind == RefValue::Kind::Zero) want.negative_down = mpfr_signbit(exact_down) != 0;
  if (!(v == want)) return "128-bit window differs from the oracle's: " + to_string(v);
  for (Format f : kAllFormats) {
    if (v.round_to(f) != encode_exact(f, exact))
      return std::string("RNE rounding to ") + std::string(name(f)) + ": oracle " +
             hex_code(f, encode_exact(f, exact)) + ", fast " + hex_code(f, v.round_to(f));
    if (deep) {
      for (Rounding r : kRoundings)
        for (Overflow o : {Overflow::NoSaturate, Overflow::Saturate})
          if (v.round_to(f, r, o) != encode_exact(f, r == Rounding::Down ? exact_down : exact, r, o))
            return std::string("rounding ") + std::string(name(r)) + " to " + std::string(name(f));
    }
  }
  if (deep) {
    std::vector<float> ax(d.x), ay(d.y);
    for (auto& a : ax) a = std::fabs(a);
    for (auto& a : ay) a = std::fabs(a);
    Mpfr mag(2);
    oracle.dot(mag, ax, ay);
    if (mpfr_zero_p(mag)) mpfr_setsign(mag, mag, 0, MPFR_RNDN);  // |terms| sum to +0
    if (!(acc.magnitude() == RefValue::from_exact(mag)))
      return "condition term: oracle " + show(mag) + ", fast " + to_string(acc.magnitude());
  }
  return "";
}

// RapidCheck runs 100 cases per property by default; each case checks a batch so that the
// whole run covers dots_budget() dot products, split evenly over the families.
std::uint64_t batch_size() {
  const std::uint64_t per_family = dots_budget() / std::size(kFamilies);
  return std::max<std::uint64_t>(1, per_family / 100);
}

void check_family(Family fam) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const auto max_len = *rc::gen::inRange<std::size_t>(1, 3001);
  // Both exact paths: SIMD slices where the exponent range allows, bins always.
  thread_local ExactAccumulator best(Simd::Avx512), avx2(Simd::Avx2), bins_only(Simd::Scalar);
  thread_local MpfrOracle oracle;
  const std::uint64_t batch = batch_size();
  for (std::uint64_t i = 0; i < batch; ++i) {
    const DotInput d = make_dot(fam, seed, i, max_len);
    ExactAccumulator& acc = i % 4 == 3 ? bins_only : i % 4 == 2 ? avx2 : best;
    // i % 4 == 1: prepared operands (the integer path where the spread allows)
    const std::string err = check_dot(d, acc, oracle, i % 8 == 0 || i % 8 == 1, i % 3 == 0, i % 4 == 1);
    if (!err.empty()) {
      std::ostringstream msg;
      msg << name(fam) << " seed " << seed << " index " << i << " n " << d.x.size() << ": " << err;
      RC_FAIL(msg.str());
    }
  }
}

}  // namespace

RC_GTEST_PROP(ExactDot, AnyFp32MatchesOracle, ()) { check_family(Family::AnyFp32); }
RC_GTEST_PROP(ExactDot, FormatCodesMatchOracle, ()) { check_family(Family::FormatCodes); }
RC_GTEST_PROP(ExactDot, NarrowMatchesOracle, ()) { check_family(Family::Narrow); }
RC_GTEST_PROP(ExactDot, CancellationMatchesOracle, ()) { check_family(Family::Cancellation); }
RC_GTEST_PROP(ExactDot, SubnormalMatchesOracle, ()) { check_family(Family::Subnormal); }
RC_GTEST_PROP(ExactDot, ExtremeMatchesOracle, ()) { check_family(Family::Extreme); }
RC_GTEST_PROP(ExactDot, ZerosMatchOracle, ()) { check_family(Family::Zeros); }
RC_GTEST_PROP(ExactDot, SpecialsMatchOracle, ()) { check_family(Family::Specials); }
RC_GTEST_PROP(ExactDot, SmallIntegersMatchOracle, ()) { check_family(Family::SmallIntegers); }
RC_GTEST_PROP(ExactDot, SpreadMatchesOracle, ()) { check_family(Family::Spread); }

// Exact by construction: integers times a common power of two sum exactly in FP64 in any
// order, so the answer is known without MPFR.
RC_GTEST_PROP(ExactDot, SmallIntegersEqualNaiveSum, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  ExactAccumulator acc;
  for (std::uint64_t i = 0; i < 100; ++i) {
    const DotInput d = make_dot(Family::SmallIntegers, seed, i);
    double naive = 0.0;
    for (std::size_t k = 0; k < d.x.size(); ++k) naive += static_cast<double>(d.x[k]) * d.y[k];
    acc.clear();
    acc.add_products(d.x, d.y);
    RC_ASSERT(acc.value().to_double() == naive);
    RC_ASSERT(!acc.value().inexact);
  }
}

TEST(ExactDot, SignedZeroRules) {
  ExactAccumulator acc;
  auto sum_of = [&](std::vector<float> x, std::vector<float> y) {
    acc.clear();
    acc.add_products(x, y);
    return acc.value();
  };
  EXPECT_EQ(sum_of({}, {}), RefValue::zero(false));                       // empty: +0
  EXPECT_EQ(sum_of({0.0f, 0.0f}, {1.0f, 2.0f}), RefValue::zero(false));   // +0 + +0
  EXPECT_EQ(sum_of({-0.0f, 0.0f}, {1.0f, -2.0f}), RefValue::zero(true));  // -0 + -0
  // x - x: +0, but -0 rounding down (IEEE 754 6.3); so is +0 + -0.
  RefValue cancelled = RefValue::zero(false);
  cancelled.negative_down = true;
  EXPECT_EQ(sum_of({-0.0f, 0.0f}, {1.0f, 2.0f}), cancelled);
  EXPECT_EQ(sum_of({1.0f, -1.0f}, {3.0f, 3.0f}), cancelled);
  EXPECT_EQ(sum_of({1.0f, -1.0f, -0.0f}, {3.0f, 3.0f, 1.0f}), cancelled);
  for (Format f : kAllFormats) {
    EXPECT_EQ(cancelled.round_to(f, Rounding::Down), info(f).sign_mask()) << name(f);
    EXPECT_EQ(cancelled.round_to(f, Rounding::Up), Code{0}) << name(f);
    EXPECT_EQ(cancelled.round_to(f, Rounding::NearestEven), Code{0}) << name(f);
  }
}

TEST(ExactDot, Specials) {
  ExactAccumulator acc;
  auto sum_of = [&](std::vector<float> x, std::vector<float> y) {
    acc.clear();
    acc.add_products(x, y);
    return acc.value();
  };
  EXPECT_EQ(sum_of({INFINITY, 1.0f}, {1.0f, 1e30f}), RefValue::infinity(false));
  EXPECT_EQ(sum_of({INFINITY, 1.0f}, {-1.0f, 1e30f}), RefValue::infinity(true));
  EXPECT_EQ(sum_of({INFINITY, -INFINITY}, {1.0f, 1.0f}).kind, RefValue::Kind::NaN);
  EXPECT_EQ(sum_of({INFINITY}, {0.0f}).kind, RefValue::Kind::NaN);  // Inf * 0
  EXPECT_EQ(sum_of({NAN, 1.0f}, {1.0f, 1.0f}).kind, RefValue::Kind::NaN);
}

TEST(ExactDot, ExtremeExponentsAndLongSums) {
  // The largest and smallest FP32 products, and enough of them to cross the 2^15-term
  // chunks in which the bins are folded.
  const float big = 0x1.fffffep127f, tiny = 0x1p-149f;
  std::vector<float> x(100000), y(100000);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = (i % 3 == 0) ? big : (i % 3 == 1 ? tiny : -big);
    y[i] = (i % 3 == 1) ? tiny : big;
  }
  MpfrOracle oracle;
  for (auto simd : {Simd::Avx512, Simd::Avx2, Simd::Scalar}) {
    ExactAccumulator acc(simd);
    DotInput d{x, y};
    EXPECT_EQ(check_dot(d, acc, oracle, true, true), "");
    // Every term the same: 2^15 adds of the largest significand into one bin, and lane
    // sums of the largest slices across many blocks.
    std::vector<float> ones(70001, 0x1.fffffep0f);
    DotInput e{ones, ones};
    EXPECT_EQ(check_dot(e, acc, oracle, true, false), "");
    for (auto& v : ones) v = -v;
    DotInput f{ones, e.y};
    EXPECT_EQ(check_dot(f, acc, oracle, true, true), "");
  }
}

TEST(ExactDot, AddDoubleIsExact) {
  // Arbitrary doubles (subnormals, 53-bit significands, extremes) through add().
  ExactAccumulator acc;
  Mpfr sum(4400), t(53);
  Bits b(7, 1, 0);
  for (int trial = 0; trial < 2000; ++trial) {
    acc.clear();
    mpfr_set_zero(sum, 1);
    const int n = static_cast<int>(b.in(1, 20));
    for (int i = 0; i < n; ++i) {
      double v = std::bit_cast<double>(b.next());
      if (!std::isfinite(v)) v = 0x1p-1074 * static_cast<double>(b.in(1, 1 << 20));
      acc.add(v);
      mpfr_set_d(t, v, MPFR_RNDN);
      mpfr_add(sum, sum, t, MPFR_RNDN);  // 4400 bits span every double: exact
    }
    Mpfr fast(2);
    acc.exact_value(fast);
    ASSERT_TRUE(mpfr_equal_p(fast, sum)) << "trial " << trial;
    for (Format f : kAllFormats) ASSERT_EQ(acc.value().round_to(f), encode_exact(f, sum));
  }
}

// RefValue's own rounding against encode_exact on values built to sit on and next to
// every kind of rounding boundary, with long tails.
RC_GTEST_PROP(RefValue, RoundingMatchesEncodeExact, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  Bits b(seed, 2, 0);
  Mpfr x(700), tail(700);
  for (int i = 0; i < 200; ++i) {
    const Format f = kAllFormats[b.in(0, 6)];
    Code c;
    do c = b.next() & info(f).code_mask();
    while (!is_finite(f, c) || !is_finite(f, next_up(f, c)));
    const double lo = decode(f, c), hi = decode(f, next_up(f, c));
    mpfr_set_d(x, lo, MPFR_RNDN);
    mpfr_set_d(tail, hi, MPFR_RNDN);
    mpfr_add(x, x, tail, MPFR_RNDN);
    mpfr_div_2ui(x, x, 1, MPFR_RNDN);  // the midpoint, exact
    switch (b.in(0, 4)) {
      case 0: break;
      case 1: mpfr_set_d(x, lo, MPFR_RNDN); break;
      default: {  // a tail far below the 128-bit window, or inside it
        mpfr_set_ui(tail, 1, MPFR_RNDN);
        mpfr_mul_2si(tail, tail, static_cast<long>(mpfr_get_exp(x)) - b.in(60, 600), MPFR_RNDN);
        if (b.next() & 1) mpfr_neg(tail, tail, MPFR_RNDN);
        mpfr_add(x, x, tail, MPFR_RNDN);
      }
    }
    if (b.chance(0.1)) mpfr_mul_2si(x, x, b.in(-1200, 1200), MPFR_RNDN);  // far out of range
    const RefValue v = RefValue::from_exact(x);
    for (Rounding r : kRoundings)
      for (Overflow o : {Overflow::NoSaturate, Overflow::Saturate})
        RC_ASSERT(v.round_to(f, r, o) == encode_exact(f, x, r, o));
    const DoubleDouble dd = v.double_double();
    RC_ASSERT(dd.hi == v.to_double());
    if (v.kind == RefValue::Kind::Finite && std::isfinite(dd.hi) && v.exponent >= -1021) {
      // lo is RN(x' - hi) for the window's value x' (its midpoint when inexact), bit for bit
      Mpfr window(130), diff(134);
      v.to_mpfr(window);
      mpfr_sub_d(diff, window, dd.hi, MPFR_RNDN);
      RC_ASSERT(std::bit_cast<std::uint64_t>(dd.lo) == std::bit_cast<std::uint64_t>(mpfr_get_d(diff, MPFR_RNDN)));
    }
    if (std::isfinite(dd.hi) && std::fabs(dd.hi) >= 0x1p-900) {
      Mpfr err(800);
      mpfr_sub_d(err, x, dd.hi, MPFR_RNDN);
      mpfr_sub_d(err, err, dd.lo, MPFR_RNDN);
      mpfr_abs(err, err, MPFR_RNDN);
      mpfr_div_d(err, err, std::fabs(dd.hi), MPFR_RNDU);
      RC_ASSERT(mpfr_cmp_d(err, 0x1p-105) <= 0);
    }
  }
}

TEST(ExponentRange, EveryInstructionSetAgrees) {
  for (Family fam : kFamilies) {
    for (std::uint64_t i = 0; i < 300; ++i) {
      const DotInput d = make_dot(fam, 99, i);
      const ExponentRange ref = exponent_range(d.x, Simd::Scalar);
      for (Simd simd : {Simd::Avx2, Simd::Avx512}) {  // above the CPU's best: its best
        const ExponentRange r = exponent_range(d.x, simd);
        ASSERT_EQ(r.empty(), ref.empty()) << name(fam) << " " << i;
        ASSERT_EQ(r.special, ref.special) << name(fam) << " " << i;
        if (!r.empty()) {
          ASSERT_EQ(r.lo, ref.lo) << name(fam) << " " << i;
          ASSERT_EQ(r.hi, ref.hi) << name(fam) << " " << i;
        }
      }
    }
  }
}
