#include "references/sliced_gemm.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <stdexcept>

#include "references/exact_dot.hpp"

namespace ulpgate {
namespace {

// A 256-bit two's complement integer: the combination of one element's digit products
// (|S| < K 127^2 128^(2 kMaxSliceDigits - 2) < 2^(20 + 14 + 112) for K <= 2^20).
struct Int256 {
  std::array<std::uint64_t, 4> w{};

  void add_shifted(std::int64_t v, int shift) {  // += v 2^shift, 0 <= shift < 192
    const std::uint64_t ext = v < 0 ? ~std::uint64_t{0} : 0;
    std::array<std::uint64_t, 4> x{static_cast<std::uint64_t>(v), ext, ext, ext};
    const int limbs = shift / 64, bits = shift % 64;
    std::array<std::uint64_t, 4> y{};
    for (int i = 3; i >= limbs; --i) {
      const std::uint64_t lo = x[i - limbs];
      const std::uint64_t below = i - limbs - 1 >= 0 ? x[i - limbs - 1] : 0;
      y[i] = bits == 0 ? lo : (lo << bits) | (below >> (64 - bits));
    }
    unsigned __int128 carry = 0;
    for (int i = 0; i < 4; ++i) {
      const unsigned __int128 s = static_cast<unsigned __int128>(w[i]) + y[i] + carry;
      w[i] = static_cast<std::uint64_t>(s);
      carry = s >> 64;
    }
  }
  bool zero() const { return (w[0] | w[1] | w[2] | w[3]) == 0; }
  bool negative() const { return (w[3] >> 63) != 0; }
  void negate() {
    unsigned __int128 carry = 1;
    for (auto& x : w) {
      const unsigned __int128 s = static_cast<unsigned __int128>(~x) + carry;
      x = static_cast<std::uint64_t>(s);
      carry = s >> 64;
    }
  }
  // Bits [lo, lo + 64) of a nonnegative value (bits below 0 are zeros).
  std::uint64_t bits_at(int lo) const {
    const auto limb = [&](int i) -> std::uint64_t { return i >= 0 && i < 4 ? w[i] : 0; };
    const int l = lo >= 0 ? lo / 64 : -((-lo + 63) / 64), b = lo - 64 * l;
    return b == 0 ? limb(l) : (limb(l) >> b) | (limb(l + 1) << (64 - b));
  }
  // Whether any of bits [0, n) of a nonnegative value is set.
  bool any_below(int n) const {
    for (int i = 0; i < 4 && n > 0; ++i, n -= 64)
      if ((n >= 64 ? w[i] : w[i] & ((std::uint64_t{1} << n) - 1)) != 0) return true;
    return false;
  }
};

// S 2^scale as 52-bit pieces, each an exact double (|scale| is far inside FP64's range).
std::array<double, 5> pieces_of(Int256 s, int scale) {
  const bool negative = s.negative();
  if (negative) s.negate();
  std::array<double, 5> out{};
  for (int i = 0; i < 5; ++i) {
    const double piece = std::ldexp(static_cast<double>(s.bits_at(52 * i) & ((std::uint64_t{1} << 52) - 1)), scale + 52 * i);
    out[i] = negative ? -piece : piece;
  }
  return out;
}

// S 2^scale as the superaccumulator's RefValue (S != 0).
RefValue to_ref(Int256 s, int scale) {
  RefValue v;
  v.kind = RefValue::Kind::Finite;
  v.negative = s.negative();
  if (v.negative) s.negate();
  int top = 3;
  while (s.w[top] == 0) --top;
  const int p = 64 * top + 63 - std::countl_zero(s.w[top]);  // the leading bit
  v.exponent = p + scale;
  v.sig_hi = s.bits_at(p - 63);
  v.sig_lo = s.bits_at(p - 127);
  v.inexact = p > 127 && s.any_below(p - 127);
  return v;
}

struct FloatBits {
  bool zero = true, special = false;
  int top = 0, lowest = 0;  // floor(log2 |v|), exponent of the lowest set bit
  std::uint64_t m = 0;      // |v| = m 2^lowest, m odd
};

FloatBits float_bits(float v) {
  FloatBits f;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(v) & 0x7FFFFFFFu;
  if (bits >= 0x7F800000u) return f.zero = false, f.special = true, f;
  if (bits == 0) return f;
  f.zero = false;
  const std::uint32_t field = bits >> 23, frac = bits & 0x7FFFFFu;
  const std::uint32_t sig = field == 0 ? frac : frac | 0x800000u;
  const int q = (field == 0 ? 1 : static_cast<int>(field)) - 150;  // weight of sig's bit 0
  const int tz = std::countr_zero(sig);
  f.m = sig >> tz;
  f.lowest = q + tz;
  f.top = q + 31 - std::countl_zero(sig);
  return f;
}

}  // namespace

std::int64_t SlicedRows::captured_rows() const { return std::count(captured.begin(), captured.end(), 1); }

SlicedRows slice_rows(std::span<const float> values, std::int64_t rows, std::int64_t k, int max_digits) {
  if (max_digits < 1 || max_digits > kMaxSliceDigits) throw std::invalid_argument("slice_rows: max_digits out of 1..9");
  if (static_cast<std::int64_t>(values.size()) < rows * k) throw std::invalid_argument("slice_rows: too few values");
  SlicedRows s;
  s.rows = rows, s.k = k;
  s.exponent.assign(static_cast<std::size_t>(rows), 0);
  s.captured.assign(static_cast<std::size_t>(rows), 1);
  std::vector<int> needed(static_cast<std::size_t>(rows), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    int top = INT_MIN, lowest = INT_MAX;
    bool special = false;
    for (std::int64_t q = 0; q < k; ++q) {
      const FloatBits f = float_bits(values[r * k + q]);
      special |= f.special;
      if (f.zero || f.special) continue;
      top = std::max(top, f.top), lowest = std::min(lowest, f.lowest);
    }
    if (special) s.captured[r] = 0;
    if (top == INT_MIN) continue;  // no finite nonzero value: digits zero, exponent 0
    s.exponent[r] = top + 1;
    needed[r] = (top + 1 - lowest + 6) / 7;
  }
  for (std::int64_t r = 0; r < rows; ++r)
    if (s.captured[r] && needed[r] <= max_digits) s.digits = std::max(s.digits, needed[r]);
  const int d = s.digits;
  s.digit.assign(static_cast<std::size_t>(d) * rows * k, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    if (needed[r] > d) s.captured[r] = 0;
    if (!s.captured[r]) continue;  // its elements are recomputed: digits left zero
    for (std::int64_t q = 0; q < k; ++q) {
      const float v = values[r * k + q];
      const FloatBits f = float_bits(v);
      if (f.zero) continue;
      // N = v 2^(7D - e): an integer (lowest >= e - 7D) below 2^(7D) <= 2^63 in magnitude
      std::uint64_t n = f.m << (f.lowest - s.exponent[r] + 7 * d);
      const bool negative = std::signbit(v);
      for (int t = d - 1; t >= 0; --t, n >>= 7) {
        const auto digit = static_cast<std::int8_t>(n & 127);
        s.digit[(static_cast<std::size_t>(t) * rows + r) * k + q] = negative ? static_cast<std::int8_t>(-digit) : digit;
      }
    }
  }
  return s;
}

void cpu_digit_gemm(const std::int8_t* a, const std::int8_t* b, std::int64_t m, std::int64_t n, std::int64_t k,
                    std::int64_t* out) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      std::int64_t total = 0;
      for (std::int64_t q0 = 0; q0 < k; q0 += kInt32Chunk) {
        std::int32_t part = 0;  // exact: at most kInt32Chunk products of |d| <= 127
        for (std::int64_t q = q0; q < std::min(k, q0 + kInt32Chunk); ++q)
          part += static_cast<std::int32_t>(a[i * k + q]) * b[j * k + q];
        total += part;
      }
      out[i * n + j] = total;
    }
}

