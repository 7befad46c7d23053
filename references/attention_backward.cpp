#include "references/attention_backward.hpp"

#include <gmp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
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
constexpr std::string_view kWho = "attention backward reference";
constexpr mpfr_prec_t kFirstPrecision = 192;
constexpr mpfr_prec_t kMaxPrecision = mpfr_prec_t{1} << 18;

// ---------------------------------------------------------------------------------------
// Arithmetic pieces

// An upper bound m 2^e (m = 0 or in [0.5, 1)) kept in double arithmetic with a 64-bit
// exponent: products of attention weights lie far below the doubles' range. Each operation
// is within 2^-53 of its exact result, so along a chain of fewer than 2^30 of them the value
// stays within 2^-22 of a true upper bound; bound() adds 2^-20.
struct Ub {
  double m = 0.0;
  std::int64_t e = 0;

  static Ub of(double x) {
    Ub u;
    int ex = 0;
    u.m = std::frexp(std::fabs(x), &ex);
    u.e = ex;
    return u;
  }
  static Ub of(mpfr_srcptr x) {
    Ub u;
    if (mpfr_zero_p(x)) return u;
    long ex = 0;
    u.m = std::fabs(mpfr_get_d_2exp(&ex, x, MPFR_RNDA));
    u.e = ex;
    if (u.m >= 1.0) u.m = 0.5, ++u.e;
    return u;
  }
  bool zero() const { return m == 0.0; }
  Ub operator*(const Ub& o) const {
    if (m == 0.0 || o.m == 0.0) return {};
    Ub r{m * o.m, e + o.e};  // in [0.25, 1)
    if (r.m < 0.5) r.m *= 2.0, --r.e;
    return r;
  }
  Ub times(double k) const { return *this * of(k); }
  Ub scaled(std::int64_t by) const { return m == 0.0 ? Ub{} : Ub{m, e + by}; }
  Ub& operator+=(const Ub& o) {
    if (o.m == 0.0) return *this;
    if (m == 0.0) return *this = o;
    if (e >= o.e) m += shifted(o.m, e - o.e);
    else m = o.m + shifted(m, o.e - e), e = o.e;
    if (m >= 1.0) m *= 0.5, ++e;
    return *this;
  }
  friend Ub operator+(Ub a, const Ub& b) { return a += b; }
  /// out (precision 64) >= the bound.
  void bound(mpfr_ptr out) const {
    mpfr_set_prec(out, 64);
    mpfr_set_d(out, m, MPFR_RNDU);
    mpfr_mul_d(out, out, 1.0 + 0x1p-20, MPFR_RNDU);
    mpfr_mul_2si(out, out, static_cast<long>(e), MPFR_RNDU);
  }

 private:
  static double shifted(double x, std::int64_t by) { return by > 1000 ? 0x1p-1000 : std::ldexp(x, -static_cast<int>(by)); }
};

// For its scope, this thread's MPFR exponent range is the widest (about 2^(+-2^62)): an
// attention weight of e^-(10^12) is then an ordinary MPFR number (the default range ends at
// 2^-(2^30), a score gap near 7.4e8). An MPFR built without thread-local limits keeps the
// default: one thread's limits must not change under another.
class WideExponents {
 public:
  WideExponents() : emin_(mpfr_get_emin()), emax_(mpfr_get_emax()), set_(mpfr_buildopt_tls_p() != 0) {
    if (set_) mpfr_set_emin(mpfr_get_emin_min()), mpfr_set_emax(mpfr_get_emax_max());
  }
  ~WideExponents() {
    if (set_) mpfr_set_emin(emin_), mpfr_set_emax(emax_);
  }
  WideExponents(const WideExponents&) = delete;
  WideExponents& operator=(const WideExponents&) = delete;

 private:
  mpfr_exp_t emin_, emax_;
  bool set_;
};

class Mpq {
 public:
  Mpq() { mpq_init(v_); }
  ~Mpq() { mpq_clear(v_); }
  Mpq(const Mpq&) = delete;
  Mpq& operator=(const Mpq&) = delete;
  operator mpq_ptr() { return v_; }
  operator mpq_srcptr() const { return v_; }

 private:
  mpq_t v_;
};
using MpqBox = std::unique_ptr<Mpq>;

// MPFR numbers in one allocation of their headers (no per-number box).
class MpfrArray {
 public:
  MpfrArray() = default;
  ~MpfrArray() { clear(); }
  MpfrArray(const MpfrArray&) = delete;
  MpfrArray& operator=(const MpfrArray&) = delete;
  MpfrArray(MpfrArray&& o) noexcept : v_(std::move(o.v_)), p_(o.p_) { o.v_.clear(); }
  MpfrArray& operator=(MpfrArray&& o) noexcept {
    std::swap(v_, o.v_), std::swap(p_, o.p_);
    return *this;
  }
  /// n zeros of precision p.
  void assign(std::size_t n, mpfr_prec_t p) {
    free_mpfr_caches_at_thread_exit();
    if (v_.size() == n && p_ == p) {
      for (auto& x : v_) mpfr_set_zero(&x, 1);
      return;
    }
    clear();
    v_.resize(n);
    p_ = p;
    for (auto& x : v_) mpfr_init2(&x, p), mpfr_set_zero(&x, 1);
  }
  /// At least n numbers of precision p, values unspecified.
  void reserve(std::size_t n, mpfr_prec_t p) {
    if (v_.size() < n || p_ != p) assign(std::max(n, v_.size()), p);
  }
  mpfr_ptr operator[](std::size_t i) { return &v_[i]; }
  mpfr_srcptr operator[](std::size_t i) const { return &v_[i]; }
  std::size_t size() const { return v_.size(); }

 private:
  void clear() {
    for (auto& x : v_) mpfr_clear(&x);
    v_.clear();
  }
  std::vector<__mpfr_struct> v_;
  mpfr_prec_t p_ = 0;
};

// out = x n exactly.
void exact_times(mpfr_ptr out, mpfr_srcptr x, unsigned long n) {
  mpfr_set_prec(out, mpfr_get_prec(x) + 64);
  mpfr_mul_ui(out, x, n, MPFR_RNDN);
}

// out = the exact sum of xs.
void exact_sum(mpfr_ptr out, const std::vector<mpfr_ptr>& xs) {
  long hi = LONG_MIN, lo = LONG_MAX;
  for (mpfr_srcptr x : xs) {
    if (!mpfr_regular_p(x)) continue;
    hi = std::max<long>(hi, mpfr_get_exp(x));
    lo = std::min<long>(lo, mpfr_get_exp(x) - static_cast<long>(mpfr_get_prec(x)));
  }
  if (hi < lo) {
    mpfr_set_prec(out, 2);
    mpfr_set_zero(out, 1);
    return;
  }
  mpfr_set_prec(out, static_cast<mpfr_prec_t>(hi - lo + 66));  // room for 2^64 carries
  mpfr_sum(out, xs.data(), xs.size(), MPFR_RNDN);
}

// out = the exact rational value of the finite MPFR number x.
void to_mpq(mpq_ptr out, mpfr_srcptr x) {
  if (mpfr_zero_p(x)) {
    mpq_set_ui(out, 0, 1);
    return;
  }
  mpz_t z;
  mpz_init(z);
  const mpfr_exp_t e = mpfr_get_z_2exp(z, x);
  mpq_set_z(out, z);
  mpz_clear(z);
  if (e >= 0) mpq_mul_2exp(out, out, static_cast<mp_bitcnt_t>(e));
  else mpq_div_2exp(out, out, static_cast<mp_bitcnt_t>(-e));
}

// The window of an exact rational; an exact zero is +0 (a kernel's sums start from +0).
RefValue exact_value(mpq_srcptr q) {
  if (mpq_sgn(q) == 0) return RefValue::zero(false);
  Mpfr t(128);
  const int ternary = mpfr_set_q(t, q, MPFR_RNDZ);
  RefValue r = RefValue::from_exact(t);
  r.inexact = ternary != 0;
  return r;
}

// The window of y, certified by the caller; below 2^-(2^30) the tiny value of its sign.
RefValue certified(mpfr_srcptr y) {
  if (mpfr_get_exp(y) - 1 <= RefValue::kTinyExponent) return RefValue::tiny(mpfr_signbit(y) != 0);
  return RefValue::from_certified(y);
}

// ---------------------------------------------------------------------------------------
// The case

Format do_format_of(const Case& c) {
  if (const auto it = c.types.find("dO"); it != c.types.end()) return it->second;
  if (const auto it = c.types.find("O"); it != c.types.end()) return it->second;
  throw InputError(fmt::format("{}: the case names no format for dO (types \"dO\" or \"O\")", kWho));
}

Format output_format(const Case& c, const char* output, const char* like) {
  const auto it = c.types.find(output);
  return it != c.types.end() ? it->second : c.types.at(like);
}

void check_finite(const Tensor& t, std::int64_t elements, const char* operand) {
  for (std::int64_t e = 0; e < elements; ++e)
    if (!std::isfinite(t.value(static_cast<std::size_t>(e))))
      throw InputError(fmt::format("{}: input {} holds a NaN or infinite value at element {} (the gradient of softmax "
                                   "has no exact value there; the check path sets such inputs to 0 first)",
                                   kWho, operand, e));
}

