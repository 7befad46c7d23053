// The sliced (int8-digit) exact GEMM path against the superaccumulator, bit for bit, with
// the integer products emulated on the CPU (references/sliced_gemm.hpp): slicing known
// answers, every dot-input family (cancellation, subnormals, extreme ranges, signed zeros,
// specials), certification and recomputation, and the int32 chunking.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <map>
#include <fmt/format.h>

#include "references/exact_dot.hpp"
#include "references/sliced_gemm.hpp"
#include "tests/references/dot_inputs.hpp"
#include "tests/references/sliced_check.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

// sum_t d_t 128^(D-1-t) 2^(e - 7D): the value the digits of element q of row r hold.
double from_digits(const SlicedRows& s, std::int64_t r, std::int64_t q) {
  long double n = 0;
  for (int t = 0; t < s.digits; ++t) n = n * 128 + s.plane(t)[r * s.k + q];
  return static_cast<double>(std::ldexp(n, s.exponent[r] - 7 * s.digits));
}

}  // namespace

TEST(SliceRows, DigitsComeFromTheData) {
  // {1}: 1 bit, 1 digit (64 = 1 * 2^(7 - 1)); a full FP32 significand: 24 bits, 4 digits;
  // BF16 values in one binade: at most 8 bits, 2 digits; 1 and 2^-40: 41 bits, 6 digits.
  const auto digits_of = [](std::vector<float> row) { return slice_rows(row, 1, static_cast<std::int64_t>(row.size())).digits; };
  EXPECT_EQ(digits_of({1.0f}), 1);
  EXPECT_EQ(slice_rows(std::vector<float>{1.0f}, 1, 1).plane(0)[0], 64);
  EXPECT_EQ(digits_of({1.0f + 0x1p-23f, -1.5f}), 4);
  EXPECT_EQ(digits_of({1.0078125f, -1.9921875f, 1.5f}), 2);
  EXPECT_EQ(digits_of({1.0f, 0x1p-40f}), 6);
  EXPECT_EQ(digits_of({0.0f, -0.0f}), 0);

  // Rows: ordinary; needing 11 digits (1 and 2^-70: more than the cap); an Inf; all zero;
  // a subnormal next to a normal (2^-126 and 2^-149: 24 bits).
  const std::vector<float> rows = {0.75f, -3.0f, 1.0f, 0x1p-70f, 1.0f, INFINITY, 0.0f, -0.0f, 0x1p-126f, 0x1p-149f};
  const SlicedRows s = slice_rows(rows, 5, 2);
  EXPECT_EQ(s.digits, 4);
  EXPECT_EQ(s.captured, (std::vector<char>{1, 0, 0, 1, 1}));
  EXPECT_EQ(s.captured_rows(), 3);
  EXPECT_EQ(s.exponent[0], 2);  // |v| < 2^2
  for (std::int64_t r : {0, 3, 4})
    for (std::int64_t q = 0; q < 2; ++q) EXPECT_EQ(from_digits(s, r, q), rows[r * 2 + q]) << r << " " << q;
  // With a cap of 3 digits the subnormal row (24 bits) is not captured either.
  EXPECT_EQ(slice_rows(rows, 5, 2, 3).captured, (std::vector<char>{1, 0, 0, 1, 0}));
}

// Every captured element's digits hold it exactly, over the families' values.
TEST(SliceRows, CapturedRowsHoldEveryValueExactly) {
  std::int64_t checked = 0;
  for (const Family fam : kFamilies)
    for (std::uint64_t i = 0; i < 300; ++i) {
      const DotInput d = make_dot(fam, 17, i, 200);
      const std::int64_t k = static_cast<std::int64_t>(d.x.size());
      if (k == 0) continue;
      const SlicedRows s = slice_rows(d.x, 1, k);
      if (!s.captured[0]) continue;
      for (std::int64_t q = 0; q < k; ++q) {
        ASSERT_EQ(from_digits(s, 0, q), d.x[q]) << name(fam) << " " << i << " element " << q;
        for (int t = 0; t < s.digits; ++t) ASSERT_LE(std::abs(static_cast<int>(s.plane(t)[q])), 127);
      }
      ++checked;
    }
  EXPECT_GT(checked, 1000);
}

// The m x n dot products through the digits equal the superaccumulator's value and
// magnitude on every element, for every family, both digit caps; each element is either
// certified by the digits or recomputed, and both happen.
TEST(SlicedDots, BitIdenticalToTheSuperaccumulator) {
  std::int64_t elements = 0, recomputed = 0;
  std::map<std::pair<std::string, int>, std::pair<std::int64_t, std::int64_t>> per_family;
  for (const int cap : {kMaxSliceDigits, 4})
    for (const Family fam : kFamilies)
      for (std::uint64_t c = 0; c < 600; ++c) {
        const DotMatrices g = make_dot_matrices(fam, 5, c * 16, 1 + static_cast<std::int64_t>(c % 4),
                                                1 + static_cast<std::int64_t>((c / 4) % 5), 600);
        const SlicedDots s = sliced_dots(g.a, g.m, g.b, g.n, g.k, cpu_digit_gemm, cap);
        const std::string diff = first_difference(s, g.a, g.b, g.k);
        ASSERT_EQ(diff, "") << name(fam) << " case " << c << " cap " << cap;
        const std::int64_t m = g.m, n = g.n;
        elements += m * n;
        recomputed += s.recomputed;
        per_family[{name(fam), cap}].first += m * n;
        per_family[{name(fam), cap}].second += s.recomputed;
      }
  EXPECT_GT(elements, 50000);
  EXPECT_GT(recomputed, 0);
  // Ordinary data is certified by the digits (the rest: zero sums); the adversarial families
  // spread beyond 63 bits per row or hold specials, and are mostly recomputed.
  for (const char* fam : {"narrow", "small_integers"}) {
    const auto [all, again] = per_family.at({fam, kMaxSliceDigits});
    EXPECT_LT(again, all / 20) << fam;
  }
}

