#include "references/exact_dot.hpp"

#include <gmp.h>

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

}  // namespace

ExponentRange exponent_range(std::span<const float> v) {
  std::uint32_t max_bits = 0, min_bits_minus_one = 0xFFFFFFFFu;
  for (float f : v) {
    const std::uint32_t m = std::bit_cast<std::uint32_t>(f) & 0x7FFFFFFFu;
    max_bits = std::max(max_bits, m);
    min_bits_minus_one = std::min(min_bits_minus_one, m - 1);  // zero wraps to the top
  }
  ExponentRange r;
  r.special = max_bits >= 0x7F800000u;
  const std::uint32_t min_bits = min_bits_minus_one + 1;
  if (min_bits_minus_one == 0xFFFFFFFFu || min_bits >= 0x7F800000u) return r;  // no finite nonzero
  r.lo = float_ilogb(min_bits);
  r.hi = r.special ? 127 : float_ilogb(max_bits);
  return r;
}

ExactAccumulator::ExactAccumulator() : bins_(static_cast<std::size_t>(kTables) * kBins, 0) {}

void ExactAccumulator::clear() {
  value_.fill(0);
  magnitude_.fill(0);
  digit_lo_ = kDigits;
  digit_hi_ = -1;
  terms_ = negative_zero_terms_ = 0;
  nan_ = pos_inf_ = neg_inf_ = false;
}

void ExactAccumulator::add_products(std::span<const float> x, std::span<const float> y) {
  add_products(x, y, exponent_range(x), exponent_range(y));
}

void ExactAccumulator::add_products(std::span<const float> x, std::span<const float> y,
                                   ExponentRange xr, ExponentRange yr) {
  if (x.size() != y.size()) throw std::invalid_argument("add_products: x and y differ in length");
  int e_lo = 1, e_hi = 0;  // FP64 exponent fields the products can have
  if (!xr.empty() && !yr.empty()) {
    e_lo = std::max(1, xr.lo + yr.lo + 1023);
    e_hi = std::min(2046, xr.hi + yr.hi + 1 + 1023);
  }
  const bool special = xr.special || yr.special;
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

  // Zero products land in the bins of exponent field 0 (no FP32 product is an FP64
  // subnormal), each adding 2^47: that counts the -0 ones for the sign of a zero sum.
  bool any_special = false;
  for (int t = 0; t < kTables; ++t) {
    std::uint64_t* table = bins_.data() + static_cast<std::size_t>(t) * kBins;
    negative_zero_terms_ += table[kSignBin] >> 47;
    table[0] = table[kSignBin] = 0;
    if (special) {
      any_special |= (table[kSpecialField] | table[kSignBin + kSpecialField]) != 0;
      table[kSpecialField] = table[kSignBin + kSpecialField] = 0;
    }
  }
  if (any_special) note_specials(x, y, n);
  fold_bins(e_lo, e_hi);
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
    add_integer(static_cast<std::int64_t>(pos - neg), pos + neg, e + 10);
  }
}

void ExactAccumulator::add_integer(std::int64_t v, std::uint64_t mag, int position) {
  const int d = position >> 5, s = position & 31;
  const i128 w = static_cast<i128>(v) << s;
  value_[d] += static_cast<std::uint32_t>(w);
  value_[d + 1] += static_cast<std::uint32_t>(w >> 32);
  value_[d + 2] += static_cast<std::int64_t>(w >> 64);
  const u128 m = static_cast<u128>(mag) << s;
  magnitude_[d] += static_cast<std::uint32_t>(m);
  magnitude_[d + 1] += static_cast<std::uint32_t>(m >> 32);
  magnitude_[d + 2] += static_cast<std::int64_t>(m >> 64);
  digit_lo_ = std::min(digit_lo_, d);
  digit_hi_ = std::max(digit_hi_, d + 2);
}

void ExactAccumulator::add(double v) {
  ++terms_;
  if (std::isnan(v)) { nan_ = true; return; }
  if (std::isinf(v)) { (v > 0 ? pos_inf_ : neg_inf_) = true; return; }
  if (v == 0.0) {
    if (std::signbit(v)) ++negative_zero_terms_;
    return;
  }
  int e;
  const double f = std::frexp(std::fabs(v), &e);  // |v| = f 2^e, f in [0.5, 1)
  auto m = static_cast<std::uint64_t>(std::ldexp(f, 53));
  int q = e - 53;
  if (q < -1074) {  // a subnormal: a multiple of 2^-1074, so the shift drops only zeros
    m >>= (-1074 - q);
    q = -1074;
  }
  add_integer(std::signbit(v) ? -static_cast<std::int64_t>(m) : static_cast<std::int64_t>(m), m,
              q + kBias);
}

