// The attention backward reference against a plain MPFR evaluation of the textbook formulas
// (P, dP, D = sum P dP, dS = P (dP - D)) at 4000 bits, itself checked at 8000 bits, with its own
// index arithmetic and mask rule; known answers; and a finite-difference check of the formulas.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <xmmintrin.h>

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
  const std::int64_t diag = i + a.seq_kv - a.seq_q;  // FlashAttention's window, written out here
  return j < len && (!a.causal || j <= diag) && (a.window_left < 0 || j >= diag - a.window_left) &&
         (a.window_right < 0 || j <= diag + a.window_right);
}

struct BwdCase {
  Case c;
  std::map<std::string, Tensor> in;
  std::string family;
};

// How the values of one case are drawn.
enum class Family {
  Ordinary, SmallIntegers, NearlyEqualV, OrthogonalDO, NearlyEqualKeys, LargeScores, DominantKey, RepeatedRows
};
constexpr Family kFamilies[] = {Family::Ordinary,        Family::SmallIntegers,   Family::NearlyEqualV,
                                Family::OrthogonalDO,    Family::NearlyEqualKeys, Family::LargeScores,
                                Family::DominantKey,     Family::RepeatedRows};
const char* name(Family f) {
  constexpr const char* names[] = {"ordinary",          "small_integers", "nearly_equal_v", "orthogonal_do",
                                   "nearly_equal_keys", "large_scores",   "dominant_key",   "repeated_rows"};
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
  if (bits.chance(0.3)) a.window_left = bits.in(-1, 4), a.window_right = bits.in(-1, 3);
  const double scales[] = {0.125, -0.5, 0.0, 1.0 / 3.0, 1.0, 2.0, 0.25};
  if (bits.chance(0.5)) a.softmax_scale = scales[bits.in(0, 6)];
  const Family family = kFamilies[bits.in(0, 7)];
  if (family == Family::RepeatedRows) a.head_dim = bits.in(1, 2), a.head_dim_v = bits.in(1, 2);
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
  } else if (family == Family::RepeatedRows) {
    // query rows drawn from two small-integer vectors, keys small integers, dO in {-1, 0, 1}:
    // equal and mirrored rows whose terms cancel or sum to rationals across rows
    double rows[2][2];
    for (auto& r : rows) r[0] = small(), r[1] = small();
    std::vector<int> pick(static_cast<std::size_t>(a.batch * a.heads * a.seq_q));
    for (int& x : pick) x = static_cast<int>(bits.in(0, 1));
    bc.in["Q"] = fill(c, "Q", fq, a.heads, a.seq_q, a.head_dim, [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
      return rows[pick[static_cast<std::size_t>((b * a.heads + h) * a.seq_q + s)]][d];
    });
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
  if (family == Family::SmallIntegers || family == Family::RepeatedRows) {
    bc.in["V"] = fill(c, "V", fv, kvh, a.seq_kv, dv, small);
    bc.in["dO"] = fill(c, "dO", fo, a.heads, a.seq_q, dv, [&](auto...) { return static_cast<double>(bits.in(-1, 1)); });
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

// Every output of the case, bit for bit (the window, and each format's rounding), and every
// magnitude to 1e-9, against the naive evaluation: the first disagreement, or "".
std::string compare_with_naive(const BwdCase& bc, std::uint64_t seed, long first_precision = 192) {
  const AttentionGradients g = detail::attention_backward_reference(bc.c, bc.in, 1, first_precision);
  // The naive evaluation at 4000 and 8000 bits, and at 16000 where those two disagree (a
  // value below 2^-3800 of its magnitude: large score gaps); the last two must agree.
  std::vector<Naive> naives;
  naives.push_back(naive(bc, 4000));
  naives.push_back(naive(bc, 8000));
  const auto compare = [&](const char* what, const std::vector<RefValue>& got, const std::vector<double>& magnitude,
                           auto member, auto mag_member) -> std::string {
    const std::vector<MpfrBox>& x1 = naives[0].*member;
    if (got.size() != x1.size()) return fmt::format("{}: {} values, the naive evaluation has {}", what, got.size(), x1.size());
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
          return fmt::format("seed {} {}: the naive evaluation changes from 8000 to 16000 bits", seed, where(what, e));
        want = next;
        mpfr_swap(exact, exact2);
      }
      const std::string ctx = fmt::format("seed {} ({}) {}: reference {}, naive {}", seed, bc.family, where(what, e),
                                          to_string(got[e]), to_string(want));
      if (!(got[e] == want)) return ctx;
      for (Format f : kCompared)
        if (got[e].round_to(f) != encode_exact(f, exact)) return fmt::format("{} in {}", ctx, ulpgate::name(f));
      const double m = mpfr_get_d(*(naives[0].*mag_member)[e], MPFR_RNDN);
      if (!(std::fabs(magnitude[e] - m) <= 1e-9 * m + 1e-300))
        return fmt::format("seed {} {}: magnitude {} against {}", seed, where(what, e), magnitude[e], m);
    }
    return "";
  };
  std::string error = compare("dQ", g.dq, g.dq_magnitude, &Naive::dq, &Naive::mq);
  if (error.empty()) error = compare("dK", g.dk, g.dk_magnitude, &Naive::dk, &Naive::mk);
  if (error.empty()) error = compare("dV", g.dv, g.dv_magnitude, &Naive::dv, &Naive::mv);
  return error;
}

