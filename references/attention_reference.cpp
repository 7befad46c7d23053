#include "references/attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format_mpfr.hpp"
#include "references/attention_exact.hpp"
#include "references/exact_dot.hpp"
#include "references/fp_env.hpp"

namespace ulpgate {
namespace {

using namespace attention_exact;
using MpfrBox = std::unique_ptr<Mpfr>;
constexpr std::string_view kWho = "attention reference";

// exp(t) at out's precision; false where it lies below MPFR's exponent range (|exp(t)| <
// 2^emin, out then 0 or the smallest positive number).
bool exp_in_range(mpfr_ptr out, mpfr_srcptr t) {
  mpfr_clear_underflow();
  mpfr_exp(out, t, MPFR_RNDN);
  return !mpfr_underflow_p();
}

// A row's logits per group of keys with equal logits: L = G(s) + beta, s the exact score q.k,
// beta the exact bias (ALiBi's slope times distance, or the sink's logit on a key of score 0),
// G(s) = sigma s or, soft-capped, cap tanh(sigma s / cap).
// Exact form (no soft cap, and sigma a given double or 1/root or no bias): L = u / den or
// sigma u with u exact (sigma s + beta, s + root beta, or s); keys with equal u form a group
// and differences of logits carry only their final roundings.
// General form (a soft cap, or biases with sigma = 1/sqrt(head_dim) irrational): keys with
// equal (s, beta) form a group (their logits differ otherwise: tanh is injective and
// transcendental at rational points, sqrt(head_dim) irrational), and logits are computed at
// each precision with a bound.
// Errors are returned as e with |computed - exact| <= e 2^-p.
class RowLogits {
 public:
  enum class Form { Given, Root, Irrational, General };

  RowLogits(const Scale& scale, double cap, bool biased)
      : scale_(scale), cap_(cap),
        form_(cap != 0 && scale.sign() != 0 ? Form::General
              : scale.given                 ? Form::Given
              : scale.root                  ? Form::Root
              : biased                      ? Form::General
                                            : Form::Irrational) {}

  Form form() const { return form_; }
  bool exact_form() const { return form_ != Form::General; }

  // Groups of keys (indices into score and bias) with equal logits, in increasing order in
  // the exact form; the group of the largest logit is ref().
  std::vector<std::vector<std::size_t>> group(const std::vector<MpfrBox>& score, const std::vector<MpfrBox>& bias) {
    const std::size_t n = score.size();
    std::vector<MpfrBox> key(n);
    if (exact_form())
      for (std::size_t j = 0; j < n; ++j) key[j] = exact_u(*score[j], bias[j] ? bias[j]->get() : nullptr);
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    const auto cmp = [&](std::size_t x, std::size_t y) {
      if (exact_form()) return mpfr_cmp(*key[x], *key[y]);
      const int c = mpfr_cmp(*score[x], *score[y]);
      return c != 0 ? c : cmp_bias(bias[x] ? bias[x]->get() : nullptr, bias[y] ? bias[y]->get() : nullptr);
    };
    std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return cmp(x, y) < 0; });
    std::vector<std::vector<std::size_t>> groups;
    for (std::size_t j : order) {
      if (groups.empty() || cmp(j, groups.back()[0]) != 0) groups.emplace_back();
      groups.back().push_back(j);
    }
    const std::size_t count = groups.size();
    u_.resize(count), s_.resize(count), beta_.resize(count), approx_.assign(count, 0.0);
    for (std::size_t g = 0; g < count; ++g) {
      const std::size_t j = groups[g][0];
      s_[g] = score[j]->get();
      beta_[g] = bias[j] ? bias[j]->get() : nullptr;
      if (exact_form()) u_[g] = std::move(key[j]);
    }
    ref_ = count - 1;
    if (!exact_form()) {  // the largest logit at 128 bits (any near-largest one would do)
      Mpfr x(128);
      for (std::size_t g = 0; g < count; ++g) {
        value(x, g, 128);
        approx_[g] = mpfr_get_d(x, MPFR_RNDN);
        if (approx_[g] > approx_[ref_]) ref_ = g;
      }
    }
    return groups;
  }

  std::size_t ref() const { return ref_; }

  // Whether group g's logit is above group h's (the general form: approximately).
  bool greater(std::size_t g, std::size_t h) const {
    return exact_form() ? mpfr_cmp(*u_[g], *u_[h]) > 0 : approx_[g] > approx_[h];
  }

  // out = L_g - L_h at precision p.
  double difference(mpfr_ptr out, std::size_t g, std::size_t h, mpfr_prec_t p) const {
    mpfr_set_prec(out, p);
    if (exact_form()) {
      Mpfr x(2);
      exact_difference(x, *u_[g], *u_[h]);
      times_mult(out, x, p);
      return 2 * abs_up(out);
    }
    if (cap_ == 0) {  // sigma (s_g - s_h) + (beta_g - beta_h)
      Mpfr ds(2), db(2), sigma(p), t(p);
      exact_difference(ds, s_[g], s_[h]);
      scale_.set(sigma);
      mpfr_mul(t, sigma, ds, MPFR_RNDN);
      const double e = 2 * abs_up(t);
      bias_difference(db, g, h);
      mpfr_add(out, t, db, MPFR_RNDN);
      return e + abs_up(out) + 1;
    }
    const mpfr_prec_t q = p + 10;
    Mpfr gg(q), gh(q), dg(q), db(2);
    const double e = capped(gg, s_[g], q) + capped(gh, s_[h], q);
    mpfr_sub(dg, gg, gh, MPFR_RNDN);
    bias_difference(db, g, h);
    mpfr_add(out, dg, db, MPFR_RNDN);
    return (e + abs_up(dg)) / 1024 + abs_up(out) + 1;
  }

  // out = L_g at precision p.
  double value(mpfr_ptr out, std::size_t g, mpfr_prec_t p) const {
    mpfr_set_prec(out, p);
    if (exact_form()) {
      times_mult(out, *u_[g], p);
      return 2 * abs_up(out);
    }
    const mpfr_prec_t q = p + 10;
    Mpfr gg(q);
    double e = 0;
    if (cap_ == 0) {
      Mpfr sigma(q);
      scale_.set(sigma);
      mpfr_mul(gg, sigma, s_[g], MPFR_RNDN);
      e = 2 * abs_up(gg);
    } else {
      e = capped(gg, s_[g], q);
    }
    if (beta_[g]) mpfr_add(out, gg, beta_[g], MPFR_RNDN);
    else mpfr_set(out, gg, MPFR_RNDN);
    return e / 1024 + abs_up(out) + 1;
  }

  // L_g = num / den exactly (the exact form with a rational sigma, or a score of 0, whose
  // logit is its bias: a sink); false otherwise.
  bool rational(std::size_t g, mpfr_ptr num, unsigned long& den) const {
    if (form_ != Form::Given && form_ != Form::Root) {
      if (!mpfr_zero_p(s_[g])) return false;
      mpfr_set_prec(num, beta_[g] ? mpfr_get_prec(beta_[g]) : 2);
      if (beta_[g]) mpfr_set(num, beta_[g], MPFR_RNDN);
      else mpfr_set_zero(num, 1);
      den = 1;
      return true;
    }
    mpfr_set_prec(num, mpfr_get_prec(*u_[g]));
    mpfr_set(num, *u_[g], MPFR_RNDN);
    den = form_ == Form::Root ? static_cast<unsigned long>(scale_.root) : 1;
    return true;
  }

