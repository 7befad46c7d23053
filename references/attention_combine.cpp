// attention_combine reference. Per query row, over the non-empty splits (b = e or 2):
//   O_d = sum_s b^L_s O_s,d / sum_s b^L_s,   LSE = log_b sum_s b^L_s.
// Splits of equal LSE form a group; a class is the groups whose weights are powers of two of
// each other (base e: a group alone; base 2: one fractional part L - floor(L)), cut into
// sub-classes J at gaps that let the first dominate the rest (form_subclasses). Sub-class a
// holds the largest LSE, M. With Num_J, Den_J the exact sums of 2^(L_s - top_J) O_s,d and
// 2^(L_s - top_J) over J, R0 = Num_a / Den_a and w_J = b^(top_J - M):
//   O_d = R0 + Delta,  Delta = sum_{J != a} w_J S_J / (Den_a D),  S_J = Num_J Den_a - Den_J Num_a,
//   D = Den_a + R,  R = sum_{J != a} w_J Den_J,  LSE = M + log_b D.
// Every S_J = 0: O_d = R0 exactly. Otherwise O_d is irrational when a class other than a's
// has S_J != 0 (the w of distinct classes are linearly independent over the algebraic
// numbers: Lindemann-Weierstrass for e^r, r rational; x^(2^m) - 2 irreducible for 2^f, f
// dyadic in [0, 1)), or else within a tiny rational Delta of R0. The LSE is exact only for
// one sub-class with Den_a = b^t (M + t). Certification: directed-rounding intervals at
// 192, 384, ... bits, S summed relative to its top sub-class so that it keeps its relative
// accuracy whatever the gaps; next to R0 (or M + t) the window follows from Delta's sign and
// size (window_beside), elsewhere from the interval of the value.
#include "references/attention_combine.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format_mpfr.hpp"
#include "references/attention_exact.hpp"
#include "references/fp_env.hpp"

