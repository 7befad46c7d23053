#include <bit>
#include "references/ref_value.hpp"

#include <gmp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/format_mpfr.hpp"
#include "references/fp_env.hpp"

namespace ulpgate {
namespace {

using u128 = unsigned __int128;

class Mpz {
 public:
  Mpz() { mpz_init(v_); }
  ~Mpz() { mpz_clear(v_); }
  Mpz(const Mpz&) = delete;
  Mpz& operator=(const Mpz&) = delete;
  operator mpz_ptr() { return v_; }

 private:
  mpz_t v_;
};

// Truncates the finite nonzero x to 128 bits; returns whether that dropped anything.
bool window_of(mpfr_srcptr x, RefValue& v) {
  v.kind = RefValue::Kind::Finite;
  v.negative = mpfr_signbit(x) != 0;
  v.exponent = static_cast<std::int32_t>(mpfr_get_exp(x) - 1);
  Mpfr t(128);
  const int ternary = mpfr_set(t, x, MPFR_RNDZ);
  mpfr_abs(t, t, MPFR_RNDN);
  mpfr_mul_2si(t, t, 127 - static_cast<long>(v.exponent), MPFR_RNDN);  // in [2^127, 2^128)
  Mpz z;
  mpfr_get_z(z, t, MPFR_RNDZ);
  static_assert(sizeof(mp_limb_t) == 8, "64-bit GMP limbs expected");
  v.sig_hi = mpz_getlimbn(z, 1);
  v.sig_lo = mpz_getlimbn(z, 0);
  return ternary != 0;
}

}  // namespace

Code RefValue::round_to(Format f, Rounding r, Overflow o) const {
  const auto& fi = info(f);
  switch (kind) {
    case Kind::NaN: return detail::special_code(f, negative, true, o);
    case Kind::Inf: return detail::special_code(f, negative, false, o);
    case Kind::Zero: return (r == Rounding::Down ? negative_down : negative) ? fi.sign_mask() : 0;
    case Kind::Finite: break;
  }
  const long lg = exponent;
  if (lg > fi.emax()) {
    return detail::compose(f, negative, std::uint64_t{1} << fi.precision(),
                           fi.emax() - fi.frac_bits, r, o);
  }
  const long q = std::max(lg, static_cast<long>(fi.emin())) - fi.frac_bits;
  // |x| / 2^q = sig * 2^-(drop) + tail / 2^q: the low `drop` bits of sig (and the tail) are
  // the fraction that decides the rounding; drop >= 127 - 52.
  const long drop = 127 - (lg - q);
  const u128 sig = (static_cast<u128>(sig_hi) << 64) | sig_lo;
  const u128 top = u128{1} << 127;
  std::uint64_t ipart = 0;
  bool above_half = false, at_half = false;
  if (drop == 128) {
    above_half = sig > top || inexact;  // sig >= 2^127 always
    at_half = sig == top && !inexact;
  } else if (drop < 128) {
    ipart = static_cast<std::uint64_t>(sig >> drop);
    const u128 rem = sig & ((u128{1} << drop) - 1);
    const u128 half = u128{1} << (drop - 1);
    above_half = rem > half || (rem == half && inexact);
    at_half = rem == half && !inexact;
  }
  // drop > 128: |x| < 2^(q-1), below half of the smallest step, and nonzero.
  const bool any_fraction = drop >= 128 || inexact ||
                            (sig & ((u128{1} << drop) - 1)) != 0;
  bool up = false;
  switch (r) {
    case Rounding::NearestEven: up = above_half || (at_half && (ipart & 1)); break;
    case Rounding::NearestAway: up = above_half || at_half; break;
    case Rounding::TowardZero: up = false; break;
    case Rounding::Up: up = !negative && any_fraction; break;
    case Rounding::Down: up = negative && any_fraction; break;
  }
  return detail::compose(f, negative, ipart + (up ? 1 : 0), static_cast<int>(q), r, o);
}

double RefValue::to_double(Rounding r) const { return decode(Format::FP64, round_to(Format::FP64, r)); }

DoubleDouble RefValue::double_double() const {
  const ReferenceFpEnv env;  // RN(x - hi) below is one IEEE addition
  const double hi = to_double();
  if (kind != Kind::Finite || !std::isfinite(hi)) return {hi, 0.0};
  // Below 2^-1021 doubles are spaced 2^-1074 apart, so |x - hi| <= 2^-1075 and RN(x - hi)
  // is zero. (Computing it would need a precision of -exponent bits: 10^9 for the tiny
  // tails a certified GELU can return.)
  if (exponent < -1021) return {hi, 0.0};
  if (exponent >= -890) {
    // x (the window's midpoint when inexact) = s1 + s2 + s3 exactly: the window's top 53
    // bits, the next 53, and the last 22 with the midpoint's half unit, each a double, and
    // zero or normal (s3's unit 2^(exponent - 128) >= 2^-1018), as is any nonzero lo: FTZ
    // and DAZ cannot touch them. |hi| = RN(|x|) is s1 or s1 + ulp(s1), so d = s1 - |hi| is 0 or
    // -ulp(s1), exactly, and d + s2 is exact too (0 <= s2 < ulp(s1)); one IEEE addition then
    // rounds (d + s2) + s3 = |x| - |hi| correctly: lo = RN(x - hi), as the MPFR path.
    const u128 sig = (static_cast<u128>(sig_hi) << 64) | sig_lo;
    const auto m53 = (std::uint64_t{1} << 53) - 1;
    // (Scaled by exact powers of two: exponent - 128 >= -1018 and exponent - 52 <= 971, so
    // each power is a normal double, and so is each nonzero product.)
    const auto pow2 = [](int e) { return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52); };
    const double s1 = static_cast<double>(static_cast<std::uint64_t>(sig >> 75)) * pow2(exponent - 52);
    const double s2 = static_cast<double>(static_cast<std::uint64_t>(sig >> 22) & m53) * pow2(exponent - 105);
    const double s3 =
        static_cast<double>((static_cast<std::uint64_t>(sig) & 0x3FFFFF) * 2 + (inexact ? 1 : 0)) * pow2(exponent - 128);
    const double lo = ((s1 - std::fabs(hi)) + s2) + s3;
    return {hi, lo == 0.0 ? 0.0 : negative ? -lo : lo};  // an exact zero difference is +0, as in MPFR
  }
  // Otherwise x and hi are both multiples of 2^(exponent - 129) and of 2^-1074, and the
  // difference is below 2^(exponent + 1): 134 bits hold it exactly.
  Mpfr d(134);
  Mpfr x(130);
  to_mpfr(x);
  mpfr_sub_d(d, x, hi, MPFR_RNDN);
  return {hi, mpfr_get_d(d, MPFR_RNDN)};
}