  // Soft-capped logits with equal biases: L_g - L_h = cap (tanh y_g - tanh y_h) = cap
  // sinh(y_g - y_h) / (cosh y_g cosh y_h), y = sigma s / cap, into out at precision p with
  // |out - d| <= e 2^-p |out|: relative, so it keeps its digits where both tanh are within
  // 2^-p of the same +-1 (scores far beyond the cap), where difference() only knows 0 +- e
  // 2^-p. False without a cap, where the biases differ, or where cosh leaves MPFR's range.
  bool relative_difference(mpfr_ptr out, double& e, std::size_t g, std::size_t h, mpfr_prec_t p) const {
    if (cap_ == 0 || cmp_bias(beta_[g], beta_[h]) != 0) return false;
    const mpfr_prec_t q = p + 16;
    Mpfr sigma(q), ds(2), t(q), yg(q), yh(q);
    scale_.set(sigma);
    exact_difference(ds, s_[g], s_[h]);
    mpfr_mul(t, sigma, ds, MPFR_RNDN);
    mpfr_div_d(t, t, cap_, MPFR_RNDN);
    mpfr_mul(yg, sigma, s_[g], MPFR_RNDN);
    mpfr_div_d(yg, yg, cap_, MPFR_RNDN);
    mpfr_mul(yh, sigma, s_[h], MPFR_RNDN);
    mpfr_div_d(yh, yh, cap_, MPFR_RNDN);
    // Relative errors in units of 2^-q: t, y_g, y_h carry three roundings each (sigma's,
    // the product's, the quotient's); sinh(t) amplifies t's by at most 1 + |t| and cosh(y)
    // y's by at most |y|; sinh, two cosh, a product and a quotient round once each.
    const double at = abs_up(t), ag = abs_up(yg), ah = abs_up(yh);
    mpfr_set_prec(out, q);
    mpfr_sinh(out, t, MPFR_RNDN);
    mpfr_cosh(yg, yg, MPFR_RNDN);
    mpfr_cosh(yh, yh, MPFR_RNDN);
    if (!mpfr_number_p(yg) || !mpfr_number_p(yh)) return false;
    mpfr_mul(yg, yg, yh, MPFR_RNDN);
    mpfr_div(out, out, yg, MPFR_RNDN);
    mpfr_mul_d(out, out, cap_, MPFR_RNDN);
    const double eq = 3 * (1 + at) + 3 * (ag + ah) + 8;
    mpfr_prec_round(out, p, MPFR_RNDN);
    e = 2 * eq / 65536 + 1;  // the q-bit errors (each at most doubled by the others), and the rounding to p
    return true;
  }

  // Group g's soft-capped logit as r + delta with r = sgn(y) cap + beta, exact (into r), and
  // delta = -sgn(y) 2 cap / (e^(2|y|) + 1), y = sigma s / cap, at precision p into delta with
  // |delta~ - delta| <= e 2^-p |delta~|: the logit next to the rational it saturates to.
  // False without a cap or for a score of 0.
  bool saturated(mpfr_ptr r, mpfr_ptr delta, double& e, std::size_t g, mpfr_prec_t p) const {
    if (cap_ == 0 || mpfr_zero_p(s_[g])) return false;
    const mpfr_prec_t q = p + 16;
    Mpfr y(q), sigma(q), c(64);
    scale_.set(sigma);
    mpfr_mul(y, sigma, s_[g], MPFR_RNDN);
    mpfr_div_d(y, y, cap_, MPFR_RNDN);
    const int sign = mpfr_sgn(y.get());
    // 2|y| carries y's three roundings (relative), which exp turns into 3 |2y| 2^-q of its
    // own; exp, +1, the quotient and the product round once each.
    const double ay = abs_up(y);
    mpfr_abs(y, y, MPFR_RNDN);
    mpfr_mul_2ui(y, y, 1, MPFR_RNDN);
    mpfr_set_prec(delta, q);
    mpfr_exp(delta, y, MPFR_RNDN);
    if (!mpfr_number_p(delta)) return false;
    mpfr_add_ui(delta, delta, 1, MPFR_RNDN);
    mpfr_d_div(delta, -2.0 * sign * cap_, delta, MPFR_RNDN);
    mpfr_prec_round(delta, p, MPFR_RNDN);
    e = 2 * (6 * ay + 8) / 65536 + 1;
    mpfr_set_d(c, sign * cap_, MPFR_RNDN);  // an FP32 value: exact
    Mpfr zero(2);
    mpfr_set_zero(zero, 1);
    exact_sum_of(r, c, beta_[g] ? beta_[g] : zero.get());
    return true;
  }

  // Group g's score is 0 (its logit then is its bias, exactly: G(0) = 0).
  bool zero_score(std::size_t g) const { return mpfr_zero_p(s_[g]) != 0; }
  mpfr_srcptr bias(std::size_t g) const { return beta_[g]; }

 private:
  static double abs_up(mpfr_srcptr x) { return std::fabs(mpfr_get_d(x, MPFR_RNDA)); }
  static int cmp_bias(mpfr_srcptr x, mpfr_srcptr y) {
    if (!x && !y) return 0;
    if (!x) return -mpfr_sgn(y);
    if (!y) return mpfr_sgn(x);
    return mpfr_cmp(x, y);
  }
  void bias_difference(mpfr_ptr out, std::size_t g, std::size_t h) const {
    Mpfr zero(2);
    mpfr_set_zero(zero, 1);
    exact_difference(out, beta_[g] ? beta_[g] : zero.get(), beta_[h] ? beta_[h] : zero.get());
  }
  // The exact u of a key: sigma s + beta (a given sigma), s + root beta (1/root), s (no bias).
  MpfrBox exact_u(mpfr_srcptr s, mpfr_srcptr beta) const {
    auto u = std::make_unique<Mpfr>(2);
    Mpfr a(mpfr_get_prec(s) + 64), b(2);
    if (form_ == Form::Given) mpfr_mul_d(a, s, scale_.value, MPFR_RNDN);  // exact
    else mpfr_set(a, s, MPFR_RNDN);
    if (beta) {
      mpfr_set_prec(b, mpfr_get_prec(beta) + 64);
      if (form_ == Form::Root) mpfr_mul_ui(b, beta, static_cast<unsigned long>(scale_.root), MPFR_RNDN);  // exact
      else mpfr_set(b, beta, MPFR_RNDN);
    } else {
      mpfr_set_zero(b, 1);
    }
    exact_sum_of(*u, a, b);
    return u;
  }
  // out = x times the exact form's multiplier (1, 1/root or sigma): at most two roundings.
  void times_mult(mpfr_ptr out, mpfr_srcptr x, mpfr_prec_t p) const {
    if (form_ == Form::Given) {
      mpfr_set(out, x, MPFR_RNDN);
    } else if (form_ == Form::Root) {
      mpfr_div_ui(out, x, static_cast<unsigned long>(scale_.root), MPFR_RNDN);
    } else {
      Mpfr sigma(p);
      scale_.set(sigma);
      mpfr_mul(out, sigma, x, MPFR_RNDN);
    }
  }
  // out = cap tanh(sigma s / cap) at precision q; returns e with |out - G(s)| <= e 2^-q:
  // sigma s / cap carries three roundings (relative), tanh's slope is at most 1 and its own
  // rounding and the product's are relative to |tanh| <= 1.
  double capped(mpfr_ptr out, mpfr_srcptr s, mpfr_prec_t q) const {
    Mpfr y(q), sigma(q);
    scale_.set(sigma);
    mpfr_mul(y, sigma, s, MPFR_RNDN);
    const double x = abs_up(y);
    mpfr_div_d(y, y, cap_, MPFR_RNDN);
    mpfr_tanh(out, y, MPFR_RNDN);
    mpfr_mul_d(out, out, cap_, MPFR_RNDN);
    return 4 * x + 3 * cap_ + 1;
  }