SlicedDots sliced_dots(std::span<const float> a, std::int64_t m, std::span<const float> b, std::int64_t n,
                       std::int64_t k, const DigitGemm& gemm, int max_digits, bool recompute) {
  const SlicedRows sa = slice_rows(a, m, k, max_digits), sb = slice_rows(b, n, k, max_digits);
  SlicedDots out;
  out.m = m, out.n = n;
  const std::size_t mn = static_cast<std::size_t>(m * n);
  std::vector<Int256> value(mn), magnitude(mn);
  std::vector<std::int64_t> p(mn);
  const auto abs_plane = [](const SlicedRows& s, int t) {
    std::vector<std::int8_t> v(s.plane(t), s.plane(t) + s.rows * s.k);
    for (auto& x : v) x = static_cast<std::int8_t>(x < 0 ? -x : x);
    return v;
  };
  std::vector<std::vector<std::int8_t>> abs_b;
  for (int t = 0; t < sb.digits; ++t) abs_b.push_back(abs_plane(sb, t));
  for (int s = 0; s < sa.digits; ++s) {
    const std::vector<std::int8_t> abs_a = abs_plane(sa, s);
    for (int t = 0; t < sb.digits; ++t) {
      const int shift = 7 * ((sa.digits - 1 - s) + (sb.digits - 1 - t));
      gemm(sa.plane(s), sb.plane(t), m, n, k, p.data());
      for (std::size_t e = 0; e < mn; ++e) value[e].add_shifted(p[e], shift);
      gemm(abs_a.data(), abs_b[t].data(), m, n, k, p.data());
      for (std::size_t e = 0; e < mn; ++e) magnitude[e].add_shifted(p[e], shift);
      out.digit_gemms += 2;
    }
  }
  out.value.resize(mn);
  out.magnitude.resize(mn);
  out.pieces.resize(mn);
  out.certified.assign(mn, 0);
  ExactAccumulator acc;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const std::size_t e = static_cast<std::size_t>(i * n + j);
      if (sa.captured[i] && sb.captured[j] && !value[e].zero()) {
        const int scale = sa.exponent[i] + sb.exponent[j] - 7 * (sa.digits + sb.digits);
        out.value[e] = to_ref(value[e], scale);
        out.magnitude[e] = to_ref(magnitude[e], scale);
        out.pieces[e] = pieces_of(value[e], scale);
        out.certified[e] = 1;
      } else {
        ++out.recomputed;
        if (!recompute) continue;
        acc.clear();
        acc.add_products(a.subspan(static_cast<std::size_t>(i * k), static_cast<std::size_t>(k)),
                         b.subspan(static_cast<std::size_t>(j * k), static_cast<std::size_t>(k)));
        out.value[e] = acc.value();
        out.magnitude[e] = acc.magnitude();
      }
    }
  return out;
}

}  // namespace ulpgate
