#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cfloat>
#include <random>

#include "core/format.hpp"
#include "core/format_mpfr.hpp"
#include "core/format_rne.hpp"
#include "core/tensor.hpp"

using namespace ulpgate;

namespace {

constexpr Rounding kRoundings[] = {Rounding::NearestEven, Rounding::NearestAway,
                                   Rounding::TowardZero, Rounding::Up, Rounding::Down};
constexpr Overflow kOverflows[] = {Overflow::NoSaturate, Overflow::Saturate};

// Formats small enough to enumerate every code.
constexpr Format kSmall[] = {Format::TF32, Format::FP16, Format::BF16, Format::E4M3, Format::E5M2};

std::uint64_t count_codes(Format f) { return std::uint64_t{1} << info(f).bits; }

// A random double from all of FP64's bit patterns, weighted towards the exponent range of
// the smaller formats so their boundaries are hit often.
rc::Gen<double> interesting_double() {
  return rc::gen::oneOf(
      rc::gen::map(rc::gen::arbitrary<std::uint64_t>(),
                   [](std::uint64_t b) { return std::bit_cast<double>(b); }),
      rc::gen::map(rc::gen::pair(rc::gen::inRange(-160, 140), rc::gen::arbitrary<std::uint64_t>()),
                   [](std::pair<int, std::uint64_t> p) {
                     // random sign and 52-bit fraction at exponent p.first
                     const double m = 1.0 + static_cast<double>(p.second >> 12) * 0x1p-52;
                     return ((p.second & 1) ? -1.0 : 1.0) * std::ldexp(m, p.first);
                   }),
      rc::gen::map(rc::gen::pair(rc::gen::elementOf(std::vector<Format>(std::begin(kSmall), std::end(kSmall))),
                                 rc::gen::arbitrary<std::uint32_t>()),
                   [](std::pair<Format, std::uint32_t> p) {
                     // a code of a small format, nudged to a tie or one FP64 ulp off it
                     const Format f = p.first;
                     const Code c = p.second & (count_codes(f) - 1);
                     const double a = decode(f, c), b = decode(f, next_up(f, c));
                     if (!std::isfinite(a) || !std::isfinite(b)) return a;
                     const double mid = a + (b - a) / 2;
                     switch ((p.second >> 28) % 4) {
                       case 0: return mid;
                       case 1: return std::nextafter(mid, INFINITY);
                       case 2: return std::nextafter(mid, -INFINITY);
                       default: return a;
                     }
                   }));
}

}  // namespace

TEST(Format, Table) {
  EXPECT_EQ(info(Format::FP16).max_finite(), 65504.0);
  EXPECT_EQ(info(Format::BF16).max_finite(), 0x1.fep127);
  EXPECT_EQ(info(Format::TF32).max_finite(), 0x1.ffcp127);
  EXPECT_EQ(info(Format::E4M3).max_finite(), 448.0);
  EXPECT_EQ(info(Format::E5M2).max_finite(), 57344.0);
  EXPECT_EQ(info(Format::FP32).max_finite(), static_cast<double>(FLT_MAX));
  EXPECT_EQ(info(Format::FP64).max_finite(), DBL_MAX);
  EXPECT_EQ(info(Format::E4M3).min_subnormal(), 0x1p-9);
  EXPECT_EQ(info(Format::E5M2).min_subnormal(), 0x1p-16);
  EXPECT_EQ(info(Format::FP16).min_subnormal(), 0x1p-24);
  EXPECT_EQ(info(Format::BF16).min_subnormal(), 0x1p-133);
  EXPECT_EQ(info(Format::FP32).min_subnormal(), 0x1p-149);
  EXPECT_EQ(info(Format::E4M3).min_normal(), 0x1p-6);
  for (Format f : kAllFormats) {
    EXPECT_EQ(parse_format(name(f)), f);
    EXPECT_TRUE(is_nan(f, canonical_nan(f)));
  }
  EXPECT_EQ(parse_format("float8_e4m3fn"), Format::E4M3);
  EXPECT_FALSE(parse_format("fp12").has_value());
}

