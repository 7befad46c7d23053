// The attention backward reference against a plain MPFR evaluation of the textbook formulas
// (P, dP, D = sum P dP, dS = P (dP - D)) at 4000 bits, itself checked at 8000 bits, with its own
// index arithmetic and mask rule; known answers; and a finite-difference check of the formulas.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format_mpfr.hpp"
#include "references/attention_backward.hpp"
#include "references/attention_reference.hpp"
#include "tests/references/dot_inputs.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

using MpfrBox = std::unique_ptr<Mpfr>;

constexpr Format kInputFormats[] = {Format::FP32, Format::FP16, Format::BF16};
constexpr Format kCompared[] = {Format::FP64, Format::FP32, Format::BF16, Format::FP16};

// Element (b, h, s, d) of an operand with `heads` heads (Q, O, dO: heads; K, V: kv heads).
std::int64_t at(const AttentionShape& a, std::int64_t heads, std::int64_t seq, std::int64_t dim, std::int64_t b,
                std::int64_t h, std::int64_t s, std::int64_t d) {
  return a.layout == AttentionLayout::BHSD ? ((b * heads + h) * seq + s) * dim + d
                                           : ((b * seq + s) * heads + h) * dim + d;
}
std::int64_t kv_count(const AttentionShape& a) { return a.kv_heads == 0 ? a.heads : a.kv_heads; }
std::int64_t kv_of(const AttentionShape& a, std::int64_t h) { return h / (a.heads / kv_count(a)); }
std::int64_t dim_v(const AttentionShape& a) { return a.head_dim_v ? a.head_dim_v : a.head_dim; }
bool visible(const AttentionShape& a, std::int64_t b, std::int64_t i, std::int64_t j) {
  const std::int64_t len = a.kv_lengths.empty() ? a.seq_kv : a.kv_lengths[b];
  return j < len && (!a.causal || j - (a.seq_kv - a.seq_q) <= i);
}

struct BwdCase {
  Case c;
  std::map<std::string, Tensor> in;
  std::string family;
};

// How the values of one case are drawn.
enum class Family { Ordinary, SmallIntegers, NearlyEqualV, OrthogonalDO, NearlyEqualKeys, LargeScores, DominantKey };
constexpr Family kFamilies[] = {Family::Ordinary,        Family::SmallIntegers, Family::NearlyEqualV,
                                Family::OrthogonalDO,    Family::NearlyEqualKeys, Family::LargeScores,
                                Family::DominantKey};
const char* name(Family f) {
  constexpr const char* names[] = {"ordinary", "small_integers", "nearly_equal_v", "orthogonal_do",
                                   "nearly_equal_keys", "large_scores", "dominant_key"};
  return names[static_cast<int>(f)];
}

double ordinary(Format f, Bits& bits, double limit) {
  double v;
  do v = decode(f, bits.next() & info(f).code_mask());
  while (!std::isfinite(v) || std::fabs(v) > limit);
  return v;
}

// Sets every element (b, h, s, d) of the operand through fn(b, h, s, d); the tensor holds fn's
// value rounded to the format.
template <class Fn>
Tensor fill(const Case& c, const char* operand, Format f, std::int64_t heads, std::int64_t seq, std::int64_t dim, Fn&& fn) {
  const AttentionShape& a = c.attention;
  Tensor t(f, static_cast<std::size_t>(a.batch * heads * seq * dim));
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t s = 0; s < seq; ++s)
        for (std::int64_t d = 0; d < dim; ++d) t.set_value(static_cast<std::size_t>(at(a, heads, seq, dim, b, h, s, d)), fn(b, h, s, d));
  (void)operand;
  return t;
}