void check_case(std::uint64_t seed, long first_precision = 192) {
  const std::string error = compare_with_naive(random_case(seed), seed, first_precision);
  if (!error.empty()) RC_FAIL(fmt::format("{} (first precision {})", error, first_precision));
}

// A case with explicit values, set by logical index (b, h, s, d); the layout is applied here.
struct Builder {
  BwdCase bc;
  Builder(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t seq_q, std::int64_t seq_kv,
          std::int64_t head_dim, std::int64_t head_dim_v, Format f = Format::FP32,
          AttentionLayout layout = AttentionLayout::BHSD) {
    Case& c = bc.c;
    c.op = Op::Attention;
    AttentionShape& a = c.attention;
    a.batch = batch, a.heads = heads, a.kv_heads = kv_heads, a.seq_q = seq_q, a.seq_kv = seq_kv;
    a.head_dim = head_dim, a.head_dim_v = head_dim_v, a.layout = layout;
    c.types = {{"Q", f}, {"K", f}, {"V", f}, {"O", f}, {"compute", Format::FP32}};
    for (const char* op : {"Q", "K", "V", "dO"}) bc.in[op] = Tensor(f, static_cast<std::size_t>(elements(op)));
  }
  AttentionShape& shape() { return bc.c.attention; }
  std::int64_t heads_of(const std::string& op) const {
    return op == "K" || op == "V" ? kv_count(bc.c.attention) : bc.c.attention.heads;
  }
  std::int64_t seq_of(const std::string& op) const {
    return op == "K" || op == "V" ? bc.c.attention.seq_kv : bc.c.attention.seq_q;
  }
  std::int64_t dim_of(const std::string& op) const {
    return op == "Q" || op == "K" ? bc.c.attention.head_dim : dim_v(bc.c.attention);
  }
  std::int64_t elements(const std::string& op) const {
    return bc.c.attention.batch * heads_of(op) * seq_of(op) * dim_of(op);
  }
  void set(const std::string& op, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, double v) {
    bc.in.at(op).set_value(static_cast<std::size_t>(at(bc.c.attention, heads_of(op), seq_of(op), dim_of(op), b, h, s, d)), v);
  }
  double get(const std::string& op, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) const {
    return bc.in.at(op).value(static_cast<std::size_t>(at(bc.c.attention, heads_of(op), seq_of(op), dim_of(op), b, h, s, d)));
  }
  // Every element of op through fn(b, h, s, d).
  template <class Fn>
  void fill_all(const std::string& op, Fn&& fn) {
    const AttentionShape& a = bc.c.attention;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < heads_of(op); ++h)
        for (std::int64_t s = 0; s < seq_of(op); ++s)
          for (std::int64_t d = 0; d < dim_of(op); ++d) set(op, b, h, s, d, fn(b, h, s, d));
  }
  void random(const std::string& op, Bits& bits, double limit = 4.0) {
    const Format f = bc.in.at(op).format();
    fill_all(op, [&](auto...) { return ordinary(f, bits, limit); });
  }
  AttentionGradients run(unsigned threads = 1) {
    validate(bc.c);
    return attention_backward_reference(bc.c, bc.in, threads);
  }
};

bool all_plus_zero(const std::vector<RefValue>& v) {
  return std::all_of(v.begin(), v.end(), [](const RefValue& x) { return x == RefValue::zero(false); });
}

}  // namespace

// Five random cases per RapidCheck case (500 per run).
RC_GTEST_PROP(AttentionBackwardReference, MatchesNaiveMpfr, ()) {
  const auto base = *rc::gen::arbitrary<std::uint64_t>();
  for (std::uint64_t seed = base; seed < base + 5; ++seed) check_case(seed);
}

// The same with Ziv's loop starting at 134 to 160 bits instead of 192 (200 cases): most outputs
// are then decided (or not) within a few bits of the error bounds, so a bound far too small shows
// as a wrong window.
RC_GTEST_PROP(AttentionBackwardReference, MatchesNaiveMpfrAtTheBoundsEdge, ()) {
  const auto base = *rc::gen::arbitrary<std::uint64_t>();
  for (std::uint64_t seed = base; seed < base + 2; ++seed) check_case(seed, *rc::gen::inRange(134, 161));
}

// dO summed exactly over query rows [first, end) of the two heads of K/V head hk, column d,
// correctly rounded: the dV of a key those rows alone see, each with P = 1.
RefValue group_sum_of_do(Builder& t, std::int64_t b, std::int64_t hk, std::int64_t first, std::int64_t end, std::int64_t d) {
  Mpfr sum(4000);
  mpfr_set_zero(sum, 1);
  for (std::int64_t h = 2 * hk; h < 2 * hk + 2; ++h)
    for (std::int64_t i = first; i < end; ++i) mpfr_add_d(sum, sum, t.get("dO", b, h, i, d), MPFR_RNDN);
  return RefValue::from_exact(sum);
}

