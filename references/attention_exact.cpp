#include "references/attention_exact.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"

namespace ulpgate::attention_exact {

const Tensor& checked_input(const std::map<std::string, Tensor>& inputs, const std::string& operand, Format f,
                            std::int64_t elements, std::string_view who) {
  const auto it = inputs.find(operand);
  if (it == inputs.end()) throw InputError(fmt::format("{}: input {} missing", who, operand));
  if (it->second.format() != f)
    throw InputError(fmt::format("{}: input {} is {}, the case says {}", who, operand, name(it->second.format()), name(f)));
  if (static_cast<std::int64_t>(it->second.size()) < elements)
    throw InputError(fmt::format("{}: input {} has {} elements, its view needs {}", who, operand, it->second.size(),
                                 elements));
  return it->second;
}

Scale scale_of(const AttentionShape& a) {
  Scale scale;
  if (a.softmax_scale) {
    scale.given = true;
    scale.value = *a.softmax_scale;
  } else {
    scale.head_dim = static_cast<long>(a.head_dim);
    const auto r = static_cast<long>(std::llround(std::sqrt(static_cast<double>(a.head_dim))));
    if (r * r == a.head_dim) scale.root = r;
  }
  return scale;
}

// The window of x / n, exactly (a rational, rounded toward zero with the ternary value).
RefValue exact_quotient(mpfr_srcptr x, unsigned long n) {
  if (mpfr_zero_p(x)) return RefValue::zero(false);  // see the header: zeros are +0
  if (!mpfr_number_p(x)) return RefValue::from_exact(x);
  Mpfr q(128);
  const int ternary = mpfr_div_ui(q, x, n, MPFR_RNDZ);
  RefValue r = RefValue::from_exact(q);
  r.inexact = ternary != 0;
  return r;
}

// The 128-bit window of |x| = |num| / n + Delta (num exact and nonzero, n >= 1), Delta
// known only to lie in [lo, hi] (exact bounds) and, where `sign` is not 0, to be nonzero of
// that sign, when that keeps |x| strictly between two neighbouring 128-bit numbers; nullopt
// otherwise. This decides outputs that sit within a tiny, transcendental distance of an exact
// number (one key dominating by a score gap of thousands: O = v_ref (1 - 2^-(10^5))) at the
// precision of Delta, not of the distance. lo = hi = 0 with a sign: Delta is below MPFR's
// range, so below any distance between num / n and a 128-bit number's neighbourhood.
std::optional<RefValue> window_near(mpfr_srcptr num, unsigned long n, mpfr_srcptr lo, mpfr_srcptr hi, bool negative,
                                    int sign) {
  RefValue t = exact_quotient(num, n);  // |num| / n truncated to 128 bits
  if (t.kind != RefValue::Kind::Finite) return std::nullopt;
  t.negative = false;
  Mpfr tm(128), unit(2), a(2), b(2), l(2), h(2);
  mpfr_set_ui(tm, t.sig_hi, MPFR_RNDN);
  mpfr_mul_2ui(tm, tm, 64, MPFR_RNDN);
  mpfr_add_ui(tm, tm, t.sig_lo, MPFR_RNDN);  // 128 bits: exact
  mpfr_mul_2si(tm, tm, static_cast<long>(t.exponent) - 127, MPFR_RNDN);
  mpfr_set_ui_2exp(unit, 1, static_cast<long>(t.exponent) - 127, MPFR_RNDN);
  // X = |num| - n T >= 0 and Y = n (T + unit) - |num| > 0, exactly.
  const long top = static_cast<long>(mpfr_get_exp(num)) + 2;
  const long bottom = std::min(static_cast<long>(mpfr_get_exp(num)) - static_cast<long>(mpfr_get_prec(num)),
                               static_cast<long>(t.exponent) - 130);
  const mpfr_prec_t prec = static_cast<mpfr_prec_t>(top - bottom + 8);
  mpfr_set_prec(a, prec), mpfr_set_prec(b, prec);
  Mpfr an(mpfr_get_prec(num));
  mpfr_abs(an, num, MPFR_RNDN);
  mpfr_mul_ui(a, tm, n, MPFR_RNDN);
  mpfr_sub(b, an, a, MPFR_RNDN);  // X
  mpfr_add(a, tm, unit, MPFR_RNDN);
  mpfr_mul_ui(a, a, n, MPFR_RNDN);
  mpfr_sub(a, a, an, MPFR_RNDN);  // Y
  mpfr_set_prec(l, mpfr_get_prec(lo) + 64), mpfr_set_prec(h, mpfr_get_prec(hi) + 64);
  mpfr_mul_ui(l, lo, n, MPFR_RNDD);
  mpfr_mul_ui(h, hi, n, MPFR_RNDU);
  mpfr_neg(b, b, MPFR_RNDN);  // -X
  // Delta > -X (with X = 0: Delta > 0) and Delta < Y.
  if ((sign > 0 || mpfr_cmp(l, b) > 0) && mpfr_cmp(h, a) < 0) {
    t.inexact = true;  // |x| in (T, T + unit)
    t.negative = negative;
    return t;
  }
  if (mpfr_zero_p(b) && (sign < 0 || mpfr_sgn(h.get()) < 0)) {  // |x| just below T: in (T - unit / 2, T)?
    mpfr_mul_ui(a, unit, n, MPFR_RNDN);
    mpfr_div_2ui(a, a, 1, MPFR_RNDN);
    mpfr_neg(a, a, MPFR_RNDN);
    if (mpfr_cmp(l, a) > 0) {
      if (t.sig_hi == (std::uint64_t{1} << 63) && t.sig_lo == 0) {
        t.sig_hi = t.sig_lo = ~std::uint64_t{0};
        --t.exponent;
      } else if (t.sig_lo-- == 0) {
        --t.sig_hi;
      }
      t.inexact = true;
      t.negative = negative;
      return t;
    }
  }
  return std::nullopt;
}

// out = x + y exactly (x, y exact).
void exact_sum_of(mpfr_ptr out, mpfr_srcptr x, mpfr_srcptr y) {
  long hi = LONG_MIN, lo = LONG_MAX;
  for (mpfr_srcptr t : {x, y}) {
    if (!mpfr_regular_p(t)) continue;
    hi = std::max<long>(hi, mpfr_get_exp(t));
    lo = std::min<long>(lo, mpfr_get_exp(t) - static_cast<long>(mpfr_get_prec(t)));
  }
  mpfr_set_prec(out, hi < lo ? 2 : static_cast<mpfr_prec_t>(hi - lo + 4));
  mpfr_add(out, x, y, MPFR_RNDN);
}

// x - y exactly (x, y exact).
void exact_difference(mpfr_ptr out, mpfr_srcptr x, mpfr_srcptr y) {
  Mpfr negated(mpfr_get_prec(y));
  mpfr_neg(negated, y, MPFR_RNDN);
  exact_sum_of(out, x, negated);
}

long log2_bound(mpfr_srcptr x) { return mpfr_zero_p(x) ? LONG_MIN / 4 : static_cast<long>(mpfr_get_exp(x)); }

}  // namespace ulpgate::attention_exact