namespace ulpgate {
namespace {

using namespace attention_exact;
using MpfrBox = std::unique_ptr<Mpfr>;

constexpr std::string_view kWho = "attention_combine reference";
constexpr mpfr_prec_t kFirstPrecision = 192;
constexpr mpfr_prec_t kMaxPrecision = mpfr_prec_t{1} << 22;
// Gaps and spans between LSEs in bits (base e: nats times log2 e). kMargin covers the bits of
// an O value (2^-149 .. 2^128), of the 128-bit window and of the split count.
constexpr double kMargin = 1024;
constexpr double kMaxSpan = 1 << 20;
// A value known only to be nonzero of a sign and below 2^kTinyBelow rounds as RefValue::tiny
// does in every format: to zero or the smallest subnormal.
constexpr long kTinyBelow = -1100;

MpfrBox exact_box(double x) {
  auto m = std::make_unique<Mpfr>(64);
  mpfr_set_d(*m, x, MPFR_RNDN);
  return m;
}

// out = x y exactly (out distinct from x and y).
void exact_product(mpfr_ptr out, mpfr_srcptr x, mpfr_srcptr y) {
  mpfr_set_prec(out, mpfr_get_prec(x) + mpfr_get_prec(y));
  mpfr_mul(out, x, y, MPFR_RNDN);
}

// acc += x 2^k exactly.
void add_scaled(mpfr_ptr acc, double x, long k) {
  Mpfr t(64), sum(2);
  mpfr_set_d(t, x, MPFR_RNDN);
  mpfr_mul_2si(t, t, k, MPFR_RNDN);
  if (mpfr_zero_p(acc)) {
    mpfr_set_prec(acc, 64);
    mpfr_set(acc, t, MPFR_RNDN);
    return;
  }
  exact_sum_of(sum, acc, t);
  mpfr_swap(acc, sum);
}

// The window of num / den (exact, den > 0); an exact zero is +0.
RefValue window_of_quotient(mpfr_srcptr num, mpfr_srcptr den) {
  if (mpfr_zero_p(num)) return RefValue::zero(false);
  Mpfr q(128);
  const int ternary = mpfr_div(q, num, den, MPFR_RNDZ);
  RefValue r = RefValue::from_exact(q);
  r.inexact = ternary != 0;
  return r;
}

// The window of |x| = |num| / den + delta (num, den exact, num != 0, den > 0), delta known
// only to lie in [lo, hi] and, where sign != 0, to be nonzero of that sign, when that keeps
// |x| strictly inside one 128-bit window; nullopt otherwise. attention_exact's window_near
// with a dyadic denominator (a base-2 sub-class's weight sum). The result has the sign
// `negative`.
std::optional<RefValue> window_beside(mpfr_srcptr num, mpfr_srcptr den, mpfr_srcptr lo, mpfr_srcptr hi, bool negative,
                                      int sign) {
  Mpfr an(mpfr_get_prec(num)), t(128), dt(2), x(2), unit(2), du(2), y(2), l(2), h(2);
  mpfr_abs(an, num, MPFR_RNDN);
  const int ternary = mpfr_div(t, an, den, MPFR_RNDZ);  // T: |num| / den truncated
  exact_product(dt, den, t);
  exact_difference(x, an, dt);  // X = |num| - den T >= 0 (0 iff T is exact)
  mpfr_set_ui_2exp(unit, 1, mpfr_get_exp(t) - 128, MPFR_RNDN);
  exact_product(du, den, unit);
  exact_difference(y, du, x);  // Y = den (T + unit) - |num| > 0
  exact_product(l, lo, den);   // den delta in [l, h]
  exact_product(h, hi, den);
  mpfr_neg(x, x, MPFR_RNDN);
  RefValue r;
  if ((sign > 0 || mpfr_cmp(l, x) > 0) && mpfr_cmp(h, y) < 0) {  // |x| in (T, T + unit)
    r = RefValue::from_exact(t);
  } else if (ternary == 0 && (sign < 0 || mpfr_sgn(h.get()) < 0)) {  // |x| in (T - unit / 2, T)?
    mpfr_div_2ui(du, du, 1, MPFR_RNDN);
    mpfr_neg(du, du, MPFR_RNDN);
    if (mpfr_cmp(l, du) <= 0) return std::nullopt;
    mpfr_nextbelow(t);  // the 128-bit number below T
    r = RefValue::from_exact(t);
  } else {
    return std::nullopt;
  }
  r.inexact = true;
  r.negative = negative;
  return r;
}

struct Interval {
  explicit Interval(mpfr_prec_t p = 2) : lo(p), hi(p) {}
  Mpfr lo, hi;
  void reset(mpfr_prec_t p) { mpfr_set_prec(lo, p), mpfr_set_prec(hi, p); }
};

// b^x (x exact) at precision p: [0, the smallest positive number] below MPFR's range.
void power(Interval& out, mpfr_srcptr x, bool base2, mpfr_prec_t p) {
  out.reset(p);
  if (base2) {
    mpfr_exp2(out.lo, x, MPFR_RNDD);
    mpfr_exp2(out.hi, x, MPFR_RNDU);
  } else {
    mpfr_exp(out.lo, x, MPFR_RNDD);
    mpfr_exp(out.hi, x, MPFR_RNDU);
  }
}

// [lo, hi] += u s for u in the nonnegative interval, s exact.
void add_product(mpfr_ptr lo, mpfr_ptr hi, const Interval& u, mpfr_srcptr s, mpfr_ptr tmp) {
  const bool neg = mpfr_sgn(s) < 0;
  mpfr_mul(tmp, neg ? u.hi.get() : u.lo.get(), s, MPFR_RNDD);
  mpfr_add(lo, lo, tmp, MPFR_RNDD);
  mpfr_mul(tmp, neg ? u.lo.get() : u.hi.get(), s, MPFR_RNDU);
  mpfr_add(hi, hi, tmp, MPFR_RNDU);
}

Format type_of(const Case& c, const std::string& operand) {
  const auto it = c.types.find(operand);
  if (it == c.types.end()) throw InputError(fmt::format("{}: case.types has no {}", kWho, operand));
  return it->second;
}

struct Inputs {
  Inputs(const Case& c, const std::map<std::string, Tensor>& inputs)
      : a(c.attention), base2(a.lse_base2), ov(attention_view(c, "O_part")), lv(attention_view(c, "LSE_part")),
        ot(checked_input(inputs, "O_part", type_of(c, "O_part"), ov.elements(), kWho)),
        lt(checked_input(inputs, "LSE_part", type_of(c, "LSE_part"), lv.elements(), kWho)) {}
  const AttentionShape& a;
  const bool base2;
  const AttentionView ov, lv;
  const Tensor& ot;
  const Tensor& lt;
};

struct Group {
  double lse = 0;
  std::vector<std::size_t> splits;  // into CombineRow::split_
};

struct SubClass {
  double top = 0;                   // its largest LSE
  std::vector<std::size_t> groups;  // into CombineRow::groups_
  std::vector<long> shift;          // per group: L_g - top (base 2; 0 in base e)
  MpfrBox den;                      // sum_g 2^shift n_g, exact
  bool unit = false;                // one split: den = 1, Num = its O value
  MpfrBox below_max;                // top - M, exact
  bool dyadic = false;              // top - M an integer (base 2): w_J = 2^(top - M) exactly
};

// A row's working numbers, reused by every column: MPFR allocates when a number is made or
// grows, not when it is reused.
struct Scratch {
  std::vector<MpfrBox> num, s;  // per sub-class: Num_J, S_J (exact)
  Mpfr t{64}, sum{2}, x{2}, y{2};
  Mpfr slo{2}, shi{2}, tmp{2}, dlo{2}, dhi{2}, q{2}, xlo{2}, xhi{2}, olo{2}, ohi{2}, a{128}, b{128};
};

// The window of a value known to lie in [lo, hi]: where both ends truncate to the same
// 128-bit number and the end nearer zero is not itself one, the value is strictly inside.
std::optional<RefValue> certify(mpfr_srcptr lo, mpfr_srcptr hi, Scratch& w) {
  if (!mpfr_regular_p(lo) || !mpfr_regular_p(hi) || mpfr_sgn(lo) != mpfr_sgn(hi)) return std::nullopt;
  const int ta = mpfr_set(w.a, lo, MPFR_RNDZ), tb = mpfr_set(w.b, hi, MPFR_RNDZ);
  if (!mpfr_equal_p(w.a, w.b) || (mpfr_sgn(lo) > 0 ? ta : tb) == 0) return std::nullopt;
  return RefValue::from_certified(w.a);
}

class CombineRow {
 public:
  CombineRow(const Inputs& in, std::int64_t row, CombineReference& out)
      : in_(in), a_(in.a), i_(row % a_.seq_q), h_((row / a_.seq_q) % a_.heads), b_(row / (a_.seq_q * a_.heads)),
        dim_(a_.head_dim), o_(out.values.data() + row * dim_), magnitude_(out.magnitude.data() + row * dim_),
        lse_(out.lse[static_cast<std::size_t>(row)]), spread_(out.lse_spread[static_cast<std::size_t>(row)]) {}