// One visible key: P = 1, dS = 0, so dQ = dK = +0 exactly and dV is the sum of dO over every
// query row (of every head of the group) that sees it; bottom-right causal with seq_q > seq_kv
// leaves only the last query row seeing it.
TEST(AttentionBackwardReference, SingleKeyGivesZeroDqDkAndDvTheGroupSumOfDo) {
  for (const bool causal : {false, true})
    for (const AttentionLayout layout : {AttentionLayout::BHSD, AttentionLayout::BSHD}) {
      Builder t(2, 4, 2, 3, 1, 5, 3, Format::BF16, layout);
      t.shape().causal = causal;
      Bits bits(7, 95, causal);
      for (const char* op : {"Q", "K", "V", "dO"}) t.random(op, bits);
      const AttentionGradients g = t.run();
      EXPECT_TRUE(all_plus_zero(g.dq));
      EXPECT_TRUE(all_plus_zero(g.dk));
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t hk = 0; hk < 2; ++hk)
          for (std::int64_t d = 0; d < 3; ++d)
            EXPECT_EQ(g.dv[g.v_index(b, hk, 0, d)], group_sum_of_do(t, b, hk, causal ? 2 : 0, 3, d)) << b << hk << d;
    }
}

// Every visible key the same row: P_j = 1/n, sum_j dS_j = 0, so dQ = scale k sum_j dS_j = +0;
// dK_j = scale sum_i (dP_ij - mean_j dP_ij) / n q_i is rational (the scale a given double) and
// exact.
TEST(AttentionBackwardReference, EqualKeysGiveZeroDqAndRationalDk) {
  Builder t(1, 2, 1, 4, 5, 3, 2, Format::FP16);
  t.shape().softmax_scale = 0.375;
  Bits bits(8, 95, 0);
  std::vector<double> key(3);
  for (double& x : key) x = ordinary(Format::FP16, bits, 3.0);
  t.fill_all("K", [&](std::int64_t, std::int64_t, std::int64_t, std::int64_t d) { return key[d]; });
  for (const char* op : {"Q", "V", "dO"}) t.random(op, bits);
  const AttentionGradients g = t.run();
  EXPECT_TRUE(all_plus_zero(g.dq));
  mpq_t want, dp, mean, x;
  mpq_inits(want, dp, mean, x, nullptr);
  for (std::int64_t j = 0; j < 5; ++j)
    for (std::int64_t d = 0; d < 3; ++d) {
      mpq_set_ui(want, 0, 1);
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 4; ++i) {
          const auto dot = [&](std::int64_t key_j, mpq_ptr out) {
            mpq_set_ui(out, 0, 1);
            for (std::int64_t e = 0; e < 2; ++e) {
              mpq_set_d(x, t.get("dO", 0, h, i, e) * t.get("V", 0, 0, key_j, e));  // exact: FP16 products
              mpq_add(out, out, x);
            }
          };
          mpq_set_ui(mean, 0, 1);
          for (std::int64_t k = 0; k < 5; ++k) dot(k, dp), mpq_add(mean, mean, dp);
          mpq_set_ui(x, 1, 5);
          mpq_mul(mean, mean, x);
          dot(j, dp);
          mpq_sub(dp, dp, mean);
          mpq_set_d(x, 0.375 * t.get("Q", 0, h, i, d));  // exact: 3/8 times an FP16 value
          mpq_mul(dp, dp, x);
          mpq_set_ui(x, 1, 5);
          mpq_mul(dp, dp, x);
          mpq_add(want, want, dp);
        }
      Mpfr w(128);
      const int ternary = mpfr_set_q(w, want, MPFR_RNDZ);
      RefValue expected = RefValue::from_exact(w);
      expected.inexact = ternary != 0;
      if (mpq_sgn(want) == 0) expected = RefValue::zero(false);
      EXPECT_EQ(g.dk[g.k_index(0, 0, j, d)], expected) << j << " " << d << ": " << to_string(g.dk[g.k_index(0, 0, j, d)]);
    }
  mpq_clears(want, dp, mean, x, nullptr);
}

TEST(AttentionBackwardReference, ZeroDoGivesZeros) {
  Builder t(2, 3, 1, 4, 6, 4, 3, Format::BF16, AttentionLayout::BSHD);
  t.shape().causal = true;
  Bits bits(9, 95, 0);
  for (const char* op : {"Q", "K", "V"}) t.random(op, bits);
  const AttentionGradients g = t.run();
  EXPECT_TRUE(all_plus_zero(g.dq));
  EXPECT_TRUE(all_plus_zero(g.dk));
  EXPECT_TRUE(all_plus_zero(g.dv));
}

// kv_lengths {0, 3}: batch 0 sees no key (dQ +0, dK = dV = +0), batch 1 keys 3 and 4 are seen
// by nobody (+0); bottom-right causal with seq_q > seq_kv masks the first query rows fully.
TEST(AttentionBackwardReference, MaskedRowsAndUnseenKeysGivePlusZero) {
  {
    Builder t(2, 2, 0, 3, 5, 4, 4);
    t.shape().kv_lengths = {0, 3};
    Bits bits(10, 95, 0);
    for (const char* op : {"Q", "K", "V", "dO"}) t.random(op, bits);
    const AttentionGradients g = t.run();
    for (std::int64_t h = 0; h < 2; ++h) {
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t d = 0; d < 4; ++d) {
          EXPECT_EQ(g.dq[g.q_index(0, h, i, d)], RefValue::zero(false));
          EXPECT_NE(g.dq[g.q_index(1, h, i, d)].kind, RefValue::Kind::Zero);
        }
      for (std::int64_t j = 0; j < 5; ++j)
        for (std::int64_t d = 0; d < 4; ++d) {
          const bool unseen = j >= 3;
          EXPECT_EQ(g.dk[g.k_index(0, h, j, d)], RefValue::zero(false));
          EXPECT_EQ(g.dv[g.v_index(0, h, j, d)], RefValue::zero(false));
          EXPECT_EQ(g.dk[g.k_index(1, h, j, d)] == RefValue::zero(false), unseen) << j;
          EXPECT_EQ(g.dv[g.v_index(1, h, j, d)] == RefValue::zero(false), unseen) << j;
          if (unseen) {
            EXPECT_EQ(g.dv_magnitude[g.v_index(1, h, j, d)], 0.0);
          }
        }
    }
  }
  {
    Builder t(1, 1, 0, 5, 2, 3, 3);
    t.shape().causal = true;  // query i sees keys j <= i - 3: none for i < 3, one (dQ = 0) for i = 3
    Bits bits(11, 95, 0);
    for (const char* op : {"Q", "K", "V", "dO"}) t.random(op, bits);
    const AttentionGradients g = t.run();
    for (std::int64_t i = 0; i < 5; ++i)
      for (std::int64_t d = 0; d < 3; ++d)
        EXPECT_EQ(g.dq[g.q_index(0, 0, i, d)] == RefValue::zero(false), i < 4) << i;
  }
}

