// The arithmetic of the sliced exact GEMM (references/sliced_gemm.hpp), per row and per
// element: slicing rows into balanced base-256 int8 digits, combining the int32 digit
// products into 192-bit sums, and the certification rule. Shared by the CPU emulation
// (sliced_gemm.cpp) and the GPU kernels (sliced_gemm_gpu.cu), so the two paths cannot drift
// apart. Plain C++17, callable from host and device code.
// See docs/concepts/references.md ("GPU exact reference: the sliced GEMM path").
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/host_device.hpp"
#include "core/uninitialized.hpp"

namespace ulpgate::slicing {

/// Digits per row at most: 8 balanced base-256 digits hold |N| <= 0x7F7F7F7F7F7F7F7F.
constexpr int kMaxDigits = 8;
/// K per exact int32 partial sum: kChunk 2^14 < 2^31, and a multiple of 16.
constexpr std::int64_t kChunk = 131056;
/// Stacked rows are padded to this many bytes (the int8 GEMMs' alignment).
constexpr std::int64_t kPitch = 16;

ULPGATE_HD int count_trailing_zeros(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}
ULPGATE_HD int count_leading_zeros(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(x));
#else
  return __builtin_clzll(x);
#endif
}

/// A row's scan: the largest |v| (as its bits: for nonnegative floats the order of the bits
/// is the order of the values), the lowest set bit over its nonzero finite values, specials.
struct RowScan {
  std::uint32_t max_bits = 0;
  std::int32_t lowest = 0x7FFFFFFF;
  std::uint32_t special = 0;
};

/// |v| = sig 2^weight for a finite float's bits (sig = 0 for zeros).
struct FloatSig {
  std::uint32_t sig;
  std::int32_t weight;
};
ULPGATE_HD FloatSig float_sig(std::uint32_t bits) {
  const std::uint32_t field = (bits >> 23) & 0xFFu, frac = bits & 0x7FFFFFu;
  return FloatSig{field == 0 ? frac : frac | 0x800000u, (field == 0 ? 1 : static_cast<std::int32_t>(field)) - 150};
}

ULPGATE_HD void scan(RowScan& s, std::uint32_t bits) {
  bits &= 0x7FFFFFFFu;
  if (bits >= 0x7F800000u) {
    s.special = 1;
    return;
  }
  if (bits == 0) return;
  const FloatSig f = float_sig(bits);
  const std::int32_t low = f.weight + count_trailing_zeros(f.sig);
  if (bits > s.max_bits) s.max_bits = bits;
  if (low < s.lowest) s.lowest = low;
}
ULPGATE_HD RowScan merge(RowScan a, const RowScan& b) {
  if (b.max_bits > a.max_bits) a.max_bits = b.max_bits;
  if (b.lowest < a.lowest) a.lowest = b.lowest;
  a.special |= b.special;
  return a;
}

/// N = v 2^-lowest for a value of a captured row (exact: lowest is at or below v's lowest bit).
ULPGATE_HD std::int64_t scaled_integer(std::uint32_t bits, std::int32_t lowest) {
  const FloatSig f = float_sig(bits);
  if (f.sig == 0) return 0;
  const int tz = count_trailing_zeros(f.sig);
  const auto n = static_cast<std::int64_t>(static_cast<std::uint64_t>(f.sig >> tz) << (f.weight + tz - lowest));
  return (bits >> 31) ? -n : n;
}

/// What slicing decided for a row: N = v 2^-lowest in `digits` digits; digits = 0 for a row
/// of zeros (captured: its sums are zeros, which are never certified) or one not captured.
struct RowPlan {
  std::int32_t lowest = 0;
  std::int32_t digits = 0;
  std::int32_t captured = 0;
};

/// The largest value D balanced base-256 digits hold: 0x7F..7F (D bytes).
ULPGATE_HD std::uint64_t digits_limit(int d) {
  std::uint64_t u = 0;
  for (int t = 0; t < d; ++t) u = (u << 8) | 0x7Fu;
  return u;
}

ULPGATE_HD RowPlan plan_row(const RowScan& s, int max_digits) {
  RowPlan p;
  if (s.special) return p;
  p.captured = 1;
  if (s.max_bits == 0) return p;
  const FloatSig f = float_sig(s.max_bits);
  const int top = f.weight + 63 - count_leading_zeros(f.sig);  // floor(log2 max |v|)
  if (top - s.lowest + 1 > 63) {
    p.captured = 0;
    return p;
  }
  const auto n = static_cast<std::uint64_t>(scaled_integer(s.max_bits, s.lowest));
  int d = 1;
  while (d <= max_digits && n > digits_limit(d)) ++d;
  if (d > max_digits) {
    p.captured = 0;
    return p;
  }
  p.lowest = s.lowest;
  p.digits = d;
  return p;
}

/// Digit t (least significant first) of N in balanced base 256: d = N mod 256 in
/// [-128, 127], then N = (N - d) / 256 exactly.
ULPGATE_HD void balanced_digits(std::int64_t n, int d, std::int8_t* out, std::int64_t stride) {
  for (int t = 0; t < d; ++t) {
    const auto digit = static_cast<std::int8_t>(static_cast<std::uint8_t>(n & 0xFF));
    out[t * stride] = digit;
    n = (n - digit) >> 8;
  }
}

