// The sliced (int8-digit) exact GEMM path with the int8 products emulated on the CPU
// (references/sliced_gemm.hpp, sliced_digits.hpp): the shared arithmetic against known
// answers, slicing known answers, and the dot products against the superaccumulator bit
// for bit over every dot-input family (cancellation, subnormals, extreme ranges, signed
// zeros, specials), with certification and the int32 chunking.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <map>
#include <fmt/format.h>

#include "core/rng.hpp"
#include "references/exact_dot.hpp"
#include "references/sliced_gemm.hpp"
#include "tests/references/dot_inputs.hpp"
#include "tests/references/sliced_check.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

// sum_t d_t 256^t 2^lowest: the value the digits of element q of row r hold.
long double from_digits(const SlicedRows& s, const std::vector<std::int8_t>& digits, std::int64_t r, std::int64_t q) {
  long double n = 0;
  for (int t = s.plan[r].digits - 1; t >= 0; --t) n = n * 256 + digits[(s.offset[r] + t) * s.pitch + q];
  return std::ldexp(n, s.plan[r].lowest);
}

slicing::Wide wide_of(__int128 v) {
  slicing::Wide w;
  w.w[0] = static_cast<std::uint64_t>(v);
  w.w[1] = static_cast<std::uint64_t>(static_cast<unsigned __int128>(v) >> 64);
  w.w[2] = v < 0 ? ~std::uint64_t{0} : 0;
  return w;
}

}  // namespace

// add_shifted against 128-bit arithmetic (sums that stay within 127 bits), both signs,
// every shift the combination uses.
TEST(SlicedDigits, AddShiftedIsExact) {
  for (std::uint64_t c = 0; c < 20000; ++c) {
    Bits bits(3, 1, c);
    __int128 want = 0;
    slicing::Wide got;
    for (int t = 0; t < 8; ++t) {
      const int shift = 8 * static_cast<int>(bits.in(0, 7));
      const auto v = static_cast<std::int64_t>(bits.next() >> bits.in(8, 63)) * (bits.chance(0.5) ? -1 : 1);
      slicing::add_shifted(got, v, shift);
      want += static_cast<__int128>(v) * (static_cast<__int128>(1) << shift);
    }
    const slicing::Wide w = wide_of(want);
    ASSERT_EQ(std::vector<std::uint64_t>(got.w, got.w + 3), std::vector<std::uint64_t>(w.w, w.w + 3)) << "case " << c;
  }
  // Past 128 bits: 2^62 2^112 + 2^62 2^112 = 2^175, then minus itself.
  slicing::Wide x;
  slicing::add_shifted(x, std::int64_t{1} << 62, 112);
  slicing::add_shifted(x, std::int64_t{1} << 62, 112);
  EXPECT_EQ(x.w[2], std::uint64_t{1} << 47);
  EXPECT_EQ(x.w[1] | x.w[0], 0u);
  slicing::add_shifted(x, -(std::int64_t{1} << 62), 112);
  slicing::add_shifted(x, -(std::int64_t{1} << 62), 112);
  EXPECT_TRUE(slicing::is_zero(x));
}

// Rounding to nearest, ties to even, with the sticky bits in every limb.
TEST(SlicedDigits, RoundToDoubleIsCorrectlyRounded) {
  const auto round = [](__int128 v, int scale) { return slicing::round_to_double(wide_of(v), scale); };
  const __int128 one = 1;
  EXPECT_EQ(round(0, 5), 0.0);
  EXPECT_EQ(round(3, -2), 0.75);
  EXPECT_EQ(round((one << 53) + 1, 0), 0x1p53);                        // tie, to even (down)
  EXPECT_EQ(round((one << 53) + 3, 0), 0x1p53 + 4);                    // tie, to even (up)
  EXPECT_EQ(round((one << 100) + (one << 47), -100), 1.0);             // tie at 2^47 below 2^100
  EXPECT_EQ(round((one << 100) + (one << 47) + 1, -100), 1.0 + 0x1p-52);  // sticky in limb 0
  EXPECT_EQ(round((one << 100) + (one << 46), -100), 1.0);             // below half
  EXPECT_EQ(round((one << 54) - 1, 0), 0x1p54);                        // rounds up into the next binade
  slicing::Wide big;  // 2^150 + 2^97 (a tie) + 1 (sticky) -> 2^150 (1 + 2^-52)
  slicing::add_shifted(big, std::int64_t{1} << 38, 112);
  slicing::add_shifted(big, std::int64_t{1} << 1, 96);
  slicing::add_shifted(big, 1, 0);
  EXPECT_EQ(slicing::round_to_double(big, -150), 1.0 + 0x1p-52);
}