// The case's tensors, views and scale, as every row reads them.
struct Problem {
  Problem(const Case& cs, const std::map<std::string, Tensor>& inputs)
      : c(cs), a(cs.attention),
        qv(attention_view(cs, "Q")), kv(attention_view(cs, "K")), vv(attention_view(cs, "V")),
        ov(attention_view(cs, "O")),
        qt(checked_input(inputs, "Q", cs.types.at("Q"), qv.elements(), kWho)),
        kt(checked_input(inputs, "K", cs.types.at("K"), kv.elements(), kWho)),
        vt(checked_input(inputs, "V", cs.types.at("V"), vv.elements(), kWho)),
        dot(checked_input(inputs, "dO", do_format_of(cs), ov.elements(), kWho)),
        hd(a.head_dim), dv(a.eff_head_dim_v()), kvh(a.eff_kv_heads()), group(a.heads / a.eff_kv_heads()),
        fast_scores(qt.format() != Format::FP64 && kt.format() != Format::FP64),
        fast_dp(dot.format() != Format::FP64 && vt.format() != Format::FP64), scale(scale_of(a)) {
    check_finite(qt, qv.elements(), "Q");
    check_finite(kt, kv.elements(), "K");
    check_finite(vt, vv.elements(), "V");
    check_finite(dot, ov.elements(), "dO");
  }
  const Case& c;
  const AttentionShape& a;
  const AttentionView qv, kv, vv, ov;
  const Tensor& qt;
  const Tensor& kt;
  const Tensor& vt;
  const Tensor& dot;
  const std::int64_t hd, dv, kvh, group;
  const bool fast_scores, fast_dp;  // exact dot products by the superaccumulator; FP64 takes the MPFR oracle
  const Scale scale;
};

// K and V of one (batch, K/V head): values, floats for the superaccumulator, and K as 53-bit
// MPFR numbers with their bounds (the dQ sums' coefficients).
struct BlockData {
  std::vector<double> k, v;  // [j * hd + d], [j * dv + d]
  std::vector<float> kf, vf;
  MpfrArray k_mp;
  std::vector<Ub> k_ub;
};

void load_block(const Problem& pb, std::int64_t b, std::int64_t hk, BlockData& bd) {
  const std::int64_t n = pb.a.seq_kv;
  bd.k.resize(static_cast<std::size_t>(n * pb.hd));
  bd.v.resize(static_cast<std::size_t>(n * pb.dv));
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t d = 0; d < pb.hd; ++d) bd.k[j * pb.hd + d] = pb.kt.value(pb.kv.offset(b, hk, j, d));
    for (std::int64_t d = 0; d < pb.dv; ++d) bd.v[j * pb.dv + d] = pb.vt.value(pb.vv.offset(b, hk, j, d));
  }
  bd.kf.assign(bd.k.begin(), bd.k.end());
  bd.vf.assign(bd.v.begin(), bd.v.end());
  bd.k_mp.assign(bd.k.size(), 53);
  bd.k_ub.resize(bd.k.size());
  for (std::size_t e = 0; e < bd.k.size(); ++e) mpfr_set_d(bd.k_mp[e], bd.k[e], MPFR_RNDN), bd.k_ub[e] = Ub::of(bd.k[e]);
}

// Exact dot products of two rows.
class Dots {
 public:
  void dot(mpfr_ptr out, std::span<const double> x, std::span<const float> xf, std::span<const double> y,
           std::span<const float> yf, bool fast) {
    if (fast) {
      acc_.clear();
      acc_.add_products(xf, yf);
      acc_.exact_value(out);
    } else {
      oracle_.dot(out, x, y);
    }
  }

 private:
  ExactAccumulator acc_;
  MpfrOracle oracle_;
};

// ---------------------------------------------------------------------------------------
// One query row, exactly

// A group of visible keys with equal scores. a = s_g - s_T, dp_sum = sum of dP over the
// group, c = n_T dp_sum_g - n_g dp_sum_T (0 for T): all exact.
struct Group {
  std::vector<std::int64_t> keys;
  MpfrBox a = std::make_unique<Mpfr>(2), dp_sum = std::make_unique<Mpfr>(2), c = std::make_unique<Mpfr>(2);
  std::int64_t size() const { return static_cast<std::int64_t>(keys.size()); }
};

// Row (b, h, i) with its n visible keys first .. first + n - 1 (per-key vectors are indexed from
// the first visible key: entry j is key first + j): the exact scores s_j = q.k_j and
// dP_j = dO.v_j, the groups of equal scores (groups[0] = T, the largest scale * s), and
// e_j = n_T dP_j - sum_T dP. Then P_j -> [j in T] / n_T and dS_j -> [j in T] e_j / n_T^2 as the
// other groups' weights go to 0: the rational "limit" parts.
struct RowExact {
  std::int64_t b = 0, h = 0, i = 0, first = 0, n = 0;
  std::vector<double> q, d_o;
  std::vector<float> qf, d_of;
  MpfrArray q_mp, d_o_mp;
  std::vector<Ub> q_ub, d_o_ub;
  std::vector<MpfrBox> score, dp, e;  // grown, never shrunk: [0, n) in use
  std::vector<std::uint32_t> group_of;
  std::vector<Group> groups;  // [0, g_count) in use
  std::size_t g_count = 0;
  std::int64_t n_top() const { return groups[0].size(); }
  std::int64_t key(std::int64_t j) const { return first + j; }  ///< the key of per-key entry j
  bool sees(std::int64_t key) const { return key >= first && key < first + n; }
};

void row_exact(const Problem& pb, const BlockData& bd, std::int64_t b, std::int64_t h, std::int64_t i, RowExact& r,
               Dots& dots) {
  const std::int64_t hd = pb.hd, dv = pb.dv;
  r.b = b, r.h = h, r.i = i;
  const KeyRange keys = attention_visible_keys(pb.c, b, i);
  r.first = keys.first, r.n = keys.size();
  r.q.resize(static_cast<std::size_t>(hd)), r.qf.resize(static_cast<std::size_t>(hd));
  r.d_o.resize(static_cast<std::size_t>(dv)), r.d_of.resize(static_cast<std::size_t>(dv));
  r.q_mp.reserve(static_cast<std::size_t>(hd), 53), r.d_o_mp.reserve(static_cast<std::size_t>(dv), 53);
  r.q_ub.resize(static_cast<std::size_t>(hd)), r.d_o_ub.resize(static_cast<std::size_t>(dv));
  for (std::int64_t d = 0; d < hd; ++d) {
    r.q[d] = pb.qt.value(pb.qv.offset(b, h, i, d)), r.qf[d] = static_cast<float>(r.q[d]);
    mpfr_set_d(r.q_mp[d], r.q[d], MPFR_RNDN), r.q_ub[d] = Ub::of(r.q[d]);
  }
  for (std::int64_t d = 0; d < dv; ++d) {
    r.d_o[d] = pb.dot.value(pb.ov.offset(b, h, i, d)), r.d_of[d] = static_cast<float>(r.d_o[d]);
    mpfr_set_d(r.d_o_mp[d], r.d_o[d], MPFR_RNDN), r.d_o_ub[d] = Ub::of(r.d_o[d]);
  }
  const auto n = static_cast<std::size_t>(r.n);
  while (r.score.size() < n) {
    r.score.push_back(std::make_unique<Mpfr>(2));
    r.dp.push_back(std::make_unique<Mpfr>(2));
    r.e.push_back(std::make_unique<Mpfr>(2));
  }
  r.group_of.resize(n);
  for (std::size_t j = 0; j < n; ++j) {
    const auto key = static_cast<std::size_t>(r.key(static_cast<std::int64_t>(j)));
    const std::span<const double> kj(bd.k.data() + key * hd, static_cast<std::size_t>(hd));
    const std::span<const float> kfj(bd.kf.data() + key * hd, static_cast<std::size_t>(hd));
    const std::span<const double> vj(bd.v.data() + key * dv, static_cast<std::size_t>(dv));
    const std::span<const float> vfj(bd.vf.data() + key * dv, static_cast<std::size_t>(dv));
    dots.dot(*r.score[j], r.q, r.qf, kj, kfj, pb.fast_scores);
    dots.dot(*r.dp[j], r.d_o, r.d_of, vj, vfj, pb.fast_dp);
  }
  // Groups of equal scores, the top group first (scale 0: one group).
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int sign = pb.scale.sign();
  if (sign != 0)
    std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
      const int cmp = mpfr_cmp(*r.score[x], *r.score[y]);
      return sign > 0 ? cmp > 0 : cmp < 0;
    });
  r.g_count = 0;
  for (std::size_t s : order) {
    if (r.g_count == 0 || (sign != 0 && !mpfr_equal_p(*r.score[s], *r.score[r.groups[r.g_count - 1].keys[0]]))) {
      if (r.groups.size() == r.g_count) r.groups.emplace_back();
      r.groups[r.g_count++].keys.clear();
    }
    r.groups[r.g_count - 1].keys.push_back(static_cast<std::int64_t>(s));
    r.group_of[s] = static_cast<std::uint32_t>(r.g_count - 1);
  }
  std::vector<mpfr_ptr> members;
  for (std::size_t g = 0; g < r.g_count; ++g) {
    Group& gr = r.groups[g];
    exact_difference(*gr.a, *r.score[gr.keys[0]], *r.score[r.groups[0].keys[0]]);
    members.clear();
    for (std::int64_t s : gr.keys) members.push_back(*r.dp[s]);
    exact_sum(*gr.dp_sum, members);
  }
  const auto n_top = static_cast<unsigned long>(r.n_top());
  Mpfr x(2), y(2);
  mpfr_set_zero(*r.groups[0].c, 1);
  for (std::size_t g = 1; g < r.g_count; ++g) {
    exact_times(x, *r.groups[g].dp_sum, n_top);
    exact_times(y, *r.groups[0].dp_sum, static_cast<unsigned long>(r.groups[g].size()));
    exact_difference(*r.groups[g].c, x, y);
  }
  for (std::size_t j = 0; j < n; ++j) {
    exact_times(x, *r.dp[j], n_top);
    exact_difference(*r.e[j], x, *r.groups[0].dp_sum);
  }
}

