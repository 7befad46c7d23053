// Number formats: encode/decode, rounding from FP64, neighbours, ULP distance.
//
// A value is held as its *code*, the format's bit pattern right-aligned in a uint64_t.
// Conversions from double are bit-identical to CUDA's host conversions (checked by
// tests/core/test_format_cuda.cpp). Definitions: see docs/concepts/formats.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ulpgate {

enum class Format : std::uint8_t { FP64, FP32, TF32, FP16, BF16, E4M3, E5M2 };

/// The 8-bit floating-point formats (E4M3, E5M2).
constexpr bool is_fp8(Format f) { return f == Format::E4M3 || f == Format::E5M2; }

/// All formats, in order of decreasing precision.
inline constexpr Format kAllFormats[] = {Format::FP64, Format::FP32, Format::TF32, Format::FP16,
                                         Format::BF16, Format::E4M3, Format::E5M2};

enum class Rounding : std::uint8_t {
  NearestEven,  ///< RNE, IEEE default (cvt.rn)
  NearestAway,  ///< ties away from zero (cvt.rna, e.g. cvt.rna.tf32.f32)
  TowardZero,   ///< truncation (cvt.rz)
  Up,           ///< toward +inf
  Down,         ///< toward -inf
};

/// What happens to finite values beyond the largest finite value.
enum class Overflow : std::uint8_t {
  NoSaturate,  ///< IEEE: round to Inf (E4M3 has none: NaN), as CUDA's __NV_NOSAT
  Saturate,    ///< clamp to +-max finite, Inf inputs too, as CUDA's __NV_SATFINITE
};

/// Static description of a binary floating-point format.
struct FormatInfo {
  Format format;
  std::string_view name;         ///< "fp32", "e4m3", ...
  int bits;                      ///< width of the code
  int exp_bits;                  ///< exponent field width
  int frac_bits;                 ///< stored fraction bits (precision - 1)
  int bias;                      ///< exponent bias
  bool has_inf;                  ///< E4M3 ("fn") has no infinities
  bool ieee_specials;            ///< exponent field all ones is Inf/NaN (E4M3: only S.1111.111 is NaN)
  std::uint64_t max_finite_code; ///< code of the largest finite positive value
  std::string_view description;

  int precision() const { return frac_bits + 1; }
  int emin() const { return 1 - bias; }  ///< exponent of the smallest normal
  int emax() const;                      ///< exponent of the largest finite value
  double max_finite() const;
  double min_normal() const;
  double min_subnormal() const;
  double epsilon() const;  ///< 2^-frac_bits: the gap between 1 and the next value
  std::uint64_t sign_mask() const { return std::uint64_t{1} << (bits - 1); }
  /// Every bit of a code (FP64: all 64; a shift by 64 would be undefined).
  std::uint64_t code_mask() const { return bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1; }
};

namespace detail {
// name, bits, exp, frac, bias, has_inf, ieee_specials, max finite code, description
inline constexpr FormatInfo kFormatInfo[] = {
    {Format::FP64, "fp64", 64, 11, 52, 1023, true, true, 0x7FEFFFFFFFFFFFFFull,
     "IEEE binary64"},
    {Format::FP32, "fp32", 32, 8, 23, 127, true, true, 0x7F7FFFFFull, "IEEE binary32"},
    {Format::TF32, "tf32", 19, 8, 10, 127, true, true, 0x3FBFFull,
     "NVIDIA TensorFloat-32: FP32 range, 10 fraction bits (stored as FP32, low 13 bits 0)"},
    {Format::FP16, "fp16", 16, 5, 10, 15, true, true, 0x7BFFull, "IEEE binary16"},
    {Format::BF16, "bf16", 16, 8, 7, 127, true, true, 0x7F7Full, "bfloat16: FP32 range, 7 fraction bits"},
    {Format::E4M3, "e4m3", 8, 4, 3, 7, false, false, 0x7Eull,
     "OCP FP8 E4M3 (\"fn\"): no Inf, NaN only S.1111.111, max 448"},
    {Format::E5M2, "e5m2", 8, 5, 2, 15, true, true, 0x7Bull, "OCP FP8 E5M2: IEEE-like, max 57344"},
};
}  // namespace detail

inline const FormatInfo& info(Format f) { return detail::kFormatInfo[static_cast<int>(f)]; }
std::string_view name(Format f);
/// Parses "fp32", "bf16", "e4m3", ... (also "float32", "half", "bfloat16", "fp8e4m3", ...).
std::optional<Format> parse_format(std::string_view text);