// Every code of the formats up to 19 bits: decode is exact and encode(decode(c)) == c in
// every rounding and overflow mode (NaNs: any NaN code maps to the canonical NaN).
TEST(Format, EveryCodeRoundTrips) {
  for (Format f : kSmall) {
    std::uint64_t n = 0;
    for (Code c = 0; c < count_codes(f); ++c) {
      const double v = decode(f, c);
      for (Rounding r : kRoundings)
        for (Overflow o : kOverflows) {
          const Code back = encode(f, v, r, o);
          if (is_nan(f, c)) {
            ASSERT_EQ(back, canonical_nan(f)) << name(f) << " " << hex_code(f, c);
          } else if (is_inf(f, c) && o == Overflow::Saturate) {
            ASSERT_EQ(back, (c & info(f).sign_mask()) | info(f).max_finite_code);
          } else {
            ASSERT_EQ(back, c) << name(f) << " " << hex_code(f, c) << " " << name(r);
          }
          ++n;
        }
    }
    std::printf("[ format ] %s: %llu codes x 10 modes round-trip\n", std::string(name(f)).c_str(),
                static_cast<unsigned long long>(count_codes(f)));
  }
}

// decode builds the double's bits with integer operations: for FP32 it must equal the
// hardware's float -> double widening (exact) on every exponent, subnormals included.
TEST(Format, Fp32DecodeMatchesHardwareWidening) {
  std::uint64_t n = 0;
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t e = 0; e < 256; ++e)
      for (std::uint32_t f = 0; f < (1u << 23); f += (f < 64 || f > (1u << 23) - 64) ? 1 : 4093) {
        const std::uint32_t w = sign << 31 | e << 23 | f;
        const double hw = static_cast<double>(std::bit_cast<float>(w)), ours = decode(Format::FP32, w);
        if (std::isnan(hw)) {
          ASSERT_TRUE(std::isnan(ours)) << std::hex << w;
          ASSERT_EQ(std::signbit(ours), sign != 0) << std::hex << w;
        } else {
          ASSERT_EQ(std::bit_cast<std::uint64_t>(ours), std::bit_cast<std::uint64_t>(hw)) << std::hex << w;
        }
        ++n;
      }
  EXPECT_GT(n, 1000000u);
}

// encode's round-to-nearest-even fast path (a value in the target's normal range, rounded
// on its bits) and the general path (encode_scaled on the exact significand) agree, over
// values drawn around every binade of every format: ties, carries into the next binade,
// the largest finite value and just past it, the smallest normal and just below it.
RC_GTEST_PROP(Format, EncodeFastPathMatchesTheGeneralPath, ()) {
  const Format f = *rc::gen::element(Format::FP32, Format::TF32, Format::FP16, Format::BF16, Format::E4M3, Format::E5M2);
  const auto& fi = info(f);
  const int e = *rc::gen::inRange(fi.emin() - 3, fi.emax() + 3);
  const int frac = fi.frac_bits;
  // Significand bits just beyond the format's: a tie, just above or below one, or random.
  const std::uint64_t low = *rc::gen::oneOf(rc::gen::just<std::uint64_t>(0), rc::gen::just<std::uint64_t>(1),
                                            rc::gen::just(std::uint64_t{1} << (51 - frac)),
                                            rc::gen::just((std::uint64_t{1} << (51 - frac)) - 1),
                                            rc::gen::just((std::uint64_t{1} << (51 - frac)) + 1),
                                            rc::gen::just((std::uint64_t{1} << (52 - frac)) - 1),
                                            rc::gen::inRange<std::uint64_t>(0, std::uint64_t{1} << (52 - frac)));
  const std::uint64_t top = *rc::gen::oneOf(rc::gen::just<std::uint64_t>(0),
                                            rc::gen::just((std::uint64_t{1} << frac) - 1),
                                            rc::gen::inRange<std::uint64_t>(0, std::uint64_t{1} << frac));
  const bool neg = *rc::gen::arbitrary<bool>();
  const std::uint64_t sig = (std::uint64_t{1} << 52) | (top << (52 - frac)) | low;
  const double x = (neg ? -1.0 : 1.0) * std::ldexp(static_cast<double>(sig), e - 52);
  for (Overflow o : {Overflow::NoSaturate, Overflow::Saturate}) {
    RC_ASSERT(encode(f, x, Rounding::NearestEven, o) == encode_scaled(f, neg, sig, e - 52, Rounding::NearestEven, o));
  }
}