BwdCase random_case(std::uint64_t seed) {
  Bits bits(seed, 93, 0);
  BwdCase bc;
  Case& c = bc.c;
  c.op = Op::Attention;
  AttentionShape& a = c.attention;
  a.batch = bits.in(1, 2);
  constexpr std::int64_t kHeads[][2] = {{1, 0}, {2, 0}, {2, 1}, {3, 1}, {4, 2}, {4, 1}, {6, 3}, {6, 2}};
  const auto& hh = kHeads[bits.in(0, 7)];
  a.heads = hh[0], a.kv_heads = hh[1];
  a.seq_q = bits.in(1, 9), a.seq_kv = bits.in(1, 9);
  a.head_dim = bits.in(1, 8), a.head_dim_v = bits.chance(0.5) ? 0 : bits.in(1, 8);
  a.layout = bits.chance(0.5) ? AttentionLayout::BHSD : AttentionLayout::BSHD;
  a.causal = bits.chance(0.5);
  if (bits.chance(0.4))
    for (std::int64_t b = 0; b < a.batch; ++b) a.kv_lengths.push_back(bits.in(0, a.seq_kv));
  const double scales[] = {0.125, -0.5, 0.0, 1.0 / 3.0, 1.0, 2.0, 0.25};
  if (bits.chance(0.5)) a.softmax_scale = scales[bits.in(0, 6)];
  const Family family = kFamilies[bits.in(0, 6)];
  bc.family = name(family);
  const Format fq = kInputFormats[bits.in(0, 2)], fk = kInputFormats[bits.in(0, 2)],
               fv = kInputFormats[bits.in(0, 2)], fo = kInputFormats[bits.in(0, 2)];
  c.types = {{"Q", fq}, {"K", fk}, {"V", fv}, {"O", fo}, {"compute", Format::FP32}};
  const std::int64_t kvh = kv_count(a), dv = dim_v(a);
  const auto small = [&](auto...) { return static_cast<double>(bits.in(-2, 2)); };
  // Q, K
  // Scaled scores up to about 3000 (weights down to e^-3000 ~ 2^-4300: the naive evaluation
  // resolves them at 8000 or 16000 bits).
  const double sc = a.softmax_scale ? std::fabs(*a.softmax_scale) : 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  const double reach = 3000.0 / (static_cast<double>(a.head_dim) * (sc == 0.0 ? 1.0 : sc));
  double q_limit = 6.0, k_limit = 6.0;
  if (family == Family::LargeScores) q_limit = k_limit = std::min(60.0, std::sqrt(reach));
  const double dominant = std::min(24.0, reach / 6.0);
  if (family == Family::SmallIntegers) {
    bc.in["Q"] = fill(c, "Q", fq, a.heads, a.seq_q, a.head_dim, small);
    bc.in["K"] = fill(c, "K", fk, kvh, a.seq_kv, a.head_dim, small);
  } else {
    bc.in["Q"] = fill(c, "Q", fq, a.heads, a.seq_q, a.head_dim, [&](auto...) { return ordinary(fq, bits, q_limit); });
    if (family == Family::NearlyEqualKeys) {
      std::vector<double> base(static_cast<std::size_t>(a.head_dim));
      for (double& x : base) x = ordinary(fk, bits, 4.0);
      bc.in["K"] = fill(c, "K", fk, kvh, a.seq_kv, a.head_dim, [&](std::int64_t, std::int64_t, std::int64_t, std::int64_t d) {
        const double x = base[d];
        // the same value, or a neighbour one or two units away
        Code code = encode(fk, x);
        const int step = static_cast<int>(bits.in(-2, 2));
        for (int s = 0; s < std::abs(step); ++s) code = step > 0 ? next_up(fk, code) : next_down(fk, code);
        return decode(fk, code);
      });
    } else if (family == Family::DominantKey) {
      // key 0 of each head = `dominant` * sign(q) of the head's query 0: its score dominates
      bc.in["K"] = fill(c, "K", fk, kvh, a.seq_kv, a.head_dim, [&](std::int64_t b, std::int64_t hk, std::int64_t s, std::int64_t d) {
        if (s != 0) return ordinary(fk, bits, 2.0);
        const double q = bc.in["Q"].value(static_cast<std::size_t>(at(a, a.heads, a.seq_q, a.head_dim, b, hk * (a.heads / kvh), 0, d)));
        return q >= 0 ? dominant : -dominant;
      });
    } else {
      bc.in["K"] = fill(c, "K", fk, kvh, a.seq_kv, a.head_dim, [&](auto...) { return ordinary(fk, bits, k_limit); });
    }
  }
  // V and dO
  if (family == Family::SmallIntegers) {
    bc.in["V"] = fill(c, "V", fv, kvh, a.seq_kv, dv, small);
    bc.in["dO"] = fill(c, "dO", fo, a.heads, a.seq_q, dv, small);
  } else if (family == Family::NearlyEqualV) {
    // every V row the same up to a unit or two: dP_j nearly equal, dP - D cancels
    std::vector<double> base(static_cast<std::size_t>(dv));
    for (double& x : base) x = ordinary(fv, bits, 4.0);
    bc.in["V"] = fill(c, "V", fv, kvh, a.seq_kv, dv, [&](std::int64_t, std::int64_t, std::int64_t, std::int64_t d) {
      Code code = encode(fv, base[d]);
      if (bits.chance(0.5)) code = bits.chance(0.5) ? next_up(fv, code) : next_down(fv, code);
      return decode(fv, code);
    });
    bc.in["dO"] = fill(c, "dO", fo, a.heads, a.seq_q, dv, [&](auto...) { return ordinary(fo, bits, 6.0); });
  } else if (family == Family::OrthogonalDO) {
    // dO_i nearly orthogonal to every V row: V rows are multiples of one vector w (plus a unit
    // here and there), and dO_i = x - (x.w / w.w) w rounded
    std::vector<double> w(static_cast<std::size_t>(dv));
    for (double& x : w) x = ordinary(fv, bits, 4.0);
    bc.in["V"] = fill(c, "V", fv, kvh, a.seq_kv, dv, [&](std::int64_t, std::int64_t, std::int64_t s, std::int64_t d) {
      Code code = encode(fv, w[d] * static_cast<double>(s % 3 + 1));
      if (bits.chance(0.2)) code = next_up(fv, code);
      return decode(fv, code);
    });
    double ww = 0.0;
    for (double x : w) ww += x * x;
    std::vector<double> row(static_cast<std::size_t>(dv));
    bc.in["dO"] = fill(c, "dO", fo, a.heads, a.seq_q, dv, [&](std::int64_t, std::int64_t, std::int64_t, std::int64_t d) {
      if (d == 0) {
        double xw = 0.0;
        for (std::int64_t e = 0; e < dv; ++e) row[e] = ordinary(fo, bits, 4.0), xw += row[e] * w[e];
        for (std::int64_t e = 0; e < dv && ww > 0; ++e) row[e] -= xw / ww * w[e];
      }
      return row[d];
    });
  } else {
    bc.in["V"] = fill(c, "V", fv, kvh, a.seq_kv, dv, [&](auto...) { return ordinary(fv, bits, 6.0); });
    bc.in["dO"] = fill(c, "dO", fo, a.heads, a.seq_q, dv, [&](auto...) { return ordinary(fo, bits, 6.0); });
  }
  if (family == Family::SmallIntegers && bits.chance(0.2))  // dO = 0
    bc.in["dO"] = Tensor(fo, bc.in["dO"].size());
  validate(c);
  return bc;
}