  const Scale& scale_;
  const double cap_;
  const Form form_;
  std::vector<MpfrBox> u_;             // exact form: per group
  std::vector<mpfr_srcptr> s_, beta_;  // per group: its first key's score and bias (null: 0)
  std::vector<double> approx_;         // general form: the logits at 128 bits
  std::size_t ref_ = 0;
};

// P = sum_{g != ref} exp(L_g - L_ref) c_g / D (D = 1 where denom is null), computed as
// exp(L_top - L_ref) S / D with top the group of the largest weight among those with c_g !=
// 0 and S = sum_g exp(L_g - L_top) c_g. S is of the size of c_top, so P's sign
// is known whenever S's is, also where exp(L_top - L_ref) lies below MPFR's exponent range:
// P is then nonzero, of S's sign and below 2^-(2^30) ("infinitesimal"). Attention's
// perturbation of O next to the dominant group's mean (c_g = n_ref V_g - n_g V_ref, D its
// denominator times n_ref) and of the LSE next to the dominant score (c_g = n_g) are of this
// form. Error bound: exp's argument carries RowLogits' bound e 2^-p, exp its own: (e + 1)
// 2^-p relative; denom_slack bounds denom's as 2^(denom_slack - p).
struct Perturbation {
  int sign = 0;  // 0: not decided at this precision (or every c_g is 0)
  bool infinitesimal = false;
  Mpfr value{2};   // P~ (0 when infinitesimal)
  Mpfr bound{64};  // |P~ - P| <= bound
};

// exp(L_g - L_top) for every group at one precision, kept while the columns share their top
// group (most do: the runner-up's V differs from the reference group's).
struct RelativeWeights {
  std::ptrdiff_t top = -1;
  mpfr_prec_t p = 0;
  std::vector<MpfrBox> u;     // null where below MPFR's range (|u| < 2^emin)
  double e_max = 0.0;         // the largest error bound (RowLogits) of the L_g - L_top computed
};


// The group of the largest weight among those with c_g != 0; -1 where every c_g is 0.
std::ptrdiff_t top_group(const RowLogits& logits, const std::vector<mpfr_srcptr>& c) {
  std::ptrdiff_t top = -1;
  for (std::size_t g = 0; g < c.size(); ++g) {
    if (!c[g] || mpfr_zero_p(c[g])) continue;
    if (top < 0 || logits.greater(g, static_cast<std::size_t>(top))) top = static_cast<std::ptrdiff_t>(g);
  }
  return top;
}

// rw for group `top` at precision p: recomputed only where either changed.
void refresh_weights(RelativeWeights& rw, std::ptrdiff_t top, const RowLogits& logits,
                     const std::vector<mpfr_srcptr>& c, mpfr_prec_t p) {
  if (rw.top == top && rw.p == p) return;
  const auto ut = static_cast<std::size_t>(top);
  Mpfr t(p);
  rw.top = top, rw.p = p, rw.e_max = 0.0;
  rw.u.clear();
  rw.u.resize(c.size());
  for (std::size_t g = 0; g < c.size(); ++g) {
    if (!c[g]) continue;
    rw.e_max = std::max(rw.e_max, logits.difference(t, g, ut, p));
    auto u = std::make_unique<Mpfr>(p);
    if (exp_in_range(*u, t)) rw.u[g] = std::move(u);
  }
}

// S = sum_g u_g c_g at precision p into s, and s_err with |S~ - S| <= s_err: 2^(slack - p)
// sum |u_g c_g| plus what the terms below MPFR's range leave out.
void relative_sum(mpfr_ptr s, mpfr_ptr s_err, const RelativeWeights& rw, const std::vector<mpfr_srcptr>& c,
                  mpfr_prec_t p) {
  std::vector<MpfrBox> terms;
  std::vector<mpfr_ptr> ptrs;
  Mpfr rel(64), under(64), tmp(64);
  mpfr_set_zero(rel, 1), mpfr_set_zero(under, 1);
  for (std::size_t g = 0; g < c.size(); ++g) {
    if (!c[g] || mpfr_zero_p(c[g])) continue;
    if (!rw.u[g]) {  // |u c_g| < 2^emin |c_g|
      mpfr_set_ui_2exp(tmp, 1, mpfr_get_emin(), MPFR_RNDU);
      mpfr_mul(tmp, tmp, c[g], MPFR_RNDU);
      mpfr_abs(tmp, tmp, MPFR_RNDU);
      mpfr_add(under, under, tmp, MPFR_RNDU);
      continue;
    }
    terms.push_back(std::make_unique<Mpfr>(p));
    mpfr_mul(*terms.back(), *rw.u[g], c[g], MPFR_RNDN);
    ptrs.push_back(*terms.back());
    mpfr_mul(tmp, *rw.u[g], c[g], MPFR_RNDU);
    mpfr_abs(tmp, tmp, MPFR_RNDU);
    mpfr_add(rel, rel, tmp, MPFR_RNDU);
  }
  mpfr_sum(s, ptrs.data(), ptrs.size(), MPFR_RNDN);
  const long slack = 6 + static_cast<long>(std::ceil(std::log2(rw.e_max + 2.0)));
  mpfr_mul_2si(s_err, rel, slack - p, MPFR_RNDU);
  mpfr_add(s_err, s_err, under, MPFR_RNDU);
}

void perturbation(Perturbation& out, RelativeWeights& rw, const RowLogits& logits, const std::vector<mpfr_srcptr>& c,
                  mpfr_srcptr denom, long denom_slack, mpfr_prec_t p) {
  out.sign = 0;
  out.infinitesimal = false;
  const std::ptrdiff_t top = top_group(logits, c);
  if (top < 0) return;
  refresh_weights(rw, top, logits, c, p);
  Mpfr t(p), s(p), u(p), s_err(64), s_abs(64), tmp(64);
  relative_sum(s, s_err, rw, c, p);
  mpfr_abs(s_abs, s, MPFR_RNDD);
  mpfr_mul_2ui(tmp, s_err, 2, MPFR_RNDU);
  if (mpfr_cmp(s_abs, tmp) <= 0) return;  // S's relative error above 1/4: undecided
  out.sign = mpfr_sgn(s.get());
  const double e_top = logits.difference(t, static_cast<std::size_t>(top), logits.ref(), p);
  if (!exp_in_range(u, t)) {
    out.infinitesimal = true;
    mpfr_set_zero(out.value, 1), mpfr_set_zero(out.bound, 1);
    return;
  }
  mpfr_set_prec(out.value, p);
  mpfr_mul(out.value, u, s, MPFR_RNDN);
  if (denom) mpfr_div(out.value, out.value, denom, MPFR_RNDN);
  // Relative errors: S~ at most 4/3 s_err / |S~|, the top weight (e_top + 1) 2^-p, denom
  // 2^(denom_slack - p), and three roundings: P~ = P (1 + delta), |delta| <= 2 r for r <=
  // 1/4, so |P~ - P| <= 2 r |P| <= 4 r |P~|.
  Mpfr r(64);
  mpfr_div(r, s_err, s_abs, MPFR_RNDU);
  mpfr_mul_d(r, r, 4.0 / 3.0, MPFR_RNDU);
  mpfr_set_d(tmp, e_top + 4.0, MPFR_RNDU);
  mpfr_mul_2si(tmp, tmp, -p, MPFR_RNDU);
  mpfr_add(r, r, tmp, MPFR_RNDU);
  if (denom) {
    mpfr_set_ui_2exp(tmp, 1, denom_slack - p, MPFR_RNDU);
    mpfr_add(r, r, tmp, MPFR_RNDU);
  }
  mpfr_set_d(tmp, 0.25, MPFR_RNDN);
  if (mpfr_cmp(r, tmp) > 0) {
    out.sign = 0;
    return;
  }
  mpfr_abs(out.bound, out.value, MPFR_RNDU);
  mpfr_mul(out.bound, out.bound, r, MPFR_RNDU);
  mpfr_mul_2ui(out.bound, out.bound, 2, MPFR_RNDU);
}