// ---------------------------------------------------------------------------------------
// One query row at precision p
//
// With u_g = exp(scale (s_g - s_T)) <= 1, R = sum_{g != T} n_g u_g and Z = n_T + R:
//   P_j = u_g / Z,  tau_j = P_j - [j in T] / n_T  (= -R / (n_T Z) in T),
//   D - D_T = deltaD = sum_{g != T} u_g c_g / (n_T Z),  D_T = sum_T dP / n_T,
//   dS_j = P_j (dP_j - D) = [j in T] e_j / n_T^2 + delta_j with
//   delta_j = tau_j e_j / n_T - deltaD / Z (j in T),  P_j (e_j / n_T - deltaD) (otherwise).
// Every quantity x below is held as x~ with |x~ - x| <= k 2^-p mass(x), mass(x) >= |x~| an
// upper bound of the sum of its terms' sizes: a product with a positive factor adds the
// factor's k and 1 (its rounding), a sum takes the larger k and 1.

struct RowApprox {
  mpfr_prec_t p = 0;
  MpfrArray tau, ds, sbar;  // per key: tau_j, delta_j, and e_j / n_T^2 in T
  std::vector<Ub> tau_mass, ds_mass, sbar_mass;
  MpfrArray weight, prob;  // per group: u_g, P_g
  Mpfr inv_top{2};         // 1 / n_T
  Ub inv_top_mass;
  std::vector<double> f;   // P_j (|dP_j| + |D|), for the magnitudes
  std::vector<double> pd;  // P_j
  double k = 0.0;
};

// x ~ scale * a with |x~ - x| <= 2^-(p+7); exact when the scale is a given double.
void scaled_score(mpfr_ptr x, mpfr_srcptr a, const Scale& s, mpfr_srcptr sigma, mpfr_prec_t p) {
  if (s.given) {
    mpfr_set_prec(x, mpfr_get_prec(a) + 53);
    mpfr_mul_d(x, a, s.value, MPFR_RNDN);
    return;
  }
  // |sigma~ - sigma| <= 2^-(p + top + 12) sigma, sigma <= 1 and |a| <= 2^top.
  mpfr_set_prec(x, p + std::max<long>(0, log2_bound(a)) + 8);
  mpfr_mul(x, sigma, a, MPFR_RNDN);
}

void row_approx(const Problem& pb, const RowExact& r, mpfr_prec_t p, bool magnitudes, RowApprox& out) {
  const auto n = static_cast<std::size_t>(r.n);
  const std::size_t groups = r.g_count;
  out.p = p;
  out.tau.reserve(n, p), out.ds.reserve(n, p), out.sbar.reserve(n, p);
  out.tau_mass.resize(n), out.ds_mass.resize(n), out.sbar_mass.resize(n);
  out.weight.reserve(groups, p), out.prob.reserve(groups, p);
  const auto n_top = static_cast<unsigned long>(r.n_top());
  Mpfr sigma(2), x(2), t(p), t2(p), big_r(p), z(p), iz(p), s(p), dd(p), tau_top(p);
  if (!pb.scale.given && groups > 1) {
    long top = 0;
    for (std::size_t g = 1; g < groups; ++g) top = std::max(top, log2_bound(*r.groups[g].a));
    mpfr_set_prec(sigma, p + top + 12);
    pb.scale.set(sigma);
  }
  // u_g (k 2: exp's argument within 2^-(p+7), exp correctly rounded), R, Z, 1/Z, and the
  // sum S = sum_{g != T} u_g c_g.
  mpfr_set_zero(big_r, 1), mpfr_set_zero(s, 1);
  Ub s_mass;
  for (std::size_t g = 1; g < groups; ++g) {
    const Group& gr = r.groups[g];
    scaled_score(x, *gr.a, pb.scale, sigma, p);
    mpfr_clear_underflow();
    mpfr_exp(out.weight[g], x, MPFR_RNDN);
    if (mpfr_underflow_p())
      throw std::runtime_error(fmt::format(
          "{}: an attention weight lies below MPFR's exponent range (batch {}, head {}, query {}: a score gap of {:g})",
          kWho, r.b, r.h, r.i, -mpfr_get_d(x, MPFR_RNDN)));
    mpfr_mul_ui(t, out.weight[g], static_cast<unsigned long>(gr.size()), MPFR_RNDN);
    mpfr_add(big_r, big_r, t, MPFR_RNDN);
    if (!mpfr_zero_p(*gr.c)) {
      mpfr_mul(t, out.weight[g], *gr.c, MPFR_RNDN);
      mpfr_add(s, s, t, MPFR_RNDN);
      s_mass += Ub::of(out.weight[g]) * Ub::of(*gr.c);
    }
  }
  const auto g_terms = static_cast<double>(groups);
  const double k_r = 3 + g_terms, k_z = k_r + 1, k_iz = k_z + 1, k_s = 3 + g_terms;
  mpfr_add_ui(z, big_r, n_top, MPFR_RNDN);
  mpfr_ui_div(iz, 1, z, MPFR_RNDN);
  const Ub iz_mass = Ub::of(iz);
  mpfr_set_prec(out.inv_top, p);
  mpfr_set_ui(out.inv_top, 1, MPFR_RNDN);
  mpfr_div_ui(out.inv_top, out.inv_top, n_top, MPFR_RNDN);
  out.inv_top_mass = Ub::of(out.inv_top);
  // deltaD = S / (n_T Z)
  mpfr_mul(dd, s, iz, MPFR_RNDN);
  mpfr_div_ui(dd, dd, n_top, MPFR_RNDN);
  const double k_dd = k_s + k_iz + 2;
  const Ub dd_mass = s_mass * iz_mass * out.inv_top_mass;
  // tau_T = -R / (n_T Z)
  mpfr_mul(tau_top, big_r, iz, MPFR_RNDN);
  mpfr_div_ui(tau_top, tau_top, n_top, MPFR_RNDN);
  mpfr_neg(tau_top, tau_top, MPFR_RNDN);
  const double k_tau_top = k_r + k_iz + 2;
  const Ub tau_top_mass = Ub::of(tau_top);
  const double k_prob = 2 + k_iz + 1;
  mpfr_set(out.prob[0], iz, MPFR_RNDN);
  for (std::size_t g = 1; g < groups; ++g) mpfr_mul(out.prob[g], out.weight[g], iz, MPFR_RNDN);
  double k = std::max({k_prob, k_tau_top, k_dd, 1.0});
  const Ub dd_over_z = iz_mass * dd_mass;
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t g = r.group_of[j];
    mpfr_srcptr e = *r.e[j];
    if (g == 0) {
      mpfr_set(out.tau[j], tau_top, MPFR_RNDN);
      out.tau_mass[j] = tau_top_mass;
      mpfr_div_ui(out.sbar[j], e, n_top * n_top, MPFR_RNDN);
      out.sbar_mass[j] = Ub::of(out.sbar[j]);
      // tau_T e_j / n_T - deltaD / Z
      mpfr_mul(t, tau_top, e, MPFR_RNDN);
      mpfr_div_ui(t, t, n_top, MPFR_RNDN);
      mpfr_mul(t2, iz, dd, MPFR_RNDN);
      mpfr_sub(out.ds[j], t, t2, MPFR_RNDN);
      out.ds_mass[j] = Ub::of(t) + dd_over_z;
      k = std::max(k, std::max(k_tau_top + 2, k_iz + k_dd + 1) + 1);
    } else {
      mpfr_set(out.tau[j], out.prob[g], MPFR_RNDN);
      out.tau_mass[j] = Ub::of(out.prob[g]);
      mpfr_set_zero(out.sbar[j], 1);
      out.sbar_mass[j] = {};
      // P_g (e_j / n_T - deltaD)
      mpfr_div_ui(t, e, n_top, MPFR_RNDN);
      const Ub inner_mass = Ub::of(t) + dd_mass;
      mpfr_sub(t, t, dd, MPFR_RNDN);
      mpfr_mul(out.ds[j], out.prob[g], t, MPFR_RNDN);
      out.ds_mass[j] = out.tau_mass[j] * inner_mass;
      k = std::max(k, std::max(1.0, k_dd) + 1 + k_prob + 1);
    }
  }
  out.k = k;
  if (!magnitudes) return;
  out.f.resize(n), out.pd.resize(n);
  const double d_total = mpfr_get_d(*r.groups[0].dp_sum, MPFR_RNDN) / static_cast<double>(n_top) +
                         mpfr_get_d(dd, MPFR_RNDN);
  for (std::size_t j = 0; j < n; ++j) {
    out.pd[j] = mpfr_get_d(out.prob[r.group_of[j]], MPFR_RNDN);
    out.f[j] = out.pd[j] * (std::fabs(mpfr_get_d(*r.dp[j], MPFR_RNDN)) + std::fabs(d_total));
  }
}

// ---------------------------------------------------------------------------------------
// Output elements: sums over rows (dK, dV) or keys (dQ) at precision p, and their decision

