#include "references/exact_dot.hpp"

#include "references/fp_env.hpp"

#include <gmp.h>
#include <immintrin.h>

// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* helpers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <stdexcept>

namespace ulpgate {
namespace {

using u128 = unsigned __int128;
using i128 = __int128;

constexpr std::uint64_t kFractionMask = (std::uint64_t{1} << 52) - 1;
constexpr std::uint64_t kImplicitBit = std::uint64_t{1} << 52;
constexpr int kSpecialField = 2047;  // FP64 exponent field of Inf and NaN
constexpr int kSignBin = 2048;       // bin of the same exponent with the sign set

// floor(log2 v) of a nonzero finite FP32 magnitude given as its bits.
int float_ilogb(std::uint32_t bits) {
  if (bits >= 0x00800000u) return static_cast<int>(bits >> 23) - 127;
  return 31 - std::countl_zero(bits) - 149;
}

// One product into one table: the 48 significant bits of an FP32 x FP32 product sit in the
// top of FP64's 53-bit significand, so dropping the low 5 (zero) bits leaves room for 2^15
// adds per bin.
inline void bin_product(std::uint64_t* table, float a, float b) {
  const auto bits = std::bit_cast<std::uint64_t>(static_cast<double>(a) * static_cast<double>(b));
  table[bits >> 52] += ((bits & kFractionMask) | kImplicitBit) >> 5;
}

constexpr int kMaxLevels = 4;
// Per lane 256 slices of at most 2^51: lane sums, their sum over 4 lanes, and twice that
// (the magnitude) stay below 2^63.
constexpr std::size_t kBlock = 1024;

struct LevelSums {
  std::int64_t value[kMaxLevels] = {};
  std::int64_t magnitude[kMaxLevels] = {};
  bool all_negative = true;  // every product had its sign bit set
  bool any_negative = false;  // some product had its sign bit set
};

__attribute__((target("avx2"))) std::int64_t lane_sum(__m256i v) {
  alignas(32) std::int64_t l[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  return l[0] + l[1] + l[2] + l[3];
}

// The products of one block (n a multiple of 4, <= kBlock), split at 2^L_0 > 2^L_1 > ...
// (magic[j] = 1.5 * 2^(52 + L_j), |p| < 2^(51 + L_0)) into integer slices summed per level,
// all levels in one pass so the remainders never leave registers.
// |p| = sign(p) p and rounding to nearest is symmetric, so the magnitude's slices are the
// value's times the sign: sum |slices| = 2 (sum over p >= 0) - (sum over all).
template <int Levels>
__attribute__((target("avx2"))) void level_sums_avx2(const float* x, const float* y,
                                                     std::size_t n, const double* magic,
                                                     LevelSums& out) {
  const __m256i zero = _mm256_setzero_si256();
  __m256d c[Levels];
  __m256i ci[Levels], value[Levels], positive[Levels];
  for (int j = 0; j < Levels; ++j) {
    c[j] = _mm256_set1_pd(magic[j]);
    ci[j] = _mm256_castpd_si256(c[j]);
    value[j] = positive[j] = zero;
  }
  __m256i signs_and = _mm256_set1_epi64x(-1), signs_or = zero;
  for (std::size_t i = 0; i < n; i += 4) {
    const __m256d p = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)),
                                    _mm256_cvtps_pd(_mm_loadu_ps(y + i)));
    const __m256i pb = _mm256_castpd_si256(p);
    signs_and = _mm256_and_si256(signs_and, pb);
    signs_or = _mm256_or_si256(signs_or, pb);
    const __m256i negative = _mm256_cmpgt_epi64(zero, pb);  // the sign bit, as a lane mask
    __m256d r = p;
    for (int j = 0; j < Levels; ++j) {
      const __m256d t = _mm256_add_pd(r, c[j]);
      const __m256i q = _mm256_sub_epi64(_mm256_castpd_si256(t), ci[j]);  // round(r / 2^L_j)
      value[j] = _mm256_add_epi64(value[j], q);
      positive[j] = _mm256_add_epi64(positive[j], _mm256_andnot_si256(negative, q));
      if (j + 1 < Levels) r = _mm256_sub_pd(r, _mm256_sub_pd(t, c[j]));  // exact remainder
    }
  }
  for (int j = 0; j < Levels; ++j) {
    out.value[j] = lane_sum(value[j]);
    out.magnitude[j] = 2 * lane_sum(positive[j]) - out.value[j];
  }
  alignas(32) std::uint64_t l[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), signs_and);
  out.all_negative = ((l[0] & l[1] & l[2] & l[3]) >> 63) != 0;
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), signs_or);
  out.any_negative = ((l[0] | l[1] | l[2] | l[3]) >> 63) != 0;
}