// The case's tensors, views and scale, as every row reads them.
struct Inputs {
  Inputs(const Case& c, const std::map<std::string, Tensor>& inputs)
      : a(c.attention),
        qv(attention_view(c, "Q")), kv(attention_view(c, "K")), vv(attention_view(c, "V")),
        qt(checked_input(inputs, "Q", c.types.at("Q"), qv.elements(), kWho)),
        kt(checked_input(inputs, "K", c.types.at("K"), kv.elements(), kWho)),
        vt(checked_input(inputs, "V", c.types.at("V"), vv.elements(), kWho)),
        hd(a.head_dim), dv(a.eff_head_dim_v()),
        fast(qt.format() != Format::FP64 && kt.format() != Format::FP64), scale(scale_of(a)),
        biased(!a.alibi_slopes.empty() || !a.sinks.empty()),
        k_scale(kv_head_scales(c, "K")), v_scale(kv_head_scales(c, "V")) {}
  const AttentionShape& a;
  const AttentionView qv, kv, vv;
  const Tensor& qt;
  const Tensor& kt;
  const Tensor& vt;
  const std::int64_t hd, dv;
  const bool fast;  // scores by the superaccumulator; FP64 Q or K take the MPFR oracle
  const Scale scale;
  const bool biased;  // ALiBi or sinks: logits carry exact biases
  // An FP8 K/V cache's scales per K/V head (1 without): K's multiplies the exact q . k, V's
  // each value (an FP8 value times an FP32 scale is exact in a double).
  const std::vector<double> k_scale, v_scale;
};

// What one attempt of Ziv's loop computes once for all columns: at precision p, the
// weights w_g = exp(L_g - L_ref) and D = sum_g n_g w_g.
struct Weights {
  explicit Weights(mpfr_prec_t precision) : p(precision), denom(p), num(p), o(p) {}
  const mpfr_prec_t p;
  Mpfr denom, num, o;
  std::vector<MpfrBox> w, terms;  // terms: n_g w_g for D, then each column's w_g V_g
  std::vector<mpfr_ptr> ptrs;
  double e_max = 0.0;  // the largest error bound (RowLogits) of the L_g - L_ref
  long slack = 0;          // |O~ - O| <= 2^(slack - p) times O's magnitude
  bool dominated = false;  // the other groups' share of D below 2^-100
};

// One query row, visible keys given (-1: the head's sink, a key of score 0 and value 0 whose
// logit is the sink): its exact scores and biases, their groups, and O and the LSE decided
// exactly or by Ziv's loop. Writes the row's outputs through o, magnitude, lse.
class QueryRow {
 public:
  QueryRow(const Inputs& in, std::int64_t b, std::int64_t h, std::int64_t i, std::vector<std::int64_t> keys,
           RefValue* o, double* magnitude, RefValue& lse)
      : in_(in), a_(in.a), scale_(in.scale), b_(b), h_(h), i_(i), hk_(in.a.kv_head(h)), dv_(in.dv),
        keys_(std::move(keys)), n_(keys_.size()), o_(o), magnitude_(magnitude), lse_(lse),
        logits_(in.scale, in.a.softcap, in.biased) {}

  void compute() {
    exact_scores();
    group_scores();
    group_values();
    decide_equal_means();
    decide_single_key_lse();
    prepare_perturbations();
    for (mpfr_prec_t p = 192;; p *= 2) {
      if (p > (1 << 18)) throw_undecided();
      if (attempt(p)) break;
    }
  }

 private:
  std::size_t gd(std::size_t g, std::int64_t d) const {
    return g * static_cast<std::size_t>(dv_) + static_cast<std::size_t>(d);
  }
  double v_of(std::size_t s, std::int64_t d) const {
    return keys_[s] < 0 ? 0.0 : in_.vt.value(in_.vv.offset(b_, hk_, keys_[s], d)) * in_.v_scale[static_cast<std::size_t>(hk_)];
  }
  void decide(std::int64_t d, const RefValue& v) {
    o_[d] = v;
    decided_[static_cast<std::size_t>(d)] = true;
  }

  void exact_scores();
  void group_scores();
  void group_values();
  void times_v(mpfr_ptr out, mpfr_srcptr w, std::size_t g, std::int64_t d) const;
  MpfrBox v_exact(std::size_t g, std::int64_t d) const;
  void decide_equal_means();
  void decide_single_key_lse();
  void prepare_perturbations();
  void prepare_near(std::int64_t d);
  void weigh(Weights& at) const;
  bool attempt(mpfr_prec_t p);
  bool attempt_column(std::int64_t d, Weights& at);
  void magnitude(std::int64_t d, const Weights& at, mpfr_ptr bound) const;
  bool decide_near(std::int64_t d, const Weights& at);
  bool decide_plain(std::int64_t d, Weights& at, mpfr_srcptr bound);
  bool decide_saturated(std::int64_t d, mpfr_prec_t p);
  void lse_near(const Weights& at);
  void lse_plain(const Weights& at);
  void lse_saturated(mpfr_prec_t p);
  [[noreturn]] void throw_undecided() const;

  const Inputs& in_;
  const AttentionShape& a_;
  const Scale& scale_;
  const std::int64_t b_, h_, i_, hk_, dv_;  // hk_: the K and V head (grouped-query attention)
  const std::vector<std::int64_t> keys_;
  const std::size_t n_;
  RefValue* const o_;
  double* const magnitude_;
  RefValue& lse_;

  RowLogits logits_;
  std::vector<MpfrBox> score_, bias_;             // bias_: null where 0
  std::vector<std::vector<std::size_t>> groups_;  // indices into keys_ and score_
  std::size_t g_count_ = 0, ref_ = 0, n_ref_ = 0;
  std::vector<double> v_single_, v_abs_;  // per (group, column); v_abs_: sum |v|
  std::vector<MpfrBox> v_sum_;
  std::vector<bool> decided_;
  bool lse_done_ = false;

  // The near path's inputs: the reference group's V, c_g, and the group sizes (the LSE's c_g).
  std::vector<MpfrBox> v_ref_, c_g_, sizes_;
  std::vector<mpfr_srcptr> c_col_, group_sizes_;
  Perturbation delta_, eps_;
  RelativeWeights o_weights_, lse_weights_;
  Mpfr n_denom_{2}, lse_num_{2};  // lse_num_ / lse_den_: L_ref where rational
  unsigned long lse_den_ = 1;
};