// A window of one key, the query's own (window (0, 0), seq_q = seq_kv): P = 1 and dS = 0 on
// every row, so dQ = dK = +0 and dV_j is dO of row j summed over the group's heads. With
// window (1, 0) and 3 of 5 keys in batch 1, key 0 is seen by rows 0 and 1, the last two keys
// by nobody (+0), and row 4 of batch 1 sees no key at all.
TEST(AttentionBackwardReference, WindowsSelectEachRowsKeys) {
  {
    Builder t(2, 4, 2, 5, 5, 3, 3, Format::BF16, AttentionLayout::BSHD);
    t.shape().window_left = 0, t.shape().window_right = 0;
    Bits bits(12, 95, 0);
    for (const char* op : {"Q", "K", "V", "dO"}) t.random(op, bits);
    const AttentionGradients g = t.run();
    EXPECT_TRUE(all_plus_zero(g.dq));
    EXPECT_TRUE(all_plus_zero(g.dk));
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t hk = 0; hk < 2; ++hk)
        for (std::int64_t j = 0; j < 5; ++j)
          for (std::int64_t d = 0; d < 3; ++d)
            EXPECT_EQ(g.dv[g.v_index(b, hk, j, d)], group_sum_of_do(t, b, hk, j, j + 1, d)) << b << hk << j << d;
  }
  {
    Builder t(2, 1, 0, 5, 5, 4, 4);
    t.shape().window_left = 1, t.shape().window_right = 0, t.shape().kv_lengths = {5, 3};
    Bits bits(13, 95, 0);
    for (const char* op : {"Q", "K", "V", "dO"}) t.random(op, bits);
    const AttentionGradients g = t.run();
    for (std::int64_t j = 0; j < 5; ++j)
      for (std::int64_t d = 0; d < 4; ++d) {
        EXPECT_NE(g.dv[g.v_index(0, 0, j, d)].kind, RefValue::Kind::Zero) << j;
        EXPECT_EQ(g.dv[g.v_index(1, 0, j, d)] == RefValue::zero(false), j >= 3) << j;
        EXPECT_EQ(g.dk[g.k_index(1, 0, j, d)] == RefValue::zero(false), j >= 3) << j;
      }
    for (std::int64_t i = 0; i < 5; ++i)  // row 0 sees key 0 alone (dQ = 0); rows 3, 4 of batch 1 see key 2 alone
      for (std::int64_t d = 0; d < 4; ++d) {
        EXPECT_EQ(g.dq[g.q_index(0, 0, i, d)] == RefValue::zero(false), i == 0) << i;
        EXPECT_EQ(g.dq[g.q_index(1, 0, i, d)] == RefValue::zero(false), i == 0 || i >= 3) << i;
      }
  }
}

// One query (q = 1, head_dim 1), two keys k0, k1, values v0, v1, dO = g: the scores are k, so
// P0 = sigmoid(k0 - k1) = 1 - P1, dP_j = g v_j, dS0 = -dS1 = P0 P1 g (v0 - v1), and
// dQ = P0 P1 g (v0 - v1)(k0 - k1), dK0 = -dK1 = P0 P1 g (v0 - v1), dV_j = P_j g.
struct TwoKeys {
  double k0, k1, v0, v1, g;
};
AttentionGradients two_keys(const TwoKeys& x, bool given_scale) {
  Builder t(1, 1, 0, 1, 2, 1, 1);
  if (given_scale) t.shape().softmax_scale = 1.0;  // else 1/sqrt(1): the perfect-square path
  t.set("Q", 0, 0, 0, 0, 1.0);
  t.set("K", 0, 0, 0, 0, x.k0), t.set("K", 0, 0, 1, 0, x.k1);
  t.set("V", 0, 0, 0, 0, x.v0), t.set("V", 0, 0, 1, 0, x.v1);
  t.set("dO", 0, 0, 0, 0, x.g);
  return t.run();
}