// Heavy cancellation the digits can capture (every row within 40 binades): pairs x y and
// -x y' with y' one to a few ulps from y, and exactly cancelling pairs, so the sums are
// tiny remainders of large terms; every nonzero element is certified and bit-identical.
TEST(SlicedDots, CertifiedUnderHeavyCancellation) {
  std::int64_t certified = 0;
  for (std::uint64_t c = 0; c < 400; ++c) {
    Bits bits(23, 7, c);
    const std::int64_t m = 1 + static_cast<std::int64_t>(bits.in(0, 4)), n = 1 + static_cast<std::int64_t>(bits.in(0, 4));
    const std::int64_t k = 2 * static_cast<std::int64_t>(bits.in(1, 200));
    std::vector<float> a, b(static_cast<std::size_t>(n * k));
    for (std::int64_t i = 0; i < m * k / 2; ++i) {
      const float x = make_float(bits, -12, 12);
      a.push_back(x), a.push_back(bits.in(0, 1) ? -x : x);
    }
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t q = 0; q < k; q += 2) {
        const float y = make_float(bits, -12, 12);
        float y2 = y;
        for (std::uint64_t s = bits.in(0, 3); s > 0; --s) y2 = std::nextafter(y2, INFINITY);
        b[j * k + q] = y, b[j * k + q + 1] = bits.in(0, 1) ? -y2 : y2;
      }
    const SlicedDots s = sliced_dots(a, m, b, n, k);
    ASSERT_EQ(first_difference(s, a, b, k), "") << "case " << c;
    for (const RefValue& v : s.value) certified += v.kind != RefValue::Kind::Zero;
    EXPECT_EQ(s.recomputed, std::count_if(s.value.begin(), s.value.end(),
                                          [](const RefValue& v) { return v.kind == RefValue::Kind::Zero; }))
        << "case " << c;
  }
  EXPECT_GT(certified, 2000);
}

// Which elements the digits certify: those of captured rows and columns with a nonzero sum.
TEST(SlicedDots, CertifiesOnlyCapturedNonzeroSums) {
  // A rows: ordinary; an Inf; a range of 2^100 (not capturable); B columns: ordinary; one
  // that cancels row 0 exactly.
  const std::vector<float> a = {1.0f, 2.0f, INFINITY, 1.0f, 1.0f, 0x1p-100f};
  const std::vector<float> b = {3.0f, -0.5f, 2.0f, -1.0f};
  const SlicedDots s = sliced_dots(a, 3, b, 2, 2);
  // certified: (0, 0) only; (0, 1) sums to 0; rows 1 and 2 are not captured
  EXPECT_EQ(s.recomputed, 5);
  EXPECT_EQ(s.value[0].to_double(), 2.0);
  EXPECT_EQ(s.value[1].kind, RefValue::Kind::Zero);
  EXPECT_FALSE(s.value[1].negative);
  EXPECT_TRUE(s.value[1].negative_down);  // terms of both signs cancelled
  EXPECT_EQ(s.value[2].kind, RefValue::Kind::Inf);
}

// The int32 partial sums stay exact past K 127^2 = 2^31: chunks of kInt32Chunk.
TEST(SlicedDots, DigitProductsChunkKToStayExactInInt32) {
  const std::int64_t k = 3 * kInt32Chunk + 5;
  std::vector<std::int8_t> a(static_cast<std::size_t>(k), 127), b(static_cast<std::size_t>(k), -127);
  std::int64_t out = 0;
  cpu_digit_gemm(a.data(), b.data(), 1, 1, k, &out);
  EXPECT_EQ(out, -k * 127 * 127);
  EXPECT_GT(k * 127 * 127, std::int64_t{1} << 31);
}

// Rows of the widest range the digits capture (values near 2^20 and near 2^-19 with full
// significands: 62 bits): the exact sums need up to ~135 bits, so the 128-bit window drops
// bits (inexact) where the digits still certify the element.
TEST(SlicedDots, CertifiedWhereTheSumNeedsMoreThan128Bits) {
  std::int64_t certified_inexact = 0;
  for (std::uint64_t c = 0; c < 200; ++c) {
    Bits bits(29, 3, c);
    const std::int64_t m = 3, n = 3, k = static_cast<std::int64_t>(bits.in(100, 600));
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
    const SlicedDots s = sliced_dots(a, m, b, n, k);
    ASSERT_EQ(first_difference(s, a, b, k), "") << "case " << c;
    EXPECT_EQ(s.recomputed, 0) << "case " << c;
    for (const RefValue& v : s.value) certified_inexact += v.inexact;
  }
  EXPECT_GT(certified_inexact, 300);
}
