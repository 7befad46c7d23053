// Exact sums built to land on the accumulator's internal boundaries: carry-save digit
// edges, slice levels, bin edges and chunk folds, the top and bottom of the product range
// and of the 128-bit window; both signs, every path, K from 1 to 2^20, long runs of equal
// terms, cancelling noise. Each sum is known by construction, S = s (2^E + t 2^(E-d)), so
// the check needs no oracle. Also: the cases that once failed at digit edges, the documented path rule,
// and independence from the caller's floating-point environment.
//
// ULPGATE_BOUNDARY_SCALE multiplies the number of sums (default 1: about 20 s here).
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <xmmintrin.h>

#include "core/format_mpfr.hpp"
#include "references/exact_dot.hpp"
#include "tests/references/dot_inputs.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

constexpr Rounding kRoundings[] = {Rounding::NearestEven, Rounding::NearestAway,
                                   Rounding::TowardZero, Rounding::Up, Rounding::Down};
constexpr Simd kPaths[] = {Simd::Avx512, Simd::Avx2, Simd::Scalar};

std::uint64_t scale() {
  const char* s = std::getenv("ULPGATE_BOUNDARY_SCALE");
  return s ? std::max<std::uint64_t>(1, std::strtoull(s, nullptr, 10)) : 1;
}

/// The caller's environment at its worst for the reference: FTZ, DAZ, rounding up.
class HostileFpEnv {
 public:
  HostileFpEnv() : saved_(_mm_getcsr()) { _mm_setcsr(0x1F80 | 0x8000 | 0x0040 | 0x4000); }
  ~HostileFpEnv() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
};

/// A sum and its exact value, known by construction.
struct KnownSum {
  std::vector<float> x, y;      // products, through add_products
  std::vector<double> doubles;  // through add()
  Mpfr exact{2};                // the exact sum, its sign rounding to nearest
  bool negative_down = false;   // the sign of a zero sum rounding down
  std::string what;
};

void set_pow2(Mpfr& m, int sign, int e) {
  mpfr_set_prec(m, 2);
  mpfr_set_si_2exp(m, sign, e, MPFR_RNDN);
}

/// Where push_pow2_product puts the factors of a power of two.
struct Split {
  int cap_x = 127, cap_y = 127;  ///< the largest exponents x and y may have, where possible
  int y = 1000;                  ///< y's exponent where possible (a narrow range); else random
};

/// s 2^k as an FP32 product 2^a 2^(k-a), k in [-298, 254], split as `split` says.
void push_pow2_product(KnownSum& s, Bits& b, int sign, int k, const Split& split) {
  int lo = std::max(-149, k - std::min(127, split.cap_y)), hi = std::min(std::min(127, split.cap_x), k + 149);
  if (lo > hi) lo = std::max(-149, k - 127), hi = std::min(127, k + 149);
  const int a = k - split.y >= lo && k - split.y <= hi ? k - split.y : static_cast<int>(b.in(lo, hi));
  s.x.push_back(static_cast<float>(sign) * std::ldexp(1.0f, a));
  s.y.push_back(std::ldexp(1.0f, k - a));
}