void QueryRow::exact_scores() {
  const auto hd = static_cast<std::size_t>(in_.hd);
  score_.resize(n_);
  std::vector<float> q(hd), k(hd);
  std::vector<double> q64(hd), k64(hd);
  for (std::int64_t d = 0; d < in_.hd; ++d)
    q64[d] = in_.qt.value(in_.qv.offset(b_, h_, i_, d)), q[d] = static_cast<float>(q64[d]);
  ExactAccumulator acc;
  MpfrOracle oracle;
  bias_.resize(n_);
  for (std::size_t s = 0; s < n_; ++s) {
    score_[s] = std::make_unique<Mpfr>(2);
    if (keys_[s] < 0) {  // the sink
      mpfr_set_zero(*score_[s], 1);
      bias_[s] = std::make_unique<Mpfr>(53, a_.sink(h_));
      continue;
    }
    if (!a_.alibi_slopes.empty()) {  // slope (an FP32 value) times an integer below 2^32: exact
      bias_[s] = std::make_unique<Mpfr>(24 + 64, a_.alibi_slopes[static_cast<std::size_t>(h_)]);
      mpfr_mul_si(*bias_[s], *bias_[s], static_cast<long>(alibi_distance(a_, i_, keys_[s])), MPFR_RNDN);
      if (mpfr_zero_p(*bias_[s])) bias_[s].reset();
    }
    for (std::int64_t d = 0; d < in_.hd; ++d)
      k64[d] = in_.kt.value(in_.kv.offset(b_, hk_, keys_[s], d)), k[d] = static_cast<float>(k64[d]);
    if (in_.fast) {
      acc.clear();
      acc.add_products(q, k);
      acc.exact_value(*score_[s]);
    } else {
      oracle.dot(*score_[s], q64, k64);
    }
    const double k_scale = in_.k_scale[static_cast<std::size_t>(hk_)];
    if (k_scale != 1.0) {  // exact: 53 more bits than the sum holds
      auto scaled = std::make_unique<Mpfr>(mpfr_get_prec(*score_[s]) + 53);
      mpfr_mul_d(*scaled, *score_[s], k_scale, MPFR_RNDN);
      score_[s] = std::move(scaled);
    }
  }
  for (const auto& s : score_)
    if (!mpfr_number_p(*s)) throw InputError("attention reference: a score is NaN or infinite");
}

// Groups of keys with equal logits (RowLogits), the reference group holding the largest.
void QueryRow::group_scores() {
  groups_ = logits_.group(score_, bias_);
  g_count_ = groups_.size();
  ref_ = logits_.ref();
  n_ref_ = groups_[ref_].size();
}

// V per group: the exact sum of the group's rows. A group of one key (the usual case) keeps
// its V row as doubles; only larger groups hold MPFR sums.
void QueryRow::group_values() {
  const std::size_t cells = g_count_ * static_cast<std::size_t>(dv_);
  v_single_.resize(cells);
  v_sum_.resize(cells);
  v_abs_.resize(cells);
  ExactAccumulator acc;
  for (std::size_t g = 0; g < g_count_; ++g)
    for (std::int64_t d = 0; d < dv_; ++d) {
      if (groups_[g].size() == 1) {
        v_single_[gd(g, d)] = v_of(groups_[g][0], d);
        v_abs_[gd(g, d)] = std::fabs(v_single_[gd(g, d)]);
        continue;
      }
      acc.clear();
      double abs_sum = 0.0;
      for (std::size_t s : groups_[g]) {
        acc.add(v_of(s, d));
        abs_sum += std::fabs(v_of(s, d));
      }
      v_sum_[gd(g, d)] = std::make_unique<Mpfr>(2);
      acc.exact_value(*v_sum_[gd(g, d)]);
      v_abs_[gd(g, d)] = abs_sum;
    }
}

// out = w * V_g[d] at out's precision
void QueryRow::times_v(mpfr_ptr out, mpfr_srcptr w, std::size_t g, std::int64_t d) const {
  if (v_sum_[gd(g, d)]) mpfr_mul(out, w, *v_sum_[gd(g, d)], MPFR_RNDN);
  else mpfr_mul_d(out, w, v_single_[gd(g, d)], MPFR_RNDN);
}

MpfrBox QueryRow::v_exact(std::size_t g, std::int64_t d) const {
  auto m = std::make_unique<Mpfr>(53);
  if (v_sum_[gd(g, d)]) {
    mpfr_set_prec(*m, mpfr_get_prec(*v_sum_[gd(g, d)]));
    mpfr_set(*m, *v_sum_[gd(g, d)], MPFR_RNDN);
  } else {
    mpfr_set_d(*m, v_single_[gd(g, d)], MPFR_RNDN);
  }
  return m;
}

// Outputs that are rational: every group has the same mean, so O is that mean.
void QueryRow::decide_equal_means() {
  decided_.assign(static_cast<std::size_t>(dv_), false);
  Mpfr one(2);
  mpfr_set_ui(one, 1, MPFR_RNDN);
  for (std::int64_t d = 0; d < dv_; ++d) {
    bool equal_means = true;
    for (std::size_t g = 1; g < g_count_ && equal_means; ++g) {
      if (!v_sum_[gd(g, d)] && !v_sum_[gd(0, d)]) {  // one key each: the values themselves
        equal_means = v_single_[gd(g, d)] == v_single_[gd(0, d)];
        continue;
      }
      // V_g n_0 == V_0 n_g, exactly (precision: any V sum of doubles, times a count)
      Mpfr lhs(4400), rhs(4400);
      times_v(lhs, one, g, d);
      times_v(rhs, one, 0, d);
      mpfr_mul_ui(lhs, lhs, groups_[0].size(), MPFR_RNDN);
      mpfr_mul_ui(rhs, rhs, groups_[g].size(), MPFR_RNDN);
      equal_means = mpfr_equal_p(lhs, rhs) != 0;
    }
    if (!equal_means) continue;
    ExactAccumulator acc;
    for (std::size_t s = 0; s < n_; ++s) acc.add(v_of(s, d));
    Mpfr total(2);
    acc.exact_value(total);
    decide(d, exact_quotient(total, static_cast<unsigned long>(n_)));
  }
}

// The LSE of a single key is its logit: exact where it is rational (the exact form with a
// given sigma or 1/root) or the score is 0 (the logit then is the bias); otherwise irrational
// and left to Ziv's loop.
void QueryRow::decide_single_key_lse() {
  if (n_ != 1) return;
  Mpfr num(2);
  unsigned long den = 1;
  if (logits_.rational(0, num, den)) {
    lse_ = den == 1 ? RefValue::from_exact(num) : exact_quotient(num, den);
  } else if (logits_.zero_score(0)) {
    mpfr_set_prec(num, 64);
    if (logits_.bias(0)) lse_ = RefValue::from_exact(logits_.bias(0));
    else mpfr_set_zero(num, 1), lse_ = RefValue::from_exact(num);
  } else {
    return;
  }
  if (lse_.kind == RefValue::Kind::Zero) lse_ = RefValue::zero(false);  // log 1 = +0
  lse_done_ = true;
}

// O = mu + delta with mu = V_ref / n_ref, the reference group's mean, and delta = sum_{g !=
// ref} w_g c_g / (n_ref D), c_g = n_ref V_g - n_g V_ref (exact): when one group dominates,
// delta is tiny and known to its own relative precision, which decides O next to mu
// (window_near) without the precision of mu - O. The LSE's perturbation takes c_g = n_g.
void QueryRow::prepare_perturbations() {
  v_ref_.resize(static_cast<std::size_t>(dv_));
  c_g_.resize(g_count_ * static_cast<std::size_t>(dv_));
  c_col_.resize(g_count_);
  sizes_.resize(g_count_);
  group_sizes_.resize(g_count_);
  for (std::size_t g = 0; g < g_count_; ++g) {
    if (g == ref_) continue;
    sizes_[g] = std::make_unique<Mpfr>(64);
    mpfr_set_ui(*sizes_[g], groups_[g].size(), MPFR_RNDN);
    group_sizes_[g] = *sizes_[g];
  }
}

// Computed for d once the first, plain attempt has not decided it (most outputs are decided
// there, and these exact differences cost as much as that attempt).
void QueryRow::prepare_near(std::int64_t d) {
  v_ref_[d] = v_exact(ref_, d);
  for (std::size_t g = 0; g < g_count_; ++g) {
    if (g == ref_) continue;
    const MpfrBox vg = v_exact(g, d);
    Mpfr x(mpfr_get_prec(*vg) + 64), y(mpfr_get_prec(*v_ref_[d]) + 64);
    mpfr_mul_ui(x, *vg, n_ref_, MPFR_RNDN);                   // exact
    mpfr_mul_ui(y, *v_ref_[d], groups_[g].size(), MPFR_RNDN);  // exact
    mpfr_neg(y, y, MPFR_RNDN);
    c_g_[gd(g, d)] = std::make_unique<Mpfr>(2);
    exact_sum_of(*c_g_[gd(g, d)], x, y);
  }
}