// The same with eight lanes; mask registers make the sign handling one masked add.
// n a multiple of 8.
template <int Levels>
__attribute__((target("avx512f"))) void level_sums_avx512(const float* x, const float* y,
                                                         std::size_t n, const double* magic,
                                                         LevelSums& out) {
  const __m512i zero = _mm512_setzero_si512();
  __m512d c[Levels];
  __m512i ci[Levels], value[Levels], positive[Levels];
  for (int j = 0; j < Levels; ++j) {
    c[j] = _mm512_set1_pd(magic[j]);
    ci[j] = _mm512_castpd_si512(c[j]);
    value[j] = positive[j] = zero;
  }
  __mmask8 all_negative = 0xFF, any_negative = 0;
  for (std::size_t i = 0; i < n; i += 8) {
    const __m512d p = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i)),
                                    _mm512_cvtps_pd(_mm256_loadu_ps(y + i)));
    const __mmask8 negative = _mm512_cmplt_epi64_mask(_mm512_castpd_si512(p), zero);
    all_negative &= negative;
    any_negative |= negative;
    __m512d r = p;
    for (int j = 0; j < Levels; ++j) {
      const __m512d t = _mm512_add_pd(r, c[j]);
      const __m512i q = _mm512_sub_epi64(_mm512_castpd_si512(t), ci[j]);
      value[j] = _mm512_add_epi64(value[j], q);
      positive[j] = _mm512_mask_add_epi64(positive[j], static_cast<__mmask8>(~negative),
                                          positive[j], q);
      if (j + 1 < Levels) r = _mm512_sub_pd(r, _mm512_sub_pd(t, c[j]));
    }
  }
  for (int j = 0; j < Levels; ++j) {
    out.value[j] = _mm512_reduce_add_epi64(value[j]);
    out.magnitude[j] = 2 * _mm512_reduce_add_epi64(positive[j]) - out.value[j];
  }
  out.all_negative = all_negative == 0xFF;
  out.any_negative = any_negative != 0;
}

// n a multiple of 8 (AVX-512) or 4 (AVX2).
void level_sums(Simd simd, const float* x, const float* y, std::size_t n, int levels,
                const double* magic, LevelSums& out) {
  if (simd == Simd::Avx512) {
    switch (levels) {
      case 1: level_sums_avx512<1>(x, y, n, magic, out); return;
      case 2: level_sums_avx512<2>(x, y, n, magic, out); return;
      case 3: level_sums_avx512<3>(x, y, n, magic, out); return;
      default: level_sums_avx512<4>(x, y, n, magic, out); return;
    }
  }
  switch (levels) {
    case 1: level_sums_avx2<1>(x, y, n, magic, out); return;
    case 2: level_sums_avx2<2>(x, y, n, magic, out); return;
    case 3: level_sums_avx2<3>(x, y, n, magic, out); return;
    default: level_sums_avx2<4>(x, y, n, magic, out); return;
  }
}

__attribute__((target("avx512f"))) void bit_range_avx512(const float* v, std::size_t n,
                                                        std::uint32_t& max_bits,
                                                        std::uint32_t& min_bits_minus_one) {
  const __m512i mask = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
  __m512i hi0 = _mm512_setzero_si512(), lo0 = _mm512_set1_epi32(-1), hi1 = hi0, lo1 = lo0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {  // two chains each, so the loop is not latency-bound
    const __m512i a = _mm512_and_si512(_mm512_loadu_si512(v + i), mask);
    const __m512i b = _mm512_and_si512(_mm512_loadu_si512(v + i + 16), mask);
    hi0 = _mm512_max_epu32(hi0, a);
    hi1 = _mm512_max_epu32(hi1, b);
    lo0 = _mm512_min_epu32(lo0, _mm512_sub_epi32(a, one));
    lo1 = _mm512_min_epu32(lo1, _mm512_sub_epi32(b, one));
  }
  max_bits = std::max(max_bits, _mm512_reduce_max_epu32(_mm512_max_epu32(hi0, hi1)));
  min_bits_minus_one =
      std::min(min_bits_minus_one, _mm512_reduce_min_epu32(_mm512_min_epu32(lo0, lo1)));
  for (; i < n; ++i) {
    const std::uint32_t m = std::bit_cast<std::uint32_t>(v[i]) & 0x7FFFFFFFu;
    max_bits = std::max(max_bits, m);
    min_bits_minus_one = std::min(min_bits_minus_one, m - 1);
  }
}

__attribute__((target("avx2"))) void bit_range_avx2(const float* v, std::size_t n,
                                                    std::uint32_t& max_bits,
                                                    std::uint32_t& min_bits_minus_one) {
  const __m256i mask = _mm256_set1_epi32(0x7FFFFFFF), one = _mm256_set1_epi32(1);
  __m256i hi = _mm256_setzero_si256(), lo = _mm256_set1_epi32(-1);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i m = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)), mask);
    hi = _mm256_max_epu32(hi, m);
    lo = _mm256_min_epu32(lo, _mm256_sub_epi32(m, one));
  }
  alignas(32) std::uint32_t h[8], l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(h), hi);
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), lo);
  for (int k = 0; k < 8; ++k) {
    max_bits = std::max(max_bits, h[k]);
    min_bits_minus_one = std::min(min_bits_minus_one, l[k]);
  }
  for (; i < n; ++i) {
    const std::uint32_t m = std::bit_cast<std::uint32_t>(v[i]) & 0x7FFFFFFFu;
    max_bits = std::max(max_bits, m);
    min_bits_minus_one = std::min(min_bits_minus_one, m - 1);
  }
}