/// Sums of FP32 products landing on a boundary. `kind` picks which.
void product_sum(KnownSum& s, std::uint64_t seed, std::uint64_t index) {
  Bits b(seed, 11, index);
  const int kind = static_cast<int>(b.in(0, 4));
  const int r = static_cast<int>(b.chance(0.5) ? b.in(0, 6) : b.in(0, 20));  // 2^r equal terms
  const int sign = b.chance(0.5) ? -1 : 1;
  // A big cancelling pair sets the top of the operands' exponent ranges (and so the
  // slice positions) where kind 1 needs it.
  const int hx = static_cast<int>(b.in(-20, 60)), hy = static_cast<int>(b.in(-20, 60));
  int e = 0;
  switch (kind) {
    case 0: {  // a carry-save digit edge: digit d holds 2^(32 d - kBias) and up
      const int d = static_cast<int>(b.in(26, 41));
      e = 32 * d - ExactAccumulator::kBias + static_cast<int>(b.in(-1, 1));
      s.what = "digit edge";
      break;
    }
    case 1: {  // a slice level edge: slices at 2^(top - 51 (j + 1)), top = hx + hy + 2
      const int j = static_cast<int>(b.in(0, 3));
      e = hx + hy + 2 - 51 * (j + 1) + static_cast<int>(b.in(-1, 1));
      s.what = "slice level " + std::to_string(j);
      break;
    }
    case 2:  // the top and the bottom of the product range
      e = b.chance(0.5) ? 254 + r - static_cast<int>(b.in(0, 2)) : -298 + r + static_cast<int>(b.in(0, 2));
      s.what = "range end";
      break;
    default:
      e = static_cast<int>(b.in(-298 + r, 254 + r));
      s.what = "anywhere";
  }
  e = std::clamp(e, -298 + r, 254 + r);
  // Under the big pair's exponents, so that it alone sets the top of the ranges; mostly
  // with one y (a narrow range: the slices), else split at random (wide: the bins).
  Split split;
  if (kind == 1) split.cap_x = hx, split.cap_y = hy;
  if (b.chance(0.7)) split.y = static_cast<int>(b.in(std::max(-149, e - r - 127), std::min(127, e - r + 149)));
  if (kind == 1) {
    const float big_x = make_float(b, hx, hx), big_y = std::fabs(make_float(b, hy, hy));
    s.x.insert(s.x.end(), {big_x, -big_x});
    s.y.insert(s.y.end(), {big_y, big_y});
  }
  const bool zero_sum = b.chance(0.03);  // noise alone: an exact cancellation
  Mpfr delta(2);
  mpfr_set_zero(delta, 1);
  if (!zero_sum) {
    if (b.chance(0.75) || e > 255 || e <= -298) {  // 2^r equal terms
      for (std::int64_t i = 0; i < (std::int64_t{1} << r); ++i) push_pow2_product(s, b, sign, e - r, split);
      s.what += ", run of 2^" + std::to_string(r);
    } else {  // 2^(e-1) + ... + 2^(e-n) + 2^(e-n): carries through every bit position
      const int n = static_cast<int>(b.in(1, std::min(80, e + 298)));
      for (int i = 1; i <= n; ++i) push_pow2_product(s, b, sign, e - i, split);
      push_pow2_product(s, b, sign, e - n, split);
      s.what += ", series of " + std::to_string(n + 1);
    }
    constexpr int kOffsets[] = {1, 2, 31, 32, 33, 47, 48, 49, 51, 52, 53, 64, 126, 127, 128, 129, 200};
    const int dd = b.chance(0.2) ? static_cast<int>(b.in(1, 250)) : kOffsets[b.in(0, std::size(kOffsets) - 1)];
    if (b.chance(0.6) && e - dd >= -298 && e - dd <= 254) {  // + or - one unit d bits below: sticky, window edges
      const int t = b.chance(0.5) ? -1 : 1;
      if (b.chance(0.2) && !s.x.empty()) s.doubles.push_back(std::ldexp(static_cast<double>(sign * t), e - dd));
      else push_pow2_product(s, b, sign * t, e - dd, split);
      set_pow2(delta, sign * t, e - dd);
      s.what += ", delta 2^(E-" + std::to_string(dd) + ")";
    }
  }
  // Cancelling noise: pairs p, -p with exponents below hx and hy.
  const int wx = static_cast<int>(b.in(0, 80)), wy = static_cast<int>(b.in(0, 80));
  const std::int64_t pairs = zero_sum ? b.in(1, 200) : b.chance(0.3) ? 0 : b.in(1, b.chance(0.9) ? 64 : 5000);
  for (std::int64_t i = 0; i < pairs; ++i) {
    const float px = make_float(b, hx - wx, hx), py = make_float(b, hy - wy, hy);
    s.x.insert(s.x.end(), {px, -px});
    s.y.insert(s.y.end(), {py, py});
  }
  for (std::size_t i = s.x.size(); i > 1; --i) {  // shuffle: runs stay runs of equal terms
    const std::size_t j = b.next() % i;
    std::swap(s.x[i - 1], s.x[j]);
    std::swap(s.y[i - 1], s.y[j]);
  }
  Mpfr main(2);
  if (zero_sum) mpfr_set_zero(main, 1);
  else set_pow2(main, sign, e);
  mpfr_set_prec(s.exact, 700);
  mpfr_add(s.exact, main, delta, MPFR_RNDN);  // exact at 700 bits
  s.negative_down = mpfr_zero_p(s.exact);     // noise pairs cancel: -0 rounding down
  s.what += ", E = " + std::to_string(e) + ", K = " + std::to_string(s.x.size());
}