TEST(AttentionBackwardReference, TwoKeysMatchTheSigmoidClosedForm) {
  const TwoKeys cases[] = {{1.5, -0.25, 2.0, -1.0, 0.75}, {0.0, 3.0, 1.0, 1.5, -2.0}, {40.0, 0.0, 0.5, 3.0, 1.0},
                           {-7.5, -7.25, -1.0, 0.125, 3.0}, {100.0, -60.0, 1.0, -1.0, 0.5}};
  for (const TwoKeys& x : cases)
    for (const bool given : {true, false}) {
      const AttentionGradients g = two_keys(x, given);
      Mpfr p0(1000), p1(1000), w(1000), c(1000), t(1000);
      mpfr_set_d(w, x.k1 - x.k0, MPFR_RNDN);  // exact
      mpfr_exp(w, w, MPFR_RNDN);                // e^-(k0 - k1)
      mpfr_add_ui(t, w, 1, MPFR_RNDN);
      mpfr_ui_div(p0, 1, t, MPFR_RNDN);
      mpfr_div(p1, w, t, MPFR_RNDN);
      mpfr_mul(c, p0, p1, MPFR_RNDN);
      mpfr_mul_d(c, c, x.g * (x.v0 - x.v1), MPFR_RNDN);  // P0 P1 g (v0 - v1)
      const auto check = [&](const RefValue& got, mpfr_srcptr want, const char* what) {
        EXPECT_EQ(got, RefValue::from_certified(want)) << what << " k " << x.k0 << "," << x.k1 << ": " << to_string(got);
        for (Format f : kCompared) EXPECT_EQ(got.round_to(f), encode_exact(f, want)) << what;
      };
      mpfr_mul_d(t, c, x.k0 - x.k1, MPFR_RNDN);
      check(g.dq[0], t, "dQ");
      check(g.dk[0], c, "dK0");
      mpfr_neg(t, c, MPFR_RNDN);
      check(g.dk[1], t, "dK1");
      mpfr_mul_d(t, p0, x.g, MPFR_RNDN);
      check(g.dv[0], t, "dV0");
      mpfr_mul_d(t, p1, x.g, MPFR_RNDN);
      check(g.dv[1], t, "dV1");
    }
}

// Score gaps of 2^20 (weight e^-(2^20) ~ 2^-(1.5 10^6)), 2^31 and 2^40 (below 2^-(2^30), MPFR's
// default range): the dominant key's dV sits just below g (decided next to the exact limit from
// the perturbation's sign), and the other gradients are the tiny products of the closed form,
// held as RefValue::tiny where they lie below 2^-(2^30).
TEST(AttentionBackwardReference, DominantKeyAcrossHugeScoreGaps) {
  for (const double gap : {0x1p20, 0x1p31, 0x1p40})
    for (const bool given : {true, false}) {
      const TwoKeys x{gap, 0.0, 2.0, -1.0, 0.75};
      const AttentionGradients g = two_keys(x, given);
      const std::string what = fmt::format("gap 2^{} {}", std::log2(gap), given ? "given" : "1/sqrt(d)");
      Mpfr t(400);
      mpfr_set_d(t, 0.75, MPFR_RNDN);
      mpfr_nextbelow(t);  // anything in (0.75 - 2^-130, 0.75) has this window
      EXPECT_EQ(g.dv[0], RefValue::from_certified(t)) << what << ": " << to_string(g.dv[0]);
      EXPECT_EQ(g.dv[0].round_to(Format::FP32), encode(Format::FP32, 0.75)) << what;
      EXPECT_EQ(g.dv[0].round_to(Format::FP32, Rounding::TowardZero), next_down(Format::FP32, encode(Format::FP32, 0.75)))
          << what;
      if (gap < 0x1p30) {  // closed forms: P1 = e^-gap / (1 + e^-gap), P0 P1 = P1 / (1 + e^-gap)
        Mpfr w(400), p1(400), c(400);
        mpfr_set_d(w, -gap, MPFR_RNDN);
        mpfr_exp(w, w, MPFR_RNDN);
        mpfr_add_ui(t, w, 1, MPFR_RNDN);
        mpfr_div(p1, w, t, MPFR_RNDN);
        mpfr_div(c, p1, t, MPFR_RNDN);
        mpfr_mul_d(c, c, 0.75 * 3.0, MPFR_RNDN);
        mpfr_mul_d(t, p1, 0.75, MPFR_RNDN);
        EXPECT_EQ(g.dv[1], RefValue::from_certified(t)) << what;
        EXPECT_EQ(g.dk[0], RefValue::from_certified(c)) << what;
        mpfr_neg(t, c, MPFR_RNDN);
        EXPECT_EQ(g.dk[1], RefValue::from_certified(t)) << what;
        mpfr_mul_d(t, c, gap, MPFR_RNDN);
        EXPECT_EQ(g.dq[0], RefValue::from_certified(t)) << what;
      } else {
        EXPECT_EQ(g.dv[1], RefValue::tiny(false)) << what << ": " << to_string(g.dv[1]);
        EXPECT_EQ(g.dk[0], RefValue::tiny(false)) << what;
        EXPECT_EQ(g.dk[1], RefValue::tiny(true)) << what;
        EXPECT_EQ(g.dq[0], RefValue::tiny(false)) << what;
        EXPECT_EQ(g.dk[1].round_to(Format::FP32), encode(Format::FP32, -0.0));
        EXPECT_EQ(g.dk[1].round_to(Format::FP32, Rounding::Down), encode(Format::FP32, -0x1p-149));
      }
    }
}

