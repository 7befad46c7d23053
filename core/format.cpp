#include "core/format.hpp"

#include <bit>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>

namespace ulpgate {
namespace {


std::uint64_t bits_of(double x) { return std::bit_cast<std::uint64_t>(x); }

Code magnitude(const FormatInfo& fi, Code c) { return c & (fi.sign_mask() - 1); }

// The code a finite overflow (or an Inf input) becomes under IEEE (non-saturating) rules.
Code overflow_code(const FormatInfo& fi, bool negative) {
  const Code sign = negative ? fi.sign_mask() : 0;
  if (fi.has_inf) return sign | (fi.max_finite_code + 1);  // the Inf code follows max finite
  return sign | (fi.sign_mask() - 1);                         // E4M3: NaN, keeping the sign (as CUDA)
}

}  // namespace

int FormatInfo::emax() const { return static_cast<int>(max_finite_code >> frac_bits) - bias; }
double FormatInfo::max_finite() const { return decode(format, max_finite_code); }
double FormatInfo::min_normal() const { return std::ldexp(1.0, emin()); }
double FormatInfo::min_subnormal() const { return std::ldexp(1.0, emin() - frac_bits); }
double FormatInfo::epsilon() const { return std::ldexp(1.0, -frac_bits); }

std::string_view name(Format f) { return info(f).name; }

std::optional<Format> parse_format(std::string_view t) {
  for (const auto& fi : detail::kFormatInfo)
    if (t == fi.name) return fi.format;
  struct Alias { std::string_view text; Format f; };
  static constexpr Alias kAliases[] = {
      {"float64", Format::FP64}, {"double", Format::FP64},   {"float32", Format::FP32},
      {"float", Format::FP32},   {"float16", Format::FP16},  {"half", Format::FP16},
      {"bfloat16", Format::BF16}, {"fp8e4m3", Format::E4M3}, {"float8_e4m3fn", Format::E4M3},
      {"e4m3fn", Format::E4M3},  {"fp8e5m2", Format::E5M2},  {"float8_e5m2", Format::E5M2},
      {"tensorfloat32", Format::TF32}};
  for (const auto& a : kAliases)
    if (t == a.text) return a.f;
  return std::nullopt;
}

std::string_view name(Rounding r) {
  switch (r) {
    case Rounding::NearestEven: return "rne";
    case Rounding::NearestAway: return "rna";
    case Rounding::TowardZero: return "rz";
    case Rounding::Up: return "ru";
    case Rounding::Down: return "rd";
  }
  return "?";
}

std::optional<Rounding> parse_rounding(std::string_view t) {
  for (Rounding r : {Rounding::NearestEven, Rounding::NearestAway, Rounding::TowardZero,
                     Rounding::Up, Rounding::Down})
    if (t == name(r)) return r;
  return std::nullopt;
}

Code canonical_nan(Format f) { return info(f).sign_mask() - 1; }

double decode(Format f, Code c) {
  if (f == Format::FP64) return std::bit_cast<double>(c);
  // Every code of a narrower format is 0 or a normal double: its bits are built with
  // integer operations (no ldexp, and no dependence on FTZ/DAZ or the rounding mode).
  const auto& fi = info(f);
  const std::uint64_t sign = (c & fi.sign_mask()) ? std::uint64_t{1} << 63 : 0;
  const Code mag = magnitude(fi, c);
  const int frac_bits = fi.frac_bits;
  const Code frac = mag & ((Code{1} << frac_bits) - 1);
  const int bexp = static_cast<int>(mag >> frac_bits);
  if (fi.ieee_specials ? bexp == (1 << fi.exp_bits) - 1 : mag == fi.sign_mask() - 1) {
    if (fi.has_inf && frac == 0) return std::bit_cast<double>(sign | 0x7FF0000000000000ull);  // +-Inf
    return sign ? -NAN : NAN;
  }
  if (bexp == 0) {
    if (frac == 0) return std::bit_cast<double>(sign);  // +-0
    // frac * 2^(emin - frac_bits): the leading bit of frac becomes the implicit one.
    const int top = 63 - std::countl_zero(frac);
    const std::uint64_t e = static_cast<std::uint64_t>(fi.emin() - frac_bits + top + 1023);
    return std::bit_cast<double>(sign | (e << 52) | ((frac << (52 - top)) & ((std::uint64_t{1} << 52) - 1)));
  }
  const std::uint64_t e = static_cast<std::uint64_t>(bexp - fi.bias + 1023);
  return std::bit_cast<double>(sign | (e << 52) | (frac << (52 - frac_bits)));
}

Code encode(Format f, double x, Rounding r, Overflow o) {
  if (f == Format::FP64 && !(std::isinf(x) && o == Overflow::Saturate)) return bits_of(x);
  const auto& fi = info(f);
  const std::uint64_t u = bits_of(x);
  if (r == Rounding::NearestEven) {
    // The common case: x lands in the format's normal range. Rounding to nearest even on
    // the bits keeps the double's exponent field, a carry out of the fraction steps it (as
    // it should); rebiased, the magnitude is the code unless it passes the largest finite
    // one (overflow, and E4M3's NaN code), which the general path below handles.
    const int field = static_cast<int>((u >> 52) & 0x7FF);
    if (field != 0x7FF && field - 1023 >= fi.emin()) {
      const int drop = 52 - fi.frac_bits;
      const std::uint64_t m = u & ~(std::uint64_t{1} << 63);
      const std::uint64_t rounded = (m + ((std::uint64_t{1} << (drop - 1)) - 1) + ((m >> drop) & 1)) >> drop;
      const Code mag = rounded - (static_cast<Code>(1023 - fi.bias) << fi.frac_bits);
      if (mag <= fi.max_finite_code) return ((u >> 63) ? fi.sign_mask() : 0) | mag;
    }
  }
  const bool neg = (u >> 63) != 0;
  const Code sign = neg ? fi.sign_mask() : 0;
  if (!std::isfinite(x)) return detail::special_code(f, neg, std::isnan(x), o);

  const int E = static_cast<int>((u >> 52) & 0x7FF);
  const std::uint64_t frac = u & ((std::uint64_t{1} << 52) - 1);
  if (E == 0 && frac == 0) return sign;  // +-0

  // |x| = sig * 2^e2 exactly.
  const std::uint64_t sig = E == 0 ? frac : (frac | (std::uint64_t{1} << 52));
  const int e2 = E == 0 ? -1074 : E - 1075;
  return encode_scaled(f, neg, sig, e2, r, o);
}

Code encode_scaled(Format f, bool neg, std::uint64_t sig, int e2, Rounding r, Overflow o) {
  const auto& fi = info(f);
  if (sig == 0) return neg ? fi.sign_mask() : 0;
  const int lg = e2 + 63 - std::countl_zero(sig);  // floor(log2 |value|)
  // Quantum (value of the last fraction bit) of the target at the value's binade.
  const int q = std::max(lg, fi.emin()) - fi.frac_bits;
  const int shift = q - e2;  // low bits of sig that fall below the quantum

  enum { Exact, BelowHalf, Tie, AboveHalf } rest = Exact;
  std::uint64_t i;
  if (shift <= 0) {
    i = sig << -shift;  // exact: shift >= bit_length(sig) - precision, so i < 2^precision
  } else if (shift > 64) {
    i = 0;
    rest = BelowHalf;  // sig < 2^64, so |value| < 2^(e2+64) <= 2^(q-1)
  } else if (shift == 64) {
    i = 0;
    const std::uint64_t half = std::uint64_t{1} << 63;
    rest = sig < half ? BelowHalf : sig == half ? Tie : AboveHalf;
  } else {
    i = sig >> shift;
    const std::uint64_t rem = sig & ((std::uint64_t{1} << shift) - 1);
    const std::uint64_t half = std::uint64_t{1} << (shift - 1);
    rest = rem == 0 ? Exact : rem < half ? BelowHalf : rem == half ? Tie : AboveHalf;
  }
  bool up = false;  // whether to add one unit in the last place to |value| truncated
  switch (r) {
    case Rounding::NearestEven: up = rest == AboveHalf || (rest == Tie && (i & 1)); break;
    case Rounding::NearestAway: up = rest == AboveHalf || rest == Tie; break;
    case Rounding::TowardZero: up = false; break;
    case Rounding::Up: up = !neg && rest != Exact; break;
    case Rounding::Down: up = neg && rest != Exact; break;
  }
  return detail::compose(f, neg, i + up, q, r, o);
}

namespace detail {
Code compose(Format f, bool neg, std::uint64_t i, int q, Rounding r, Overflow o) {
  const auto& fi = info(f);
  const Code sign = neg ? fi.sign_mask() : 0;
  if (i == (std::uint64_t{1} << fi.precision())) {  // rounded up into the next binade
    i >>= 1;
    ++q;
  }
  if (i == 0) return sign;  // underflow to a signed zero
  Code mag;
  if (i < (std::uint64_t{1} << fi.frac_bits)) {
    mag = i;  // subnormal (q is emin - frac_bits here)
  } else {
    const long bexp = static_cast<long>(q) + fi.frac_bits + fi.bias;
    const long max_bexp = static_cast<long>(fi.max_finite_code >> fi.frac_bits);
    mag = bexp > max_bexp ? fi.max_finite_code + 1
                          : (static_cast<Code>(bexp) << fi.frac_bits) |
                                (i - (std::uint64_t{1} << fi.frac_bits));
  }
  if (mag > fi.max_finite_code) {
    // Overflow: saturating clamps; IEEE clamps only when rounding toward zero's side.
    const bool to_max = o == Overflow::Saturate || r == Rounding::TowardZero ||
                        (r == Rounding::Up && neg) || (r == Rounding::Down && !neg);
    return to_max ? (sign | fi.max_finite_code) : overflow_code(fi, neg);
  }
  return sign | mag;
}

Code special_code(Format f, bool neg, bool nan, Overflow o) {
  const auto& fi = info(f);
  if (nan) return canonical_nan(f);
  return o == Overflow::Saturate ? ((neg ? fi.sign_mask() : 0) | fi.max_finite_code)
                                 : overflow_code(fi, neg);
}
}  // namespace detail

namespace {
Code from_ordinal(const FormatInfo& fi, std::int64_t o, bool negative_zero) {
  if (o > 0) return static_cast<Code>(o);
  if (o < 0) return fi.sign_mask() | static_cast<Code>(-o);
  return negative_zero ? fi.sign_mask() : 0;
}
}  // namespace

Code next_up(Format f, Code c) {
  const auto& fi = info(f);
  const auto o = ordinal(f, c);
  if (!o) return c;
  const auto top = static_cast<std::int64_t>(fi.max_finite_code + (fi.has_inf ? 1 : 0));
  if (*o == top) return fi.has_inf ? c : canonical_nan(f);
  // IEEE nextUp(-min subnormal) is -0.
  return from_ordinal(fi, *o + 1, /*negative_zero=*/*o < 0);
}

Code next_down(Format f, Code c) {
  if (is_nan(f, c)) return c;
  const Code s = info(f).sign_mask();
  const Code n = next_up(f, c ^ s);
  return is_nan(f, n) ? n : n ^ s;
}

double ulp_of(Format f, double x) {
  const auto& fi = info(f);
  if (std::isnan(x)) return NAN;
  const double a = std::fabs(x);
  if (a < fi.min_normal()) return fi.min_subnormal();
  if (a > fi.max_finite()) return std::ldexp(1.0, fi.emax() - fi.frac_bits);
  return std::ldexp(1.0, std::max(std::ilogb(a), fi.emin()) - fi.frac_bits);
}

std::string hex_code(Format f, Code c) {
  return fmt::format("0x{:0{}x}", c, (info(f).bits + 3) / 4);
}

std::string hex_float(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", x);
  return buf;
}

}  // namespace ulpgate