void QueryRow::weigh(Weights& at) const {
  const mpfr_prec_t p = at.p;
  Mpfr t(p);
  at.w.resize(g_count_);
  for (std::size_t g = 0; g < g_count_; ++g) {
    at.w[g] = std::make_unique<Mpfr>(p);
    at.e_max = std::max(at.e_max, logits_.difference(t, g, ref_, p));
    mpfr_exp(*at.w[g], t, MPFR_RNDN);
  }
  // |w~ - w| <= (e + 1) 2^-p w: exp's argument carries RowLogits' bound e, exp its own
  // rounding.
  at.terms.resize(g_count_);
  at.ptrs.resize(g_count_);
  for (std::size_t g = 0; g < g_count_; ++g) {
    at.terms[g] = std::make_unique<Mpfr>(p);
    mpfr_mul_ui(*at.terms[g], *at.w[g], groups_[g].size(), MPFR_RNDN);
    at.ptrs[g] = *at.terms[g];
  }
  mpfr_sum(at.denom, at.ptrs.data(), g_count_, MPFR_RNDN);
  // The other groups' share of the weight: below 2^-100, the plain attempt cannot decide an
  // output next to the dominant mean, so the near path goes first.
  if (g_count_ > 1) {
    Mpfr others_sum(64);
    std::vector<mpfr_ptr> others;
    for (std::size_t g = 0; g < g_count_; ++g)
      if (g != ref_) others.push_back(*at.terms[g]);
    mpfr_sum(others_sum, others.data(), others.size(), MPFR_RNDU);
    at.dominated = mpfr_zero_p(others_sum) || mpfr_get_exp(others_sum) < -100;
  }
  at.slack = 6 + static_cast<long>(std::ceil(std::log2(at.e_max + 2.0)));
}

// One attempt of Ziv's loop at precision p: true once every output of the row is decided.
bool QueryRow::attempt(mpfr_prec_t p) {
  Weights at(p);
  mpfr_set_prec(n_denom_, p + 32);
  weigh(at);
  bool all = true;
  for (std::int64_t d = 0; d < dv_; ++d) all = attempt_column(d, at) && all;
  if (!lse_done_ && n_ref_ == 1 && g_count_ > 1 && logits_.rational(ref_, lse_num_, lse_den_)) lse_near(at);
  if (!lse_done_) lse_plain(at);
  if (!lse_done_ && p > 192) lse_saturated(p);
  return all && lse_done_;
}

// Column d's magnitude at this precision, and its O where still undecided: next to the
// dominant group's mean first where that path is prepared, then by the plain quotient.
bool QueryRow::attempt_column(std::int64_t d, Weights& at) {
  Mpfr bound(64);
  magnitude(d, at, bound);
  if (decided_[static_cast<std::size_t>(d)]) return true;
  if ((at.p > 192 || at.dominated) && g_count_ > 1 && !v_ref_[d]) prepare_near(d);
  if (v_ref_[d] && decide_near(d, at)) return true;
  return decide_plain(d, at, bound) || decide_saturated(d, at.p);
}

// magnitude: sum_g w_g sum|v| / D, bounded above in 64 bits
void QueryRow::magnitude(std::int64_t d, const Weights& at, mpfr_ptr bound) const {
  Mpfr tmp(64);
  mpfr_set_zero(bound, 1);
  for (std::size_t g = 0; g < g_count_; ++g) {
    mpfr_mul_d(tmp, *at.w[g], v_abs_[gd(g, d)], MPFR_RNDU);
    mpfr_add(bound, bound, tmp, MPFR_RNDU);
  }
  mpfr_div(bound, bound, at.denom, MPFR_RNDU);
  magnitude_[d] = mpfr_get_d(bound, MPFR_RNDN);
}

// O = mu + delta, decided from delta's sign and size where they keep |O| inside one window.
bool QueryRow::decide_near(std::int64_t d, const Weights& at) {
  for (std::size_t g = 0; g < g_count_; ++g) c_col_[g] = g == ref_ ? nullptr : c_g_[gd(g, d)]->get();
  mpfr_mul_ui(n_denom_, at.denom, n_ref_, MPFR_RNDN);
  perturbation(delta_, o_weights_, logits_, c_col_, n_denom_, at.slack + 1, at.p);
  if (delta_.sign == 0) return false;
  if (!mpfr_zero_p(*v_ref_[d])) {
    const bool negative = mpfr_sgn(v_ref_[d]->get()) < 0;  // |O| = |mu| + delta sgn(mu)
    Mpfr lo(at.p + 64), hi(at.p + 64);
    mpfr_sub(lo, delta_.value, delta_.bound, MPFR_RNDD);
    mpfr_add(hi, delta_.value, delta_.bound, MPFR_RNDU);
    if (negative) mpfr_swap(lo, hi), mpfr_neg(lo, lo, MPFR_RNDD), mpfr_neg(hi, hi, MPFR_RNDU);
    const auto near = window_near(*v_ref_[d], static_cast<unsigned long>(n_ref_), lo, hi, negative,
                                  negative ? -delta_.sign : delta_.sign);
    if (near) decide(d, *near);
    return near.has_value();
  }
  if (delta_.infinitesimal) {  // mu = 0: O = delta
    decide(d, RefValue::tiny(delta_.sign < 0));
    return true;
  }
  if (mpfr_zero_p(delta_.bound)) return false;
  const long err = static_cast<long>(mpfr_get_exp(delta_.value)) - static_cast<long>(mpfr_get_exp(delta_.bound));
  if (!mpfr_can_round(delta_.value, err, MPFR_RNDN, MPFR_RNDZ, 128)) return false;
  decide(d, RefValue::from_certified(delta_.value));
  return true;
}

// O = sum_g w_g V_g / D at this precision.
bool QueryRow::decide_plain(std::int64_t d, Weights& at, mpfr_srcptr bound) {
  for (std::size_t g = 0; g < g_count_; ++g) times_v(*at.terms[g], *at.w[g], g, d);
  mpfr_sum(at.num, at.ptrs.data(), g_count_, MPFR_RNDN);
  mpfr_div(at.o, at.num, at.denom, MPFR_RNDN);
  // |O~ - O| <= 2^(slack - p) sum_j p_j |v_j| (the magnitude, bounded above). Weights below
  // MPFR's range (|w| < 2^-(2^30)) are 0 in both: the bound covers what they leave out while
  // it is above 2^-(2^20) (p <= 2^18), and the near path decides the rest.
  if (mpfr_zero_p(at.o) || mpfr_zero_p(bound) || mpfr_get_exp(bound) < -(1L << 20)) return false;
  const long err = static_cast<long>(mpfr_get_exp(at.o)) - (static_cast<long>(mpfr_get_exp(bound)) + at.slack - at.p);
  if (!mpfr_can_round(at.o, err, MPFR_RNDN, MPFR_RNDZ, 128)) return false;
  decide(d, RefValue::from_certified(at.o));
  return true;
}