// Grouped-query attention is multi-head attention with each K/V head repeated for its group:
// dQ is the same bit for bit, and dK, dV of a K/V head are the sums of the repeated heads'
// (checked to within the 128-bit windows' own widths).
TEST(AttentionBackwardReference, GroupedQueryGradientsAreSumsOverTheGroup) {
  for (const std::int64_t kv_heads : {3, 2, 1})
    for (const bool small : {false, true}) {
      Builder gq(2, 6, kv_heads, 3, 5, 4, 3, Format::BF16, AttentionLayout::BSHD);
      gq.shape().causal = true, gq.shape().kv_lengths = {5, 2};
      Builder mh(2, 6, 0, 3, 5, 4, 3, Format::BF16, AttentionLayout::BSHD);
      mh.shape().causal = true, mh.shape().kv_lengths = {5, 2};
      Bits bits(static_cast<std::uint64_t>(kv_heads), 96, small);
      const auto value = [&]() { return small ? static_cast<double>(bits.in(-2, 2)) : ordinary(Format::BF16, bits, 4.0); };
      for (const char* op : {"Q", "dO"}) gq.fill_all(op, [&](auto...) { return value(); });
      for (const char* op : {"K", "V"}) gq.fill_all(op, [&](auto...) { return value(); });
      for (const char* op : {"Q", "dO"}) mh.fill_all(op, [&](auto b, auto h, auto s, auto d) { return gq.get(op, b, h, s, d); });
      for (const char* op : {"K", "V"})
        mh.fill_all(op, [&](auto b, auto h, auto s, auto d) { return gq.get(op, b, h / (6 / kv_heads), s, d); });
      const AttentionGradients g = gq.run(), m = mh.run();
      EXPECT_EQ(g.dq, m.dq) << kv_heads;
      const auto summed = [&](const std::vector<RefValue>& grouped, const std::vector<RefValue>& per_head,
                              std::int64_t dim, const char* what) {
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t hk = 0; hk < kv_heads; ++hk)
            for (std::int64_t j = 0; j < 5; ++j)
              for (std::int64_t d = 0; d < dim; ++d) {
                Mpfr sum(2000), x(130), bound(64), diff(2000);
                mpfr_set_zero(sum, 1), mpfr_set_zero(bound, 1);
                for (std::int64_t h = hk * (6 / kv_heads); h < (hk + 1) * (6 / kv_heads); ++h) {
                  per_head[((b * 6 + h) * 5 + j) * dim + d].to_mpfr(x);
                  mpfr_add(sum, sum, x, MPFR_RNDN);
                  mpfr_abs(x, x, MPFR_RNDN);
                  mpfr_add(bound, bound, x, MPFR_RNDU);
                }
                const RefValue got = grouped[((b * kv_heads + hk) * 5 + j) * dim + d];
                got.to_mpfr(x);
                mpfr_sub(diff, x, sum, MPFR_RNDN);
                mpfr_abs(x, x, MPFR_RNDN);
                mpfr_add(bound, bound, x, MPFR_RNDU);
                mpfr_mul_2si(bound, bound, -127, MPFR_RNDU);  // each window within 2^-128 of its value
                EXPECT_LE(mpfr_cmpabs(diff, bound), 0) << what << " " << kv_heads << " " << b << hk << j << d;
                if (small && got.kind == RefValue::Kind::Zero) {
                  EXPECT_TRUE(mpfr_zero_p(sum)) << what;
                }
              }
      };
      summed(g.dk, m.dk, 4, "dK");
      summed(g.dv, m.dv, 3, "dV");
    }
}

// The formulas' signs and the scale's place: central differences of L = sum_i O_i . dO_i in
// double against the reference, perturbing each q, k and v value (causal GQA, BSHD, the
// default scale and a given one).
double loss(const Builder& t, const std::map<std::string, std::vector<double>>& x) {
  const AttentionShape& a = t.bc.c.attention;
  const std::int64_t kvh = kv_count(a), hd = a.head_dim, dv = dim_v(a);
  const double scale = a.softmax_scale ? *a.softmax_scale : 1.0 / std::sqrt(static_cast<double>(hd));
  const auto val = [&](const std::string& op, std::int64_t heads, std::int64_t seq, std::int64_t dim, std::int64_t b,
                       std::int64_t h, std::int64_t s, std::int64_t d) { return x.at(op)[at(a, heads, seq, dim, b, h, s, d)]; };
  double l = 0.0;
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        std::vector<double> s;
        for (std::int64_t j = 0; j < a.seq_kv; ++j) {
          if (!visible(a, b, i, j)) continue;
          double dot = 0.0;
          for (std::int64_t d = 0; d < hd; ++d)
            dot += val("Q", a.heads, a.seq_q, hd, b, h, i, d) * val("K", kvh, a.seq_kv, hd, b, kv_of(a, h), j, d);
          s.push_back(scale * dot);
        }
        if (s.empty()) continue;
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0.0;
        for (double& v : s) z += (v = std::exp(v - m));
        for (std::int64_t d = 0; d < dv; ++d) {
          double o = 0.0;
          for (std::size_t j = 0; j < s.size(); ++j)
            o += s[j] / z * val("V", kvh, a.seq_kv, dv, b, kv_of(a, h), static_cast<std::int64_t>(j), d);
          l += o * val("dO", a.heads, a.seq_q, dv, b, h, i, d);
        }
      }
  return l;
}