// The textbook formulas at precision prec, with the magnitudes (64 bits, rounded up) that tell
// the evaluation's own noise from a value.
struct Naive {
  std::vector<MpfrBox> dq, dk, dv;
  std::vector<MpfrBox> mq, mk, mv;
};

MpfrBox number(mpfr_prec_t prec) {
  auto x = std::make_unique<Mpfr>(prec);
  mpfr_set_zero(*x, 1);
  return x;
}

Naive naive(const BwdCase& bc, mpfr_prec_t prec) {
  const Case& c = bc.c;
  const AttentionShape& a = c.attention;
  const std::int64_t kvh = kv_count(a), hd = a.head_dim, dv = dim_v(a);
  const Tensor &Q = bc.in.at("Q"), &K = bc.in.at("K"), &V = bc.in.at("V"), &dO = bc.in.at("dO");
  Naive r;
  const auto make = [&](std::vector<MpfrBox>& v, std::int64_t n, mpfr_prec_t p) {
    for (std::int64_t e = 0; e < n; ++e) v.push_back(number(p));
  };
  make(r.dq, a.batch * a.heads * a.seq_q * hd, prec), make(r.mq, a.batch * a.heads * a.seq_q * hd, 64);
  make(r.dk, a.batch * kvh * a.seq_kv * hd, prec), make(r.mk, a.batch * kvh * a.seq_kv * hd, 64);
  make(r.dv, a.batch * kvh * a.seq_kv * dv, prec), make(r.mv, a.batch * kvh * a.seq_kv * dv, 64);
  Mpfr sigma(prec), x(prec), m(prec), z(prec), big_d(prec), t(prec), u(64), dabs(64);
  if (a.softmax_scale) mpfr_set_d(sigma, *a.softmax_scale, MPFR_RNDN);
  else mpfr_set_ui(sigma, static_cast<unsigned long>(hd), MPFR_RNDN), mpfr_rec_sqrt(sigma, sigma, MPFR_RNDN);
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        const std::int64_t hk = kv_of(a, h);
        std::vector<std::int64_t> keys;
        for (std::int64_t j = 0; j < a.seq_kv; ++j)
          if (visible(a, b, i, j)) keys.push_back(j);
        if (keys.empty()) continue;
        const auto n = keys.size();
        std::vector<MpfrBox> p(n), dp(n);
        for (std::size_t s = 0; s < n; ++s) {  // scores
          p[s] = number(prec);
          for (std::int64_t d = 0; d < hd; ++d) {
            mpfr_set_d(x, Q.value(at(a, a.heads, a.seq_q, hd, b, h, i, d)), MPFR_RNDN);
            mpfr_mul_d(x, x, K.value(at(a, kvh, a.seq_kv, hd, b, hk, keys[s], d)), MPFR_RNDN);
            mpfr_add(*p[s], *p[s], x, MPFR_RNDN);
          }
          mpfr_mul(*p[s], *p[s], sigma, MPFR_RNDN);
        }
        mpfr_set(m, *p[0], MPFR_RNDN);
        for (auto& s : p) mpfr_max(m, m, *s, MPFR_RNDN);
        mpfr_set_zero(z, 1);
        for (auto& s : p) {
          mpfr_sub(*s, *s, m, MPFR_RNDN);
          mpfr_exp(*s, *s, MPFR_RNDN);
          mpfr_add(z, z, *s, MPFR_RNDN);
        }
        for (auto& s : p) mpfr_div(*s, *s, z, MPFR_RNDN);  // P
        mpfr_set_zero(big_d, 1);
        for (std::size_t s = 0; s < n; ++s) {
          dp[s] = number(prec);
          for (std::int64_t d = 0; d < dv; ++d) {
            mpfr_set_d(x, dO.value(at(a, a.heads, a.seq_q, dv, b, h, i, d)), MPFR_RNDN);
            mpfr_mul_d(x, x, V.value(at(a, kvh, a.seq_kv, dv, b, hk, keys[s], d)), MPFR_RNDN);
            mpfr_add(*dp[s], *dp[s], x, MPFR_RNDN);
          }
          mpfr_mul(x, *p[s], *dp[s], MPFR_RNDN);
          mpfr_add(big_d, big_d, x, MPFR_RNDN);
        }
        for (std::size_t s = 0; s < n; ++s) {
          const std::int64_t j = keys[s];
          mpfr_sub(t, *dp[s], big_d, MPFR_RNDN);
          mpfr_mul(t, t, *p[s], MPFR_RNDN);  // dS
          mpfr_abs(u, *dp[s], MPFR_RNDU);
          mpfr_abs(dabs, big_d, MPFR_RNDU);
          mpfr_add(u, u, dabs, MPFR_RNDU);
          mpfr_mul(u, u, *p[s], MPFR_RNDU);  // P (|dP| + |D|)
          for (std::int64_t d = 0; d < hd; ++d) {
            const double kd = K.value(at(a, kvh, a.seq_kv, hd, b, hk, j, d));
            const double qd = Q.value(at(a, a.heads, a.seq_q, hd, b, h, i, d));
            const std::size_t eq = static_cast<std::size_t>(((b * a.heads + h) * a.seq_q + i) * hd + d);
            const std::size_t ek = static_cast<std::size_t>(((b * kvh + hk) * a.seq_kv + j) * hd + d);
            mpfr_mul_d(x, t, kd, MPFR_RNDN);
            mpfr_mul(x, x, sigma, MPFR_RNDN);
            mpfr_add(*r.dq[eq], *r.dq[eq], x, MPFR_RNDN);
            mpfr_mul_d(x, t, qd, MPFR_RNDN);
            mpfr_mul(x, x, sigma, MPFR_RNDN);
            mpfr_add(*r.dk[ek], *r.dk[ek], x, MPFR_RNDN);
            mpfr_mul_d(dabs, u, std::fabs(kd), MPFR_RNDU);
            mpfr_add(*r.mq[eq], *r.mq[eq], dabs, MPFR_RNDU);
            mpfr_mul_d(dabs, u, std::fabs(qd), MPFR_RNDU);
            mpfr_add(*r.mk[ek], *r.mk[ek], dabs, MPFR_RNDU);
          }
          for (std::int64_t d = 0; d < dv; ++d) {
            const double od = dO.value(at(a, a.heads, a.seq_q, dv, b, h, i, d));
            const std::size_t ev = static_cast<std::size_t>(((b * kvh + hk) * a.seq_kv + j) * dv + d);
            mpfr_mul_d(x, *p[s], od, MPFR_RNDN);
            mpfr_add(*r.dv[ev], *r.dv[ev], x, MPFR_RNDN);
            mpfr_mul_d(dabs, *p[s], std::fabs(od), MPFR_RNDU);
            mpfr_add(*r.mv[ev], *r.mv[ev], dabs, MPFR_RNDU);
          }
        }
      }
  const double abs_sigma = std::fabs(mpfr_get_d(sigma, MPFR_RNDN));
  for (auto* v : {&r.mq, &r.mk})
    for (auto& x : *v) mpfr_mul_d(*x, *x, abs_sigma * (1 + 0x1p-40), MPFR_RNDU);
  return r;
}