// The integer path's sums over `groups` groups of 8 prepared values (see Operand): per lane
// the low and high 52-bit halves of every product, and of the negative ones again apart.
// Each lane add is below 2^52 and each register takes at most 2048 of them per call.
struct IntegerSums {
  unsigned __int128 all = 0, negative = 0;  // sums of the products' magnitudes
};
constexpr std::size_t kIntegerGroups = 4096;

// The sum of each register's eight 64-bit lanes, exactly (up to 67 bits).
__attribute__((target("avx512f"))) void lane_sums(const __m512i (&v)[4], unsigned __int128 (&out)[4]) {
  alignas(64) std::uint64_t l[4][8];
  for (int r = 0; r < 4; ++r) _mm512_store_si512(l[r], v[r]);
  for (int r = 0; r < 4; ++r) {
    unsigned __int128 t = 0;
    for (int i = 0; i < 8; ++i) t += l[r][i];
    out[r] = t;
  }
}

// One group: all products' halves into al/ah, the negative ones' into nl/nh.
__attribute__((target("avx512f,avx512ifma"))) inline void integer_step(const std::uint64_t* x, const std::uint8_t* xs,
                                                                     const std::uint64_t* y, const std::uint8_t* ys,
                                                                     std::size_t g, __m512i& al, __m512i& ah,
                                                                     __m512i& nl, __m512i& nh) {
  const __m512i a = _mm512_loadu_si512(x + 8 * g), b = _mm512_loadu_si512(y + 8 * g);
  const auto neg = static_cast<__mmask8>(xs[g] ^ ys[g]);  // the products' sign bits
  al = _mm512_madd52lo_epu64(al, a, b);
  ah = _mm512_madd52hi_epu64(ah, a, b);
  nl = _mm512_mask_madd52lo_epu64(nl, neg, a, b);
  nh = _mm512_mask_madd52hi_epu64(nh, neg, a, b);
}

__attribute__((target("avx512f,avx512ifma"))) IntegerSums integer_sums(const std::uint64_t* x, const std::uint8_t* xs,
                                                                    const std::uint64_t* y, const std::uint8_t* ys,
                                                                    std::size_t groups) {
  // Two groups per step into separate registers (IFMA's latency would otherwise bound each
  // register's chain); the sums over all products need no mask, the negative ones one.
  __m512i al[2], ah[2], nl[2], nh[2];
  for (int u = 0; u < 2; ++u) al[u] = ah[u] = nl[u] = nh[u] = _mm512_setzero_si512();
  std::size_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    integer_step(x, xs, y, ys, g, al[0], ah[0], nl[0], nh[0]);
    integer_step(x, xs, y, ys, g + 1, al[1], ah[1], nl[1], nh[1]);
  }
  if (g < groups) integer_step(x, xs, y, ys, g, al[0], ah[0], nl[0], nh[0]);
  // The two registers' lanes add without overflow (each below 2048 * 2^52); the sum is
  // (high halves) 2^52 + (low halves), below 2^104 * 2^15 = 2^119.
  const __m512i v[4] = {_mm512_add_epi64(al[0], al[1]), _mm512_add_epi64(ah[0], ah[1]),
                        _mm512_add_epi64(nl[0], nl[1]), _mm512_add_epi64(nh[0], nh[1])};
  unsigned __int128 t[4];
  lane_sums(v, t);
  IntegerSums s;
  s.all = (t[1] << 52) + t[0];
  s.negative = (t[3] << 52) + t[2];
  return s;
}

}  // namespace

Simd best_simd() {
  static const Simd best = __builtin_cpu_supports("avx512f") ? Simd::Avx512
                           : __builtin_cpu_supports("avx2")  ? Simd::Avx2
                                                             : Simd::Scalar;
  return best;
}

Simd usable_simd(Simd requested) { return std::min(requested, best_simd()); }

bool has_ifma() {
  static const bool ifma = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512ifma");
  return ifma;
}