TEST(SliceRows, DigitsComeFromTheData) {
  // {1}: N = 1, one digit; a full FP32 significand next to a larger value: 24 bits, 4
  // digits (3 balanced digits hold only up to 0x7F7F7F); BF16 values in one binade: 8 bits,
  // 2 digits; 1 and 2^-40: 41 bits, 6 digits; zeros: no digits.
  const auto digits_of = [](std::vector<float> row) {
    return slice_rows(row, 1, static_cast<std::int64_t>(row.size())).plan[0].digits;
  };
  EXPECT_EQ(digits_of({1.0f}), 1);
  EXPECT_EQ(slice_rows(std::vector<float>{1.0f}, 1, 1).value[0], 1);
  EXPECT_EQ(digits_of({1.0f + 0x1p-23f, -1.5f}), 4);
  EXPECT_EQ(digits_of({1.0078125f, -1.9921875f, 1.5f}), 2);
  EXPECT_EQ(digits_of({1.0f, 0x1p-40f}), 6);
  EXPECT_EQ(digits_of({0.0f, -0.0f}), 0);
  EXPECT_EQ(digits_of({-127.0f}), 1);  // |N| = 127 fits one digit, and so does -127
  EXPECT_EQ(digits_of({-129.0f, 128.0f}), 2);  // lowest bit 2^0: |N| = 129 needs two

  // Rows: ordinary; a span of 71 bits (1 and 2^-70: more than 8 digits); an Inf; all zero;
  // a subnormal next to a normal (2^-126 and 2^-149: N = 2^23, 4 digits).
  const std::vector<float> rows = {0.75f, -3.0f, 1.0f, 0x1p-70f, 1.0f, INFINITY, 0.0f, -0.0f, 0x1p-126f, 0x1p-149f};
  const SlicedRows s = slice_rows(rows, 5, 2);
  std::vector<int> captured, digits;
  for (const auto& p : s.plan) captured.push_back(p.captured), digits.push_back(p.digits);
  EXPECT_EQ(captured, (std::vector<int>{1, 0, 0, 1, 1}));
  EXPECT_EQ(digits, (std::vector<int>{1, 0, 0, 0, 4}));
  EXPECT_EQ(s.captured_rows(), 3);
  EXPECT_EQ(s.plan[0].lowest, -2);  // 0.75 = 3 2^-2
  EXPECT_EQ(s.stacked, 5);
  EXPECT_EQ(s.pitch, 16);
  for (std::int64_t r : {0, 3, 4})
    for (std::int64_t q = 0; q < 2; ++q) {
      EXPECT_EQ(from_digits(s, s.value, r, q), rows[r * 2 + q]) << r << " " << q;
      EXPECT_EQ(from_digits(s, s.magnitude, r, q), std::fabs(rows[r * 2 + q])) << r << " " << q;
    }
  // With a cap of 3 digits the subnormal row is not captured either.
  EXPECT_EQ(slice_rows(rows, 5, 2, 3).captured_rows(), 2);
}

// Every captured element's digits hold it and its magnitude exactly, over the families'
// values; the stacked rows past K are zeros.
TEST(SliceRows, CapturedRowsHoldEveryValueExactly) {
  std::int64_t checked = 0;
  for (const Family fam : kFamilies)
    for (std::uint64_t i = 0; i < 300; ++i) {
      const DotInput d = make_dot(fam, 17, i, 200);
      const std::int64_t k = static_cast<std::int64_t>(d.x.size());
      if (k == 0) continue;
      const SlicedRows s = slice_rows(d.x, 1, k);
      if (!s.plan[0].captured) continue;
      for (std::int64_t q = 0; q < k; ++q) {
        ASSERT_EQ(from_digits(s, s.value, 0, q), d.x[q]) << name(fam) << " " << i << " element " << q;
        ASSERT_EQ(from_digits(s, s.magnitude, 0, q), std::fabs(d.x[q])) << name(fam) << " " << i << " element " << q;
      }
      for (std::int64_t t = 0; t < s.plan[0].digits; ++t)
        for (std::int64_t q = k; q < s.pitch; ++q) ASSERT_EQ(s.value[t * s.pitch + q], 0);
      ++checked;
    }
  EXPECT_GT(checked, 1000);
}