/// Sums of doubles through add(), over the whole FP64 range (digits 0 to 66).
void double_sum(KnownSum& s, std::uint64_t seed, std::uint64_t index) {
  Bits b(seed, 12, index);
  const int r = static_cast<int>(b.chance(0.6) ? b.in(0, 6) : b.in(0, 16));
  const int sign = b.chance(0.5) ? -1 : 1;
  int e;
  if (b.chance(0.6)) {
    e = 32 * static_cast<int>(b.in(0, 66)) - ExactAccumulator::kBias + static_cast<int>(b.in(-1, 1));
    s.what = "digit edge";
  } else {
    e = b.chance(0.5) ? static_cast<int>(b.in(-1074 + r, -1060 + r)) : static_cast<int>(b.in(1010 + r, 1023 + r));
    s.what = "range end";
  }
  e = std::clamp(e, -1074 + r, 1023 + r);
  for (std::int64_t i = 0; i < (std::int64_t{1} << r); ++i) s.doubles.push_back(std::ldexp(static_cast<double>(sign), e - r));
  Mpfr delta(2);
  mpfr_set_zero(delta, 1);
  const int dd = static_cast<int>(b.in(1, 130));
  if (b.chance(0.5) && e - dd >= -1074 && e - dd <= 1023) {
    const int t = b.chance(0.5) ? -1 : 1;
    s.doubles.push_back(std::ldexp(static_cast<double>(sign * t), e - dd));
    set_pow2(delta, sign * t, e - dd);
  }
  for (std::int64_t i = b.chance(0.3) ? 0 : b.in(1, 50); i > 0; --i) {  // noise of any magnitude
    double p;
    do p = std::bit_cast<double>(b.next());
    while (!std::isfinite(p));
    s.doubles.insert(s.doubles.end(), {p, -p});
  }
  for (std::size_t i = s.doubles.size(); i > 1; --i) std::swap(s.doubles[i - 1], s.doubles[b.next() % i]);
  Mpfr main(2);
  set_pow2(main, sign, e);
  mpfr_set_prec(s.exact, 2300);
  mpfr_add(s.exact, main, delta, MPFR_RNDN);
  s.what += ", E = " + std::to_string(e) + ", K = " + std::to_string(s.doubles.size());
}

void accumulate(ExactAccumulator& acc, const KnownSum& s) {
  acc.clear();
  if (!s.x.empty()) acc.add_products(s.x, s.y);
  for (double v : s.doubles) acc.add(v);
}

/// "" or what differs from the known sum: the exact value, the 128-bit window, every
/// format's rounding in every mode.
std::string check_known(const ExactAccumulator& acc, const KnownSum& s) {
  Mpfr got(2);
  acc.exact_value(got);
  if (!mpfr_equal_p(got, s.exact) || mpfr_signbit(got) != mpfr_signbit(s.exact)) {
    char* a = nullptr;
    mpfr_asprintf(&a, "exact sum %Ra, expected %Ra", got.get(), s.exact.get());
    std::string m(a);
    mpfr_free_str(a);
    return m;
  }
  RefValue want = RefValue::from_exact(s.exact);
  if (want.kind == RefValue::Kind::Zero) want.negative_down = s.negative_down;
  const RefValue v = acc.value();
  if (!(v == want)) return "window " + to_string(v) + ", expected " + to_string(want);
  for (Format f : kAllFormats)
    for (Rounding r : kRoundings)
      for (Overflow o : {Overflow::NoSaturate, Overflow::Saturate})
        if (v.round_to(f, r, o) != want.round_to(f, r, o))
          return std::string("rounding to ") + std::string(name(f)) + " " + std::string(name(r));
  return "";
}