  void compute() {
    read_splits();
    if (split_.empty()) {
      for (std::int64_t d = 0; d < dim_; ++d) o_[d] = RefValue::zero(false), magnitude_[d] = 0.0;
      lse_ = RefValue::infinity(true);
      return;
    }
    magnitudes();
    form_groups();
    form_subclasses();
    decided_.assign(static_cast<std::size_t>(dim_), false);
    work_.num.resize(subs_.size());
    work_.s.resize(subs_.size());
    for (std::size_t j = 0; j < subs_.size(); ++j) work_.num[j] = boxed(), work_.s[j] = boxed();
    decide_exact_lse();
    for (mpfr_prec_t p = kFirstPrecision;; p *= 2) {
      if (p > kMaxPrecision) throw_undecided();
      if (attempt(p)) break;
    }
  }

 private:
  static MpfrBox boxed() { return std::make_unique<Mpfr>(2); }
  double value(std::size_t k, std::int64_t d) const { return values_[k * static_cast<std::size_t>(dim_) + d]; }
  double bits(double gap) const { return in_.base2 ? gap : gap * std::numbers::log2e; }

  void read_splits();
  void magnitudes();
  void form_groups();
  void form_subclasses();
  void decide_exact_lse();
  bool attempt(mpfr_prec_t p);
  std::size_t terms(std::int64_t d);
  const std::vector<std::unique_ptr<Interval>>& relative_weights(std::size_t top);
  bool attempt_column(std::int64_t d);
  bool beside_dyadic_top(std::int64_t d, std::size_t top);
  bool attempt_lse();
  [[noreturn]] void throw_undecided() const;

  const Inputs& in_;
  const AttentionShape& a_;
  const std::int64_t i_, h_, b_, dim_;
  RefValue* const o_;
  double* const magnitude_;
  RefValue& lse_;
  double& spread_;

  std::vector<std::pair<double, std::int64_t>> split_;  // (LSE, split) of the non-empty splits, LSE descending
  std::vector<double> values_;                          // their O rows
  std::vector<Group> groups_;
  std::vector<SubClass> subs_;  // subs_[0]: a, the sub-class of M; then by top descending
  double span_a_ = 0;           // bits from M to a's smallest LSE
  std::vector<bool> decided_;   // per column
  Scratch work_;
  Mpfr max_{64};                // M
  bool lse_done_ = false;
  bool lse_center_ = false;     // Den_a = b^t: the LSE lies next to M + t
  Mpfr center_{2};              // M + t