// Per element: delta = sum of the perturbation terms, limit = sum of the limit terms, each
// with its mass and number of roundings. The value is m (limit + delta), m the scale for dQ
// and dK, 1 for dV.
class SumArray {
 public:
  void assign(std::size_t n, mpfr_prec_t p) {
    delta_.assign(n, p), limit_.assign(n, p);
    delta_mass_.assign(n, Ub{}), limit_mass_.assign(n, Ub{});
    delta_terms_.assign(n, 0), limit_terms_.assign(n, 0);
  }
  std::size_t size() const { return delta_mass_.size(); }
  void add_delta(std::size_t e, mpfr_srcptr x, const Ub& x_mass, mpfr_srcptr coeff, const Ub& coeff_mass) {
    if (x_mass.zero() || coeff_mass.zero()) return;  // an exact zero term
    mpfr_fma(delta_[e], x, coeff, delta_[e], MPFR_RNDN);
    delta_mass_[e] += x_mass * coeff_mass;
    ++delta_terms_[e];
  }
  void add_limit(std::size_t e, mpfr_srcptr x, const Ub& x_mass, mpfr_srcptr coeff, const Ub& coeff_mass) {
    if (x_mass.zero() || coeff_mass.zero()) return;
    mpfr_fma(limit_[e], x, coeff, limit_[e], MPFR_RNDN);
    limit_mass_[e] += x_mass * coeff_mass;
    ++limit_terms_[e];
  }
  void merge(std::size_t e, const SumArray& o) {
    mpfr_add(delta_[e], delta_[e], o.delta_[e], MPFR_RNDN);
    mpfr_add(limit_[e], limit_[e], o.limit_[e], MPFR_RNDN);
    delta_mass_[e] += o.delta_mass_[e], limit_mass_[e] += o.limit_mass_[e];
    delta_terms_[e] += o.delta_terms_[e] + 1, limit_terms_[e] += o.limit_terms_[e] + 1;
  }
  /// The limit replaced by the exact one (rounded once).
  void set_limit(std::size_t e, mpq_srcptr exact) {
    mpfr_set_q(limit_[e], exact, MPFR_RNDN);
    limit_mass_[e] = Ub::of(limit_[e]);
    limit_terms_[e] = 0;
  }
  mpfr_srcptr delta(std::size_t e) const { return delta_[e]; }
  mpfr_srcptr limit(std::size_t e) const { return limit_[e]; }
  /// Bounds on |delta~ - delta| and |limit~ - limit| given the rows' k.
  Ub delta_error(std::size_t e, double k, mpfr_prec_t p) const {
    return delta_mass_[e].times(k + static_cast<double>(delta_terms_[e]) + 1).scaled(-p);
  }
  Ub limit_error(std::size_t e, double k, mpfr_prec_t p) const {
    return limit_mass_[e].times(k + static_cast<double>(limit_terms_[e]) + 1).scaled(-p);
  }
  bool delta_zero(std::size_t e) const { return delta_mass_[e].zero(); }
  bool limit_zero(std::size_t e) const { return limit_mass_[e].zero(); }

 private:
  MpfrArray delta_, limit_;
  std::vector<Ub> delta_mass_, limit_mass_;
  std::vector<std::int64_t> delta_terms_, limit_terms_;
};

// The scale at precision p: exact (a given double) or correctly rounded.
struct ScaleAt {
  ScaleAt(const Scale& s, mpfr_prec_t p) : value(s.given ? 53 : p), exact(s.given) { s.set(value); }
  Mpfr value;
  bool exact;
};

// The value m (limit + delta) at precision p when its 128-bit window is decided.
// A value known only to lie within err of t where |t| + err < 2^kNegligibleExponent, far
// below FP64's smallest subnormal (2^-1074): every format rounds it to a zero, so its digits
// are not needed (a gradient of weights e^-(10^6) cancelling against terms near 1 would need
// millions of bits). Held as tiny() of t's sign where |t| > err proves it, else as +0 (the
// checks compare +0 and -0 as equal).
constexpr long kNegligibleExponent = -1100;
std::optional<RefValue> below_every_subnormal(mpfr_srcptr t, mpfr_srcptr err) {
  Mpfr top(64);
  mpfr_abs(top, t, MPFR_RNDU);
  mpfr_prec_round(top, 64, MPFR_RNDU);
  mpfr_add(top, top, err, MPFR_RNDU);
  if (mpfr_zero_p(top)) return RefValue::zero(false);
  if (mpfr_get_exp(top) > kNegligibleExponent) return std::nullopt;
  if (mpfr_cmpabs(t, err) > 0) return RefValue::tiny(mpfr_signbit(t) != 0);
  return RefValue::zero(false);
}

std::optional<RefValue> decide_plain(const SumArray& sums, std::size_t e, double k, mpfr_prec_t p,
                                     const ScaleAt* scale) {
  if (sums.delta_zero(e) && sums.limit_zero(e)) return RefValue::zero(false);  // every term exactly 0
  Mpfr t(p), t2(p), bound(64);
  mpfr_add(t, sums.limit(e), sums.delta(e), MPFR_RNDN);
  Ub err = sums.delta_error(e, k, p) + sums.limit_error(e, k, p) + Ub::of(t).scaled(-p);
  if (scale) {
    mpfr_mul(t2, t, scale->value, MPFR_RNDN);
    const Ub sigma = Ub::of(scale->value);
    Ub err2 = err * sigma + Ub::of(t2).scaled(-p);
    if (!scale->exact) err2 += (Ub::of(t) + err) * sigma.scaled(1 - p);  // |sigma~ - sigma| <= 2^-p sigma
    err = err2;
    mpfr_swap(t, t2);
  }
  err.bound(bound);
  if (mpfr_zero_p(t)) return below_every_subnormal(t, bound);
  const long bits = static_cast<long>(mpfr_get_exp(t)) - static_cast<long>(mpfr_get_exp(bound));
  if (bits <= 0 || !mpfr_can_round(t, bits, MPFR_RNDN, MPFR_RNDZ, 128)) return below_every_subnormal(t, bound);
  return certified(t);
}

// m * limit exactly, where m (the scale, when `scaled`) is rational.
std::optional<RefValue> exact_multiple(mpq_srcptr limit, const Scale& s, bool scaled) {
  if (!scaled || mpq_sgn(limit) == 0) return exact_value(limit);
  Mpq v;
  if (s.given) mpq_set_d(v, s.value);
  else if (s.root) mpq_set_ui(v, 1, static_cast<unsigned long>(s.root));
  else return std::nullopt;  // irrational: so is the value, and Ziv's loop decides it
  mpq_mul(v, v, limit);
  return exact_value(v);
}

// The value m (limit + delta) next to the exact m limit: decided from delta's sign and size
// (window_near) where m limit is a rational with a denominator of one word.
std::optional<RefValue> decide_near(const SumArray& sums, std::size_t e, mpq_srcptr limit, double k, mpfr_prec_t p,
                                    const Scale& s, bool scaled) {
  if (mpq_sgn(limit) == 0 || sums.delta_zero(e)) return std::nullopt;
  if (scaled && !s.given && !s.root) return std::nullopt;
  if (!mpz_fits_ulong_p(mpq_denref(limit))) return std::nullopt;
  unsigned long n = mpz_get_ui(mpq_denref(limit));
  if (scaled && !s.given && __builtin_mul_overflow(n, static_cast<unsigned long>(s.root), &n)) return std::nullopt;
  Mpfr num(static_cast<mpfr_prec_t>(std::max<std::size_t>(2, mpz_sizeinbase(mpq_numref(limit), 2))));
  mpfr_set_z(num, mpq_numref(limit), MPFR_RNDN);  // exact
  if (scaled && s.given) {
    Mpfr x(mpfr_get_prec(num) + 53);
    mpfr_mul_d(x, num, s.value, MPFR_RNDN);  // exact
    mpfr_set_prec(num, mpfr_get_prec(x));
    mpfr_set(num, x, MPFR_RNDN);
  }
  // Delta = m delta sgn(m limit), in [lo, hi]
  Mpfr bound(64), lo(p + 64), hi(p + 64);
  sums.delta_error(e, k, p).bound(bound);
  mpfr_sub(lo, sums.delta(e), bound, MPFR_RNDD);
  mpfr_add(hi, sums.delta(e), bound, MPFR_RNDU);
  if (scaled && s.given) {
    mpfr_prec_round(lo, p + 64 + 53, MPFR_RNDN), mpfr_prec_round(hi, p + 64 + 53, MPFR_RNDN);
    mpfr_mul_d(lo, lo, s.value, MPFR_RNDN), mpfr_mul_d(hi, hi, s.value, MPFR_RNDN);  // exact
    if (s.value < 0) mpfr_swap(lo, hi);
  } else if (scaled) {
    mpfr_div_ui(lo, lo, static_cast<unsigned long>(s.root), MPFR_RNDD);
    mpfr_div_ui(hi, hi, static_cast<unsigned long>(s.root), MPFR_RNDU);
  }
  const bool negative = mpfr_sgn(num.get()) < 0;
  if (negative) {
    mpfr_swap(lo, hi);
    mpfr_neg(lo, lo, MPFR_RNDN), mpfr_neg(hi, hi, MPFR_RNDN);
  }
  const int sign = mpfr_sgn(lo.get()) > 0 ? 1 : mpfr_sgn(hi.get()) < 0 ? -1 : 0;
  return window_near(num, n, lo, hi, negative, sign);
}