template <class A>
constexpr bool takes_raw_ranges =
    requires(A a, std::span<const float> s, ExponentRange r) { a.add_products(s, s, r, r); };

/// The documented path rule (exact_dot.hpp, docs/concepts/references.md) for one add_products call.
ExactAccumulator::PathTerms expected_paths(Simd simd, std::span<const float> x, std::span<const float> y) {
  const ExponentRange xr = exponent_range(x), yr = exponent_range(y);
  const std::size_t k = x.size(), lanes = simd == Simd::Avx512 ? 8 : 4;
  const int spread = xr.empty() || yr.empty() ? 0 : (xr.hi - xr.lo) + (yr.hi - yr.lo);
  ExactAccumulator::PathTerms p;
  if (simd != Simd::Scalar && k >= lanes && !xr.special && !yr.special && spread <= 156) {
    p.slices = k / lanes * lanes;
    p.single = k % lanes;
  } else {
    p.bins = k;
  }
  return p;
}

}  // namespace

TEST(ExactDotBoundaries, ProductSumsOnEveryPath) {
  const std::uint64_t n = 1500 * scale();
  std::uint64_t slices = 0, bins = 0, terms = 0;
  ExactAccumulator accs[] = {ExactAccumulator(kPaths[0]), ExactAccumulator(kPaths[1]), ExactAccumulator(kPaths[2])};
  for (std::uint64_t i = 0; i < n; ++i) {
    KnownSum s;
    product_sum(s, 20261201, i);
    for (ExactAccumulator& acc : accs) {
      accumulate(acc, s);
      const std::string err = check_known(acc, s);
      ASSERT_EQ(err, "") << "sum " << i << " (" << s.what << "), path " << static_cast<int>(acc.simd());
      ExactAccumulator::PathTerms want = expected_paths(acc.simd(), s.x, s.y);
      want.single += s.doubles.size();
      ASSERT_EQ(acc.path_terms(), want) << "sum " << i << " (" << s.what << ")";
      slices += acc.path_terms().slices, bins += acc.path_terms().bins, terms += acc.terms();
    }
    if (i % 8 == 0) {  // the caller's environment cannot change a bit
      HostileFpEnv hostile;
      accumulate(accs[i % 3], s);
      const std::string err = check_known(accs[i % 3], s);
      ASSERT_EQ(err, "") << "under FTZ/DAZ/round-up: sum " << i << " (" << s.what << ")";
    }
  }
  std::printf("%llu sums, %llu terms: %llu through slices, %llu through bins\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(terms),
              static_cast<unsigned long long>(slices), static_cast<unsigned long long>(bins));
  if (best_simd() != Simd::Scalar) {
    EXPECT_GT(slices, terms / 10);
  }
  EXPECT_GT(bins, terms / 10);
}

TEST(ExactDotBoundaries, DoubleSums) {
  const std::uint64_t n = 3000 * scale();
  ExactAccumulator acc;
  for (std::uint64_t i = 0; i < n; ++i) {
    KnownSum s;
    double_sum(s, 20261202, i);
    accumulate(acc, s);
    ASSERT_EQ(check_known(acc, s), "") << "sum " << i << " (" << s.what << ")";
    if (i % 8 == 0) {
      HostileFpEnv hostile;
      accumulate(acc, s);
      ASSERT_EQ(check_known(acc, s), "") << "under FTZ/DAZ/round-up: sum " << i << " (" << s.what << ")";
    }
  }
}

// ---- Cases that once failed at carry-save digit edges ----