Operand::Operand(std::span<const float> v, Simd simd, Prepare prepare)
    : values_(v), range_(exponent_range(v, simd)) {
  if (prepare != Prepare::Integers || usable_simd(simd) != Simd::Avx512 || !has_ifma() || range_.special ||
      range_.empty())
    return;
  // Every nonzero value is a multiple of 2^(lo - 23) (24-bit significands), and of 2^-149;
  // it is below 2^(hi + 1).
  const int unit = std::max(range_.lo - 23, -149);
  if (range_.hi + 1 - unit > 52) return;
  unit_ = unit;
  const std::size_t padded = (v.size() + 7) / 8 * 8;
  integers_.assign(padded, 0);
  signs_.assign(padded / 8, 0);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(v[i]);
    const std::uint32_t field = (bits >> 23) & 0xFF, fraction = bits & 0x7FFFFF;
    // |v| = m 2^(max(field, 1) - 150): m has the implicit bit when normal
    const std::uint64_t m = field == 0 ? fraction : (fraction | 0x800000u);
    if (m != 0) integers_[i] = m << (std::max<int>(static_cast<int>(field), 1) - 150 - unit);
    signs_[i / 8] = static_cast<std::uint8_t>(signs_[i / 8] | ((bits >> 31) << (i % 8)));
  }
}

ExponentRange exponent_range(std::span<const float> v, Simd simd) {
  std::uint32_t max_bits = 0, min_bits_minus_one = 0xFFFFFFFFu;
  simd = usable_simd(simd);
  if (simd == Simd::Avx512) {
    bit_range_avx512(v.data(), v.size(), max_bits, min_bits_minus_one);
  } else if (simd == Simd::Avx2) {
    bit_range_avx2(v.data(), v.size(), max_bits, min_bits_minus_one);
  } else {
    for (float f : v) {
      const std::uint32_t m = std::bit_cast<std::uint32_t>(f) & 0x7FFFFFFFu;
      max_bits = std::max(max_bits, m);
      min_bits_minus_one = std::min(min_bits_minus_one, m - 1);  // zero wraps to the top
    }
  }
  ExponentRange r;
  r.special = max_bits >= 0x7F800000u;
  const std::uint32_t min_bits = min_bits_minus_one + 1;
  if (min_bits_minus_one == 0xFFFFFFFFu || min_bits >= 0x7F800000u) return r;  // no finite nonzero
  r.lo = float_ilogb(min_bits);
  r.hi = r.special ? 127 : float_ilogb(max_bits);
  return r;
}

ExactAccumulator::ExactAccumulator(Simd simd)
    : bins_(static_cast<std::size_t>(kTables) * kBins, 0), simd_(usable_simd(simd)) {}

void ExactAccumulator::clear() {
  single_ = false;
  for (int d = digit_lo_; d <= digit_hi_; ++d) value_[d] = magnitude_[d] = 0;
  digit_lo_ = kDigits;
  digit_hi_ = -1;
  unnormalized_adds_ = 0;
  paths_ = {};
  terms_ = negative_zero_terms_ = 0;
  any_sign_bit_ = nan_ = pos_inf_ = neg_inf_ = false;
}

void ExactAccumulator::add_products(std::span<const float> x, std::span<const float> y) {
  add_products_checked(x, y, exponent_range(x, simd_), exponent_range(y, simd_));
}

void ExactAccumulator::add_products(const Operand& x, const Operand& y) {
  if (simd_ == Simd::Avx512 && !x.integers().empty() && !y.integers().empty()) {
    if (x.values().size() != y.values().size()) throw std::invalid_argument("add_products: x and y differ in length");
    add_integers(x, y);
    return;
  }
  add_products_checked(x.values(), y.values(), x.range(), y.range());
}

// No floating-point arithmetic: the caller's environment cannot touch it.
void ExactAccumulator::add_integers(const Operand& x, const Operand& y) {
  const std::size_t n = x.values().size(), groups = x.integers().size() / 8;
  const int position = x.unit() + y.unit() + kBias;  // the products count units of 2^(ux + uy)
  for (std::size_t g = 0; g < groups; g += kIntegerGroups) {
    const std::size_t m = std::min(kIntegerGroups, groups - g);
    const IntegerSums s = integer_sums(x.integers().data() + 8 * g, x.signs().data() + g,
                                       y.integers().data() + 8 * g, y.signs().data() + g, m);
    const std::size_t terms = std::min(n, 8 * (g + m)) - 8 * g;  // the padding adds zeros
    terms_ += terms;
    paths_.integers += terms;
    const i128 value = static_cast<i128>(s.all) - 2 * static_cast<i128>(s.negative);
    if (terms_ == terms && digit_hi_ < 0 && !single_) {  // the first terms since clear()
      single_ = true;
      single_value_ = value, single_magnitude_ = s.all, single_position_ = position;
    } else {
      flush_single();
      add_wide(value, s.all, position);
    }
    if (s.all == 0) {
      // Every product is zero: their sign bits decide the sign of a zero sum. (Once a
      // product is nonzero the magnitude is, and the zero rules no longer apply.)
      std::uint64_t negatives = 0;
      for (std::size_t i = 8 * g; i < 8 * g + terms; ++i)
        negatives += ((x.signs()[i / 8] ^ y.signs()[i / 8]) >> (i % 8)) & 1u;
      negative_zero_terms_ += negatives;
      any_sign_bit_ |= negatives != 0;
    }
  }
}