// ---------------------------------------------------------------------------------------
// The exact analysis: whether a gradient is rational, and which rational
//
// With x = e^scale, a row's weights are x^(a_g) for its groups (a_g = s_g - s_T exact) and
// F = sum_g n_g x^(a_g), so P_j = x^(a_j) / F and dS_j = x^(a_j) H_j / F^2 with
// H_j = sum_g (n_g dP_j - sum_g dP) x^(a_g). A gradient is a sum over rows of such terms:
// dV_jd = sum_C N_C / F_C, dK_jd / scale = sum_C N_C / F_C^2 (rows grouped in classes C of
// equal F), dQ_id / scale = N / F^2, each N an exponential polynomial with rational
// coefficients. scale * exponents are distinct algebraic numbers, so by Lindemann-Weierstrass
// an exponential polynomial with algebraic coefficients is 0 only when every coefficient is:
// N / F^k is then algebraic exactly when N = alpha F^k coefficient by coefficient, alpha
// rational; and a sum over classes is rational exactly when L = alpha Q, L = sum_C N_C
// prod_{C' != C} F_C'^k, Q = prod_C F_C^k. Anything else is transcendental, and Ziv's loop
// ends on it.

class ExpPoly {
 public:
  /// Adds c x^a (exact copies).
  void add(mpfr_srcptr a, mpfr_srcptr c) {
    if (mpfr_zero_p(c)) return;
    t_.push_back({copy(a), copy(c)});
  }
  /// Sorts by exponent, merges equal exponents and drops zero coefficients.
  void normalize() {
    std::sort(t_.begin(), t_.end(), [](const Term& x, const Term& y) { return mpfr_cmp(*x.a, *y.a) < 0; });
    std::vector<Term> merged;
    for (Term& t : t_) {
      if (!merged.empty() && mpfr_equal_p(*merged.back().a, *t.a)) {
        Mpfr sum(2);
        exact_sum_of(sum, *merged.back().c, *t.c);
        merged.back().c = copy(sum);
      } else {
        merged.push_back(std::move(t));
      }
      if (mpfr_zero_p(*merged.back().c)) merged.pop_back();
    }
    t_ = std::move(merged);
  }
  std::size_t size() const { return t_.size(); }
  bool empty() const { return t_.empty(); }
  ExpPoly clone() const {
    ExpPoly r;
    for (const Term& t : t_) r.t_.push_back({copy(*t.a), copy(*t.c)});
    return r;
  }
  /// out = x y (normalized); false when x y has more than `budget` raw terms.
  static bool product(const ExpPoly& x, const ExpPoly& y, ExpPoly& out, std::size_t budget) {
    if (x.size() * y.size() > budget) return false;
    ExpPoly r;
    Mpfr a(2), c(2);
    for (const Term& s : x.t_)
      for (const Term& t : y.t_) {
        exact_sum_of(a, *s.a, *t.a);
        mpfr_set_prec(c, mpfr_get_prec(*s.c) + mpfr_get_prec(*t.c));
        mpfr_mul(c, *s.c, *t.c, MPFR_RNDN);  // exact
        r.add(a, c);
      }
    r.normalize();
    out = std::move(r);
    return true;
  }
  /// *this += o (normalized).
  void add_all(const ExpPoly& o) {
    for (const Term& t : o.t_) add(*t.a, *t.c);
    normalize();
  }
  /// alpha with *this == alpha o (both normalized, o nonzero); false when not proportional.
  bool ratio(const ExpPoly& o, mpq_ptr alpha) const {
    if (t_.empty()) {
      mpq_set_ui(alpha, 0, 1);
      return true;
    }
    if (t_.size() != o.t_.size()) return false;
    Mpfr lhs(2), rhs(2);
    for (std::size_t i = 0; i < t_.size(); ++i) {
      if (!mpfr_equal_p(*t_[i].a, *o.t_[i].a)) return false;
      if (i == 0) continue;
      mpfr_set_prec(lhs, mpfr_get_prec(*t_[i].c) + mpfr_get_prec(*o.t_[0].c));
      mpfr_set_prec(rhs, mpfr_get_prec(*o.t_[i].c) + mpfr_get_prec(*t_[0].c));
      mpfr_mul(lhs, *t_[i].c, *o.t_[0].c, MPFR_RNDN);  // exact
      mpfr_mul(rhs, *o.t_[i].c, *t_[0].c, MPFR_RNDN);
      if (!mpfr_equal_p(lhs, rhs)) return false;
    }
    Mpq den;
    to_mpq(alpha, *t_[0].c);
    to_mpq(den, *o.t_[0].c);
    mpq_div(alpha, alpha, den);
    return true;
  }

 private:
  struct Term {
    MpfrBox a, c;
  };
  static MpfrBox copy(mpfr_srcptr x) {
    auto m = std::make_unique<Mpfr>(mpfr_get_prec(x));
    mpfr_set(*m, x, MPFR_RNDN);
    return m;
  }
  std::vector<Term> t_;
};

enum class Verdict { Rational, Transcendental, Unknown };
constexpr std::size_t kTermBudget = 1 << 14;

// F = sum_g n_g x^(a_g) of a row, raised to `power` (1 or 2).
ExpPoly denominator(const RowExact& r, int power) {
  ExpPoly f;
  Mpfr n(64);
  for (std::size_t g = 0; g < r.g_count; ++g) {
    mpfr_set_ui(n, static_cast<unsigned long>(r.groups[g].size()), MPFR_RNDN);
    f.add(*r.groups[g].a, n);
  }
  f.normalize();
  if (power == 1) return f;
  ExpPoly f2;
  ExpPoly::product(f, f, f2, std::size_t{1} << 40);  // G^2 terms: the row's own size squared
  return f2;
}

// Adds coeff x^(a_j) H_j to n: the terms of dS_j (times its F^2) scaled by coeff.
void add_ds_terms(const RowExact& r, std::int64_t j, double coeff, ExpPoly& n) {
  if (coeff == 0.0) return;
  Mpfr h(2), x(2), a(2), c(2);
  const mpfr_srcptr a_j = *r.groups[r.group_of[j]].a;
  for (std::size_t g = 0; g < r.g_count; ++g) {
    exact_times(x, *r.dp[j], static_cast<unsigned long>(r.groups[g].size()));
    exact_difference(h, x, *r.groups[g].dp_sum);  // n_g dP_j - sum_g dP
    if (mpfr_zero_p(h)) continue;
    exact_sum_of(a, a_j, *r.groups[g].a);
    mpfr_set_prec(c, mpfr_get_prec(h) + 53);
    mpfr_mul_d(c, h, coeff, MPFR_RNDN);  // exact
    n.add(a, c);
  }
}

// Whether sum_C N_C / Fk_C (the classes' numerators and powered denominators) is rational,
// and its value.
Verdict classify(std::vector<std::pair<ExpPoly, ExpPoly>>& classes, mpq_ptr value) {
  mpq_set_ui(value, 0, 1);
  std::vector<std::size_t> rest;
  Mpq alpha;
  for (std::size_t c = 0; c < classes.size(); ++c) {
    auto& [fk, n] = classes[c];
    n.normalize();
    if (n.empty()) continue;
    if (n.ratio(fk, alpha)) mpq_add(value, value, alpha);
    else rest.push_back(c);
  }
  if (rest.empty()) return Verdict::Rational;
  if (rest.size() == 1) return Verdict::Transcendental;
  if (rest.size() > 8) return Verdict::Unknown;
  ExpPoly q = classes[rest[0]].first.clone(), l, term, next;
  for (std::size_t k = 1; k < rest.size(); ++k) {
    if (!ExpPoly::product(q, classes[rest[k]].first, next, kTermBudget)) return Verdict::Unknown;
    q = std::move(next);
  }
  for (std::size_t k = 0; k < rest.size(); ++k) {
    term = classes[rest[k]].second.clone();
    for (std::size_t other = 0; other < rest.size(); ++other) {
      if (other == k) continue;
      if (!ExpPoly::product(term, classes[rest[other]].first, next, kTermBudget)) return Verdict::Unknown;
      term = std::move(next);
    }
    l.add_all(term);
  }
  if (!l.ratio(q, alpha)) return Verdict::Transcendental;
  mpq_add(value, value, alpha);
  return Verdict::Rational;
}

// dQ_id / scale of row r.
Verdict classify_dq(const RowExact& r, const BlockData& bd, std::int64_t hd, std::int64_t d, mpq_ptr value) {
  std::vector<std::pair<ExpPoly, ExpPoly>> one(1);
  one[0].first = denominator(r, 2);
  for (std::int64_t j = 0; j < r.n; ++j) add_ds_terms(r, j, bd.k[r.key(j) * hd + d], one[0].second);
  return classify(one, value);
}