// A negative power of two at a digit edge: the negation's carry left the window.
TEST(ExactDotBoundaries, NegativePowerOfTwoAtDigitEdge) {
  for (Simd simd : kPaths) {
    ExactAccumulator acc(simd);
    const std::vector<float> x(65536, -1.0f / 16), y(65536, 1.0f / 16);
    acc.add_products(x, y);
    EXPECT_EQ(acc.value().to_double(), -256.0) << static_cast<int>(simd);
    acc.clear();
    for (int i = 0; i < 8192; ++i) acc.add(-0.03125);
    EXPECT_EQ(acc.value().to_double(), -256.0);
  }
  ExactAccumulator bins(Simd::Scalar);
  std::vector<float> x(131073, -2048.0f), y(131073, 4096.0f - 0x1p-12f);
  y.back() = 32.0f;
  bins.add_products(x, y);
  EXPECT_EQ(bins.value().to_double(), -0x1p40);
  EXPECT_EQ(bins.path_terms().bins, 131073u);
}

// Subnormal inputs under FTZ/DAZ, and the slice splitting under directed rounding.
TEST(ExactDotBoundaries, CallersFloatingPointEnvironment) {
  const std::vector<float> x{0x1p-140f, 0x1.8p-149f * 2, 3.0f, 1.5f, -0x1p-130f, 1.0f, 2.0f, 0x1p-149f, 1.0f},
      y{1.0f, 1.0f, 0x1p-148f, 1.0f / 3, 1.0f, 1.0f, 0x1p-20f, 1.0f, 0x1p-100f};
  for (Simd simd : kPaths) {
    ExactAccumulator clean(simd), hostile(simd);
    clean.add_products(x, y);
    clean.add(0x1p-1074);
    clean.add(-0x1.8p-1060);
    {
      HostileFpEnv env;
      hostile.add_products(x, y);
      hostile.add(0x1p-1074);
      hostile.add(-0x1.8p-1060);
    }
    EXPECT_EQ(hostile.value(), clean.value()) << static_cast<int>(simd);
    EXPECT_EQ(hostile.magnitude(), clean.magnitude()) << static_cast<int>(simd);
    Mpfr a(2), b(2);
    MpfrOracle oracle;
    oracle.dot(a, x, y);
    {
      HostileFpEnv env;
      oracle.dot(b, x, y);
    }
    EXPECT_TRUE(mpfr_equal_p(a, b));
  }
  // The environment is the caller's again afterwards.
  const unsigned before = _mm_getcsr() & ~0x3Fu;
  {
    HostileFpEnv env;
    const unsigned hostile = _mm_getcsr() & ~0x3Fu;
    ExactAccumulator acc;
    acc.add_products(x, y);
    EXPECT_EQ(_mm_getcsr() & ~0x3Fu, hostile);
  }
  EXPECT_EQ(_mm_getcsr() & ~0x3Fu, before);
}

// More than 2^31 add() calls without clear(): the digits are carried every 2^30 calls.
TEST(ExactDotBoundaries, MoreThan2To31Adds) {
  ExactAccumulator acc;
  const std::uint64_t n = (std::uint64_t{1} << 31) + 16;
  // 53 one bits aligned to a digit (2^(60-52) = 2^(32 * 34 - kBias)): the lowest digit
  // grows by 2^32 - 1 per add, past 2^63 after 2^31 + 1 adds.
  const double v = 0x1.fffffffffffffp60;
  for (std::uint64_t i = 0; i < n; ++i) acc.add(v);
  Mpfr want(128), got(2);
  mpfr_set_d(want, v, MPFR_RNDN);
  mpfr_mul_ui(want, want, n, MPFR_RNDN);  // exact: 53 + 32 bits
  acc.exact_value(got);
  EXPECT_TRUE(mpfr_equal_p(want, got));
  EXPECT_EQ(acc.terms(), n);
}

// The exponent ranges come from the data only: there is no overload that takes them, and
// a long bins sum leaves nothing behind for the next one.
TEST(ExactDotBoundaries, RangesComeFromTheData) {
  static_assert(!takes_raw_ranges<ExactAccumulator>);
  std::vector<float> x(100000, 1e5f), y(100000, 1.0f);
  x[7] = 0x1p-100f, y[7] = 0x1p-100f;
  x[8] = -0x1p-100f, y[8] = 0x1p-100f;
  ExactAccumulator acc;
  const Operand ox(x), oy(y);  // 216 binades of spread: the bins
  for (int round = 0; round < 2; ++round) {
    acc.clear();
    acc.add_products(ox, oy);
    Mpfr got(2);
    acc.exact_value(got);
    EXPECT_EQ(mpfr_cmp_d(got, 1e5 * 99998), 0) << "round " << round;
  }
}