std::string_view name(Rounding r);
std::optional<Rounding> parse_rounding(std::string_view text);

using Code = std::uint64_t;

/// The exact value of a code (every format here is a subset of FP64).
double decode(Format f, Code c);

/// Rounds x to the format, directly (no intermediate format), then encodes it.
Code encode(Format f, double x, Rounding r = Rounding::NearestEven,
            Overflow o = Overflow::NoSaturate);

/// Rounds (-1)^neg * sig * 2^exp2 (an exact value given as an integer significand and a
/// power of two, e.g. an integer sum of aligned terms) to the format and encodes it.
Code encode_scaled(Format f, bool neg, std::uint64_t sig, int exp2, Rounding r = Rounding::NearestEven,
                   Overflow o = Overflow::NoSaturate);

/// round(x) as a double: decode(encode(...)).
inline double round_to(Format f, double x, Rounding r = Rounding::NearestEven,
                       Overflow o = Overflow::NoSaturate) {
  return decode(f, encode(f, x, r, o));
}

// The classification of codes, inline: the analyzers ask it of every output element.
inline bool is_nan(Format f, Code c) {
  const auto& fi = info(f);
  const Code mag = c & (fi.sign_mask() - 1);
  if (!fi.ieee_specials) return mag == fi.sign_mask() - 1;
  return mag > fi.max_finite_code + 1;
}
inline bool is_inf(Format f, Code c) {
  const auto& fi = info(f);
  return fi.has_inf && (c & (fi.sign_mask() - 1)) == fi.max_finite_code + 1;
}
inline bool is_finite(Format f, Code c) { return !is_nan(f, c) && !is_inf(f, c); }
inline bool is_negative(Format f, Code c) { return (c & info(f).sign_mask()) != 0; }  ///< the sign bit (also for -0 and NaN)
Code canonical_nan(Format f);

/// The next value above / below c. NaN stays NaN; +Inf is the top and -Inf the bottom;
/// from +-max finite of E4M3 (no Inf) the result is NaN: there is no next value.
/// next_up(-0) = next_up(+0) = the smallest positive subnormal.
Code next_up(Format f, Code c);
Code next_down(Format f, Code c);

/// Integer ULP distance: how many steps through representable values from a to b,
/// i.e. |ordinal(a) - ordinal(b)|. +0 and -0 are one value (distance 0); Inf is one step
/// beyond max finite. nullopt when either is NaN: a NaN is never silently "close".
/// The position of c on the number line of the format, with +0 and -0 both at 0
/// (NaN: nullopt).
inline std::optional<std::int64_t> ordinal(Format f, Code c) {
  if (is_nan(f, c)) return std::nullopt;
  const auto mag = static_cast<std::int64_t>(c & (info(f).sign_mask() - 1));
  return is_negative(f, c) ? -mag : mag;
}
inline std::optional<std::uint64_t> ulp_distance(Format f, Code a, Code b) {
  const auto oa = ordinal(f, a), ob = ordinal(f, b);
  if (!oa || !ob) return std::nullopt;
  return static_cast<std::uint64_t>(*oa > *ob ? *oa - *ob : *ob - *oa);
}

/// ulp(x): the gap between consecutive values of the format at magnitude |x|:
/// 2^(max(floor(log2|x|), emin) - frac_bits); for |x| above max finite (and Inf) the gap
/// at the top binade; ulp(0) = the smallest subnormal. This is the unit of ulp_error.
double ulp_of(Format f, double x);

/// TF32 code (19 bits) <-> the FP32 word that carries it in memory (low 13 bits zero).
inline std::uint32_t tf32_code_to_fp32_bits(Code c) { return static_cast<std::uint32_t>(c << 13); }
inline Code fp32_bits_to_tf32_code(std::uint32_t w) { return w >> 13; }

/// Formats a code as a hex literal of the format's width, e.g. "0x3c00".
std::string hex_code(Format f, Code c);
/// A double as a C99 hex float ("%a"), e.g. "0x1.8p+0".
std::string hex_float(double x);

namespace detail {
/// The code of (-1)^neg * i * 2^q, where i (< 2^precision, or == 2^precision after rounding
/// up) already holds the rounded significand; applies subnormal/overflow rules. Shared by
/// the FP64 and the exact (MPFR) rounding paths so they cannot disagree.
Code compose(Format f, bool neg, std::uint64_t i, int q, Rounding r, Overflow o);
/// The code of a NaN (canonical) or of an infinite input under the overflow rule.
Code special_code(Format f, bool neg, bool nan, Overflow o);
}  // namespace detail

}  // namespace ulpgate