// The CPU models round to FP32 nearest-even with the hardware's double -> float conversion
// (kernels/emulated/gemm_models.cpp round32): it must give encode's code on every finite
// double, around every FP32 binade (ties, subnormals, the overflow threshold) and beyond.
RC_GTEST_PROP(Format, Fp32NarrowingMatchesEncodeNearestEven, ()) {
  const int e = *rc::gen::inRange(-160, 140);
  const std::uint64_t low = *rc::gen::oneOf(rc::gen::just<std::uint64_t>(0), rc::gen::just(std::uint64_t{1} << 28),
                                            rc::gen::just((std::uint64_t{1} << 28) - 1),
                                            rc::gen::just((std::uint64_t{1} << 28) + 1),
                                            rc::gen::inRange<std::uint64_t>(0, std::uint64_t{1} << 52));
  const std::uint64_t sig = (std::uint64_t{1} << 52) | (low & ((std::uint64_t{1} << 52) - 1));
  const double x = (*rc::gen::arbitrary<bool>() ? -1.0 : 1.0) * std::ldexp(static_cast<double>(sig), e - 52);
  RC_ASSERT(std::bit_cast<std::uint32_t>(static_cast<float>(x)) == encode(Format::FP32, x, Rounding::NearestEven));
}

// Codes are ordered like their values, and next_up moves exactly one ULP.
TEST(Format, OrderAndNeighbours) {
  for (Format f : kSmall) {
    for (Code c = 0; c < count_codes(f); ++c) {
      if (is_nan(f, c)) continue;
      const Code up = next_up(f, c);
      if (is_nan(f, up)) {  // E4M3's max finite has no successor
        ASSERT_EQ(f, Format::E4M3);
        ASSERT_EQ(c, info(f).max_finite_code);
        continue;
      }
      if (is_inf(f, c) && !is_negative(f, c)) {
        ASSERT_EQ(up, c);
        continue;
      }
      ASSERT_LT(decode(f, c), decode(f, up)) << name(f) << hex_code(f, c);
      ASSERT_EQ(ulp_distance(f, c, up), 1u) << name(f) << " " << hex_code(f, c);
      const Code back = next_down(f, up);
      // next_down(next_up(-0)) is +0 (both zeros are one value)
      ASSERT_EQ(decode(f, back), decode(f, c)) << name(f) << " " << hex_code(f, c);
    }
  }
}

TEST(Format, UlpDistanceKnownAnswers) {
  const Format h = Format::FP16;
  EXPECT_EQ(ulp_distance(h, 0x0000, 0x8000), 0u);  // +0, -0
  EXPECT_EQ(ulp_distance(h, 0x0001, 0x8001), 2u);  // +-min subnormal
  EXPECT_EQ(ulp_distance(h, 0x7BFF, 0x7C00), 1u);  // max, Inf
  EXPECT_EQ(ulp_distance(h, 0x3C00, 0x3C01), 1u);
  EXPECT_EQ(ulp_distance(h, 0x3C00, 0x4000), 1024u);  // [1, 2) holds 1024 values
  EXPECT_EQ(ulp_distance(h, 0xFC00, 0x7C00), 2u * 0x7C00);
  EXPECT_FALSE(ulp_distance(h, 0x7E00, 0x3C00).has_value());
  EXPECT_FALSE(ulp_distance(h, 0x3C00, 0xFE00).has_value());
  EXPECT_FALSE(ulp_distance(Format::E4M3, 0x7F, 0x7F).has_value());
  EXPECT_EQ(ulp_distance(Format::E4M3, 0x7E, 0xFE), 2u * 0x7E);
  EXPECT_EQ(next_up(h, 0x8001), 0x8000u);    // nextUp(-min subnormal) = -0
  EXPECT_EQ(next_up(h, 0x8000), 0x0001u);    // nextUp(-0) = min subnormal
  EXPECT_EQ(next_down(h, 0x0001), 0x0000u);  // nextDown(min subnormal) = +0
  EXPECT_EQ(next_down(h, 0x0000), 0x8001u);
  EXPECT_EQ(next_up(h, 0xFC00), 0xFBFFu);
  EXPECT_EQ(next_up(Format::E4M3, 0x7E), canonical_nan(Format::E4M3));
  EXPECT_EQ(next_down(Format::E4M3, 0xFE), canonical_nan(Format::E4M3));
}