// What the naive value x (precision prec, magnitude mag) says the RefValue is: +0 below the
// evaluation's noise (2^(200 - prec) of the magnitude: an exact zero); a 128-bit number where x
// lies that close to one (an exact rational, e.g. a sum of dO values); else x's window.
// `exact` receives the value the formats round: 0, that 128-bit number, or x.
RefValue expected(mpfr_srcptr x, mpfr_srcptr mag, mpfr_prec_t prec, mpfr_ptr exact) {
  mpfr_set_prec(exact, prec);
  if (mpfr_zero_p(x) || (!mpfr_zero_p(mag) && mpfr_get_exp(x) < mpfr_get_exp(mag) - (prec - 200))) {
    mpfr_set_zero(exact, 1);
    return RefValue::zero(false);
  }
  Mpfr r(128), diff(prec);
  mpfr_set(r, x, MPFR_RNDN);
  mpfr_sub(diff, x, r, MPFR_RNDN);
  if (mpfr_zero_p(diff) || mpfr_get_exp(diff) < mpfr_get_exp(x) - (prec - 200)) {
    mpfr_set(exact, r, MPFR_RNDN);
    return RefValue::from_exact(r);
  }
  mpfr_set(exact, x, MPFR_RNDN);
  return RefValue::from_certified(x);
}