bool ExactAccumulator::normalise(const std::array<std::int64_t, kDigits>& in,
                                 std::array<std::uint32_t, kDigits>& out) const {
  out.fill(0);
  std::int64_t carry = 0;
  int d = std::max(digit_lo_, 0);
  for (; d < kDigits; ++d) {
    carry += in[d];
    out[d] = static_cast<std::uint32_t>(carry);
    carry >>= 32;  // arithmetic: the digits are a two's complement number
    if (d >= digit_hi_ && (carry == 0 || carry == -1)) break;
  }
  if (carry == -1) {
    for (++d; d < kDigits; ++d) out[d] = 0xFFFFFFFFu;
    return true;
  }
  assert(carry == 0);
  return false;
}

RefValue ExactAccumulator::summarise(const std::array<std::int64_t, kDigits>& digits,
                                     bool magnitude) const {
  if (nan_ || (!magnitude && pos_inf_ && neg_inf_)) return RefValue::nan();
  if (pos_inf_ || neg_inf_) return RefValue::infinity(!magnitude && neg_inf_);
  std::array<std::uint32_t, kDigits> w;
  const bool negative = normalise(digits, w);
  if (negative) {  // two's complement negation: the magnitude
    std::uint64_t carry = 1;
    for (auto& digit : w) {
      const std::uint64_t t = static_cast<std::uint64_t>(static_cast<std::uint32_t>(~digit)) + carry;
      digit = static_cast<std::uint32_t>(t);
      carry = t >> 32;
    }
  }
  int top = kDigits - 1;
  while (top >= 0 && w[top] == 0) --top;
  if (top < 0) {
    // IEEE 754 (RNE): an exact zero sum is -0 only when every term is -0.
    const bool all_negative_zero = !magnitude && terms_ > 0 && negative_zero_terms_ == terms_;
    return RefValue::zero(all_negative_zero);
  }
  auto digit = [&](int i) -> std::uint64_t { return i >= 0 ? w[i] : 0; };
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
  for (int i = top - 6; i >= 0 && !sticky; --i) sticky = w[i] != 0;
  RefValue v;
  v.kind = RefValue::Kind::Finite;
  v.negative = negative;
  v.inexact = sticky;
  v.exponent = 32 * top + 31 - lz - kBias;
  v.sig_hi = a;
  v.sig_lo = b;
  return v;
}

RefValue ExactAccumulator::value() const { return summarise(value_, false); }
RefValue ExactAccumulator::magnitude() const { return summarise(magnitude_, true); }

void ExactAccumulator::exact_value(mpfr_ptr out) const {
  const RefValue v = value();
  if (v.kind != RefValue::Kind::Finite) {
    v.to_mpfr(out);
    return;
  }
  std::array<std::uint32_t, kDigits> w;
  const bool negative = normalise(value_, w);
  if (negative) {
    std::uint64_t carry = 1;
    for (auto& digit : w) {
      const std::uint64_t t = static_cast<std::uint64_t>(static_cast<std::uint32_t>(~digit)) + carry;
      digit = static_cast<std::uint32_t>(t);
      carry = t >> 32;
    }
  }
  int top = kDigits - 1, low = 0;
  while (w[top] == 0) --top;
  while (w[low] == 0) ++low;
  mpz_t z;
  mpz_init(z);
  mpz_import(z, static_cast<std::size_t>(top - low + 1), -1, sizeof(std::uint32_t), 0, 0, &w[low]);
  mpfr_set_prec(out, std::max<mpfr_prec_t>(2, static_cast<mpfr_prec_t>(mpz_sizeinbase(z, 2))));
  mpfr_set_z_2exp(out, z, 32L * low - kBias, MPFR_RNDN);  // exact: the precision holds z
  mpz_clear(z);
  if (negative) mpfr_neg(out, out, MPFR_RNDN);
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

void MpfrOracle::dot(mpfr_ptr out, std::span<const float> x, std::span<const float> y) {
  if (x.size() != y.size()) throw std::invalid_argument("oracle dot: x and y differ in length");
  const std::size_t n = x.size();
  reserve(n, 53);
  for (std::size_t i = 0; i < n; ++i)  // an FP32 x FP32 product is exact in FP64
    mpfr_set_d(&terms_[i], static_cast<double>(x[i]) * static_cast<double>(y[i]), MPFR_RNDN);
  // Products lie in [2^-298, 2^256): 620 bits hold any sum of fewer than 2^64 of them.
  mpfr_set_prec(out, 620);
  mpfr_sum(out, pointers_.data(), n, MPFR_RNDN);
}

void MpfrOracle::dot(mpfr_ptr out, std::span<const double> x, std::span<const double> y) {
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
  mpfr_sum(out, pointers_.data(), n, MPFR_RNDN);
}

}  // namespace ulpgate
