#include "core/format_mpfr.hpp"

#include <algorithm>
#include <cmath>

namespace ulpgate {

Code encode_exact(Format f, mpfr_srcptr x, Rounding r, Overflow o) {
  const auto& fi = info(f);
  const bool neg = mpfr_signbit(x) != 0;
  if (!mpfr_number_p(x)) return detail::special_code(f, neg, mpfr_nan_p(x) != 0, o);
  if (mpfr_zero_p(x)) return neg ? fi.sign_mask() : 0;

  const long lg = static_cast<long>(mpfr_get_exp(x)) - 1;  // floor(log2|x|)
  if (lg > fi.emax()) {
    // Beyond the top binade: every rounding gives a magnitude above max finite; let compose
    // apply the overflow rule to the smallest such significand.
    return detail::compose(f, neg, std::uint64_t{1} << fi.precision(), fi.emax() - fi.frac_bits,
                           r, o);
  }
  const long q = std::max(lg, static_cast<long>(fi.emin())) - fi.frac_bits;
  // t = x / 2^q is exact; the target's significand is t rounded to an integer.
  Mpfr t(mpfr_get_prec(x));
  mpfr_mul_2si(t, x, -q, MPFR_RNDN);
  Mpfr iv(64);
  switch (r) {
    case Rounding::NearestEven: mpfr_rint(iv, t, MPFR_RNDN); break;
    case Rounding::NearestAway: mpfr_round(iv, t); break;
    case Rounding::TowardZero: mpfr_rint(iv, t, MPFR_RNDZ); break;
    case Rounding::Up: mpfr_rint(iv, t, MPFR_RNDU); break;
    case Rounding::Down: mpfr_rint(iv, t, MPFR_RNDD); break;
  }
  mpfr_abs(iv, iv, MPFR_RNDN);
  const auto i = static_cast<std::uint64_t>(mpfr_get_ui(iv, MPFR_RNDN));  // < 2^54: exact
  return detail::compose(f, neg, i, static_cast<int>(q), r, o);
}

double ulp_error(Format f, Code computed, mpfr_srcptr exact) {
  const double c = decode(f, computed);
  if (std::isnan(c) || mpfr_nan_p(exact)) return NAN;
  if (std::isinf(c) || mpfr_inf_p(exact)) {
    if (std::isinf(c) && mpfr_inf_p(exact) && (c < 0) == (mpfr_signbit(exact) != 0)) return 0.0;
    if (std::isinf(c)) return c;
    return mpfr_signbit(exact) ? INFINITY : -INFINITY;
  }
  // Exact difference: enough bits to span both operands' lowest and highest bits.
  Mpfr cm(53, c);
  mpfr_prec_t prec = 64;
  if (!mpfr_zero_p(exact) && c != 0.0) {
    const long hi = std::max<long>(mpfr_get_exp(exact), mpfr_get_exp(cm));
    const long lo = std::min<long>(mpfr_get_exp(exact) - mpfr_get_prec(exact),
                                   mpfr_get_exp(cm) - 53);
    prec = static_cast<mpfr_prec_t>(hi - lo + 2);
  } else {
    prec = std::max<mpfr_prec_t>(mpfr_get_prec(exact), 53);
  }
  // Operands whose bits span more than 4096 positions (an exact value near 2^-(10^9)
  // against a subnormal, say) would need that many bits: there one correctly rounded 53-bit
  // difference is used. Dividing by u is exact, so the result differs from the exact
  // quotient's rounding only if that quotient is below 2^-1022 ulps.
  Mpfr diff(prec <= 4096 ? prec : 53);
  mpfr_sub(diff, cm, exact, MPFR_RNDN);  // exact, or one correct rounding
  const double u = ulp_of(f, mpfr_get_d(exact, MPFR_RNDZ));  // RNDZ keeps the binade
  mpfr_div_d(diff, diff, u, MPFR_RNDN);                        // power of two: exact
  return mpfr_get_d(diff, MPFR_RNDN);
}

double ulp_error(Format f, Code computed, double exact) {
  Mpfr e(53, exact);
  return ulp_error(f, computed, e.get());
}

}  // namespace ulpgate