// xr and yr are the exponent ranges of x and y themselves (or wider): only exponent_range
// and Operand make them.
void ExactAccumulator::add_products_checked(std::span<const float> x, std::span<const float> y,
                                            const ExponentRange& xr, const ExponentRange& yr) {
  if (x.size() != y.size()) throw std::invalid_argument("add_products: x and y differ in length");
  const ReferenceFpEnv env;
  int e_lo = 1, e_hi = 0;  // FP64 exponent fields the products can have
  if (!xr.empty() && !yr.empty()) {
    e_lo = std::max(1, xr.lo + yr.lo + 1023);
    e_hi = std::min(2046, xr.hi + yr.hi + 1 + 1023);
  }
  const bool special = xr.special || yr.special;
  const std::size_t lanes = simd_ == Simd::Avx512 ? 8 : 4;
  if (simd_ != Simd::Scalar && !special && x.size() >= lanes) {
    // Every product is a multiple of 2^(xr.lo + yr.lo - 46) (24-bit significands) and
    // below 2^(xr.hi + yr.hi + 2): slices at 2^(top - 51 j) cover that in `levels` steps.
    const int top = xr.empty() || yr.empty() ? 0 : xr.hi + yr.hi + 2;
    const int span = xr.empty() || yr.empty() ? 0 : top - (xr.lo + yr.lo - 46);
    const int levels = std::max(1, (span - 51 + 50) / 51 + 1);
    if (levels <= kMaxLevels) {
      const std::size_t body = x.size() / lanes * lanes;
      add_levels(x.data(), y.data(), body, levels, top);
      for (std::size_t i = body; i < x.size(); ++i) {  // exact: an FP32 product fits FP64
        add(static_cast<double>(x[i]) * static_cast<double>(y[i]));
      }
      return;
    }
  }
  for (std::size_t i = 0; i < x.size(); i += kChunk) {
    const std::size_t n = std::min(kChunk, x.size() - i);
    add_chunk(x.data() + i, y.data() + i, n, e_lo, e_hi, special);
  }
}

void ExactAccumulator::add_chunk(const float* x, const float* y, std::size_t n, int e_lo,
                                 int e_hi, bool special) {
  std::uint64_t* t0 = bins_.data();
  std::uint64_t* t1 = t0 + kBins;
  std::uint64_t* t2 = t1 + kBins;
  std::uint64_t* t3 = t2 + kBins;
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    bin_product(t0, x[i], y[i]);
    bin_product(t1, x[i + 1], y[i + 1]);
    bin_product(t2, x[i + 2], y[i + 2]);
    bin_product(t3, x[i + 3], y[i + 3]);
  }
  for (; i < n; ++i) bin_product(t0, x[i], y[i]);
  terms_ += n;
  paths_.bins += n;

  // Zero products land in the bins of exponent field 0 (no FP32 product is an FP64
  // subnormal), each adding 2^47: that counts the -0 ones for the sign of a zero sum.
  bool any_special = false;
  for (int t = 0; t < kTables; ++t) {
    std::uint64_t* table = bins_.data() + static_cast<std::size_t>(t) * kBins;
    const std::uint64_t negative_zeros = table[kSignBin] >> 47;  // the bin counts only -0 terms
    negative_zero_terms_ += negative_zeros;
    any_sign_bit_ |= negative_zeros != 0;
    table[0] = table[kSignBin] = 0;
    if (special) {
      any_special |= (table[kSpecialField] | table[kSignBin + kSpecialField]) != 0;
      table[kSpecialField] = table[kSignBin + kSpecialField] = 0;
    }
  }
  if (any_special) note_specials(x, y, n);
  fold_bins(e_lo, e_hi);
}

void ExactAccumulator::add_levels(const float* x, const float* y, std::size_t n, int levels,
                                  int top) {
  double magic[kMaxLevels];
  int position[kMaxLevels];
  for (int j = 0; j < levels; ++j) {
    const int l = top - 51 - 51 * j;  // slice j counts units of 2^l; |p| < 2^(l + 51)
    // 1.5 * 2^(52 + l), built from its bits (ldexp costs more than the whole loop at K=256)
    magic[j] = std::bit_cast<double>((static_cast<std::uint64_t>(1023 + 52 + l) << 52) |
                                     (std::uint64_t{1} << 51));
    position[j] = l + kBias;
  }
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t m = std::min(kBlock, n - i);
    LevelSums sums;
    level_sums(simd_, x + i, y + i, m, levels, magic, sums);
    for (int j = 0; j < levels; ++j) add_integer(sums.value[j], sums.magnitude[j], position[j]);
    terms_ += m;
    paths_.slices += m;
    if (sums.all_negative) negative_zero_terms_ += m;
    any_sign_bit_ |= sums.any_negative;
  }
}