TEST(Format, NeighboursMatchNextafterForFp32AndFp64) {
  for (std::uint32_t i = 0; i < 2000000; ++i) {
    const std::uint32_t b = i * 2654435761u;
    const float x = std::bit_cast<float>(b);
    if (std::isnan(x)) continue;
    const float up = std::nextafter(x, INFINITY), dn = std::nextafter(x, -INFINITY);
    ASSERT_EQ(next_up(Format::FP32, b), std::bit_cast<std::uint32_t>(up)) << std::hex << b;
    ASSERT_EQ(next_down(Format::FP32, b), std::bit_cast<std::uint32_t>(dn)) << std::hex << b;
    const double d = std::ldexp(static_cast<double>(b) + 0.5, static_cast<int>(b % 2000) - 1100);
    ASSERT_EQ(decode(Format::FP64, next_up(Format::FP64, std::bit_cast<std::uint64_t>(d))),
              std::nextafter(d, INFINITY));
  }
}

// FP64 -> FP32 under RNE is exactly the hardware conversion, in every rounding mode the
// FPU offers.
RC_GTEST_PROP(Format, Fp32MatchesHardwareConversion, ()) {
  const double x = *interesting_double();
  const std::pair<int, Rounding> modes[] = {{FE_TONEAREST, Rounding::NearestEven},
                                            {FE_TOWARDZERO, Rounding::TowardZero},
                                            {FE_UPWARD, Rounding::Up},
                                            {FE_DOWNWARD, Rounding::Down}};
  for (auto [fe, r] : modes) {
    std::fesetround(fe);
    volatile double vx = x;
    const float hw = static_cast<float>(vx);
    std::fesetround(FE_TONEAREST);
    const Code ours = encode(Format::FP32, x, r);
    if (std::isnan(x)) {
      RC_ASSERT(is_nan(Format::FP32, ours));
    } else {
      RC_ASSERT(ours == std::bit_cast<std::uint32_t>(hw));
    }
  }
}

// Two independent implementations agree: rounding a double through the integer fast path
// and through MPFR (encode_exact).
RC_GTEST_PROP(Format, FastAndExactRoundingAgree, ()) {
  const double x = *interesting_double();
  Mpfr m(53, x);
  for (Format f : kAllFormats)
    for (Rounding r : kRoundings)
      for (Overflow o : kOverflows) {
        const Code a = encode(f, x, r, o), b = encode_exact(f, m, r, o);
        if (std::isnan(x) && f == Format::FP64) {
          RC_ASSERT(is_nan(f, b));
          continue;
        }
        RC_ASSERT(a == b);
      }
}

// The result is a neighbour of x in the direction the mode demands.
RC_GTEST_PROP(Format, RoundingIsFaithfulAndDirected, ()) {
  const double x = *interesting_double();
  RC_PRE(std::isfinite(x));
  for (Format f : kAllFormats) {
    const auto& fi = info(f);
    if (std::fabs(x) > fi.max_finite()) continue;
    const double dn = round_to(f, x, Rounding::Down), up = round_to(f, x, Rounding::Up);
    RC_ASSERT(dn <= x);
    RC_ASSERT(x <= up);
    if (dn != up) RC_ASSERT(decode(f, next_up(f, encode(f, dn))) == up);
    const double rz = round_to(f, x, Rounding::TowardZero);
    RC_ASSERT(rz == (x < 0 ? up : dn));
    const double rn = round_to(f, x, Rounding::NearestEven);
    RC_ASSERT(rn == dn || rn == up);
    RC_ASSERT(std::fabs(rn - x) <= std::fabs((rn == dn ? up : dn) - x));
  }
}