// Pinning a path is safe on any CPU, and the path a sum took is visible.
TEST(ExactDotBoundaries, PathsArePinnedAndObservable) {
  EXPECT_EQ(usable_simd(Simd::Avx512), best_simd());
  EXPECT_EQ(usable_simd(Simd::Scalar), Simd::Scalar);
  const std::vector<float> x(20, 1.5f), y(20, -3.0f);
  for (Simd simd : kPaths) {
    ExactAccumulator acc(simd);
    EXPECT_EQ(acc.simd(), usable_simd(simd));
    acc.add_products(x, y);
    acc.add(1.0);
    ExactAccumulator::PathTerms want = expected_paths(acc.simd(), x, y);
    want.single += 1;
    EXPECT_EQ(acc.path_terms(), want);
    EXPECT_EQ(acc.value().to_double(), -89.0);
    acc.clear();
    EXPECT_EQ(acc.path_terms(), ExactAccumulator::PathTerms{});
  }
  // 157 binades of spread: the bins even with SIMD.
  std::vector<float> wide(16, 1.0f), ones(16, 1.0f);
  wide[0] = 0x1p100f, wide[1] = 0x1p-57f;
  ExactAccumulator acc;
  acc.add_products(wide, ones);
  EXPECT_EQ(acc.path_terms().bins, 16u);
  wide[1] = 0x1p-56f;  // 156: slices where the CPU has SIMD
  acc.clear();
  acc.add_products(wide, ones);
  EXPECT_EQ(acc.path_terms().slices, best_simd() == Simd::Scalar ? 0u : 16u);
}

// Prepared operands take the integer path where the CPU has IFMA and each operand's values
// lie within 52 bits; otherwise the slices (or bins) as spans would.
TEST(ExactDotBoundaries, PreparedOperandsTakeTheIntegerPath) {
  std::vector<float> x(21, 1.5f), y(21, -3.0f);
  x[3] = 0x1p-28f;  // 1.5 .. 2^-28: 1.5 is 3 * 2^50 units of 2^-51 (2^-28's last bit): 52 bits
  y[5] = -0.0f;
  const bool ifma = best_simd() == Simd::Avx512 && has_ifma();
  {
    const Operand ox(x), oy(y);
    EXPECT_EQ(ox.integers().empty(), !ifma);
    ExactAccumulator acc;
    acc.add_products(ox, oy);
    EXPECT_EQ(acc.path_terms().integers, ifma ? 21u : 0u);
    EXPECT_EQ(acc.terms(), 21u);
    EXPECT_EQ(acc.value().to_double(), -4.5 * 19 - 3.0 * 0x1p-28);
    EXPECT_EQ(acc.magnitude().to_double(), 4.5 * 19 + 3.0 * 0x1p-28);
  }
  x[3] = 0x1p-29f;  // 53 bits: not prepared
  EXPECT_TRUE(Operand(x).integers().empty());
  EXPECT_TRUE(Operand(y, Simd::Avx2).integers().empty());
  EXPECT_TRUE(Operand(y, Simd::Avx512, Operand::Prepare::Range).integers().empty());
  // Only zero products: their sign bits give the zero's sign, as on the other paths.
  std::vector<float> z(9, -0.0f), one(9, 1.0f);
  z[8] = 2.0f, one[8] = -0.0f;  // every product -0, neither operand all zeros
  for (Simd simd : kPaths) {
    ExactAccumulator acc(simd);
    acc.add_products(Operand(z, simd), Operand(one, simd));
    EXPECT_EQ(acc.value(), RefValue::zero(true)) << static_cast<int>(simd);
    z[0] = 0.0f;  // now one +0 among them: +0, -0 rounding down
    acc.clear();
    acc.add_products(Operand(z, simd), Operand(one, simd));
    RefValue want = RefValue::zero(false);
    want.negative_down = true;
    EXPECT_EQ(acc.value(), want) << static_cast<int>(simd);
    z[0] = -0.0f;
  }
}
