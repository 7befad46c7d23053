#include "references/attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <climits>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format_mpfr.hpp"
#include "references/exact_dot.hpp"
#include "references/fp_env.hpp"

namespace ulpgate {
namespace {

using MpfrBox = std::unique_ptr<Mpfr>;

const Tensor& input(const std::map<std::string, Tensor>& inputs, const Case& c,
                    const std::string& operand, std::int64_t elements) {
  const auto it = inputs.find(operand);
  if (it == inputs.end()) throw InputError("attention reference: input " + operand + " missing");
  const Format f = c.types.at(operand);
  if (it->second.format() != f)
    throw InputError(fmt::format("attention reference: input {} is {}, the case says {}", operand,
                                 name(it->second.format()), name(f)));
  if (static_cast<std::int64_t>(it->second.size()) < elements)
    throw InputError(fmt::format("attention reference: input {} has {} elements, its view needs {}",
                                 operand, it->second.size(), elements));
  return it->second;
}

// The softmax scale: a given double, or exactly 1/sqrt(head_dim).
struct Scale {
  bool given = false;
  double value = 0.0;    // when given
  long head_dim = 1;     // otherwise
  long root = 0;         // sqrt(head_dim) when head_dim is a perfect square, else 0
  int sign() const { return given ? (value > 0) - (value < 0) : 1; }
  /// sigma at precision p: exact when given, else correctly rounded (relative error 2^-p).
  void set(mpfr_ptr out) const {
    if (given) mpfr_set_d(out, value, MPFR_RNDN);
    else {
      mpfr_set_ui(out, static_cast<unsigned long>(head_dim), MPFR_RNDN);
      mpfr_rec_sqrt(out, out, MPFR_RNDN);
    }
  }
};

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

// exp(t) at out's precision; false where it lies below MPFR's exponent range (|exp(t)| <
// 2^emin, out then 0 or the smallest positive number).
bool exp_in_range(mpfr_ptr out, mpfr_srcptr t) {
  mpfr_clear_underflow();
  mpfr_exp(out, t, MPFR_RNDN);
  return !mpfr_underflow_p();
}

// P = sum_{g != ref} exp(sigma diff_g) c_g / D (D = 1 where denom is null), computed as
// exp(sigma diff_top) S / D with top the group of the largest weight among those with c_g !=
// 0 and S = sum_g exp(sigma (diff_g - diff_top)) c_g. S is of the size of c_top, so P's sign
// is known whenever S's is, also where exp(sigma diff_top) lies below MPFR's exponent range:
// P is then nonzero, of S's sign and below 2^-(2^30) ("infinitesimal"). Attention's
// perturbation of O next to the dominant group's mean (c_g = n_ref V_g - n_g V_ref, D its
// denominator times n_ref) and of the LSE next to the dominant score (c_g = n_g) are of this
// form. Error bound: exp's argument carries sigma's and its product's rounding, exp its own
// (2 |t| + 1) 2^-p relative; denom_slack bounds denom's as 2^(denom_slack - p).
struct Perturbation {
  int sign = 0;  // 0: not decided at this precision (or every c_g is 0)
  bool infinitesimal = false;
  Mpfr value{2};   // P~ (0 when infinitesimal)
  Mpfr bound{64};  // |P~ - P| <= bound
};

// exp(sigma (diff_g - diff_top)) for every group at one precision, kept while the columns
// share their top group (most do: the runner-up's V differs from the reference group's).
struct RelativeWeights {
  std::ptrdiff_t top = -1;
  mpfr_prec_t p = 0;
  std::vector<MpfrBox> u;     // null where below MPFR's range (|u| < 2^emin)
  double t_max = 0.0;         // the largest |sigma (diff_g - diff_top)| computed
};

void perturbation(Perturbation& out, RelativeWeights& rw, mpfr_srcptr sigma, int sigma_sign,
                  const std::vector<MpfrBox>& diff, const std::vector<mpfr_srcptr>& c, mpfr_srcptr denom,
                  long denom_slack, mpfr_prec_t p) {
  out.sign = 0;
  out.infinitesimal = false;
  std::ptrdiff_t top = -1;
  for (std::size_t g = 0; g < c.size(); ++g) {
    if (!c[g] || mpfr_zero_p(c[g])) continue;
    const int order = mpfr_cmp(*diff[g], *diff[static_cast<std::size_t>(std::max<std::ptrdiff_t>(top, 0))]);
    if (top < 0 || (sigma_sign > 0 ? order > 0 : order < 0)) top = static_cast<std::ptrdiff_t>(g);
  }
  if (top < 0) return;
  const auto ut = static_cast<std::size_t>(top);
  Mpfr x(2), t(p), s(p), rel(64), under(64), tmp(64);
  if (rw.top != top || rw.p != p) {
    rw.top = top, rw.p = p, rw.t_max = 0.0;
    rw.u.clear();
    rw.u.resize(c.size());
    for (std::size_t g = 0; g < c.size(); ++g) {
      if (!c[g]) continue;
      exact_difference(x, *diff[g], *diff[ut]);
      mpfr_mul(t, sigma, x, MPFR_RNDN);
      rw.t_max = std::max(rw.t_max, std::fabs(mpfr_get_d(t, MPFR_RNDA)));
      auto u = std::make_unique<Mpfr>(p);
      if (exp_in_range(*u, t)) rw.u[g] = std::move(u);
    }
  }
  std::vector<MpfrBox> terms;
  std::vector<mpfr_ptr> ptrs;
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
  const double t_max = rw.t_max;
  Mpfr u(p);
  mpfr_sum(s, ptrs.data(), ptrs.size(), MPFR_RNDN);
  // |S~ - S| <= 2^(slack - p) sum |u_g c_g| + the terms below range
  const long slack = 6 + static_cast<long>(std::ceil(std::log2(2.0 * t_max + 2.0)));
  Mpfr s_err(64), s_abs(64);
  mpfr_mul_2si(s_err, rel, slack - p, MPFR_RNDU);
  mpfr_add(s_err, s_err, under, MPFR_RNDU);
  mpfr_abs(s_abs, s, MPFR_RNDD);
  mpfr_mul_2ui(tmp, s_err, 2, MPFR_RNDU);
  if (mpfr_cmp(s_abs, tmp) <= 0) return;  // S's relative error above 1/4: undecided
  out.sign = mpfr_sgn(s.get());
  mpfr_mul(t, sigma, *diff[ut], MPFR_RNDN);
  const double t_top = std::fabs(mpfr_get_d(t, MPFR_RNDA));
  if (!exp_in_range(u, t)) {
    out.infinitesimal = true;
    mpfr_set_zero(out.value, 1), mpfr_set_zero(out.bound, 1);
    return;
  }
  mpfr_set_prec(out.value, p);
  mpfr_mul(out.value, u, s, MPFR_RNDN);
  if (denom) mpfr_div(out.value, out.value, denom, MPFR_RNDN);
  // Relative errors: S~ at most 4/3 s_err / |S~|, the top weight (2 |t| + 1) 2^-p, denom
  // 2^(denom_slack - p), and three roundings: P~ = P (1 + delta), |delta| <= 2 r for r <=
  // 1/4, so |P~ - P| <= 2 r |P| <= 4 r |P~|.
  Mpfr r(64);
  mpfr_div(r, s_err, s_abs, MPFR_RNDU);
  mpfr_mul_d(r, r, 4.0 / 3.0, MPFR_RNDU);
  mpfr_set_d(tmp, 2.0 * t_top + 4.0, MPFR_RNDU);
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

// log2 of an upper bound of |x| (x finite), for error bounds.
long log2_bound(mpfr_srcptr x) { return mpfr_zero_p(x) ? LONG_MIN / 4 : static_cast<long>(mpfr_get_exp(x)); }

struct Row {
  std::vector<std::int64_t> keys;  // visible keys
};

}  // namespace

AttentionReference attention_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                                       unsigned threads, const std::vector<char>* only) {
  const ReferenceFpEnv env;  // whatever a kernel left set; parallel_for's threads inherit it
  if (c.op != Op::Attention) throw InputError("attention reference: case.op is not attention");
  const AttentionShape& a = c.attention;
  const AttentionView qv = attention_view(c, "Q"), kv = attention_view(c, "K"),
                      vv = attention_view(c, "V");
  const Tensor& qt = input(inputs, c, "Q", qv.elements());
  const Tensor& kt = input(inputs, c, "K", kv.elements());
  const Tensor& vt = input(inputs, c, "V", vv.elements());
  const std::int64_t hd = a.head_dim, dv = a.eff_head_dim_v();
  const bool fast = qt.format() != Format::FP64 && kt.format() != Format::FP64;

  Scale scale;
  if (a.softmax_scale) {
    scale.given = true;
    scale.value = *a.softmax_scale;
  } else {
    scale.head_dim = static_cast<long>(hd);
    const auto r = static_cast<long>(std::llround(std::sqrt(static_cast<double>(hd))));
    if (r * r == hd) scale.root = r;
  }

  AttentionReference out;
  out.batch = a.batch, out.heads = a.heads, out.seq_q = a.seq_q, out.head_dim_v = dv;
  out.o_format = c.types.count("O") ? c.types.at("O") : Format::FP16;
  const std::int64_t rows = a.batch * a.heads * a.seq_q;
  if (only && static_cast<std::int64_t>(only->size()) != rows)
    throw std::invalid_argument("attention reference: the row mask has the wrong size");
  out.values.resize(static_cast<std::size_t>(rows * dv));
  out.magnitude.resize(static_cast<std::size_t>(rows * dv));
  out.lse.resize(static_cast<std::size_t>(rows));

  // A thread per 2^15 terms at least (each row also rounds its exp with MPFR): small
  // cases run on the calling thread.
  const std::int64_t computed = only ? std::count(only->begin(), only->end(), 1) : rows;
  threads = threads_for(static_cast<double>(computed) * static_cast<double>(a.seq_kv) * static_cast<double>(hd + dv), 0x1p15,
                        threads);
  parallel_for(rows, [&](std::int64_t row) {
    if (only && !(*only)[static_cast<std::size_t>(row)]) {
      out.lse[static_cast<std::size_t>(row)] = RefValue::zero(false);
      return;
    }
    const std::int64_t i = row % a.seq_q, h = (row / a.seq_q) % a.heads, b = row / (a.seq_q * a.heads);
    const std::int64_t hk = a.kv_head(h);  // K and V head (grouped-query attention)
    std::vector<std::int64_t> keys;
    for (std::int64_t j = 0; j < a.seq_kv; ++j)
      if (attention_visible(c, b, i, j)) keys.push_back(j);
    const auto o_at = [&](std::int64_t d) { return static_cast<std::size_t>(row * dv + d); };
    if (keys.empty()) {  // fully masked: the documented convention
      for (std::int64_t d = 0; d < dv; ++d) out.values[o_at(d)] = RefValue::zero(false);
      out.lse[static_cast<std::size_t>(row)] = RefValue::infinity(true);
      return;
    }

    // Exact scores q_i . k_j.
    const std::size_t n = keys.size();
    std::vector<MpfrBox> score(n);
    {
      std::vector<float> q(static_cast<std::size_t>(hd)), k(static_cast<std::size_t>(hd));
      std::vector<double> q64(static_cast<std::size_t>(hd)), k64(static_cast<std::size_t>(hd));
      for (std::int64_t d = 0; d < hd; ++d) q64[d] = qt.value(qv.offset(b, h, i, d)), q[d] = static_cast<float>(q64[d]);
      ExactAccumulator acc;
      MpfrOracle oracle;
      for (std::size_t s = 0; s < n; ++s) {
        for (std::int64_t d = 0; d < hd; ++d)
          k64[d] = kt.value(kv.offset(b, hk, keys[s], d)), k[d] = static_cast<float>(k64[d]);
        score[s] = std::make_unique<Mpfr>(2);
        if (fast) {
          acc.clear();
          acc.add_products(q, k);
          acc.exact_value(*score[s]);
        } else {
          oracle.dot(*score[s], q64, k64);
        }
      }
    }
    for (const auto& s : score)
      if (!mpfr_number_p(*s)) throw InputError("attention reference: a score is NaN or infinite");

    // Groups of equal scaled scores, the reference group holding the largest.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t x, std::size_t y) { return mpfr_cmp(*score[x], *score[y]) < 0; });
    std::vector<std::vector<std::size_t>> groups;  // indices into keys/score
    for (std::size_t s : order) {
      if (groups.empty() || (scale.sign() != 0 && !mpfr_equal_p(*score[s], *score[groups.back()[0]])))
        groups.emplace_back();
      groups.back().push_back(s);
    }
    const std::size_t g_count = groups.size();
    const std::size_t ref = scale.sign() < 0 ? 0 : g_count - 1;
    // diff_g = score_g - score_ref, exactly; t_g = sigma diff_g <= 0.
    std::vector<MpfrBox> diff(g_count);
    for (std::size_t g = 0; g < g_count; ++g) {
      mpfr_srcptr sg = *score[groups[g][0]], sr = *score[groups[ref][0]];
      const long hi = std::max<long>(log2_bound(sg), log2_bound(sr));
      const long lo = std::min<long>(mpfr_zero_p(sg) ? hi : mpfr_get_exp(sg) - mpfr_get_prec(sg),
                                     mpfr_zero_p(sr) ? hi : mpfr_get_exp(sr) - mpfr_get_prec(sr));
      diff[g] = std::make_unique<Mpfr>(static_cast<mpfr_prec_t>(std::max<long>(hi - lo + 2, 2)));
      mpfr_sub(*diff[g], sg, sr, MPFR_RNDN);  // exact
    }

    // V per group: the exact sum of the group's rows. A group of one key (the usual case)
    // keeps its V row as doubles; only larger groups hold MPFR sums.
    auto v_of = [&](std::size_t s, std::int64_t d) { return vt.value(vv.offset(b, hk, keys[s], d)); };
    const auto gd = [&](std::size_t g, std::int64_t d) { return g * static_cast<std::size_t>(dv) + static_cast<std::size_t>(d); };
    std::vector<double> v_single(g_count * static_cast<std::size_t>(dv));
    std::vector<MpfrBox> v_sum(g_count * static_cast<std::size_t>(dv));
    std::vector<double> v_abs(g_count * static_cast<std::size_t>(dv));  // sum |v| per group
    {
      ExactAccumulator acc;
      for (std::size_t g = 0; g < g_count; ++g)
        for (std::int64_t d = 0; d < dv; ++d) {
          if (groups[g].size() == 1) {
            v_single[gd(g, d)] = v_of(groups[g][0], d);
            v_abs[gd(g, d)] = std::fabs(v_single[gd(g, d)]);
            continue;
          }
          acc.clear();
          double abs_sum = 0.0;
          for (std::size_t s : groups[g]) {
            acc.add(v_of(s, d));
            abs_sum += std::fabs(v_of(s, d));
          }
          v_sum[gd(g, d)] = std::make_unique<Mpfr>(2);
          acc.exact_value(*v_sum[gd(g, d)]);
          v_abs[gd(g, d)] = abs_sum;
        }
    }
    // out = w * V_g[d] at out's precision
    auto times_v = [&](mpfr_ptr out, mpfr_srcptr w, std::size_t g, std::int64_t d) {
      if (v_sum[gd(g, d)]) mpfr_mul(out, w, *v_sum[gd(g, d)], MPFR_RNDN);
      else mpfr_mul_d(out, w, v_single[gd(g, d)], MPFR_RNDN);
    };

    // Outputs that are rational: every group has the same mean, so O is that mean.
    std::vector<bool> decided(static_cast<std::size_t>(dv), false);
    Mpfr one(2);
    mpfr_set_ui(one, 1, MPFR_RNDN);
    for (std::int64_t d = 0; d < dv; ++d) {
      bool equal_means = true;
      for (std::size_t g = 1; g < g_count && equal_means; ++g) {
        if (!v_sum[gd(g, d)] && !v_sum[gd(0, d)]) {  // one key each: the values themselves
          equal_means = v_single[gd(g, d)] == v_single[gd(0, d)];
          continue;
        }
        // V_g n_0 == V_0 n_g, exactly (precision: any V sum of doubles, times a count)
        Mpfr lhs(4400), rhs(4400);
        times_v(lhs, one, g, d);
        times_v(rhs, one, 0, d);
        mpfr_mul_ui(lhs, lhs, groups[0].size(), MPFR_RNDN);
        mpfr_mul_ui(rhs, rhs, groups[g].size(), MPFR_RNDN);
        equal_means = mpfr_equal_p(lhs, rhs) != 0;
      }
      if (!equal_means) continue;
      ExactAccumulator acc;
      for (std::size_t s = 0; s < n; ++s) acc.add(v_of(s, d));
      Mpfr total(2);
      acc.exact_value(total);
      out.values[o_at(d)] = exact_quotient(total, static_cast<unsigned long>(n));
      decided[d] = true;
    }

    // The LSE of a single key is sigma * score: exact when sigma is a given double or
    // 1/sqrt of a perfect square; otherwise irrational (or 0) and left to the loop.
    bool lse_done = false;
    RefValue& lse = out.lse[static_cast<std::size_t>(row)];
    if (n == 1) {
      mpfr_srcptr s0 = *score[0];
      if (scale.given || scale.root || mpfr_zero_p(s0)) {
        if (scale.given) {
          Mpfr p(mpfr_get_prec(s0) + 53);
          mpfr_mul_d(p, s0, scale.value, MPFR_RNDN);
          lse = RefValue::from_exact(p);
        } else if (mpfr_zero_p(s0)) {
          lse = RefValue::from_exact(s0);
        } else {
          lse = exact_quotient(s0, static_cast<unsigned long>(scale.root));
        }
        if (lse.kind == RefValue::Kind::Zero) lse = RefValue::zero(false);  // log 1 = +0
        lse_done = true;
      }
    }

    // O = mu + delta with mu = V_ref / n_ref, the reference group's mean, and
    // delta = sum_{g != ref} w_g c_g / (n_ref D), c_g = n_ref V_g - n_g V_ref (exact): when
    // one group dominates, delta is tiny and known to its own relative precision, which
    // decides O next to mu (window_near) without the precision of mu - O.
    const std::size_t n_ref = groups[ref].size();
    std::vector<MpfrBox> v_ref(static_cast<std::size_t>(dv)), c_g(g_count * static_cast<std::size_t>(dv));
    const auto v_exact = [&](std::size_t g, std::int64_t d) {
      auto m = std::make_unique<Mpfr>(53);
      if (v_sum[gd(g, d)]) {
        mpfr_set_prec(*m, mpfr_get_prec(*v_sum[gd(g, d)]));
        mpfr_set(*m, *v_sum[gd(g, d)], MPFR_RNDN);
      } else {
        mpfr_set_d(*m, v_single[gd(g, d)], MPFR_RNDN);
      }
      return m;
    };
    // Computed for d once the first, plain attempt has not decided it (most outputs are
    // decided there, and these exact differences cost as much as that attempt).
    const auto prepare_near = [&](std::int64_t d) {
      v_ref[d] = v_exact(ref, d);
      for (std::size_t g = 0; g < g_count; ++g) {
        if (g == ref) continue;
        const MpfrBox vg = v_exact(g, d);
        std::vector<mpfr_ptr> two;
        Mpfr x(mpfr_get_prec(*vg) + 64), y(mpfr_get_prec(*v_ref[d]) + 64);
        mpfr_mul_ui(x, *vg, n_ref, MPFR_RNDN);                 // exact
        mpfr_mul_ui(y, *v_ref[d], groups[g].size(), MPFR_RNDN);  // exact
        mpfr_neg(y, y, MPFR_RNDN);
        c_g[gd(g, d)] = std::make_unique<Mpfr>(2);
        exact_sum_of(*c_g[gd(g, d)], x, y);
      }
    };

    // The near path's per-column inputs and results, and the group sizes (the LSE's c_g).
    std::vector<mpfr_srcptr> c_col(g_count);
    std::vector<MpfrBox> sizes(g_count);
    std::vector<mpfr_srcptr> group_sizes(g_count);
    for (std::size_t g = 0; g < g_count; ++g) {
      if (g == ref) continue;
      sizes[g] = std::make_unique<Mpfr>(64);
      mpfr_set_ui(*sizes[g], groups[g].size(), MPFR_RNDN);
      group_sizes[g] = *sizes[g];
    }
    Perturbation delta, eps;
    RelativeWeights o_weights, lse_weights;
    Mpfr n_denom(2);

    // Ziv's loop for the rest, and the magnitudes.
    for (mpfr_prec_t p = 192;; p *= 2) {
      if (p > (1 << 18)) {
        std::string undecided;
        for (std::int64_t d = 0; d < dv; ++d)
          if (!decided[d]) undecided += fmt::format("{}{}", undecided.empty() ? "" : ",", d);
        throw std::runtime_error(fmt::format(
            "attention reference: rounding not decided at 2^18 bits (batch {}, head {}, query {}: {} keys in {} score "
            "groups; output columns [{}]{})", b, h, i, n, g_count, undecided, lse_done ? "" : ", the log-sum-exp"));
      }
      Mpfr sigma(p), t(p), denom(p), num(p), o(p), bound(64), tmp(64);
      mpfr_set_prec(n_denom, p + 32);
      scale.set(sigma);
      std::vector<MpfrBox> w(g_count);
      double t_max = 0.0;
      for (std::size_t g = 0; g < g_count; ++g) {
        w[g] = std::make_unique<Mpfr>(p);
        mpfr_mul(t, sigma, *diff[g], MPFR_RNDN);
        t_max = std::max(t_max, std::fabs(mpfr_get_d(t, MPFR_RNDU)));
        mpfr_exp(*w[g], t, MPFR_RNDN);
      }
      // |w~ - w| <= (2|t| + 1) 2^-p w: exp's argument carries sigma's and the product's
      // rounding, exp its own.
      std::vector<MpfrBox> terms(g_count);
      std::vector<mpfr_ptr> ptrs(g_count);
      for (std::size_t g = 0; g < g_count; ++g) {
        terms[g] = std::make_unique<Mpfr>(p);
        mpfr_mul_ui(*terms[g], *w[g], groups[g].size(), MPFR_RNDN);
        ptrs[g] = *terms[g];
      }
      mpfr_sum(denom, ptrs.data(), g_count, MPFR_RNDN);
      // The other groups' share of the weight: below 2^-100, the plain attempt cannot decide
      // an output next to the dominant mean, so the near path goes first.
      bool dominated = false;
      if (g_count > 1) {
        Mpfr others_sum(64);
        std::vector<mpfr_ptr> others;
        for (std::size_t g = 0; g < g_count; ++g)
          if (g != ref) others.push_back(*terms[g]);
        mpfr_sum(others_sum, others.data(), others.size(), MPFR_RNDU);
        dominated = mpfr_zero_p(others_sum) || mpfr_get_exp(others_sum) < -100;
      }
      const long slack = 6 + static_cast<long>(std::ceil(std::log2(2.0 * t_max + 2.0)));
      bool all = true;
      for (std::int64_t d = 0; d < dv; ++d) {
        // magnitude: sum_g w_g sum|v| / D, bounded above in 64 bits
        mpfr_set_zero(bound, 1);
        for (std::size_t g = 0; g < g_count; ++g) {
          mpfr_mul_d(tmp, *w[g], v_abs[gd(g, d)], MPFR_RNDU);
          mpfr_add(bound, bound, tmp, MPFR_RNDU);
        }
        mpfr_div(bound, bound, denom, MPFR_RNDU);
        out.magnitude[o_at(d)] = mpfr_get_d(bound, MPFR_RNDN);
        if (decided[d]) continue;
        if ((p > 192 || dominated) && g_count > 1 && !v_ref[d]) prepare_near(d);
        if (v_ref[d]) {  // next to the dominant group's mean: O = mu + delta
          for (std::size_t g = 0; g < g_count; ++g) c_col[g] = g == ref ? nullptr : c_g[gd(g, d)]->get();
          mpfr_mul_ui(n_denom, denom, n_ref, MPFR_RNDN);
          perturbation(delta, o_weights, sigma, scale.sign(), diff, c_col, n_denom, slack + 1, p);
          if (delta.sign != 0 && !mpfr_zero_p(*v_ref[d])) {
            const bool negative = mpfr_sgn(v_ref[d]->get()) < 0;  // |O| = |mu| + delta sgn(mu)
            Mpfr lo(p + 64), hi(p + 64);
            mpfr_sub(lo, delta.value, delta.bound, MPFR_RNDD);
            mpfr_add(hi, delta.value, delta.bound, MPFR_RNDU);
            if (negative) mpfr_swap(lo, hi), mpfr_neg(lo, lo, MPFR_RNDD), mpfr_neg(hi, hi, MPFR_RNDU);
            if (auto near = window_near(*v_ref[d], static_cast<unsigned long>(n_ref), lo, hi, negative,
                                        negative ? -delta.sign : delta.sign)) {
              out.values[o_at(d)] = *near;
              decided[d] = true;
              continue;
            }
          } else if (delta.sign != 0 && delta.infinitesimal) {  // mu = 0: O = delta
            out.values[o_at(d)] = RefValue::tiny(delta.sign < 0);
            decided[d] = true;
            continue;
          } else if (delta.sign != 0 && !mpfr_zero_p(delta.bound)) {
            const long err = static_cast<long>(mpfr_get_exp(delta.value)) - static_cast<long>(mpfr_get_exp(delta.bound));
            if (mpfr_can_round(delta.value, err, MPFR_RNDN, MPFR_RNDZ, 128)) {
              out.values[o_at(d)] = RefValue::from_certified(delta.value);
              decided[d] = true;
              continue;
            }
          }
        }
        for (std::size_t g = 0; g < g_count; ++g) times_v(*terms[g], *w[g], g, d);
        mpfr_sum(num, ptrs.data(), g_count, MPFR_RNDN);
        mpfr_div(o, num, denom, MPFR_RNDN);
        // |O~ - O| <= 2^(slack - p) sum_j p_j |v_j| (the magnitude, bounded above). Weights
        // below MPFR's range (|w| < 2^-(2^30)) are 0 in both: the bound covers what they leave
        // out while it is above 2^-(2^20) (p <= 2^18), and the near path decides the rest.
        if (mpfr_zero_p(o) || mpfr_zero_p(bound) || mpfr_get_exp(bound) < -(1L << 20)) {
          all = false;
          continue;
        }
        const long err = static_cast<long>(mpfr_get_exp(o)) - (static_cast<long>(mpfr_get_exp(bound)) + slack - p);
        if (mpfr_can_round(o, err, MPFR_RNDN, MPFR_RNDZ, 128)) {
          out.values[o_at(d)] = RefValue::from_certified(o);
          decided[d] = true;
        } else {
          all = false;
        }
      }
      if (!lse_done && n_ref == 1 && g_count > 1 && (scale.given || scale.root)) {
        // LSE = m + log1p(eps), m = sigma score_ref rational, eps = sum_{g != ref} n_g w_g:
        // next to m when one key dominates (as O next to mu above).
        Mpfr m_num(mpfr_get_prec(*score[groups[ref][0]]) + 53);
        unsigned long m_den = 1;
        if (scale.given) mpfr_mul_d(m_num, *score[groups[ref][0]], scale.value, MPFR_RNDN);  // exact
        else mpfr_set(m_num, *score[groups[ref][0]], MPFR_RNDN), m_den = static_cast<unsigned long>(scale.root);
        if (!mpfr_zero_p(m_num)) {
          perturbation(eps, lse_weights, sigma, scale.sign(), diff, group_sizes, nullptr, 0, p);  // eps > 0
          const bool negative = mpfr_sgn(m_num.get()) < 0;  // |LSE| = |m| + log1p(eps) sgn(m)
          Mpfr lo(p + 64), hi(p + 64);
          mpfr_set_zero(lo, 1), mpfr_set_zero(hi, 1);
          if (eps.sign > 0 && !eps.infinitesimal) {
            // log1p(eps) <= eps, and its derivative is below 1: |l~ - l| <= eps's bound + 2^-p l~
            Mpfr l(p), eb(64);
            mpfr_log1p(l, eps.value, MPFR_RNDN);
            mpfr_mul_2si(eb, l, -p, MPFR_RNDU);
            mpfr_add(eb, eb, eps.bound, MPFR_RNDU);
            mpfr_sub(lo, l, eb, MPFR_RNDD);
            mpfr_add(hi, l, eb, MPFR_RNDU);
            if (negative) mpfr_swap(lo, hi), mpfr_neg(lo, lo, MPFR_RNDD), mpfr_neg(hi, hi, MPFR_RNDU);
          }
          if (eps.sign > 0) {
            if (auto near = window_near(m_num, m_den, lo, hi, negative, negative ? -1 : 1)) {
              lse = *near;
              lse_done = true;
            }
          }
        }
      }
      if (!lse_done) {
        // LSE = sigma score_ref + log D: error below 2^(slack - p) (|m| + |log D| + |LSE| + 1)
        Mpfr m(p), l(p), lse_v(p);
        mpfr_mul(m, sigma, *score[groups[ref][0]], MPFR_RNDN);
        mpfr_log(l, denom, MPFR_RNDN);
        mpfr_add(lse_v, m, l, MPFR_RNDN);
        mpfr_set_ui(bound, 1, MPFR_RNDU);
        for (mpfr_srcptr x : {m.get(), l.get(), lse_v.get()}) {
          mpfr_abs(tmp, x, MPFR_RNDU);
          mpfr_add(bound, bound, tmp, MPFR_RNDU);
        }
        if (!mpfr_zero_p(lse_v)) {
          const long err = static_cast<long>(mpfr_get_exp(lse_v)) - (static_cast<long>(mpfr_get_exp(bound)) + slack - p);
          if (mpfr_can_round(lse_v, err, MPFR_RNDN, MPFR_RNDZ, 128)) {
            lse = RefValue::from_certified(lse_v);
            lse_done = true;
          }
        }
        all = all && lse_done;
      }
      if (all) break;
    }
  }, threads);
  return out;
}

}  // namespace ulpgate