TEST(Format, OverflowRules) {
  const Format e4 = Format::E4M3, e5 = Format::E5M2;
  // E4M3: 464 is the tie between 448 (even) and the missing 480: RNE keeps 448.
  EXPECT_EQ(encode(e4, 464.0), 0x7Eu);
  EXPECT_EQ(encode(e4, 464.0 + 1e-9), 0x7Fu);  // NaN: no Inf in E4M3
  EXPECT_EQ(encode(e4, -500.0), 0xFFu);        // NaN, sign kept (as CUDA __NV_NOSAT)
  EXPECT_EQ(encode(e4, 1e30, Rounding::NearestEven, Overflow::Saturate), 0x7Eu);
  EXPECT_EQ(encode(e4, -INFINITY, Rounding::NearestEven, Overflow::Saturate), 0xFEu);
  EXPECT_EQ(encode(e4, 1e30, Rounding::TowardZero), 0x7Eu);
  // E5M2 and FP16 overflow to Inf at the midpoint above max.
  EXPECT_EQ(encode(e5, 61440.0), 0x7Cu);
  EXPECT_EQ(encode(e5, std::nextafter(61440.0, 0.0)), 0x7Bu);
  EXPECT_EQ(encode(e5, 61440.0, Rounding::NearestEven, Overflow::Saturate), 0x7Bu);
  EXPECT_EQ(encode(Format::FP16, 65520.0), 0x7C00u);
  EXPECT_EQ(encode(Format::FP16, 65519.99), 0x7BFFu);
  EXPECT_EQ(encode(Format::FP16, 1e6, Rounding::Down), 0x7BFFu);
  EXPECT_EQ(encode(Format::FP16, -1e6, Rounding::Down), 0xFC00u);
  EXPECT_EQ(encode(Format::FP16, -1e6, Rounding::Up), 0xFBFFu);
  // Underflow keeps the sign; half the smallest subnormal is a tie to even (zero).
  EXPECT_EQ(encode(Format::FP16, -0x1p-25), 0x8000u);
  EXPECT_EQ(encode(Format::FP16, 0x1p-25, Rounding::NearestAway), 0x0001u);
  EXPECT_EQ(encode(Format::FP16, 0x1.8p-25), 0x0001u);
  EXPECT_EQ(encode(Format::FP16, 1e-300, Rounding::Up), 0x0001u);
  EXPECT_EQ(encode(Format::FP16, -1e-300, Rounding::Up), 0x8000u);
}

// TF32's three conversions: RNE, RNA (cvt.rna.tf32.f32) and truncation of the low 13 bits.
RC_GTEST_PROP(Format, Tf32Conversions, (std::uint32_t bits)) {
  const float x = std::bit_cast<float>(bits);
  RC_PRE(std::isfinite(x));
  const Code rz = encode(Format::TF32, x, Rounding::TowardZero);
  RC_ASSERT(tf32_code_to_fp32_bits(rz) == (bits & ~0x1FFFu));
  // RNA adds half of the dropped unit to the magnitude and truncates (unless it overflows).
  const std::uint32_t rna_bits = (bits + 0x1000u) & ~0x1FFFu;
  const Code rna = encode(Format::TF32, x, Rounding::NearestAway);
  if (((rna_bits >> 23) & 0xFF) != 0xFF) RC_ASSERT(tf32_code_to_fp32_bits(rna) == rna_bits);
  const Code rne = encode(Format::TF32, x, Rounding::NearestEven);
  if ((bits & 0x1FFFu) != 0x1000u) RC_ASSERT(rne == rna);
}