  // At the current precision: w_J = b^(top_J - M), R and D, and per top sub-class T the
  // b^(top_J - top_T) of the sub-classes below it.
  mpfr_prec_t p_ = 0;
  std::vector<std::unique_ptr<Interval>> w_;
  Interval r_, d_;
  std::map<std::size_t, std::vector<std::unique_ptr<Interval>>> u_;
};

void CombineRow::read_splits() {
  for (std::int64_t s = 0; s < a_.splits; ++s) {
    const double l = in_.lt.value(static_cast<std::size_t>(in_.lv.offset(s * a_.batch + b_, h_, i_, 0)));
    if (std::isnan(l) || l == INFINITY)
      throw InputError(fmt::format("{}: LSE_part of split {} at (batch {}, head {}, query {}) is {}; a partial "
                                   "log-sum-exp is finite, or -inf for an empty split",
                                   kWho, s, b_, h_, i_, l));
    if (l != -INFINITY) split_.emplace_back(l, s);
  }
  std::stable_sort(split_.begin(), split_.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  spread_ = 0.0;
  for (const auto& [l, s] : split_) spread_ = std::max(spread_, std::fabs(l));
  if (split_.empty()) return;
  mpfr_set_d(max_, split_[0].first, MPFR_RNDN);
  values_.reserve(split_.size() * static_cast<std::size_t>(dim_));
  for (const auto& [l, s] : split_)
    for (std::int64_t d = 0; d < dim_; ++d)
      values_.push_back(in_.ot.value(static_cast<std::size_t>(in_.ov.offset(s * a_.batch + b_, h_, i_, d))));
}

// sum_s w_s |O_s,d| with w_s = b^(L_s - M) / sum_s b^(L_s - M) in double (the weights far
// below M underflow to 0: they change no double); NaN for a column with a NaN or Inf O_s,d.
void CombineRow::magnitudes() {
  const double m = split_[0].first;
  std::vector<double> w;
  double total = 0.0;
  for (const auto& [l, s] : split_) {
    w.push_back(in_.base2 ? std::exp2(l - m) : std::exp(l - m));
    total += w.back();
  }
  for (std::int64_t d = 0; d < dim_; ++d) {
    double sum = 0.0;
    for (std::size_t k = 0; k < split_.size(); ++k) sum += w[k] * std::fabs(value(k, d));
    magnitude_[d] = std::isfinite(sum) ? sum / total : NAN;  // finite values stay below 2^132
  }
}

void CombineRow::form_groups() {
  for (std::size_t k = 0; k < split_.size(); ++k) {
    if (groups_.empty() || groups_.back().lse != split_[k].first) groups_.push_back(Group{split_[k].first, {}});
    groups_.back().splits.push_back(k);
  }
}

// Sub-classes. a (from M down): a gap above 2 span_a + kMargin ends it, so that a rational
// R0 (its denominator within 2^(2 span_a + 430) or so) is farther from every other 128-bit
// number than the rest of the class moves O: that rest then only adds a tiny Delta. The
// others: a gap above span_J + span_a + kMargin ends J, so that a nonzero exact S_J outweighs
// the rest of its class and a class's S is zero only if each of its sub-classes' is.
void CombineRow::form_subclasses() {
  std::vector<std::vector<std::size_t>> classes;  // groups, LSE descending; classes[0] holds M
  if (!in_.base2) {
    for (std::size_t g = 0; g < groups_.size(); ++g) classes.push_back({g});
  } else {
    std::map<double, std::size_t> by_fraction;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const double l = groups_[g].lse;
      const auto [it, fresh] = by_fraction.emplace(l - std::floor(l), classes.size());  // exact for FP32 values
      if (fresh) classes.emplace_back();
      classes[it->second].push_back(g);
    }
  }
  for (std::size_t c = 0; c < classes.size(); ++c) {
    const auto& cls = classes[c];
    for (std::size_t k = 0; k < cls.size();) {
      const bool is_a = c == 0 && k == 0;
      SubClass sub;
      sub.top = groups_[cls[k]].lse;
      double span = 0;
      do {
        sub.groups.push_back(cls[k]);
        // Exact: LSEs of one class within 2^20 binades differ by an integer below 2^21.
        sub.shift.push_back(in_.base2 ? static_cast<long>(groups_[cls[k]].lse - sub.top) : 0L);
        span = bits(sub.top - groups_[cls[k]].lse);
        if (span > kMaxSpan)
          throw InputError(fmt::format(
              "{}: the LSE_part values at (batch {}, head {}, query {}) chain over more than 2^20 binades without "
              "a gap that separates them ({} down to {}); the reference does not handle such rows",
              kWho, b_, h_, i_, sub.top, groups_[cls[k]].lse));
        ++k;
      } while (k < cls.size() &&
               bits(groups_[cls[k - 1]].lse - groups_[cls[k]].lse) <= (is_a ? 2 * span : span + span_a_) + kMargin);
      if (is_a) span_a_ = span;
      subs_.push_back(std::move(sub));
    }
  }
  std::stable_sort(subs_.begin() + 1, subs_.end(), [](const SubClass& x, const SubClass& y) { return x.top > y.top; });
  for (auto& sub : subs_) {
    sub.den = boxed();
    mpfr_set_zero(*sub.den, 1);
    for (std::size_t k = 0; k < sub.groups.size(); ++k)
      add_scaled(*sub.den, static_cast<double>(groups_[sub.groups[k]].splits.size()), sub.shift[k]);
    sub.unit = sub.groups.size() == 1 && groups_[sub.groups[0]].splits.size() == 1;
    sub.below_max = boxed();
    exact_difference(*sub.below_max, *exact_box(sub.top), max_);
    sub.dyadic = in_.base2 && mpfr_integer_p(*sub.below_max);
  }
}

// One sub-class with Den_a = b^t: LSE = M + t exactly. Otherwise Den_a = b^t still puts the
// LSE next to M + t (a dominant sub-class), which attempt_lse tries first.
void CombineRow::decide_exact_lse() {
  const Mpfr& den_a = *subs_[0].den;
  const bool power_of_two = mpfr_cmp_ui_2exp(den_a, 1, mpfr_get_exp(den_a) - 1) == 0;
  lse_center_ = in_.base2 ? power_of_two : mpfr_cmp_ui(den_a, 1) == 0;
  if (!lse_center_) return;
  Mpfr t(64);
  mpfr_set_si(t, static_cast<long>(mpfr_get_exp(den_a)) - 1, MPFR_RNDN);
  exact_sum_of(center_, max_, t);
  if (subs_.size() > 1) return;
  lse_ = mpfr_zero_p(center_) ? RefValue::zero(false) : RefValue::from_exact(center_);
  lse_done_ = true;
}

// One round at precision p: true once every output of the row is decided.
bool CombineRow::attempt(mpfr_prec_t p) {
  p_ = p;
  u_.clear();
  w_.resize(subs_.size());
  r_.reset(p), d_.reset(p);
  for (mpfr_ptr v : {work_.slo.get(), work_.shi.get(), work_.tmp.get(), work_.dlo.get(), work_.dhi.get(),
                     work_.q.get(), work_.xlo.get(), work_.xhi.get(), work_.olo.get(), work_.ohi.get()})
    mpfr_set_prec(v, p);
  mpfr_set_zero(r_.lo, 1), mpfr_set_zero(r_.hi, 1);
  for (std::size_t j = 1; j < subs_.size(); ++j) {
    if (!w_[j]) w_[j] = std::make_unique<Interval>();
    power(*w_[j], *subs_[j].below_max, in_.base2, p);
    add_product(r_.lo, r_.hi, *w_[j], *subs_[j].den, work_.tmp);
  }
  mpfr_add(d_.lo, r_.lo, *subs_[0].den, MPFR_RNDD);
  mpfr_add(d_.hi, r_.hi, *subs_[0].den, MPFR_RNDU);
  bool all = true;
  for (std::int64_t d = 0; d < dim_; ++d) {
    const auto k = static_cast<std::size_t>(d);
    if (!decided_[k]) decided_[k] = attempt_column(d);
    all = all && decided_[k];
  }
  if (!lse_done_) lse_done_ = attempt_lse();
  return all && lse_done_;
}

// Column d's exact terms into work_: Num_J and S_J for every sub-class. Returns the first J
// with S_J != 0, or 0 where there is none.
std::size_t CombineRow::terms(std::int64_t d) {
  Scratch& w = work_;
  for (std::size_t j = 0; j < subs_.size(); ++j) {
    const SubClass& sub = subs_[j];
    mpfr_ptr num = *w.num[j];
    if (sub.unit) {
      mpfr_set_prec(num, 64);
      mpfr_set_d(num, value(groups_[sub.groups[0]].splits[0], d), MPFR_RNDN);
      continue;
    }
    mpfr_set_zero(num, 1);
    for (std::size_t k = 0; k < sub.groups.size(); ++k)
      for (std::size_t split : groups_[sub.groups[k]].splits) {
        mpfr_set_d(w.t, value(split, d), MPFR_RNDN);
        mpfr_mul_2si(w.t, w.t, sub.shift[k], MPFR_RNDN);
        if (mpfr_zero_p(num)) {
          mpfr_set_prec(num, 64);
          mpfr_set(num, w.t, MPFR_RNDN);
        } else {
          exact_sum_of(w.sum, num, w.t);
          mpfr_swap(num, w.sum);
        }
      }
  }
  std::size_t top = 0;
  for (std::size_t j = subs_.size() - 1; j >= 1; --j) {
    mpfr_ptr s = *w.s[j];
    if (subs_[0].unit && subs_[j].unit) {
      exact_difference(s, *w.num[j], *w.num[0]);
    } else {
      exact_product(w.x, *w.num[j], *subs_[0].den);
      exact_product(w.y, *subs_[j].den, *w.num[0]);
      exact_difference(s, w.x, w.y);
    }
    if (!mpfr_zero_p(s)) top = j;
  }
  return top;
}

const std::vector<std::unique_ptr<Interval>>& CombineRow::relative_weights(std::size_t top) {
  auto& u = u_[top];
  if (u.empty()) {
    u.resize(subs_.size());
    Mpfr x(2);
    for (std::size_t j = top + 1; j < subs_.size(); ++j) {
      exact_difference(x, *subs_[j].below_max, *subs_[top].below_max);
      u[j] = std::make_unique<Interval>();
      power(*u[j], x, in_.base2, p_);
    }
  }
  return u;
}

bool CombineRow::attempt_column(std::int64_t d) {
  if (std::isnan(magnitude_[d])) {  // a NaN or Inf O_s,d
    o_[d] = RefValue::nan();
    return true;
  }
  const std::size_t top = terms(d);
  Scratch& w = work_;
  mpfr_srcptr num_a = *w.num[0];
  const Mpfr& den_a = *subs_[0].den;
  if (top == 0) {  // every sub-class has the mean R0: O = R0 exactly
    o_[d] = window_of_quotient(num_a, den_a);
    return true;
  }
  // S = sum_J b^(top_J - top_T) S_J, in [slo, shi]
  const auto& u = relative_weights(top);
  mpfr_set(w.slo, *w.s[top], MPFR_RNDD);
  mpfr_set(w.shi, *w.s[top], MPFR_RNDU);
  for (std::size_t j = top + 1; j < subs_.size(); ++j)
    if (!mpfr_zero_p(*w.s[j])) add_product(w.slo, w.shi, *u[j], *w.s[j], w.tmp);
  if (mpfr_sgn(w.slo.get()) <= 0 && mpfr_sgn(w.shi.get()) >= 0) return false;
  const int sign = mpfr_sgn(w.slo.get()) > 0 ? 1 : -1;
  if (sign < 0) {  // |S|
    mpfr_swap(w.slo, w.shi);
    mpfr_neg(w.slo, w.slo, MPFR_RNDN), mpfr_neg(w.shi, w.shi, MPFR_RNDN);
  }
  // |Delta| = w_T |S| / (Den_a D), in [dlo, dhi]
  mpfr_mul(w.dlo, w_[top]->lo, w.slo, MPFR_RNDD);
  mpfr_mul(w.q, d_.hi, den_a, MPFR_RNDU);
  mpfr_div(w.dlo, w.dlo, w.q, MPFR_RNDD);
  mpfr_mul(w.dhi, w_[top]->hi, w.shi, MPFR_RNDU);
  mpfr_mul(w.q, d_.lo, den_a, MPFR_RNDD);
  mpfr_div(w.dhi, w.dhi, w.q, MPFR_RNDU);
  const bool infinitesimal = mpfr_zero_p(w.dlo);  // below MPFR's range
  if (mpfr_zero_p(num_a)) {                       // O = Delta
    if (infinitesimal) {
      if (mpfr_get_exp(w.dhi) >= kTinyBelow) return false;
      o_[d] = RefValue::tiny(sign < 0);
      return true;
    }
    if (subs_[top].dyadic && beside_dyadic_top(d, top)) return true;
    if (sign < 0) mpfr_swap(w.dlo, w.dhi), mpfr_neg(w.dlo, w.dlo, MPFR_RNDN), mpfr_neg(w.dhi, w.dhi, MPFR_RNDN);
    const auto v = certify(w.dlo, w.dhi, w);
    if (v) o_[d] = *v;
    return v.has_value();
  }
  // |O| = |R0| + Delta sgn(R0): Delta of sign `along` in that frame.
  const int along = sign * mpfr_sgn(num_a);
  if (along > 0) mpfr_set(w.xlo, w.dlo, MPFR_RNDN), mpfr_set(w.xhi, w.dhi, MPFR_RNDN);
  else mpfr_neg(w.xlo, w.dhi, MPFR_RNDN), mpfr_neg(w.xhi, w.dlo, MPFR_RNDN);
  const auto near = [&] {
    const auto v = window_beside(num_a, den_a, w.xlo, w.xhi, mpfr_sgn(num_a) < 0, along);
    if (v) o_[d] = *v;
    return v.has_value();
  };
  const auto plain = [&] {  // O in R0 + [Delta]
    if (infinitesimal) return false;
    mpfr_div(w.olo, num_a, den_a, MPFR_RNDD);
    mpfr_div(w.ohi, num_a, den_a, MPFR_RNDU);
    if (sign > 0) mpfr_add(w.olo, w.olo, w.dlo, MPFR_RNDD), mpfr_add(w.ohi, w.ohi, w.dhi, MPFR_RNDU);
    else mpfr_sub(w.olo, w.olo, w.dhi, MPFR_RNDD), mpfr_sub(w.ohi, w.ohi, w.dlo, MPFR_RNDU);
    const auto v = certify(w.olo, w.ohi, w);
    if (v) o_[d] = *v;
    return v.has_value();
  };
  // Delta far below R0's last bit: only the near path can decide.
  const bool small = infinitesimal || mpfr_get_exp(w.dhi) < mpfr_get_exp(num_a) - mpfr_get_exp(den_a) - 130;
  return small ? near() || plain() : plain() || near();
}

// Num_a = 0 and the top sub-class T of a's class (base 2, a gap of over 1024 binades):
// O = V (1 + sigma) / (1 + r) with V = 2^(top_T - M) S_T / Den_a^2 rational, sigma = sum_{J
// below T} b^(top_J - top_T) S_J / S_T and r = R / Den_a >= 2^(top_T - M) Den_T / Den_a. O may
// lie within 2^-(10^6) of V, far beyond Ziv's loop on Delta: decide it next to V from
// rho = (sigma - r) / (1 + r), as attempt_column does next to R0.
bool CombineRow::beside_dyadic_top(std::int64_t d, std::size_t top) {
  const mpfr_prec_t p = p_;
  const Scratch& w = work_;
  const auto& u = relative_weights(top);
  mpfr_srcptr s_top = *w.s[top];
  const Mpfr& den_a = *subs_[0].den;
  Mpfr lo(p), hi(p), tmp(p), rlo(p), rhi(p), x(p), y(p);
  mpfr_set_zero(lo, 1), mpfr_set_zero(hi, 1);  // sum_{J below T} u_J S_J, then sigma
  for (std::size_t j = top + 1; j < subs_.size(); ++j)
    if (!mpfr_zero_p(*w.s[j])) add_product(lo, hi, *u[j], *w.s[j], tmp);
  if (mpfr_sgn(s_top) < 0) mpfr_swap(lo, hi);
  mpfr_div(lo, lo, s_top, MPFR_RNDD);
  mpfr_div(hi, hi, s_top, MPFR_RNDU);
  mpfr_div(rlo, r_.lo, den_a, MPFR_RNDD);
  mpfr_div(rhi, r_.hi, den_a, MPFR_RNDU);
  mpfr_sub(lo, lo, rhi, MPFR_RNDD);  // sigma - r
  mpfr_sub(hi, hi, rlo, MPFR_RNDU);
  // rho = (sigma - r) / (1 + r): each end over the 1 + r that moves it outwards
  if (mpfr_sgn(lo.get()) >= 0) mpfr_add_ui(x, rhi, 1, MPFR_RNDU);
  else mpfr_add_ui(x, rlo, 1, MPFR_RNDD);
  mpfr_div(lo, lo, x, MPFR_RNDD);
  if (mpfr_sgn(hi.get()) >= 0) mpfr_add_ui(x, rlo, 1, MPFR_RNDD);
  else mpfr_add_ui(x, rhi, 1, MPFR_RNDU);
  mpfr_div(hi, hi, x, MPFR_RNDU);
  Mpfr num(mpfr_get_prec(s_top)), den(2);
  mpfr_mul_2si(num, s_top, mpfr_get_si(*subs_[top].below_max, MPFR_RNDN), MPFR_RNDN);  // exact: not infinitesimal
  exact_product(den, den_a, den_a);
  mpfr_abs(x, num, MPFR_RNDN);  // x: |V| below, y: above
  mpfr_div(y, x, den, MPFR_RNDU);
  mpfr_div(x, x, den, MPFR_RNDD);
  const int sign = mpfr_sgn(lo.get()) > 0 ? 1 : mpfr_sgn(hi.get()) < 0 ? -1 : 0;
  mpfr_mul(lo, mpfr_sgn(lo.get()) >= 0 ? x : y, lo, MPFR_RNDD);  // delta = |V| rho
  mpfr_mul(hi, mpfr_sgn(hi.get()) >= 0 ? y : x, hi, MPFR_RNDU);
  const auto v = window_beside(num, den, lo, hi, mpfr_sgn(num.get()) < 0, sign);
  if (v) o_[d] = *v;
  return v.has_value();
}

// LSE = M + log_b D: next to M + t (Den_a = b^t) as M + t + log_b(1 + R / Den_a), else plain.
bool CombineRow::attempt_lse() {
  const mpfr_prec_t p = p_;
  const Mpfr& den_a = *subs_[0].den;
  if (lse_center_) {
    Mpfr elo(p), ehi(p), ln2(p);  // log_b(1 + R / b^t), in [elo, ehi]
    const long t = static_cast<long>(mpfr_get_exp(den_a)) - 1;
    mpfr_mul_2si(elo, r_.lo, -t, MPFR_RNDD);
    mpfr_mul_2si(ehi, r_.hi, -t, MPFR_RNDU);
    mpfr_log1p(elo, elo, MPFR_RNDD);
    mpfr_log1p(ehi, ehi, MPFR_RNDU);
    if (in_.base2) {
      mpfr_const_log2(ln2, MPFR_RNDU);
      mpfr_div(elo, elo, ln2, MPFR_RNDD);
      mpfr_const_log2(ln2, MPFR_RNDD);
      mpfr_div(ehi, ehi, ln2, MPFR_RNDU);
    }
    if (mpfr_zero_p(center_)) {  // LSE = eps
      if (mpfr_zero_p(elo)) {
        if (mpfr_get_exp(ehi) >= kTinyBelow) return false;
        lse_ = RefValue::tiny(false);
        return true;
      }
      const auto v = certify(elo, ehi, work_);
      if (v) lse_ = *v;
      return v.has_value();
    }
    const bool negative = mpfr_sgn(center_.get()) < 0;  // |LSE| = |M + t| + eps sgn(M + t)
    if (negative) mpfr_swap(elo, ehi), mpfr_neg(elo, elo, MPFR_RNDN), mpfr_neg(ehi, ehi, MPFR_RNDN);
    Mpfr one(2);
    mpfr_set_ui(one, 1, MPFR_RNDN);
    if (const auto v = window_beside(center_, one, elo, ehi, negative, negative ? -1 : 1)) {
      lse_ = *v;
      return true;
    }
  }
  Mpfr lo(p), hi(p);
  if (in_.base2) mpfr_log2(lo, d_.lo, MPFR_RNDD), mpfr_log2(hi, d_.hi, MPFR_RNDU);
  else mpfr_log(lo, d_.lo, MPFR_RNDD), mpfr_log(hi, d_.hi, MPFR_RNDU);
  mpfr_add(lo, lo, max_, MPFR_RNDD);
  mpfr_add(hi, hi, max_, MPFR_RNDU);
  const auto v = certify(lo, hi, work_);
  if (v) lse_ = *v;
  return v.has_value();
}

void CombineRow::throw_undecided() const {
  std::string undecided;
  for (std::int64_t d = 0; d < dim_; ++d)
    if (!decided_[static_cast<std::size_t>(d)]) undecided += fmt::format("{}{}", undecided.empty() ? "" : ",", d);
  throw std::logic_error(fmt::format(
      "{}: rounding not decided at 2^22 bits (batch {}, head {}, query {}: {} non-empty splits in {} sub-classes; "
      "columns [{}]{})",
      kWho, b_, h_, i_, split_.size(), subs_.size(), undecided, lse_done_ ? "" : ", the log-sum-exp"));
}

}  // namespace

CombineReference combine_reference(const Case& c, const std::map<std::string, Tensor>& inputs, unsigned threads) {
  const ReferenceFpEnv env;  // the magnitudes' double arithmetic in round-to-nearest; threads inherit it
  if (c.op != Op::AttentionCombine) throw InputError(fmt::format("{}: case.op is not attention_combine", kWho));
  const Inputs in(c, inputs);
  const AttentionShape& a = in.a;
  CombineReference out;
  out.batch = a.batch, out.heads = a.heads, out.seq_q = a.seq_q, out.head_dim = a.head_dim;
  out.lse_base2 = a.lse_base2;
  const std::int64_t rows = a.batch * a.heads * a.seq_q;
  out.values.resize(static_cast<std::size_t>(rows * a.head_dim));
  out.magnitude.resize(static_cast<std::size_t>(rows * a.head_dim));
  out.lse.resize(static_cast<std::size_t>(rows));
  out.lse_spread.resize(static_cast<std::size_t>(rows));
  // A thread per 2^12 split values at least (each costs a few MPFR operations).
  threads = threads_for(static_cast<double>(rows) * static_cast<double>(a.splits * a.head_dim), 0x1p12, threads);
  parallel_for(rows, [&](std::int64_t row) { CombineRow(in, row, out).compute(); }, threads);
  return out;
}

}  // namespace ulpgate