/// A 192-bit two's complement integer.
struct Wide {
  std::uint64_t w[3] = {0, 0, 0};
};

/// x += v 2^shift (0 <= shift < 128).
ULPGATE_HD void add_shifted(Wide& x, std::int64_t v, int shift) {
  const std::uint64_t ext = v < 0 ? ~std::uint64_t{0} : 0, u = static_cast<std::uint64_t>(v);
  std::uint64_t y[3];
  if (shift == 0) {
    y[0] = u, y[1] = ext, y[2] = ext;
  } else if (shift < 64) {
    y[0] = u << shift, y[1] = (u >> (64 - shift)) | (ext << shift), y[2] = ext;
  } else if (shift == 64) {
    y[0] = 0, y[1] = u, y[2] = ext;
  } else {
    y[0] = 0, y[1] = u << (shift - 64), y[2] = (u >> (128 - shift)) | (ext << (shift - 64));
  }
  std::uint64_t carry = 0;
  for (int l = 0; l < 3; ++l) {
    const std::uint64_t s = x.w[l] + y[l];
    const std::uint64_t c1 = s < x.w[l];
    x.w[l] = s + carry;
    carry = c1 | (x.w[l] < s);
  }
}

ULPGATE_HD bool is_zero(const Wide& x) { return (x.w[0] | x.w[1] | x.w[2]) == 0; }

/// The sum of chunk partial products for one element into value: diagonals s + t of the
/// digit pairs, each summed in int64 (at most 8 pairs x chunks of < 2^31) and shifted in.
/// p points at chunk 0's matrix, chunk c at p + c * chunk_stride; stacked rows ra (A), rb (B).
/// Each chunk's matrix is stacked A x stacked B^T in int32, column-major: (ra, rb) at rb * ld + ra.
ULPGATE_HD void combine(const std::int32_t* p, std::int64_t ld, std::int64_t chunk_stride, int chunks,
                        std::int64_t ra, int da, std::int64_t rb, int db, Wide& value) {
  for (int diag = 0; diag <= da + db - 2; ++diag) {
    std::int64_t sum = 0;
    const int s_lo = diag - db + 1 > 0 ? diag - db + 1 : 0, s_hi = diag < da - 1 ? diag : da - 1;
    for (int s = s_lo; s <= s_hi; ++s)
      for (int c = 0; c < chunks; ++c) sum += p[c * chunk_stride + (rb + diag - s) * ld + ra + s];
    add_shifted(value, sum, 8 * diag);
  }
}

/// A nonnegative x 2^scale rounded to the nearest double, ties to even (x 2^scale is a
/// normal double or zero for every product sum of FP32-or-narrower values).
ULPGATE_HD double round_to_double(const Wide& x, int scale) {
  int top = 2;
  while (top >= 0 && x.w[top] == 0) --top;
  if (top < 0) return 0.0;
  const int p = 64 * top + 63 - count_leading_zeros(x.w[top]);  // the leading bit
  const auto bits_at = [&](int lo) -> std::uint64_t {             // bits [lo, lo + 64), lo >= 0
    const int l = lo / 64, b = lo % 64;
    const std::uint64_t a = l < 3 ? x.w[l] : 0, c = l + 1 < 3 ? x.w[l + 1] : 0;
    return b == 0 ? a : (a >> b) | (c << (64 - b));
  };
  if (p < 53) return ldexp(static_cast<double>(x.w[0]), scale);
  std::uint64_t m = bits_at(p - 52) & ((std::uint64_t{1} << 53) - 1);
  const bool round = (bits_at(p - 53) & 1) != 0;
  bool sticky = false;
  for (int l = 0; l < 3 && 64 * l < p - 53; ++l) {
    const int n = p - 53 - 64 * l;  // bits of limb l below the round bit
    sticky |= (n >= 64 ? x.w[l] : x.w[l] & ((std::uint64_t{1} << n) - 1)) != 0;
  }
  if (round && (sticky || (m & 1))) ++m;
  return ldexp(static_cast<double>(m), scale + p - 52);
}

/// What the sliced path hands back for an m x n block of dot products; element (i, j) at
/// j * m + i (column-major, the order the products come in on the GPU).
struct SlicedElements {
  std::int64_t m = 0, n = 0;
  std::vector<RowPlan> a_plan, b_plan;
  std::int64_t stacked_a = 0, stacked_b = 0;  ///< digit rows of A and of B (the GEMMs' sizes)
  // (resize leaves these unwritten: the GPU's download writes them in full)
  UninitVector<std::uint64_t> limb[3];        ///< S, two's complement (certified elements)
  UninitVector<double> condition;             ///< RN(sum |a b|) (certified elements)
  UninitVector<std::uint8_t> certified;
  std::int64_t products = 0;                  ///< int8 GEMM calls run
  /// Milliseconds per phase on the GPU (CUDA events; zeros for the CPU emulation).
  double ms_upload = 0, ms_slice = 0, ms_products = 0, ms_combine = 0, ms_download = 0;
};

}  // namespace ulpgate::slicing