void RefValue::to_mpfr(mpfr_ptr out) const {
  mpfr_set_prec(out, 130);
  switch (kind) {
    case Kind::NaN: mpfr_set_nan(out); return;
    case Kind::Inf: mpfr_set_inf(out, negative ? -1 : 1); return;
    case Kind::Zero: mpfr_set_zero(out, negative ? -1 : 1); return;
    case Kind::Finite: break;
  }
  static_assert(sizeof(unsigned long) == 8, "LP64 expected");
  mpfr_set_ui(out, sig_hi, MPFR_RNDN);
  mpfr_mul_2ui(out, out, 64, MPFR_RNDN);
  mpfr_add_ui(out, out, sig_lo, MPFR_RNDN);  // 128 bits: exact
  long shift = static_cast<long>(exponent) - 127;
  if (inexact) {  // the midpoint of [window, window + 2^(exponent-127))
    mpfr_mul_2ui(out, out, 1, MPFR_RNDN);
    mpfr_add_ui(out, out, 1, MPFR_RNDN);
    --shift;
  }
  mpfr_mul_2si(out, out, shift, MPFR_RNDN);
  if (negative) mpfr_neg(out, out, MPFR_RNDN);
}

RefValue RefValue::from_exact(mpfr_srcptr x) {
  if (mpfr_nan_p(x)) return nan();
  if (mpfr_inf_p(x)) return infinity(mpfr_signbit(x) != 0);
  if (mpfr_zero_p(x)) return zero(mpfr_signbit(x) != 0);
  RefValue v;
  v.inexact = window_of(x, v);
  return v;
}

RefValue RefValue::from_certified(mpfr_srcptr y) {
  RefValue v = from_exact(y);
  if (v.kind == Kind::Finite) v.inexact = true;
  return v;
}

std::string to_string(const RefValue& v) {
  switch (v.kind) {
    case RefValue::Kind::NaN: return "nan";
    case RefValue::Kind::Inf: return v.negative ? "-inf" : "inf";
    case RefValue::Kind::Zero: return v.negative ? "-0" : v.negative_down ? "0 (-0 rounding down)" : "0";
    case RefValue::Kind::Finite: break;
  }
  char window[80];
  std::snprintf(window, sizeof window, "%s0x%016llx%016llxp%+d%s", v.negative ? "-" : "",
                static_cast<unsigned long long>(v.sig_hi), static_cast<unsigned long long>(v.sig_lo),
                v.exponent - 127, v.inexact ? " + sticky" : "");
  return hex_float(v.to_double()) + " [" + window + "]";
}

}  // namespace ulpgate