// A soft cap that every score is far beyond: all logits are cap tanh(y) within 2^-p of the
// same +-cap, the weights w_g = 1 + e_g with e_g = expm1(L_g - L_ref) below 2^-32, and O lies
// within that of the plain mean M = V / N of the row's values (V their exact sum, N the
// keys), a rational the plain attempt cannot round past where it is a 128-bit number. Then
// O - M = sum_g e_g c_g / (N D), c_g = N V_g - n_g V (exact), D = N + sum_g n_g e_g, and the
// e_g come from RowLogits::relative_difference, relative to themselves: their sign and size
// decide O next to M (window_near) as decide_near does next to one dominant group.
bool QueryRow::decide_saturated(std::int64_t d, mpfr_prec_t p) {
  if (a_.softcap == 0 || g_count_ < 2) return false;
  const auto n = static_cast<unsigned long>(n_);
  std::vector<MpfrBox> terms;
  std::vector<mpfr_ptr> ptrs;
  Mpfr diff(p), e(p), v(2), c(2), x(2), y(2), mag(64), nsum(64), tmp(64);
  mpfr_set_zero(mag, 1), mpfr_set_zero(nsum, 1);
  {
    ExactAccumulator acc;
    for (std::size_t s = 0; s < n_; ++s) acc.add(v_of(s, d));
    acc.exact_value(v);
  }
  double e_max = 0;
  for (std::size_t g = 0; g < g_count_; ++g) {
    if (g == ref_) continue;
    double eg = 0;
    if (!logits_.relative_difference(diff, eg, g, ref_, p)) return false;
    if (!mpfr_zero_p(diff) && mpfr_get_exp(diff) > -32) return false;  // not saturated: Ziv's plain loop decides
    mpfr_expm1(e, diff, MPFR_RNDN);  // relative error (eg + 2) 2^-p: expm1's slope is about 1 here
    e_max = std::max(e_max, eg + 2);
    mpfr_abs(tmp, e, MPFR_RNDU);
    mpfr_mul_ui(tmp, tmp, groups_[g].size(), MPFR_RNDU);
    mpfr_add(nsum, nsum, tmp, MPFR_RNDU);  // sum n_g |e_g|
    const MpfrBox vg = v_exact(g, d);
    mpfr_set_prec(x, mpfr_get_prec(*vg) + 64), mpfr_set_prec(y, mpfr_get_prec(v) + 64);
    mpfr_mul_ui(x, *vg, n, MPFR_RNDN);                   // exact
    mpfr_mul_ui(y, v, groups_[g].size(), MPFR_RNDN);     // exact
    mpfr_neg(y, y, MPFR_RNDN);
    exact_sum_of(c, x, y);
    if (mpfr_zero_p(c)) continue;
    terms.push_back(std::make_unique<Mpfr>(p));
    mpfr_mul(*terms.back(), e, c, MPFR_RNDN);
    ptrs.push_back(*terms.back());
    mpfr_abs(tmp, *terms.back(), MPFR_RNDU);
    mpfr_add(mag, mag, tmp, MPFR_RNDU);
  }
  if (terms.empty()) return false;
  Mpfr sum(p), err(64);
  mpfr_sum(sum, ptrs.data(), ptrs.size(), MPFR_RNDN);
  // |S~ - S| <= ((e_max + 2) sum |T_g| + |S~|) 2^-p: each term's factors and product, the sum.
  mpfr_mul_d(err, mag, e_max + 2, MPFR_RNDU);
  mpfr_abs(tmp, sum, MPFR_RNDU);
  mpfr_add(err, err, tmp, MPFR_RNDU);
  mpfr_mul_2si(err, err, -p, MPFR_RNDU);
  mpfr_abs(tmp, sum, MPFR_RNDD);
  if (mpfr_cmp(tmp, err) <= 0) return false;  // sign undecided at this precision
  const int sign = mpfr_sgn(sum.get());
  // Delta = S / (N D), D in [N - sum n_g |e_g|, N + sum n_g |e_g|]: |Delta| in [lo, hi]. D's
  // bounds carry p + 64 bits: where M = 0, O is Delta itself and needs them to 128 bits.
  Mpfr lo(p + 64), hi(p + 64), dlo(p + 64), dhi(p + 64);
  mpfr_set_ui(dlo, n, MPFR_RNDN), mpfr_set_ui(dhi, n, MPFR_RNDN);
  mpfr_sub(dlo, dlo, nsum, MPFR_RNDD), mpfr_add(dhi, dhi, nsum, MPFR_RNDU);
  mpfr_mul_ui(dlo, dlo, n, MPFR_RNDD), mpfr_mul_ui(dhi, dhi, n, MPFR_RNDU);
  mpfr_abs(lo, sum, MPFR_RNDD);  // exact: tmp holds |S~| to 64 bits only
  mpfr_sub(lo, lo, err, MPFR_RNDD);
  mpfr_div(lo, lo, dhi, MPFR_RNDD);
  mpfr_abs(hi, sum, MPFR_RNDU);
  mpfr_add(hi, hi, err, MPFR_RNDU);
  mpfr_div(hi, hi, dlo, MPFR_RNDU);
  if (sign < 0) mpfr_swap(lo, hi), mpfr_neg(lo, lo, MPFR_RNDD), mpfr_neg(hi, hi, MPFR_RNDU);  // Delta's own range
  if (mpfr_zero_p(v)) {  // M = 0: O = Delta
    if (!mpfr_number_p(lo) || mpfr_zero_p(lo) || mpfr_zero_p(hi)) return false;
    Mpfr a(128), b(128);
    mpfr_set(a, lo, MPFR_RNDZ), mpfr_set(b, hi, MPFR_RNDZ);
    if (!mpfr_equal_p(a, b) || mpfr_equal_p(a, lo) || mpfr_equal_p(b, hi)) return false;  // lo, hi in one 128-bit window
    decide(d, RefValue::from_certified(lo));
    return true;
  }
  const bool negative = mpfr_sgn(v.get()) < 0;  // |O| = |M| + Delta sgn(M)
  if (negative) mpfr_swap(lo, hi), mpfr_neg(lo, lo, MPFR_RNDD), mpfr_neg(hi, hi, MPFR_RNDU);
  const auto near = window_near(v, n, lo, hi, negative, negative ? -sign : sign);
  if (near) decide(d, *near);
  return near.has_value();
}

// LSE = m + log1p(eps), m = L_ref = lse_num_ / lse_den_ rational, eps = sum_{g != ref} n_g
// w_g: next to m when one key dominates (as O next to mu).
void QueryRow::lse_near(const Weights& at) {
  const mpfr_prec_t p = at.p;
  mpfr_srcptr m_num = lse_num_;
  const unsigned long m_den = lse_den_;
  perturbation(eps_, lse_weights_, logits_, group_sizes_, nullptr, 0, p);  // eps > 0
  if (eps_.sign <= 0) return;
  if (mpfr_zero_p(m_num)) {  // LSE = log1p(eps), in (eps - eps^2 / 2, eps)
    if (eps_.infinitesimal) {
      lse_ = RefValue::tiny(false), lse_done_ = true;
      return;
    }
    Mpfr lo(p + 64), hi(p + 64), sq(p + 64), a(128), b(128);
    mpfr_add(hi, eps_.value, eps_.bound, MPFR_RNDU);  // above eps, so above log1p(eps)
    mpfr_sqr(sq, hi, MPFR_RNDU);
    mpfr_sub(lo, eps_.value, eps_.bound, MPFR_RNDD);
    mpfr_sub(lo, lo, sq, MPFR_RNDD);                   // below eps - eps^2, so below log1p(eps)
    if (mpfr_sgn(lo.get()) <= 0) return;
    mpfr_set(a, lo, MPFR_RNDZ), mpfr_set(b, hi, MPFR_RNDZ);
    if (!mpfr_equal_p(a, b) || mpfr_equal_p(a, lo) || mpfr_equal_p(b, hi)) return;
    lse_ = RefValue::from_certified(lo), lse_done_ = true;
    return;
  }
  const bool negative = mpfr_sgn(m_num) < 0;  // |LSE| = |m| + log1p(eps) sgn(m)
  Mpfr lo(p + 64), hi(p + 64);
  mpfr_set_zero(lo, 1), mpfr_set_zero(hi, 1);
  if (!eps_.infinitesimal) {
    // log1p(eps) <= eps, and its derivative is below 1: |l~ - l| <= eps's bound + 2^-p l~
    Mpfr l(p), eb(64);
    mpfr_log1p(l, eps_.value, MPFR_RNDN);
    mpfr_mul_2si(eb, l, -p, MPFR_RNDU);
    mpfr_add(eb, eb, eps_.bound, MPFR_RNDU);
    mpfr_sub(lo, l, eb, MPFR_RNDD);
    mpfr_add(hi, l, eb, MPFR_RNDU);
    if (negative) mpfr_swap(lo, hi), mpfr_neg(lo, lo, MPFR_RNDD), mpfr_neg(hi, hi, MPFR_RNDU);
  }
  if (auto near = window_near(m_num, m_den, lo, hi, negative, negative ? -1 : 1)) {
    lse_ = *near;
    lse_done_ = true;
  }
}