void ExactAccumulator::note_specials(const float* x, const float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double p = static_cast<double>(x[i]) * static_cast<double>(y[i]);
    if (std::isnan(p)) nan_ = true;
    else if (std::isinf(p)) (p > 0 ? pos_inf_ : neg_inf_) = true;
  }
}

void ExactAccumulator::fold_bins(int e_lo, int e_hi) {
  std::uint64_t* t0 = bins_.data();
  for (int e = e_lo; e <= e_hi; ++e) {
    std::uint64_t pos = 0, neg = 0;
    for (int t = 0; t < kTables; ++t) {
      std::uint64_t* table = t0 + static_cast<std::size_t>(t) * kBins;
      pos += table[e];
      neg += table[kSignBin + e];
      table[e] = table[kSignBin + e] = 0;
    }
    if ((pos | neg) == 0) continue;
    // pos + neg < 2^15 * 2^48: both fit a signed 64-bit integer, and so does pos - neg.
    // Bin e counts units of 2^(e - 1075 + 5) = 2^(position - kBias) with position e + 10.
    add_integer(static_cast<std::int64_t>(pos - neg), static_cast<std::int64_t>(pos + neg), e + 10);
  }
}

void ExactAccumulator::flush_single() {
  if (!single_) return;
  single_ = false;
  add_wide(single_value_, single_magnitude_, single_position_);
}

void ExactAccumulator::add_integer(std::int64_t v, std::int64_t mag, int position) {
  flush_single();
  const int d = position >> 5, s = position & 31;
  const i128 w = static_cast<i128>(v) << s;
  value_[d] += static_cast<std::uint32_t>(w);
  value_[d + 1] += static_cast<std::uint32_t>(w >> 32);
  value_[d + 2] += static_cast<std::int64_t>(w >> 64);
  const i128 m = static_cast<i128>(mag) << s;
  magnitude_[d] += static_cast<std::uint32_t>(m);
  magnitude_[d + 1] += static_cast<std::uint32_t>(m >> 32);
  magnitude_[d + 2] += static_cast<std::int64_t>(m >> 64);
  digit_lo_ = std::min(digit_lo_, d);
  digit_hi_ = std::max(digit_hi_, d + 2);
  if (++unnormalized_adds_ == kNormalizeEvery) normalize();
}

// v and mag below 2^124 in magnitude: two add_integer calls of at most 62 bits each.
void ExactAccumulator::add_wide(i128 v, u128 mag, int position) {
  constexpr std::int64_t kLow = (std::int64_t{1} << 62) - 1;
  const auto v_low = static_cast<std::int64_t>(v & kLow), m_low = static_cast<std::int64_t>(mag & kLow);
  const auto v_high = static_cast<std::int64_t>(v >> 62), m_high = static_cast<std::int64_t>(mag >> 62);
  add_integer(v_low, m_low, position);
  if (v_high != 0 || m_high != 0) add_integer(v_high, m_high, position + 62);
}

void ExactAccumulator::normalize() {
  // Below the top digit each digit keeps its low 32 bits and passes the rest up; the top
  // one (signed) absorbs what is left once that fits 32 bits. The number is unchanged.
  int hi = digit_hi_;
  for (auto* digits : {&value_, &magnitude_}) {
    std::int64_t carry = 0;
    for (int d = digit_lo_; d < kDigits; ++d) {
      carry += (*digits)[d];  // zero above digit_hi_
      if ((d >= digit_hi_ && carry >= INT32_MIN && carry <= INT32_MAX) || d == kDigits - 1) {
        (*digits)[d] = carry;
        hi = std::max(hi, d);
        break;
      }
      (*digits)[d] = carry & 0xFFFFFFFF;
      carry >>= 32;  // arithmetic
    }
  }
  digit_hi_ = hi;
  unnormalized_adds_ = 0;
}

void ExactAccumulator::add(double v) {
  // Decoded from the bits, with no floating-point operation: FTZ/DAZ cannot touch it.
  const auto bits = std::bit_cast<std::uint64_t>(v);
  const bool negative = (bits >> 63) != 0;
  const int field = static_cast<int>(bits >> 52) & 0x7FF;
  const std::uint64_t fraction = bits & kFractionMask;
  ++terms_;
  ++paths_.single;
  any_sign_bit_ |= negative;
  if (field == kSpecialField) {
    if (fraction != 0) nan_ = true;
    else (negative ? neg_inf_ : pos_inf_) = true;
    return;
  }
  if (field == 0 && fraction == 0) {
    if (negative) ++negative_zero_terms_;
    return;
  }
  // |v| = m 2^(q - kBias) with m < 2^53: subnormals have field 0 and no implicit bit.
  const auto m = static_cast<std::int64_t>(field == 0 ? fraction : fraction | kImplicitBit);
  const int q = (field == 0 ? 1 : field) - 1075;
  add_integer(negative ? -m : m, m, q + kBias);
}