std::string where(const char* what, std::size_t e) { return fmt::format("{}[{}]", what, e); }

void check_case(std::uint64_t seed) {
  const BwdCase bc = random_case(seed);
  const AttentionGradients g = attention_backward_reference(bc.c, bc.in, 1);
  // The naive evaluation at 4000 and 8000 bits, and at 16000 where those two disagree (a
  // value below 2^-3800 of its magnitude: large score gaps); the last two must agree.
  std::vector<Naive> naives;
  naives.push_back(naive(bc, 4000));
  naives.push_back(naive(bc, 8000));
  const auto compare = [&](const char* what, const std::vector<RefValue>& got, const std::vector<double>& magnitude,
                           auto member, auto mag_member) {
    const std::vector<MpfrBox>& x1 = naives[0].*member;
    RC_ASSERT(got.size() == x1.size());
    Mpfr exact(2), exact2(2);
    for (std::size_t e = 0; e < got.size(); ++e) {
      std::size_t level = 0;
      RefValue want = expected(*(naives[0].*member)[e], *(naives[0].*mag_member)[e], 4000, exact);
      for (;; ++level) {
        if (level + 1 == naives.size()) naives.push_back(naive(bc, 4000 << (level + 1)));
        const RefValue next = expected(*(naives[level + 1].*member)[e], *(naives[level + 1].*mag_member)[e],
                                       4000 << (level + 1), exact2);
        if (next == want) break;
        if (level == 1)
          RC_FAIL(fmt::format("seed {} {}: the naive evaluation changes from 8000 to 16000 bits", seed, where(what, e)));
        want = next;
        mpfr_swap(exact, exact2);
      }
      const std::string ctx = fmt::format("seed {} ({}) {}: reference {}, naive {}", seed, bc.family, where(what, e),
                                          to_string(got[e]), to_string(want));
      if (!(got[e] == want)) RC_FAIL(ctx);
      for (Format f : kCompared)
        if (got[e].round_to(f) != encode_exact(f, exact)) RC_FAIL(fmt::format("{} in {}", ctx, ulpgate::name(f)));
      const double m = mpfr_get_d(*(naives[0].*mag_member)[e], MPFR_RNDN);
      if (!(std::fabs(magnitude[e] - m) <= 1e-9 * m + 1e-300))
        RC_FAIL(fmt::format("seed {} {}: magnitude {} against {}", seed, where(what, e), magnitude[e], m));
    }
  };
  compare("dQ", g.dq, g.dq_magnitude, &Naive::dq, &Naive::mq);
  compare("dK", g.dk, g.dk_magnitude, &Naive::dk, &Naive::mk);
  compare("dV", g.dv, g.dv_magnitude, &Naive::dv, &Naive::mv);
}

}  // namespace

// Three random cases per RapidCheck case.
RC_GTEST_PROP(AttentionBackwardReference, MatchesNaiveMpfr, ()) {
  const auto base = *rc::gen::arbitrary<std::uint64_t>();
  for (std::uint64_t seed = base; seed < base + 3; ++seed) check_case(seed);
}