// One key under a soft cap it is far beyond: LSE = its logit = r + delta (RowLogits::
// saturated), within e^-(2|y|) of the rational r (-cap, or cap, plus the bias), which Ziv's
// loop cannot round past where r is a 128-bit number; delta, known relative to itself,
// decides it next to r.
void QueryRow::lse_saturated(mpfr_prec_t p) {
  if (g_count_ != 1 || n_ref_ != 1) return;
  Mpfr r(2), delta(p), lo(p + 64), hi(p + 64), err(64);
  double e = 0;
  if (!logits_.saturated(r, delta, e, ref_, p) || mpfr_zero_p(delta)) return;
  mpfr_abs(err, delta, MPFR_RNDU);
  mpfr_mul_d(err, err, e, MPFR_RNDU);
  mpfr_mul_2si(err, err, -p, MPFR_RNDU);
  mpfr_sub(lo, delta, err, MPFR_RNDD);
  mpfr_add(hi, delta, err, MPFR_RNDU);
  if (mpfr_sgn(lo.get()) != mpfr_sgn(hi.get())) return;
  const int sign = mpfr_sgn(delta.get());
  if (mpfr_zero_p(r)) {  // LSE = delta
    Mpfr a(128), b(128);
    mpfr_set(a, lo, MPFR_RNDZ), mpfr_set(b, hi, MPFR_RNDZ);
    if (!mpfr_equal_p(a, b) || mpfr_equal_p(a, lo) || mpfr_equal_p(b, hi)) return;
    lse_ = RefValue::from_certified(lo);
    lse_done_ = true;
    return;
  }
  const bool negative = mpfr_sgn(r.get()) < 0;  // |LSE| = |r| + delta sgn(r)
  if (negative) mpfr_swap(lo, hi), mpfr_neg(lo, lo, MPFR_RNDD), mpfr_neg(hi, hi, MPFR_RNDU);
  if (auto near = window_near(r, 1, lo, hi, negative, negative ? -sign : sign)) {
    lse_ = *near;
    lse_done_ = true;
  }
}

// LSE = L_ref + log D: error below 2^(slack - p) (|m| + |log D| + |LSE| + 1) plus m's own
// bound e_m 2^-p.
void QueryRow::lse_plain(const Weights& at) {
  const mpfr_prec_t p = at.p;
  Mpfr m(p), l(p), lse_v(p), bound(64), tmp(64);
  const double e_m = logits_.value(m, ref_, p);
  mpfr_log(l, at.denom, MPFR_RNDN);
  mpfr_add(lse_v, m, l, MPFR_RNDN);
  mpfr_set_d(bound, e_m + 1, MPFR_RNDU);
  for (mpfr_srcptr x : {m.get(), l.get(), lse_v.get()}) {
    mpfr_abs(tmp, x, MPFR_RNDU);
    mpfr_add(bound, bound, tmp, MPFR_RNDU);
  }
  if (mpfr_zero_p(lse_v)) return;
  const long err = static_cast<long>(mpfr_get_exp(lse_v)) - (static_cast<long>(mpfr_get_exp(bound)) + at.slack - p);
  if (mpfr_can_round(lse_v, err, MPFR_RNDN, MPFR_RNDZ, 128)) {
    lse_ = RefValue::from_certified(lse_v);
    lse_done_ = true;
  }
}

void QueryRow::throw_undecided() const {
  std::string undecided;
  for (std::int64_t d = 0; d < dv_; ++d)
    if (!decided_[static_cast<std::size_t>(d)]) undecided += fmt::format("{}{}", undecided.empty() ? "" : ",", d);
  throw std::runtime_error(fmt::format(
      "attention reference: rounding not decided at 2^18 bits (batch {}, head {}, query {}: {} keys in {} score "
      "groups; output columns [{}]{})", b_, h_, i_, n_, g_count_, undecided, lse_done_ ? "" : ", the log-sum-exp"));
}

// Row `row` of the output (indexed as AttentionReference::row), skipped (+0) where `only`
// leaves it out.
void reference_row(const Case& c, const Inputs& in, std::int64_t row, const std::vector<char>* only,
                   AttentionReference& out) {
  const AttentionShape& a = in.a;
  const std::int64_t dv = in.dv;
  RefValue& lse = out.lse[static_cast<std::size_t>(row)];
  if (only && !(*only)[static_cast<std::size_t>(row)]) {
    lse = RefValue::zero(false);
    return;
  }
  const std::int64_t i = row % a.seq_q, h = (row / a.seq_q) % a.heads, b = row / (a.seq_q * a.heads);
  std::vector<std::int64_t> keys;
  const KeyRange visible = attention_visible_keys(c, b, i);
  for (std::int64_t j = visible.first; j < visible.end; ++j) keys.push_back(j);
  if (a.sink(h) != -INFINITY) keys.push_back(-1);
  RefValue* o = out.values.data() + row * dv;
  if (keys.empty()) {  // fully masked: the documented convention
    for (std::int64_t d = 0; d < dv; ++d) o[d] = RefValue::zero(false);
    lse = RefValue::infinity(true);
    return;
  }
  QueryRow(in, b, h, i, std::move(keys), o, out.magnitude.data() + row * dv, lse).compute();
}

}  // namespace

AttentionReference attention_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                                       unsigned threads, const std::vector<char>* only) {
  const ReferenceFpEnv env;  // whatever a kernel left set; parallel_for's threads inherit it
  if (c.op != Op::Attention) throw InputError("attention reference: case.op is not attention");
  const Inputs in(c, inputs);
  const AttentionShape& a = in.a;
  AttentionReference out;
  out.batch = a.batch, out.heads = a.heads, out.seq_q = a.seq_q, out.head_dim_v = in.dv;
  out.o_format = c.types.count("O") ? c.types.at("O") : Format::FP16;
  const std::int64_t rows = a.batch * a.heads * a.seq_q;
  if (only && static_cast<std::int64_t>(only->size()) != rows)
    throw std::invalid_argument("attention reference: the row mask has the wrong size");
  out.values.resize(static_cast<std::size_t>(rows * in.dv));
  out.magnitude.resize(static_cast<std::size_t>(rows * in.dv));
  out.lse.resize(static_cast<std::size_t>(rows));

  // A thread per 2^15 terms at least (each row also rounds its exp with MPFR): small
  // cases run on the calling thread.
  const std::int64_t computed = only ? std::count(only->begin(), only->end(), 1) : rows;
  threads = threads_for(static_cast<double>(computed) * static_cast<double>(a.seq_kv) * static_cast<double>(in.hd + in.dv),
                        0x1p15, threads);
  parallel_for(rows, [&](std::int64_t row) { reference_row(c, in, row, only, out); }, threads);
  return out;
}

}  // namespace ulpgate