TEST(AttentionBackwardReference, FiniteDifferencesAgree) {
  for (const bool given : {false, true}) {
    Builder t(1, 4, 2, 3, 4, 3, 2, Format::FP32, AttentionLayout::BSHD);
    t.shape().causal = true;
    if (given) t.shape().softmax_scale = -0.75;
    Bits bits(12, 97, given);
    for (const char* op : {"Q", "K", "V", "dO"}) t.random(op, bits, 2.0);
    const AttentionGradients g = t.run();
    std::map<std::string, std::vector<double>> x;
    for (const char* op : {"Q", "K", "V", "dO"})
      for (std::size_t e = 0; e < t.bc.in.at(op).size(); ++e) x[op].push_back(t.bc.in.at(op).value(e));
    const AttentionShape& a = t.bc.c.attention;
    const auto check = [&](const std::string& op, const std::vector<RefValue>& grad, std::int64_t heads,
                           std::int64_t seq, std::int64_t dim) {
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t s = 0; s < seq; ++s)
          for (std::int64_t d = 0; d < dim; ++d) {
            const auto e = static_cast<std::size_t>(at(a, heads, seq, dim, 0, h, s, d));
            const double keep = x[op][e], step = 1e-5;
            x[op][e] = keep + step;
            const double up = loss(t, x);
            x[op][e] = keep - step;
            const double down = loss(t, x);
            x[op][e] = keep;
            const double fd = (up - down) / (2 * step), want = grad[((h * seq) + s) * dim + d].to_double();
            EXPECT_NEAR(fd, want, 1e-6 * (1.0 + std::fabs(want))) << op << " " << h << s << d << " scale given " << given;
          }
    };
    check("Q", g.dq, a.heads, a.seq_q, a.head_dim);
    check("K", g.dk, kv_count(a), a.seq_kv, a.head_dim);
    check("V", g.dv, kv_count(a), a.seq_kv, dim_v(a));
  }
}

// Row chunks on several threads (one K/V head: the rows are split and their sums merged), on
// ordinary and on small-integer data (exact zeros and rationals): the same values.
TEST(AttentionBackwardReference, ThreadsDoNotChangeBits) {
  for (const bool small : {false, true}) {
    Builder t(1, 2, 1, 40, 40, 8, 8, Format::BF16);
    t.shape().causal = true;
    Bits bits(13, 98, small);
    for (const char* op : {"Q", "K", "V", "dO"})
      t.fill_all(op, [&](auto...) { return small ? static_cast<double>(bits.in(-2, 2)) : ordinary(Format::BF16, bits, 3.0); });
    const AttentionGradients one = t.run(1);
    for (const unsigned threads : {2u, 3u}) {
      const AttentionGradients more = t.run(threads);
      EXPECT_EQ(one.dq, more.dq) << threads;
      EXPECT_EQ(one.dk, more.dk) << threads;
      EXPECT_EQ(one.dv, more.dv) << threads;
    }
  }
}

// The caller's FTZ/DAZ and rounding mode (a kernel may leave them set) change no bit.
TEST(AttentionBackwardReference, CallersFloatingPointEnvironment) {
  for (std::uint64_t seed = 200; seed < 220; ++seed) {
    const BwdCase bc = random_case(seed);
    const AttentionGradients clean = attention_backward_reference(bc.c, bc.in, 2);
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(0x1F80 | 0x8000 | 0x0040 | 0x2000);  // FTZ, DAZ, round down
    const AttentionGradients hostile = attention_backward_reference(bc.c, bc.in, 2);
    _mm_setcsr(saved);
    EXPECT_EQ(clean.dq, hostile.dq) << seed;
    EXPECT_EQ(clean.dk, hostile.dk) << seed;
    EXPECT_EQ(clean.dv, hostile.dv) << seed;
  }
}

// dO's format is the case's "dO" type where named, else O's; the outputs' are "dQ", "dK", "dV"
// where named, else Q's, K's, V's. NaN or Inf inputs and missing or mistyped tensors are input
// errors, as is a score gap beyond MPFR's widest exponent range an error that says so.
TEST(AttentionBackwardReference, FormatsAndInputErrors) {
  Builder t(1, 1, 0, 2, 3, 2, 2, Format::FP16);
  Bits bits(14, 99, 0);
  for (const char* op : {"Q", "K", "V", "dO"}) t.random(op, bits);
  const AttentionGradients g = t.run();
  EXPECT_EQ(g.dq_format, Format::FP16);
  EXPECT_EQ(g.dv_format, Format::FP16);
  BwdCase bc = t.bc;
  bc.c.types["dO"] = Format::FP32;
  EXPECT_THROW(attention_backward_reference(bc.c, bc.in, 1), InputError);  // dO is FP16
  bc.in["dO"] = Tensor(Format::FP32, bc.in["dO"].size());
  for (std::size_t e = 0; e < bc.in["dO"].size(); ++e) bc.in["dO"].set_value(e, t.bc.in.at("dO").value(e));
  bc.c.types["dQ"] = Format::FP32, bc.c.types["dK"] = Format::BF16, bc.c.types["dV"] = Format::E4M3;
  const AttentionGradients h = attention_backward_reference(bc.c, bc.in, 1);
  EXPECT_EQ(h.dq, g.dq);
  EXPECT_EQ(h.dq_format, Format::FP32);
  EXPECT_EQ(h.dk_format, Format::BF16);
  EXPECT_EQ(h.dv_format, Format::E4M3);
  EXPECT_EQ(h.expected_dv(0, 0, 1, 1), h.dv[h.v_index(0, 0, 1, 1)].round_to(Format::E4M3));
  for (const char* op : {"Q", "K", "V", "dO"}) {
    BwdCase bad = t.bc;
    bad.in[op].set_value(1, std::nan(""));
    EXPECT_THROW(attention_backward_reference(bad.c, bad.in, 1), InputError) << op;
    bad.in[op].set_value(1, -INFINITY);
    EXPECT_THROW(attention_backward_reference(bad.c, bad.in, 1), InputError) << op;
    bad.in.erase(op);
    EXPECT_THROW(attention_backward_reference(bad.c, bad.in, 1), InputError) << op;
  }
  const TwoKeys huge{0x1p70, 0.0, 1.0, 2.0, 1.0};  // e^-(2^70): below 2^-(2^62)
  try {
    two_keys(huge, true);
    ADD_FAILURE() << "no error for a score gap of 2^70";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("exponent range"), std::string::npos) << e.what();
  }
}