// The m x n dot products through the digits equal the superaccumulator's value and
// condition on every certified element, for every family and two digit caps, and every
// element of captured rows and columns with a nonzero sum is certified. 500 matrices per
// family and cap (about 50,000 elements), scaled by ULPGATE_REF_DOTS / 10^6 for long runs.
TEST(SlicedDots, BitIdenticalToTheSuperaccumulator) {
  std::int64_t elements = 0, recomputed = 0;
  std::map<std::pair<std::string, int>, std::pair<std::int64_t, std::int64_t>> per_family;
  const std::uint64_t cases = std::max<std::uint64_t>(1, 500 * dots_budget() / 1'000'000);
  for (const int cap : {kMaxSliceDigits, 4})
    for (const Family fam : kFamilies)
      for (std::uint64_t c = 0; c < cases; ++c) {
        const DotMatrices g = make_dot_matrices(fam, 5, c * 16, 1 + static_cast<std::int64_t>(c % 4),
                                                1 + static_cast<std::int64_t>((c / 4) % 5), 600);
        const SlicedDots s = cpu_sliced_dots(g.a, g.m, g.b, g.n, g.k, cap);
        ASSERT_EQ(first_difference(s, g.a, g.b, g.k), "") << name(fam) << " case " << c << " cap " << cap;
        elements += g.m * g.n;
        recomputed += s.recomputed;
        per_family[{name(fam), cap}].first += g.m * g.n;
        per_family[{name(fam), cap}].second += s.recomputed;
      }
  EXPECT_GT(elements, 50000 * static_cast<std::int64_t>(cases) / 500);
  EXPECT_GT(recomputed, 0);
  std::printf("%lld elements against the superaccumulator, %lld recomputed\n", static_cast<long long>(elements),
              static_cast<long long>(recomputed));
  // Ordinary data is certified by the digits (the rest: zero sums); the adversarial
  // families spread beyond 62 bits per row or hold specials, and are mostly recomputed.
  for (const char* fam : {"narrow", "small_integers"}) {
    const auto [all, again] = per_family.at({fam, kMaxSliceDigits});
    EXPECT_LT(again, all / 20) << fam;
  }
}

// Heavy cancellation the digits can capture (every row within 24 binades): pairs x y and
// -x y' with y' one to a few ulps from y, and exactly cancelling pairs, so the sums are
// tiny remainders of large terms; every nonzero element is certified and bit-identical.
TEST(SlicedDots, CertifiedUnderHeavyCancellation) {
  std::int64_t certified = 0;
  const std::uint64_t cases = std::max<std::uint64_t>(1, 400 * dots_budget() / 1'000'000);  // ULPGATE_REF_DOTS
  for (std::uint64_t c = 0; c < cases; ++c) {
    Bits bits(23, 7, c);
    const std::int64_t m = 1 + bits.in(0, 4), n = 1 + bits.in(0, 4);
    const std::int64_t k = 2 * bits.in(1, 200);
    std::vector<float> a, b(static_cast<std::size_t>(n * k));
    for (std::int64_t i = 0; i < m * k / 2; ++i) {
      const float x = make_float(bits, -12, 12);
      a.push_back(x), a.push_back(bits.in(0, 1) ? -x : x);
    }
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t q = 0; q < k; q += 2) {
        const float y = make_float(bits, -12, 12);
        float y2 = y;
        for (std::int64_t s = bits.in(0, 3); s > 0; --s) y2 = std::nextafter(y2, INFINITY);
        b[j * k + q] = y, b[j * k + q + 1] = bits.in(0, 1) ? -y2 : y2;
      }
    const SlicedDots s = cpu_sliced_dots(a, m, b, n, k);
    ASSERT_EQ(first_difference(s, a, b, k), "") << "case " << c;
    for (const auto x : s.certified) certified += x;
  }
  std::printf("%lld cancelling elements certified and bit-identical\n", static_cast<long long>(certified));
  EXPECT_GT(certified, 2000 * static_cast<std::int64_t>(cases) / 400);
}

