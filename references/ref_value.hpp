// A reference value: what an exact (or Ziv-certified) computation hands to the analyzers.
//
// It keeps the sign and the leading 128 bits of the magnitude plus a sticky bit. That is
// enough to round correctly, in any rounding mode, to every ulpgate format (at most 53
// bits of precision) and to give a double-double, while staying 24 bytes per element, so
// a 1024x1024x64 batch of references fits in memory.
#pragma once

#include <cstdint>

#include <mpfr.h>

#include "core/format.hpp"

namespace ulpgate {

/// An unevaluated sum hi + lo with |lo| <= ulp(hi)/2.
struct DoubleDouble {
  double hi = 0.0, lo = 0.0;
};

/// A real value x held so that it rounds correctly to any format of up to 126 bits:
/// |x| = (sig_hi * 2^64 + sig_lo) * 2^(exponent - 127) + tail, 0 <= tail < 2^(exponent - 127),
/// and `inexact` says tail > 0. For finite nonzero x the top bit of sig_hi is set.
struct RefValue {
  enum class Kind : std::uint8_t { Zero, Finite, Inf, NaN };
  Kind kind = Kind::Zero;
  bool negative = false;  ///< also the sign of a zero
  bool inexact = false;   ///< bits beyond the 128 kept are nonzero
  /// For a zero: its sign when rounding toward -inf. IEEE 754 gives an exact zero sum of
  /// terms not all zeros of one sign +0, but -0 when rounding down.
  bool negative_down = false;
  std::int32_t exponent = 0;  ///< floor(log2 |x|) for finite nonzero x
  std::uint64_t sig_hi = 0, sig_lo = 0;

  bool operator==(const RefValue&) const = default;

  /// The correct rounding of x to the format, encoded (same rules as encode_exact).
  Code round_to(Format f, Rounding r = Rounding::NearestEven,
                Overflow o = Overflow::NoSaturate) const;
  /// The correct rounding to FP64 as a double.
  double to_double(Rounding r = Rounding::NearestEven) const;
  /// hi = RN(x), lo = RN(x - hi); exact to within 2^-128 |x| (the kept window), so
  /// |hi + lo - x| <= (2^-106 + 2^-128) |x|.
  DoubleDouble double_double() const;
  /// Sets out (precision changed to 130) to x when !inexact, otherwise to the midpoint of
  /// the window interval (within 2^-128 |x|).
  void to_mpfr(mpfr_ptr out) const;

  /// A zero of one sign in every rounding mode.
  static RefValue zero(bool negative) {
    RefValue z{Kind::Zero, negative};
    z.negative_down = negative;
    return z;
  }
  /// Exponent of tiny(): below the smallest MPFR number, 2^-(2^30).
  static constexpr std::int32_t kTinyExponent = -(1 << 30) - 1;
  /// A nonzero value below 2^-(2^30) in magnitude whose digits no computation here can give
  /// (an attention weight of e^-(10^10), say): held as 2^kTinyExponent with the sticky bit.
  /// It rounds as every value that small does: to zero, or to the smallest subnormal when
  /// rounding away from zero.
  static RefValue tiny(bool negative) {
    RefValue t{Kind::Finite, negative, true};
    t.exponent = kTinyExponent;
    t.sig_hi = std::uint64_t{1} << 63;
    return t;
  }
  static RefValue nan() { return RefValue{Kind::NaN}; }
  static RefValue infinity(bool negative) { return RefValue{Kind::Inf, negative}; }
  /// The value of an exact MPFR number (any precision): truncated to 128 bits, sticky set
  /// if that dropped anything.
  static RefValue from_exact(mpfr_srcptr x);
  /// From an approximation y whose truncation to 128 bits is known to equal the true
  /// value's (e.g. certified by mpfr_can_round), and whose true value is known not to be
  /// a 128-bit number: sets inexact.
  static RefValue from_certified(mpfr_srcptr y);
};

/// Format a value for messages: "-0x1.8p+0 (exact)", "nan", ...
std::string to_string(const RefValue& v);

}  // namespace ulpgate