// Whether two rows have the same groups: the same F.
int compare_shapes(const RowExact& x, const RowExact& y) {
  if (x.g_count != y.g_count) return x.g_count < y.g_count ? -1 : 1;
  for (std::size_t g = 0; g < x.g_count; ++g) {
    if (const int c = mpfr_cmp(*x.groups[g].a, *y.groups[g].a)) return c;
    if (x.groups[g].size() != y.groups[g].size()) return x.groups[g].size() < y.groups[g].size() ? -1 : 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// The computation: passes over the query rows at rising precision

class Backward {
 public:
  Backward(const Case& c, const std::map<std::string, Tensor>& inputs, unsigned threads, mpfr_prec_t first);
  AttentionGradients run();

 private:
  enum class Stage { First, Limits, Later };  // Limits: the exact limits of the open elements
  struct Item {
    std::size_t block;
    std::int64_t row_begin, row_end, chunks;
  };
  // One item's sums over its rows for its block's dK and dV.
  struct Chunk {
    SumArray dk, dv;
    std::vector<double> dk_mag, dv_mag;
    std::vector<MpqBox> dk_lim, dv_lim;
    double k = 0.0;
  };
  // What a worker reuses from row to row.
  struct Scratch {
    Dots dots;
    RowExact row;
    RowApprox approx;
    SumArray dq;
    std::vector<double> dq_mag;
  };

  std::int64_t block_rows() const { return pb_.group * pb_.a.seq_q; }
  std::int64_t q_base(std::size_t block, std::int64_t lr) const {
    const std::int64_t b = static_cast<std::int64_t>(block) / pb_.kvh, hk = static_cast<std::int64_t>(block) % pb_.kvh;
    return out_.q_index(b, hk * pb_.group + lr / pb_.a.seq_q, lr % pb_.a.seq_q, 0);
  }
  std::int64_t k_base(std::size_t block) const { return static_cast<std::int64_t>(block) * pb_.a.seq_kv * pb_.hd; }
  std::int64_t v_base(std::size_t block) const { return static_cast<std::int64_t>(block) * pb_.a.seq_kv * pb_.dv; }
  bool keys_open(std::size_t block) const;
  bool block_open(std::size_t block) const;

  void pass(mpfr_prec_t p, Stage stage);
  void analyse(std::size_t block);
  void run_item(const Item& item, mpfr_prec_t p, Stage stage, Chunk& chunk, Scratch& scratch);
  void row_dq(std::size_t block, std::int64_t lr, mpfr_prec_t p, Stage stage, Scratch& scratch);
  void row_keys(std::size_t block, const std::vector<char>& key_open, Stage stage, Chunk& chunk, Scratch& scratch);
  void finish_keys(std::size_t block, Chunk& chunk, mpfr_prec_t p, Stage stage);
  std::optional<RefValue> decide(SumArray& sums, std::size_t e, double k, mpfr_prec_t p, const ScaleAt* scale,
                                 const Mpq* limit) const;
  [[noreturn]] void throw_undecided() const;

  const Problem pb_;
  const unsigned threads_;
  const mpfr_prec_t first_;  // Ziv's first precision
  AttentionGradients out_;
  std::vector<char> open_q_, open_k_, open_v_;  // not yet decided
  std::vector<MpqBox> lim_q_, lim_k_, lim_v_;  // exact limits, once computed
  std::vector<BlockData> blocks_;
};

Backward::Backward(const Case& c, const std::map<std::string, Tensor>& inputs, unsigned threads, mpfr_prec_t first)
    : pb_(c, inputs), threads_(threads), first_(first) {
  const AttentionShape& a = pb_.a;
  out_.batch = a.batch, out_.heads = a.heads, out_.kv_heads = pb_.kvh, out_.seq_q = a.seq_q, out_.seq_kv = a.seq_kv;
  out_.head_dim = pb_.hd, out_.head_dim_v = pb_.dv;
  out_.dq_format = output_format(c, "dQ", "Q");
  out_.dk_format = output_format(c, "dK", "K");
  out_.dv_format = output_format(c, "dV", "V");
  const auto nq = static_cast<std::size_t>(a.batch * a.heads * a.seq_q * pb_.hd);
  const auto nk = static_cast<std::size_t>(a.batch * pb_.kvh * a.seq_kv * pb_.hd);
  const auto nv = static_cast<std::size_t>(a.batch * pb_.kvh * a.seq_kv * pb_.dv);
  out_.dq.assign(nq, RefValue::zero(false)), out_.dk.assign(nk, RefValue::zero(false));
  out_.dv.assign(nv, RefValue::zero(false));
  out_.dq_magnitude.assign(nq, 0.0), out_.dk_magnitude.assign(nk, 0.0), out_.dv_magnitude.assign(nv, 0.0);
  open_q_.assign(nq, 1), open_k_.assign(nk, 1), open_v_.assign(nv, 1);
  lim_q_.resize(nq), lim_k_.resize(nk), lim_v_.resize(nv);
  // Fully masked rows contribute nothing and their dQ is +0; keys no query sees get +0.
  for (std::int64_t b = 0; b < a.batch; ++b) {
    std::vector<std::int64_t> cover(static_cast<std::size_t>(a.seq_kv) + 1, 0);  // +1 at first, -1 at end
    for (std::int64_t i = 0; i < a.seq_q; ++i) {
      const KeyRange keys = attention_visible_keys(c, b, i);
      if (keys.size() == 0) {
        for (std::int64_t h = 0; h < a.heads; ++h) std::fill_n(open_q_.begin() + out_.q_index(b, h, i, 0), pb_.hd, 0);
        continue;
      }
      ++cover[static_cast<std::size_t>(keys.first)], --cover[static_cast<std::size_t>(keys.end)];
    }
    std::int64_t seen = 0;
    for (std::int64_t j = 0; j < a.seq_kv; ++j) {
      seen += cover[static_cast<std::size_t>(j)];
      if (seen > 0) continue;
      for (std::int64_t hk = 0; hk < pb_.kvh; ++hk) {
        std::fill_n(open_k_.begin() + out_.k_index(b, hk, j, 0), pb_.hd, 0);
        std::fill_n(open_v_.begin() + out_.v_index(b, hk, j, 0), pb_.dv, 0);
      }
    }
  }
  blocks_.resize(static_cast<std::size_t>(a.batch * pb_.kvh));
  parallel_for(static_cast<std::int64_t>(blocks_.size()), [&](std::int64_t blk) {
    load_block(pb_, blk / pb_.kvh, blk % pb_.kvh, blocks_[static_cast<std::size_t>(blk)]);
  }, threads_for(static_cast<double>(nk + nv), 0x1p16, threads_));
}

bool Backward::keys_open(std::size_t block) const {
  const auto kb = open_k_.begin() + k_base(block), vb = open_v_.begin() + v_base(block);
  return std::find(kb, kb + pb_.a.seq_kv * pb_.hd, 1) != kb + pb_.a.seq_kv * pb_.hd ||
         std::find(vb, vb + pb_.a.seq_kv * pb_.dv, 1) != vb + pb_.a.seq_kv * pb_.dv;
}

bool Backward::block_open(std::size_t block) const {
  if (keys_open(block)) return true;
  for (std::int64_t lr = 0; lr < block_rows(); ++lr) {
    const auto qb = open_q_.begin() + q_base(block, lr);
    if (std::find(qb, qb + pb_.hd, 1) != qb + pb_.hd) return true;
  }
  return false;
}

AttentionGradients Backward::run() {
  pass(first_, Stage::First);
  for (mpfr_prec_t p = 2 * first_;; p *= 2) {
    bool open = false;
    for (std::size_t blk = 0; blk < blocks_.size() && !open; ++blk) open = block_open(blk);
    if (!open) break;
    if (p > kMaxPrecision) throw_undecided();
    pass(p, p == 2 * first_ ? Stage::Limits : Stage::Later);
    if (p == 2 * first_) {  // what two precisions left open: is it rational?
      std::vector<std::size_t> open;
      for (std::size_t blk = 0; blk < blocks_.size(); ++blk)
        if (block_open(blk)) open.push_back(blk);
      parallel_for(static_cast<std::int64_t>(open.size()), [&](std::int64_t k) {
        const WideExponents wide;
        analyse(open[static_cast<std::size_t>(k)]);
      }, std::min<unsigned>(threads_, static_cast<unsigned>(open.size())));
    }
  }
  return std::move(out_);
}

void Backward::pass(mpfr_prec_t p, Stage stage) {
  std::vector<std::size_t> open;
  double work = 0.0;
  for (std::size_t blk = 0; blk < blocks_.size(); ++blk)
    if (block_open(blk)) {
      open.push_back(blk);
      work += static_cast<double>(block_rows()) * static_cast<double>(pb_.a.seq_kv) *
              static_cast<double>(2 * pb_.hd + pb_.dv);
    }
  if (open.empty()) return;
  // Blocks (batch, K/V head) are independent; fewer blocks than threads are split into row
  // chunks whose dK and dV sums are merged after.
  const unsigned threads = threads_for(work, 0x1p15, threads_);
  const std::int64_t chunks =
      std::clamp<std::int64_t>((threads + open.size() - 1) / open.size(), 1, block_rows());
  std::vector<Item> items;
  for (std::size_t blk : open)
    for (std::int64_t c = 0; c < chunks; ++c)
      items.push_back({blk, block_rows() * c / chunks, block_rows() * (c + 1) / chunks, chunks});
  std::vector<Chunk> kept(chunks > 1 ? items.size() : 0);
  parallel_for(static_cast<std::int64_t>(items.size()), [&](std::int64_t it) {
    const WideExponents wide;
    Scratch scratch;
    const Item& item = items[static_cast<std::size_t>(it)];
    if (item.chunks > 1) {
      run_item(item, p, stage, kept[static_cast<std::size_t>(it)], scratch);
      return;
    }
    Chunk chunk;
    run_item(item, p, stage, chunk, scratch);
    finish_keys(item.block, chunk, p, stage);
  }, threads);
  if (chunks == 1) return;
  for (std::size_t first = 0; first < items.size(); first += static_cast<std::size_t>(chunks)) {
    Chunk& into = kept[first];
    const std::size_t blk = items[first].block;
    if (!keys_open(blk)) continue;
    const WideExponents wide;
    for (std::size_t c = first + 1; c < first + static_cast<std::size_t>(chunks); ++c) {
      Chunk& from = kept[c];
      into.k = std::max(into.k, from.k);
      for (std::size_t e = 0; e < into.dk.size(); ++e)
        if (open_k_[static_cast<std::size_t>(k_base(blk)) + e]) {
          into.dk.merge(e, from.dk);
          if (stage == Stage::First) into.dk_mag[e] += from.dk_mag[e];
          if (from.dk_lim.size() && from.dk_lim[e]) {
            if (!into.dk_lim[e]) std::swap(into.dk_lim[e], from.dk_lim[e]);
            else mpq_add(*into.dk_lim[e], *into.dk_lim[e], *from.dk_lim[e]);
          }
        }
      for (std::size_t e = 0; e < into.dv.size(); ++e)
        if (open_v_[static_cast<std::size_t>(v_base(blk)) + e]) {
          into.dv.merge(e, from.dv);
          if (stage == Stage::First) into.dv_mag[e] += from.dv_mag[e];
          if (from.dv_lim.size() && from.dv_lim[e]) {
            if (!into.dv_lim[e]) std::swap(into.dv_lim[e], from.dv_lim[e]);
            else mpq_add(*into.dv_lim[e], *into.dv_lim[e], *from.dv_lim[e]);
          }
        }
    }
    finish_keys(blk, into, p, stage);
  }
}

// The exact analysis of the block's open elements; rational ones are decided.
void Backward::analyse(std::size_t blk) {
  const std::int64_t b = static_cast<std::int64_t>(blk) / pb_.kvh, hk = static_cast<std::int64_t>(blk) % pb_.kvh;
  const std::int64_t rows = block_rows(), hd = pb_.hd, dv = pb_.dv, seq_kv = pb_.a.seq_kv;
  const bool keys = keys_open(blk);
  Dots dots;
  std::vector<std::unique_ptr<RowExact>> exact(static_cast<std::size_t>(rows));
  Mpq alpha;
  for (std::int64_t lr = 0; lr < rows; ++lr) {
    const std::int64_t h = hk * pb_.group + lr / pb_.a.seq_q, i = lr % pb_.a.seq_q;
    if (attention_visible_count(pb_.c, b, i) == 0) continue;
    const std::int64_t base = q_base(blk, lr);
    const bool q_open = std::find(open_q_.begin() + base, open_q_.begin() + base + hd, 1) != open_q_.begin() + base + hd;
    if (!q_open && !keys) continue;
    auto r = std::make_unique<RowExact>();
    row_exact(pb_, blocks_[blk], b, h, i, *r, dots);
    for (std::int64_t d = 0; d < hd && q_open; ++d) {
      const auto e = static_cast<std::size_t>(base + d);
      if (!open_q_[e] || classify_dq(*r, blocks_[blk], hd, d, alpha) != Verdict::Rational) continue;
      if (auto v = exact_multiple(alpha, pb_.scale, true)) out_.dq[e] = *v, open_q_[e] = 0, lim_q_[e].reset();
    }
    if (keys) exact[static_cast<std::size_t>(lr)] = std::move(r);
  }
  if (!keys) return;
  // Classes of rows with equal F.
  std::vector<std::int64_t> order;
  for (std::int64_t lr = 0; lr < rows; ++lr)
    if (exact[lr]) order.push_back(lr);
  std::sort(order.begin(), order.end(),
            [&](std::int64_t x, std::int64_t y) { return compare_shapes(*exact[x], *exact[y]) < 0; });
  std::vector<std::size_t> class_of(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> first_of;
  for (std::int64_t lr : order) {
    if (first_of.empty() || compare_shapes(*exact[first_of.back()], *exact[lr]) != 0) first_of.push_back(lr);
    class_of[lr] = first_of.size() - 1;
  }
  std::vector<ExpPoly> f1(first_of.size()), f2(first_of.size());
  for (std::size_t c = 0; c < first_of.size(); ++c)
    f1[c] = denominator(*exact[first_of[c]], 1), f2[c] = denominator(*exact[first_of[c]], 2);
  Mpfr coeff(53);
  for (std::int64_t j = 0; j < seq_kv; ++j) {
    for (std::int64_t d = 0; d < hd + dv; ++d) {
      const bool is_k = d < hd;
      const auto e = static_cast<std::size_t>(is_k ? k_base(blk) + j * hd + d : v_base(blk) + j * dv + (d - hd));
      if (!(is_k ? open_k_[e] : open_v_[e])) continue;
      std::vector<std::pair<ExpPoly, ExpPoly>> classes(first_of.size());
      for (std::size_t c = 0; c < first_of.size(); ++c) classes[c].first = (is_k ? f2[c] : f1[c]).clone();
      for (std::int64_t lr : order) {
        const RowExact& r = *exact[lr];
        if (!r.sees(j)) continue;
        ExpPoly& n = classes[class_of[lr]].second;
        if (is_k) {
          add_ds_terms(r, j - r.first, r.q[d], n);
        } else {
          mpfr_set_d(coeff, r.d_o[d - hd], MPFR_RNDN);
          n.add(*r.groups[r.group_of[j - r.first]].a, coeff);
        }
      }
      if (classify(classes, alpha) != Verdict::Rational) continue;
      const auto v = exact_multiple(alpha, pb_.scale, is_k);
      if (!v) continue;
      (is_k ? out_.dk : out_.dv)[e] = *v;
      (is_k ? open_k_ : open_v_)[e] = 0;
      (is_k ? lim_k_ : lim_v_)[e].reset();
    }
  }
}

void Backward::run_item(const Item& item, mpfr_prec_t p, Stage stage, Chunk& chunk, Scratch& scratch) {
  const std::size_t blk = item.block;
  const std::int64_t b = static_cast<std::int64_t>(blk) / pb_.kvh, hk = static_cast<std::int64_t>(blk) % pb_.kvh;
  const std::int64_t seq_kv = pb_.a.seq_kv;
  const bool keys = keys_open(blk);
  std::vector<char> key_open(static_cast<std::size_t>(seq_kv), 0);
  std::vector<std::int64_t> next_open(static_cast<std::size_t>(seq_kv) + 1, seq_kv);  // the first open key >= j
  if (keys) {
    const auto nk = static_cast<std::size_t>(seq_kv * pb_.hd), nv = static_cast<std::size_t>(seq_kv * pb_.dv);
    chunk.dk.assign(nk, p), chunk.dv.assign(nv, p);
    if (stage == Stage::First) chunk.dk_mag.assign(nk, 0.0), chunk.dv_mag.assign(nv, 0.0);
    if (stage == Stage::Limits) chunk.dk_lim.resize(nk), chunk.dv_lim.resize(nv);
    for (std::int64_t j = seq_kv - 1; j >= 0; --j) {
      const auto kb = open_k_.begin() + k_base(blk) + j * pb_.hd, vb = open_v_.begin() + v_base(blk) + j * pb_.dv;
      key_open[j] = std::find(kb, kb + pb_.hd, 1) != kb + pb_.hd || std::find(vb, vb + pb_.dv, 1) != vb + pb_.dv;
      next_open[j] = key_open[j] ? j : next_open[j + 1];
    }
  }
  for (std::int64_t lr = item.row_begin; lr < item.row_end; ++lr) {
    const std::int64_t h = hk * pb_.group + lr / pb_.a.seq_q, i = lr % pb_.a.seq_q;
    const KeyRange visible = attention_visible_keys(pb_.c, b, i);
    if (visible.size() == 0) continue;
    const auto qb = open_q_.begin() + q_base(blk, lr);
    const bool q_open = std::find(qb, qb + pb_.hd, 1) != qb + pb_.hd;
    const bool k_open = next_open[visible.first] < visible.end;
    if (!q_open && !k_open) continue;
    row_exact(pb_, blocks_[blk], b, h, i, scratch.row, scratch.dots);
    // A product that fell below MPFR's exponent range would be 0 with a mass of 0: an exact
    // zero it is not. (Weights themselves are checked in row_approx.)
    mpfr_clear_underflow();
    row_approx(pb_, scratch.row, p, stage == Stage::First, scratch.approx);
    if (k_open) {
      chunk.k = std::max(chunk.k, scratch.approx.k);
      row_keys(blk, key_open, stage, chunk, scratch);
    }
    if (mpfr_underflow_p())
      throw std::runtime_error(fmt::format("{}: a product of attention weights lies below MPFR's exponent range "
                                           "(batch {}, head {}, query {})", kWho, b, h, i));
    if (q_open) row_dq(blk, lr, p, stage, scratch);
  }
}

// dQ_i = scale (sum_{j in T} e_j k_j / n_T^2 + sum_j delta_j k_j), decided at the row.
void Backward::row_dq(std::size_t blk, std::int64_t lr, mpfr_prec_t p, Stage stage, Scratch& scratch) {
  const RowExact& r = scratch.row;
  const RowApprox& ra = scratch.approx;
  const BlockData& bd = blocks_[blk];
  const std::int64_t hd = pb_.hd, base = q_base(blk, lr);
  SumArray& s = scratch.dq;
  s.assign(static_cast<std::size_t>(hd), p);
  for (std::int64_t j = 0; j < r.n; ++j) {
    const bool top = r.group_of[j] == 0;
    for (std::int64_t d = 0; d < hd; ++d) {
      if (!open_q_[base + d]) continue;
      const auto kd = static_cast<std::size_t>(r.key(j) * hd + d);
      s.add_delta(d, ra.ds[j], ra.ds_mass[j], bd.k_mp[kd], bd.k_ub[kd]);
      if (stage == Stage::First && top) s.add_limit(d, ra.sbar[j], ra.sbar_mass[j], bd.k_mp[kd], bd.k_ub[kd]);
    }
  }
  if (mpfr_underflow_p())
    throw std::runtime_error(fmt::format("{}: a product of attention weights lies below MPFR's exponent range "
                                         "(batch {}, head {}, query {})", kWho, r.b, r.h, r.i));
  if (stage == Stage::First) {
    const double scale = std::fabs(pb_.scale.given ? pb_.scale.value : 1.0 / std::sqrt(static_cast<double>(hd)));
    for (std::int64_t d = 0; d < hd; ++d) {
      double m = 0.0;
      for (std::int64_t j = 0; j < r.n; ++j) m += ra.f[j] * std::fabs(bd.k[r.key(j) * hd + d]);
      out_.dq_magnitude[base + d] = scale * m;
    }
  }
  const ScaleAt scale(pb_.scale, p);
  const auto n_top = static_cast<unsigned long>(r.n_top());
  for (std::int64_t d = 0; d < hd; ++d) {
    const auto e = static_cast<std::size_t>(base + d);
    if (!open_q_[e]) continue;
    if (stage != Stage::First) {
      if (!lim_q_[e]) {  // sum_{j in T} e_j k_jd / n_T^2
        lim_q_[e] = std::make_unique<Mpq>();
        Mpq term, kd;
        for (std::int64_t j : r.groups[0].keys) {
          to_mpq(term, *r.e[j]);
          mpq_set_d(kd, bd.k[r.key(j) * hd + d]);
          mpq_mul(term, term, kd);
          mpq_add(*lim_q_[e], *lim_q_[e], term);
        }
        mpq_set_ui(kd, 1, n_top * n_top);
        mpq_mul(*lim_q_[e], *lim_q_[e], kd);
      }
      s.set_limit(d, *lim_q_[e]);
    }
    if (auto v = decide(s, d, ra.k, p, &scale, lim_q_[e].get())) {
      out_.dq[e] = *v;
      open_q_[e] = 0;
      lim_q_[e].reset();
    }
  }
}

// The row's terms of dK_j = scale sum_i dS_ij q_i and dV_j = sum_i P_ij dO_i for its open keys.
void Backward::row_keys(std::size_t blk, const std::vector<char>& key_open, Stage stage, Chunk& chunk,
                        Scratch& scratch) {
  const RowExact& r = scratch.row;
  const RowApprox& ra = scratch.approx;
  const std::int64_t hd = pb_.hd, dv = pb_.dv;
  const std::int64_t kb = k_base(blk), vb = v_base(blk);
  const auto n_top = static_cast<unsigned long>(r.n_top());
  Mpq ebar, term, coeff;
  for (std::int64_t j = 0; j < r.n; ++j) {
    const std::int64_t key = r.key(j);
    if (!key_open[key]) continue;
    const bool top = r.group_of[j] == 0;
    const bool limits = stage == Stage::Limits && top;
    if (limits) {
      to_mpq(ebar, *r.e[j]);
      mpq_set_ui(coeff, 1, n_top * n_top);
      mpq_mul(ebar, ebar, coeff);
    }
    for (std::int64_t d = 0; d < hd; ++d) {
      const auto e = static_cast<std::size_t>(key * hd + d);
      if (!open_k_[kb + e]) continue;
      chunk.dk.add_delta(e, ra.ds[j], ra.ds_mass[j], r.q_mp[d], r.q_ub[d]);
      if (stage == Stage::First) {
        if (top) chunk.dk.add_limit(e, ra.sbar[j], ra.sbar_mass[j], r.q_mp[d], r.q_ub[d]);
        chunk.dk_mag[e] += ra.f[j] * std::fabs(r.q[d]);
      }
      if (limits) {
        if (!chunk.dk_lim[e]) chunk.dk_lim[e] = std::make_unique<Mpq>();
        mpq_set_d(coeff, r.q[d]);
        mpq_mul(term, ebar, coeff);
        mpq_add(*chunk.dk_lim[e], *chunk.dk_lim[e], term);
      }
    }
    for (std::int64_t d = 0; d < dv; ++d) {
      const auto e = static_cast<std::size_t>(key * dv + d);
      if (!open_v_[vb + e]) continue;
      chunk.dv.add_delta(e, ra.tau[j], ra.tau_mass[j], r.d_o_mp[d], r.d_o_ub[d]);
      if (stage == Stage::First) {
        if (top) chunk.dv.add_limit(e, ra.inv_top, ra.inv_top_mass, r.d_o_mp[d], r.d_o_ub[d]);
        chunk.dv_mag[e] += ra.pd[j] * std::fabs(r.d_o[d]);
      }
      if (limits) {
        if (!chunk.dv_lim[e]) chunk.dv_lim[e] = std::make_unique<Mpq>();
        mpq_set_d(term, r.d_o[d]);
        mpq_set_ui(coeff, 1, n_top);
        mpq_mul(term, term, coeff);
        mpq_add(*chunk.dv_lim[e], *chunk.dv_lim[e], term);
      }
    }
  }
}

// Decides the block's open dK and dV elements from the merged sums.
void Backward::finish_keys(std::size_t blk, Chunk& chunk, mpfr_prec_t p, Stage stage) {
  if (chunk.dk.size() == 0) return;
  const ScaleAt scale(pb_.scale, p);
  const double abs_scale = std::fabs(pb_.scale.given ? pb_.scale.value : 1.0 / std::sqrt(static_cast<double>(pb_.hd)));
  const auto finish = [&](SumArray& sums, std::vector<double>& mag, std::vector<MpqBox>& lim_chunk,
                          std::vector<MpqBox>& lim, std::vector<char>& open, std::vector<RefValue>& values,
                          std::vector<double>& magnitude, std::int64_t base, const ScaleAt* sc, double mag_scale) {
    for (std::size_t e = 0; e < sums.size(); ++e) {
      const auto g = static_cast<std::size_t>(base) + e;
      if (stage == Stage::First) magnitude[g] = mag_scale * mag[e];
      if (!open[g]) continue;
      if (stage == Stage::Limits) {
        lim[g] = lim_chunk[e] ? std::move(lim_chunk[e]) : std::make_unique<Mpq>();
      }
      if (stage != Stage::First) sums.set_limit(e, *lim[g]);
      if (auto v = decide(sums, e, chunk.k, p, sc, lim[g].get())) {
        values[g] = *v;
        open[g] = 0;
        lim[g].reset();
      }
    }
  };
  finish(chunk.dk, chunk.dk_mag, chunk.dk_lim, lim_k_, open_k_, out_.dk, out_.dk_magnitude, k_base(blk), &scale,
         abs_scale);
  finish(chunk.dv, chunk.dv_mag, chunk.dv_lim, lim_v_, open_v_, out_.dv, out_.dv_magnitude, v_base(blk), nullptr, 1.0);
}

// Plainly; else exactly where delta is exactly 0; else next to the exact limit.
std::optional<RefValue> Backward::decide(SumArray& sums, std::size_t e, double k, mpfr_prec_t p, const ScaleAt* scale,
                                         const Mpq* limit) const {
  if (auto v = decide_plain(sums, e, k, p, scale)) return v;
  if (!limit) return std::nullopt;
  if (sums.delta_zero(e)) return exact_multiple(*limit, pb_.scale, scale != nullptr);
  return decide_near(sums, e, *limit, k, p, pb_.scale, scale != nullptr);
}

void Backward::throw_undecided() const {
  const auto where = [&](const char* what, std::size_t e, std::int64_t heads, std::int64_t seq, std::int64_t dim) {
    const auto x = static_cast<std::int64_t>(e);
    return fmt::format("{} (batch {}, head {}, position {}, column {})", what, x / dim / seq / heads,
                       x / dim / seq % heads, x / dim % seq, x % dim);
  };
  std::string first;
  std::size_t count = 0;
  for (std::size_t e = 0; e < open_q_.size(); ++e)
    if (open_q_[e] && count++ == 0) first = where("dQ", e, pb_.a.heads, pb_.a.seq_q, pb_.hd);
  for (std::size_t e = 0; e < open_k_.size(); ++e)
    if (open_k_[e] && count++ == 0) first = where("dK", e, pb_.kvh, pb_.a.seq_kv, pb_.hd);
  for (std::size_t e = 0; e < open_v_.size(); ++e)
    if (open_v_[e] && count++ == 0) first = where("dV", e, pb_.kvh, pb_.a.seq_kv, pb_.dv);
  throw std::runtime_error(fmt::format(
      "{}: rounding not decided at 2^18 bits for {} output(s), the first {}: an exact value the exact analysis "
      "does not prove (several query rows' terms cancelling or summing to a rational), or one within "
      "2^-(2^18) of a rounding boundary",
      kWho, count, first));
}

}  // namespace

AttentionGradients attention_backward_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                                                unsigned threads) {
  const ReferenceFpEnv env;  // whatever a kernel left set; parallel_for's threads inherit it
  if (!is_attention(c.op)) throw InputError(fmt::format("{}: case.op is not attention", kWho));
  const WideExponents wide;
  return Backward(c, inputs, threads, kFirstPrecision).run();
}

namespace detail {
AttentionGradients attention_backward_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                                                unsigned threads, long first_precision) {
  const ReferenceFpEnv env;
  if (!is_attention(c.op)) throw InputError(fmt::format("{}: case.op is not attention", kWho));
  if (first_precision < 130) throw std::invalid_argument(fmt::format("{}: first precision below 130", kWho));
  const WideExponents wide;
  return Backward(c, inputs, threads, first_precision).run();
}
}  // namespace detail

}  // namespace ulpgate