// Which elements the digits certify: those of captured rows and columns with a nonzero sum.
TEST(SlicedDots, CertifiesOnlyCapturedNonzeroSums) {
  // A rows: ordinary; an Inf; a span of 2^100 (not capturable). B columns: ordinary; one
  // that cancels row 0 exactly.
  const std::vector<float> a = {1.0f, 2.0f, INFINITY, 1.0f, 1.0f, 0x1p-100f};
  const std::vector<float> b = {3.0f, -0.5f, 2.0f, -1.0f};
  const SlicedDots s = cpu_sliced_dots(a, 3, b, 2, 2);
  // certified: (0, 0) only; (0, 1) sums to 0; rows 1 and 2 are not captured
  EXPECT_EQ(s.recomputed, 5);
  EXPECT_EQ(std::vector<std::uint8_t>(s.certified.begin(), s.certified.end()), (std::vector<std::uint8_t>{1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(s.value(0, 0).to_double(), 2.0);
  EXPECT_EQ(s.condition[s.index(0, 0)], 4.0);
  EXPECT_EQ(first_difference(s, a, b, 2), "");
}

// The int32 partial sums stay exact past K 2^14 = 2^31: chunks of kInt32Chunk, even where
// every product is the largest, (-128)(-128).
TEST(SlicedDots, DigitProductsChunkKToStayExactInInt32) {
  const std::int64_t k = 3 * kInt32Chunk + 5, pitch = (k + 15) / 16 * 16;
  std::vector<std::int8_t> a(static_cast<std::size_t>(pitch), -128), b(static_cast<std::size_t>(pitch), -128);
  std::fill(a.begin() + k, a.end(), 0);
  std::vector<std::int32_t> out;
  cpu_digit_products(a.data(), 1, b.data(), 1, k, pitch, out);
  EXPECT_EQ(out, (std::vector<std::int32_t>{static_cast<std::int32_t>(kInt32Chunk * 16384), static_cast<std::int32_t>(kInt32Chunk * 16384),
                                             static_cast<std::int32_t>(kInt32Chunk * 16384), 5 * 16384}));
  EXPECT_GT(kInt32Chunk * 16384 * 2, std::int64_t{1} << 31);
  // Through the combination: one row of K values -1, one of K values -1 (N = -1 each: one
  // digit), sum K exactly.
  std::vector<float> x(static_cast<std::size_t>(k), -1.0f);
  const SlicedDots s = cpu_sliced_dots(x, 1, x, 1, k);
  EXPECT_EQ(s.value(0, 0).to_double(), static_cast<double>(k));
  EXPECT_EQ(s.products, 2 * 4);
}

// Rows of the widest span the digits capture (values near 2^19 and near 2^-19 with full
// significands: 62 bits, 8 digits): the exact sums need up to ~145 bits, so the 128-bit
// window drops bits (inexact) where the digits still certify the element.
TEST(SlicedDots, CertifiedWhereTheSumNeedsMoreThan128Bits) {
  std::int64_t certified_inexact = 0;
  for (std::uint64_t c = 0; c < 200; ++c) {
    Bits bits(29, 3, c);
    const std::int64_t m = 3, n = 3, k = bits.in(100, 600);
    const auto draw = [&](std::int64_t count) {
      std::vector<float> v;
      for (std::int64_t i = 0; i < count; ++i) {  // large ones positive (sums grow), small ones odd
        const float m = std::fabs(make_float(bits, 0, 0));
        v.push_back(bits.in(0, 1) ? m * 0x1p19f
                                  : (bits.in(0, 1) ? -0x1p-19f : 0x1p-19f) * std::bit_cast<float>(std::bit_cast<std::uint32_t>(m) | 1u));
      }
      return v;
    };
    const std::vector<float> a = draw(m * k), b = draw(n * k);
    const SlicedDots s = cpu_sliced_dots(a, m, b, n, k);
    ASSERT_EQ(first_difference(s, a, b, k), "") << "case " << c;
    EXPECT_EQ(s.recomputed, 0) << "case " << c;
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) certified_inexact += s.value(i, j).inexact;
  }
  EXPECT_GT(certified_inexact, 300);
}