// Exact values that no single row's terms show: only the sum over query rows is rational.
// (a) Classes of different F: keys (0,0), (-2,-1), (-2,-2), (0,1); query A = (0,1) sees keys
// 0 and 1 (key 0 on top, the other at gap 1): P = 1/(1+u), u = e^-scale; queries B1 = (0,1) and
// B2 = (-2,1) see all four keys at gaps {0, 1, 2, 3}, key 0 at gap 1 and 3: P = u / F and
// u^3 / F with F = (1+u)(1+u^2). With dO = 1 on A, B1, B2 (0 elsewhere), dV_0 = 1/(1+u) +
// (u+u^3)/F = 1 exactly, for any scale. (b) One class: queries (1,0) and (0,1) against keys
// (1,0) and (0,1) have scores (1,0) and (0,1): P_0 = sigmoid(s) + sigmoid(-s) = 1 over the
// two rows, so equal dO gives dV_0 = dO. (c) Two heads with the same query and opposite dO:
// their dS and P dO cancel, dK = dV = 0 exactly. Every other output against the naive
// evaluation too.
TEST(AttentionBackwardReference, RationalSumsAcrossQueryRows) {
  for (const bool given : {true, false}) {
    Builder t(1, 2, 1, 3, 4, 2, 1);
    t.shape().causal = true;  // query i sees keys 0 .. i + 1
    if (given) t.shape().softmax_scale = 1.0;
    const double keys[4][2] = {{0, 0}, {-2, -1}, {-2, -2}, {0, 1}};
    for (int j = 0; j < 4; ++j) t.set("K", 0, 0, j, 0, keys[j][0]), t.set("K", 0, 0, j, 1, keys[j][1]);
    const double queries[2][3][2] = {{{0, 1}, {1, 1}, {0, 1}}, {{1, -1}, {2, 0}, {-2, 1}}};
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 3; ++i) t.set("Q", 0, h, i, 0, queries[h][i][0]), t.set("Q", 0, h, i, 1, queries[h][i][1]);
    for (int j = 0; j < 4; ++j) t.set("V", 0, 0, j, 0, 0.5 * j - 1);
    t.set("dO", 0, 0, 0, 0, 1.0), t.set("dO", 0, 0, 2, 0, 1.0), t.set("dO", 0, 1, 2, 0, 1.0);
    const AttentionGradients g = t.run();
    EXPECT_EQ(g.dv[0], RefValue::from_exact(Mpfr(53, 1.0))) << given << ": " << to_string(g.dv[0]);
    EXPECT_EQ(compare_with_naive(t.bc, given), "");
  }
  {
    Builder t(1, 1, 0, 2, 2, 2, 2, Format::BF16);
    t.set("Q", 0, 0, 0, 0, 1), t.set("Q", 0, 0, 1, 1, 1);
    t.set("K", 0, 0, 0, 0, 1), t.set("K", 0, 0, 1, 1, 1);
    t.set("V", 0, 0, 0, 0, 3), t.set("V", 0, 0, 1, 1, -2), t.set("V", 0, 0, 1, 0, 0.5);
    for (int i = 0; i < 2; ++i) t.set("dO", 0, 0, i, 0, 0.75), t.set("dO", 0, 0, i, 1, -1.25);
    const AttentionGradients g = t.run();
    EXPECT_EQ(g.dv[g.v_index(0, 0, 0, 0)].to_double(), 0.75);
    EXPECT_EQ(g.dv[g.v_index(0, 0, 1, 1)].to_double(), -1.25);
    EXPECT_FALSE(g.dv[g.v_index(0, 0, 0, 0)].inexact);
    EXPECT_EQ(compare_with_naive(t.bc, 2), "");
  }
  {
    Builder t(1, 2, 1, 2, 3, 3, 2, Format::FP16);
    Bits bits(15, 99, 0);
    t.random("K", bits), t.random("V", bits);
    for (int i = 0; i < 2; ++i)
      for (int d = 0; d < 3; ++d) {
        const double q = ordinary(Format::FP16, bits, 2.0);
        t.set("Q", 0, 0, i, d, q), t.set("Q", 0, 1, i, d, q);
      }
    for (int i = 0; i < 2; ++i)
      for (int d = 0; d < 2; ++d) {
        const double o = ordinary(Format::FP16, bits, 2.0);
        t.set("dO", 0, 0, i, d, o), t.set("dO", 0, 1, i, d, -o);
      }
    const AttentionGradients g = t.run();
    EXPECT_TRUE(all_plus_zero(g.dk));
    EXPECT_TRUE(all_plus_zero(g.dv));
    EXPECT_FALSE(all_plus_zero(g.dq));
    EXPECT_EQ(compare_with_naive(t.bc, 3), "");
  }
}