int ExactAccumulator::magnitude_digits(const std::array<std::int64_t, kDigits>& in,
                                       std::array<std::uint32_t, kDigits>& out,
                                       bool& negative) const {
  // Carry propagation turns the carry-save digits into a two's complement number; it
  // settles within a couple of digits above the highest touched one.
  std::int64_t carry = 0;
  int d = digit_lo_;
  for (; d < kDigits; ++d) {
    carry += d <= digit_hi_ ? in[d] : 0;
    out[d] = static_cast<std::uint32_t>(carry);
    carry >>= 32;  // arithmetic
    if (d >= digit_hi_ && (carry == 0 || carry == -1)) break;
  }
  negative = carry == -1;
  int top = std::min(d, kDigits - 1);
  if (negative) {  // two's complement negation over [digit_lo_, top]; above it, ~1s = 0
    std::uint64_t c = 1;
    for (int i = digit_lo_; i <= top; ++i) {
      const std::uint64_t t = static_cast<std::uint64_t>(static_cast<std::uint32_t>(~out[i])) + c;
      out[i] = static_cast<std::uint32_t>(t);
      c = t >> 32;
    }
    // A carry out of the window: every digit was zero, the number is -2^(32 (top + 1)),
    // and its magnitude needs the digit above (the sums' range leaves room for it).
    if (c != 0) out[++top] = 1;
  }
  int hi = top;
  while (hi >= digit_lo_ && out[hi] == 0) --hi;
  return hi;
}

RefValue ExactAccumulator::summarise(const std::array<std::int64_t, kDigits>& digits,
                                     bool magnitude) const {
  if (nan_ || (!magnitude && pos_inf_ && neg_inf_)) return RefValue::nan();
  if (pos_inf_ || neg_inf_) return RefValue::infinity(!magnitude && neg_inf_);
  std::array<std::uint32_t, kDigits> w;
  bool negative = false;
  const int top = digit_lo_ < kDigits ? magnitude_digits(digits, w, negative) : -1;
  if (top < digit_lo_ || top < 0) {
    if (magnitude) return RefValue::zero(false);
    // The magnitude is zero when every term is: magnitudes only add nonnegative amounts.
    bool all_zero = true;
    for (int d = digit_lo_; d <= digit_hi_ && all_zero; ++d) all_zero = magnitude_[d] == 0;
    return zero_sum(all_zero);
  }
  auto digit = [&](int i) -> std::uint64_t { return i >= digit_lo_ ? w[i] : 0; };
  std::uint64_t a = digit(top) << 32 | digit(top - 1);
  std::uint64_t b = digit(top - 2) << 32 | digit(top - 3);
  std::uint64_t c = digit(top - 4) << 32 | digit(top - 5);
  const int lz = std::countl_zero(w[top]);
  if (lz > 0) {
    a = a << lz | b >> (64 - lz);
    b = b << lz | c >> (64 - lz);
    c <<= lz;
  }
  bool sticky = c != 0;
  for (int i = top - 6; i >= digit_lo_ && !sticky; --i) sticky = w[i] != 0;
  RefValue v;
  v.kind = RefValue::Kind::Finite;
  v.negative = negative;
  v.inexact = sticky;
  v.exponent = 32 * top + 31 - lz - kBias;
  v.sig_hi = a;
  v.sig_lo = b;
  return v;
}

// An exact zero sum: IEEE 754 gives -0 when every term is -0, +0 when every term is +0, and
// otherwise +0, or -0 when rounding down.
RefValue ExactAccumulator::zero_sum(bool magnitude_zero) const {
  if (magnitude_zero && terms_ > 0 && negative_zero_terms_ == terms_) return RefValue::zero(true);
  RefValue z = RefValue::zero(false);
  z.negative_down = !magnitude_zero || any_sign_bit_;
  return z;
}

namespace {
// m 2^(position - kBias) with m < 2^124 nonzero: exact in the 128-bit window.
RefValue from_integer(unsigned __int128 m, bool negative, int position) {
  const int lz = m >> 64 ? std::countl_zero(static_cast<std::uint64_t>(m >> 64))
                         : 64 + std::countl_zero(static_cast<std::uint64_t>(m));
  const unsigned __int128 sig = m << lz;
  RefValue v;
  v.kind = RefValue::Kind::Finite;
  v.negative = negative;
  v.exponent = 127 - lz + position - ExactAccumulator::kBias;
  v.sig_hi = static_cast<std::uint64_t>(sig >> 64);
  v.sig_lo = static_cast<std::uint64_t>(sig);
  return v;
}
}  // namespace

RefValue ExactAccumulator::value() const {
  if (single_ && !nan_ && !pos_inf_ && !neg_inf_) {
    if (single_value_ == 0) return zero_sum(single_magnitude_ == 0);
    const bool negative = single_value_ < 0;
    return from_integer(static_cast<u128>(negative ? -single_value_ : single_value_), negative, single_position_);
  }
  return summarise(value_, false);
}