// Rounding an exact value goes straight to the target. A value a hair above a tie must
// round up, although the nearest double is the tie itself (and would round to even).
TEST(Format, NoDoubleRoundingFromExactValues) {
  int checked = 0;
  for (Format f : kAllFormats) {
    const auto& fi = info(f);
    for (double lo : {1.0, 1.0 + 2 * fi.epsilon(), fi.min_normal(), fi.min_subnormal() * 2,
                      fi.max_finite() / 2}) {
      if (encode(f, lo) & 1) lo = decode(f, next_down(f, encode(f, lo)));  // an even code
      const double hi = decode(f, next_up(f, encode(f, lo)));
      Mpfr tie(200), x(200);
      mpfr_set_d(tie, lo, MPFR_RNDN);
      mpfr_add_d(tie, tie, hi, MPFR_RNDN);
      mpfr_div_2ui(tie, tie, 1, MPFR_RNDN);  // exact midpoint
      ASSERT_EQ(encode_exact(f, tie), encode(f, lo)) << name(f) << " tie goes to even " << lo;
      // tie + 2^-80 * tie: one FP64 rounding of it is the tie itself (or its neighbour)
      mpfr_mul_2si(x, tie, -80, MPFR_RNDN);
      mpfr_add(x, tie, x, MPFR_RNDN);
      ASSERT_EQ(encode_exact(f, x), encode(f, hi)) << name(f) << " above tie " << lo;
      mpfr_mul_2si(x, tie, -80, MPFR_RNDN);
      mpfr_sub(x, tie, x, MPFR_RNDN);
      ASSERT_EQ(encode_exact(f, x), encode(f, lo)) << name(f) << " below tie " << lo;
      if (f != Format::FP64) {
        // The hazard is real: going through the nearest double loses the information.
        mpfr_mul_2si(x, tie, -80, MPFR_RNDN);
        mpfr_add(x, tie, x, MPFR_RNDN);
        EXPECT_EQ(encode(f, mpfr_get_d(x, MPFR_RNDN)), encode(f, lo)) << name(f);
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 35);
}

TEST(Format, ExactRoundingFarOutsideTheRange) {
  Mpfr x(64);
  mpfr_set_ui_2exp(x, 1, 5000, MPFR_RNDN);
  EXPECT_EQ(encode_exact(Format::FP64, x), std::bit_cast<std::uint64_t>(double{INFINITY}));
  EXPECT_EQ(encode_exact(Format::E4M3, x, Rounding::NearestEven, Overflow::Saturate), 0x7Eu);
  EXPECT_EQ(encode_exact(Format::FP16, x, Rounding::TowardZero), 0x7BFFu);
  mpfr_set_si_2exp(x, -1, -5000, MPFR_RNDN);
  EXPECT_EQ(encode_exact(Format::FP64, x), std::bit_cast<std::uint64_t>(-0.0));
  EXPECT_EQ(encode_exact(Format::FP32, x, Rounding::Down), 0x80000001u);
  EXPECT_EQ(encode_exact(Format::BF16, x, Rounding::Up), 0x8000u);
}

TEST(Format, UlpErrorKnownAnswers) {
  const Format h = Format::FP16;
  EXPECT_EQ(ulp_of(h, 1.0), 0x1p-10);
  EXPECT_EQ(ulp_of(h, 0.75), 0x1p-11);
  EXPECT_EQ(ulp_of(h, 0.0), 0x1p-24);
  EXPECT_EQ(ulp_of(h, 1e-7), 0x1p-24);  // subnormal range: fixed quantum
  EXPECT_EQ(ulp_of(h, 1e6), 0x1p5);     // above max: the top binade's
  EXPECT_EQ(ulp_of(Format::E4M3, 448.0), 32.0);
  // computed 1.0 for exact 1 + 2^-11: half a unit low
  EXPECT_EQ(ulp_error(h, encode(h, 1.0), 1.0 + 0x1p-11), -0.5);
  EXPECT_EQ(ulp_error(h, encode(h, 1.0 + 0x1p-10), 1.0 + 0x1p-12), 0.75);
  // the exact value's binade sets the unit: computed 1.0, exact just below 1
  EXPECT_EQ(ulp_error(h, encode(h, 1.0), 1.0 - 0x1p-12), 0.5);
  EXPECT_EQ(ulp_error(h, encode(h, 0.0), -0x1p-24), 1.0);
  EXPECT_TRUE(std::isnan(ulp_error(h, canonical_nan(h), 1.0)));
  EXPECT_EQ(ulp_error(h, 0x7C00, 1.0), INFINITY);
  EXPECT_EQ(ulp_error(h, encode(h, 1.0), INFINITY), -INFINITY);
  EXPECT_EQ(ulp_error(h, 0x7C00, INFINITY), 0.0);
  // exact values beyond double precision: 1 + 2^-11 + 2^-100 against fp16 1.0
  Mpfr x(200);
  mpfr_set_ui_2exp(x, 1, -100, MPFR_RNDN);
  mpfr_add_d(x, x, 1.0 + 0x1p-11, MPFR_RNDN);
  EXPECT_EQ(ulp_error(h, encode(h, 1.0), x.get()), -(0.5 + 0x1p-90));
  // An exact value a billion binades down (a certified GELU tail) against the smallest
  // subnormal: one unit, and without a billion-bit subtraction.
  mpfr_set_si_2exp(x, -1, -1000000000, MPFR_RNDN);
  EXPECT_EQ(ulp_error(h, 1, x.get()), 1.0);
}

// The fractional error of the correctly rounded value is at most 1/2 ULP, and of every
// other code more than 1/2.
RC_GTEST_PROP(Format, CorrectRoundingHasErrorAtMostHalfUlp, ()) {
  const double x = *interesting_double();
  RC_PRE(std::isfinite(x));
  for (Format f : kSmall) {
    if (std::fabs(x) >= info(f).max_finite()) continue;
    const Code c = encode(f, x);
    RC_ASSERT(std::fabs(ulp_error(f, c, x)) <= 0.5);
    const Code other = next_up(f, c);
    if (is_finite(f, other) && decode(f, other) != decode(f, c) &&
        std::fabs(decode(f, other)) <= info(f).max_finite())
      RC_ASSERT(std::fabs(ulp_error(f, other, x)) >= 0.5);
  }
}

// encode_scaled rounds integer * 2^e exactly: checked against MPFR on 64-bit significands.
RC_GTEST_PROP(Format, EncodeScaledMatchesExactRounding, (std::uint64_t sig, bool neg)) {
  const int e = *rc::gen::inRange(-1200, 1100);
  Mpfr x(64);
  mpfr_set_ui_2exp(x, 0, 0, MPFR_RNDN);
  mpfr_set_uj_2exp(x, sig, e, MPFR_RNDN);
  if (neg) mpfr_neg(x, x, MPFR_RNDN);
  for (Format f : kAllFormats)
    for (Rounding r : kRoundings)
      for (Overflow o : kOverflows) RC_ASSERT(encode_scaled(f, neg, sig, e, r, o) == encode_exact(f, x, r, o));
}

// The device-capable rounding (format_rne.hpp) gives encode's storage word for every format
// below FP64: on the special values, at every exponent from far below the smallest
// subnormal to past the overflow threshold, on ties and their neighbours, and on random bits.
TEST(Format, RneStorageEqualsEncode) {
  std::mt19937_64 rng(5);
  for (const Format f : {Format::FP32, Format::TF32, Format::FP16, Format::BF16, Format::E4M3, Format::E5M2}) {
    const RneFormat p = rne_format(f);
    const auto& fi = info(f);
    const auto check = [&](double x) {
      ASSERT_EQ(rne_storage(p, x), code_to_storage(f, encode(f, x))) << name(f) << " " << hex_float(x);
    };
    for (double x : std::initializer_list<double>{0.0, -0.0, INFINITY, -INFINITY, NAN, -NAN, 5e-324, -5e-324, DBL_MAX, -DBL_MAX, fi.max_finite(),
                     fi.min_subnormal(), fi.min_subnormal() / 2, fi.min_normal()})
      check(x);
    std::uniform_int_distribution<std::uint64_t> bits;
    const int low = fi.emin() - fi.frac_bits - 3, high = fi.emax() + 2;
    for (int e = low; e <= high; ++e)
      for (int t = 0; t < 2000; ++t) {
        // a random significand at 2^e, and one ending exactly on a tie of the format there
        const double m = 1.0 + static_cast<double>(bits(rng) >> 12) * 0x1p-52;
        check(std::ldexp(t % 2 ? m : -m, e));
        const int q = std::max(e, fi.emin()) - fi.frac_bits;
        const double tie = std::ldexp(static_cast<double>((bits(rng) >> 40) | 1) + 0.5, q);
        check(tie), check(std::nextafter(tie, 0.0)), check(std::nextafter(tie, INFINITY));
      }
    for (int t = 0; t < 1000000; ++t) check(std::bit_cast<double>(bits(rng)));
  }
}
