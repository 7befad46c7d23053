// Rounding a double to a format's storage word, to nearest even with IEEE overflow: what
// encode(f, x) then code_to_storage(f, c) give (format.hpp), in integer operations only and
// in code that compiles for the GPU too, so that a large operand can be sampled and stored
// on the device (distributions/fill_gpu.cu) with the CPU's bits. tests/core/test_format.cpp
// compares the two over every special case and millions of doubles in each format.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/format.hpp"
#include "core/host_device.hpp"

namespace ulpgate {

/// What the rounding needs of a format (a plain struct: it is passed to a kernel).
struct RneFormat {
  int frac_bits = 23, emin = -126, bias = 127;
  std::uint64_t sign_mask = 0, max_finite_code = 0;
  std::uint64_t nan_code = 0;      ///< the canonical NaN (every NaN input becomes it)
  std::uint64_t overflow_mag = 0;  ///< the magnitude of an overflow: Inf, E4M3's NaN
  int storage_shift = 0;           ///< TF32: 13 (its code sits in the top of an FP32 word)
};

/// The storage word of x rounded to nearest even (ties to even), overflow to +-Inf (E4M3:
/// NaN with x's sign), NaN to the canonical NaN, as encode(f, x).
ULPGATE_HD std::uint64_t rne_storage(const RneFormat& f, double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint64_t sign = (u >> 63) ? f.sign_mask : 0;
  const int field = static_cast<int>((u >> 52) & 0x7FF);
  const std::uint64_t frac = u & ((std::uint64_t{1} << 52) - 1);
  std::uint64_t code;
  if (field == 0x7FF) {
    code = frac ? f.nan_code : (sign | f.overflow_mag);
  } else if (field == 0) {
    code = sign;  // +-0, and double subnormals: far below half the smallest subnormal here
  } else {
    // |x| = sig 2^(lg - 52); the target's unit at x's binade is 2^q.
    const std::uint64_t sig = frac | (std::uint64_t{1} << 52);
    const int lg = field - 1023;
    const int q = (lg > f.emin ? lg : f.emin) - f.frac_bits;
    const int shift = q - (lg - 52);  // >= 52 - frac_bits > 0: bits below the unit
    std::uint64_t i = 0;
    if (shift <= 53) {  // otherwise |x| < 2^(q-1): below half a unit, rounds to zero
      i = sig >> shift;
      const std::uint64_t rem = sig & ((std::uint64_t{1} << shift) - 1), half = std::uint64_t{1} << (shift - 1);
      i += (rem > half || (rem == half && (i & 1))) ? 1 : 0;
    }
    int qq = q;
    if (i == (std::uint64_t{1} << (f.frac_bits + 1))) i >>= 1, ++qq;  // carried into the next binade
    if (i == 0) {
      code = sign;
    } else if (i < (std::uint64_t{1} << f.frac_bits)) {
      code = sign | i;  // subnormal
    } else {
      const long bexp = static_cast<long>(qq) + f.frac_bits + f.bias;
      const long max_bexp = static_cast<long>(f.max_finite_code >> f.frac_bits);
      const std::uint64_t mag = bexp > max_bexp ? f.max_finite_code + 1
                                                : (static_cast<std::uint64_t>(bexp) << f.frac_bits) |
                                                      (i - (std::uint64_t{1} << f.frac_bits));
      code = sign | (mag > f.max_finite_code ? f.overflow_mag : mag);
    }
  }
  return code << f.storage_shift;
}

/// The parameters of format f (host code).
inline RneFormat rne_format(Format f) {
  const FormatInfo& fi = info(f);
  RneFormat r;
  r.frac_bits = fi.frac_bits, r.emin = fi.emin(), r.bias = fi.bias;
  r.sign_mask = fi.sign_mask(), r.max_finite_code = fi.max_finite_code;
  r.nan_code = fi.sign_mask() - 1;
  r.overflow_mag = fi.has_inf ? fi.max_finite_code + 1 : fi.sign_mask() - 1;
  r.storage_shift = f == Format::TF32 ? 13 : 0;
  return r;
}

}  // namespace ulpgate