RefValue ExactAccumulator::magnitude() const {
  if (single_ && !nan_ && !pos_inf_ && !neg_inf_)
    return single_magnitude_ == 0 ? RefValue::zero(false) : from_integer(single_magnitude_, false, single_position_);
  return summarise(magnitude_, true);
}

namespace {
// out = (-1)^negative * (the little-endian words as an integer) * 2^exponent, exactly.
template <class Word>
void set_exact(mpfr_ptr out, const Word* words, std::size_t count, long exponent, bool negative) {
  mpz_t z;
  mpz_init(z);
  mpz_import(z, count, -1, sizeof(Word), 0, 0, words);
  mpfr_set_prec(out, std::max<mpfr_prec_t>(2, static_cast<mpfr_prec_t>(mpz_sizeinbase(z, 2))));
  mpfr_set_z_2exp(out, z, exponent, MPFR_RNDN);  // exact: the precision holds z
  mpz_clear(z);
  if (negative) mpfr_neg(out, out, MPFR_RNDN);
}
}  // namespace

void ExactAccumulator::exact_value(mpfr_ptr out) const {
  const RefValue v = value();
  if (v.kind != RefValue::Kind::Finite) {
    v.to_mpfr(out);
    return;
  }
  if (single_) {  // the lone block's integer, exactly
    const bool negative = single_value_ < 0;
    const u128 m = static_cast<u128>(negative ? -single_value_ : single_value_);
    const std::uint64_t words[2] = {static_cast<std::uint64_t>(m), static_cast<std::uint64_t>(m >> 64)};
    set_exact(out, words, 2, single_position_ - kBias, negative);
    return;
  }
  std::array<std::uint32_t, kDigits> w;
  bool negative = false;
  const int top = magnitude_digits(value_, w, negative);
  int low = digit_lo_;
  while (w[low] == 0) ++low;
  set_exact(out, &w[low], static_cast<std::size_t>(top - low + 1), 32L * low - kBias, negative);
}

// ---- MPFR oracle ----

MpfrOracle::~MpfrOracle() {
  for (auto& t : terms_) mpfr_clear(&t);
}

void MpfrOracle::reserve(std::size_t n, mpfr_prec_t prec) {
  while (terms_.size() < n) {
    terms_.emplace_back();
    mpfr_init2(&terms_.back(), prec);
  }
  pointers_.resize(terms_.size());
  for (std::size_t i = 0; i < terms_.size(); ++i) {
    if (mpfr_get_prec(&terms_[i]) != prec) mpfr_set_prec(&terms_[i], prec);
    pointers_[i] = &terms_[i];
  }
}

void MpfrOracle::dot(mpfr_ptr out, std::span<const float> x, std::span<const float> y,
                     mpfr_rnd_t zero_sign) {
  const ReferenceFpEnv env;  // the products, and mpfr_set_d, see subnormals
  if (x.size() != y.size()) throw std::invalid_argument("oracle dot: x and y differ in length");
  const std::size_t n = x.size();
  reserve(n, 53);
  for (std::size_t i = 0; i < n; ++i)  // an FP32 x FP32 product is exact in FP64
    mpfr_set_d(&terms_[i], static_cast<double>(x[i]) * static_cast<double>(y[i]), MPFR_RNDN);
  // Products lie in [2^-298, 2^256): 620 bits hold any sum of fewer than 2^64 of them.
  mpfr_set_prec(out, 620);
  mpfr_sum(out, pointers_.data(), n, zero_sign);  // exact: the mode only signs a zero
}

void MpfrOracle::dot(mpfr_ptr out, std::span<const double> x, std::span<const double> y,
                     mpfr_rnd_t zero_sign) {
  const ReferenceFpEnv env;  // the products, and mpfr_set_d, see subnormals
  if (x.size() != y.size()) throw std::invalid_argument("oracle dot: x and y differ in length");
  const std::size_t n = x.size();
  reserve(n, 106);
  long hi = LONG_MIN, lo = LONG_MAX;
  for (std::size_t i = 0; i < n; ++i) {
    mpfr_set_d(&terms_[i], x[i], MPFR_RNDN);
    mpfr_mul_d(&terms_[i], &terms_[i], y[i], MPFR_RNDN);  // 53 x 53 bits: exact in 106
    if (mpfr_regular_p(&terms_[i])) {
      hi = std::max<long>(hi, mpfr_get_exp(&terms_[i]));
      lo = std::min<long>(lo, mpfr_get_exp(&terms_[i]) - 106);
    }
  }
  mpfr_set_prec(out, hi == LONG_MIN ? 2 : static_cast<mpfr_prec_t>(hi - lo + 66));
  mpfr_sum(out, pointers_.data(), n, zero_sign);  // exact: the mode only signs a zero
}

}  // namespace ulpgate
