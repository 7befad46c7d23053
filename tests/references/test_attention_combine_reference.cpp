// The attention_combine reference against a brute-force MPFR evaluation written out again:
// its own index arithmetic, its own exactness decision (equal means per LSE value, base e, or
// per fractional part, base 2), exact rationals by one division, and the other values at
// 640 bits plus the row's LSE span, with an error bound, taken only where that bound decides
// the 128-bit window.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format_mpfr.hpp"
#include "references/attention_combine.hpp"
#include "tests/references/dot_inputs.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

using MpfrBox = std::unique_ptr<Mpfr>;
constexpr Format kPartFormats[] = {Format::FP32, Format::FP16, Format::BF16};

struct CombineCase {
  Case c;
  std::map<std::string, Tensor> in;
};

Case combine_case(std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t dim, std::int64_t splits,
                  bool base2, Format o_part, AttentionLayout layout = AttentionLayout::BHSD) {
  Case c;
  c.op = Op::AttentionCombine;
  AttentionShape& a = c.attention;
  a.batch = batch, a.heads = heads, a.seq_q = seq_q, a.head_dim = dim, a.splits = splits, a.lse_base2 = base2;
  a.layout = layout;
  c.types = {{"O_part", o_part}, {"LSE_part", Format::FP32}, {"O", Format::FP32}, {"compute", Format::FP32}};
  validate(c);
  return c;
}

// Element (s, b, h, i, d) of O_part and (s, b, h, i) of LSE_part, written out: split s of
// batch b is batch s * batch + b; LSE_part is [batch][head][query] whatever the layout.
std::int64_t o_at(const AttentionShape& a, std::int64_t s, std::int64_t b, std::int64_t h, std::int64_t i,
                  std::int64_t d) {
  const std::int64_t sb = s * a.batch + b;
  return a.layout == AttentionLayout::BHSD ? ((sb * a.heads + h) * a.seq_q + i) * a.head_dim + d
                                           : ((sb * a.seq_q + i) * a.heads + h) * a.head_dim + d;
}
std::int64_t lse_at(const AttentionShape& a, std::int64_t s, std::int64_t b, std::int64_t h, std::int64_t i) {
  return ((s * a.batch + b) * a.heads + h) * a.seq_q + i;
}

// ---------------------------------------------------------------------------------------
// Brute force

struct SplitRow {
  bool base2 = false;
  std::vector<double> lse;             // per split (-inf: empty)
  std::vector<std::vector<double>> o;  // [split][d]
};

struct Truth {
  std::vector<RefValue> o;
  std::vector<double> magnitude;
  RefValue lse;
  double spread = 0;
};

RefValue quotient_window(mpfr_srcptr x, mpfr_srcptr y) {
  if (mpfr_zero_p(x)) return RefValue::zero(false);
  Mpfr q(128);
  const int ternary = mpfr_div(q, x, y, MPFR_RNDZ);
  RefValue r = RefValue::from_exact(q);
  r.inexact = ternary != 0;
  return r;
}

// The window of a value within err of v, where v - err and v + err truncate to one 128-bit
// number and the end nearer zero is not one itself (the value then lies strictly inside).
std::optional<RefValue> window_within(mpfr_srcptr v, mpfr_srcptr err) {
  const mpfr_prec_t p = mpfr_get_prec(v) + 64;
  Mpfr lo(p), hi(p), a(128), b(128);
  mpfr_sub(lo, v, err, MPFR_RNDD);
  mpfr_add(hi, v, err, MPFR_RNDU);
  if (mpfr_sgn(lo.get()) == 0 || mpfr_sgn(lo.get()) != mpfr_sgn(hi.get())) return std::nullopt;
  const int ta = mpfr_set(a, lo, MPFR_RNDZ), tb = mpfr_set(b, hi, MPFR_RNDZ);
  if (!mpfr_equal_p(a, b) || (mpfr_sgn(lo.get()) > 0 ? ta : tb) == 0) return std::nullopt;
  RefValue r = RefValue::from_exact(a);
  r.inexact = true;
  return r;
}

Truth brute_force(const SplitRow& r) {
  const std::size_t n = r.lse.size(), dim = r.o[0].size();
  Truth t;
  t.o.assign(dim, RefValue::zero(false));
  t.magnitude.assign(dim, 0.0);
  std::vector<std::size_t> live;
  for (std::size_t s = 0; s < n; ++s)
    if (r.lse[s] != -INFINITY) live.push_back(s);
  if (live.empty()) {
    t.lse = RefValue::infinity(true);
    return t;
  }
  double m = -INFINITY, low = INFINITY;
  for (std::size_t s : live) {
    m = std::max(m, r.lse[s]), low = std::min(low, r.lse[s]);
    t.spread = std::max(t.spread, std::fabs(r.lse[s]));
  }
  const double span_bits = (m - low) * (r.base2 ? 1.0 : 1.4426950408889634);
  std::vector<bool> decided(dim, false);
  bool lse_decided = false;
  for (std::size_t d = 0; d < dim; ++d)
    for (std::size_t s : live)
      if (!std::isfinite(r.o[s][d])) t.o[d] = RefValue::nan(), t.magnitude[d] = NAN, decided[d] = true;

  // Exactness. Classes of splits whose weights are rational multiples of each other: equal
  // LSE (base e), equal fractional part (base 2); weights 2^(L - top of the class) within.
  // O is rational iff every class has the same ratio sum w O / sum w, and is that ratio.
  {
    const mpfr_prec_t prec = 1400 + static_cast<mpfr_prec_t>(span_bits);
    std::map<double, std::vector<std::size_t>> classes;
    for (std::size_t s : live) classes[r.base2 ? r.lse[s] - std::floor(r.lse[s]) : r.lse[s]].push_back(s);
    std::vector<MpfrBox> den;
    std::vector<std::vector<MpfrBox>> num;  // [class][d]
    Mpfr w(prec), x(prec);
    for (const auto& [key, members] : classes) {
      double top = -INFINITY;
      for (std::size_t s : members) top = std::max(top, r.lse[s]);
      den.push_back(std::make_unique<Mpfr>(prec));
      mpfr_set_zero(*den.back(), 1);
      num.emplace_back();
      for (std::size_t d = 0; d < dim; ++d) {
        num.back().push_back(std::make_unique<Mpfr>(prec));
        mpfr_set_zero(*num.back().back(), 1);
      }
      for (std::size_t s : members) {
        mpfr_set_ui_2exp(w, 1, static_cast<long>(r.lse[s] - top), MPFR_RNDN);  // base e: 2^0
        mpfr_add(*den.back(), *den.back(), w, MPFR_RNDN);
        for (std::size_t d = 0; d < dim; ++d) {
          if (!std::isfinite(r.o[s][d])) continue;
          mpfr_mul_d(x, w, r.o[s][d], MPFR_RNDN);
          mpfr_add(*num.back()[d], *num.back()[d], x, MPFR_RNDN);  // exact at this precision
        }
      }
    }
    Mpfr lhs(2 * prec), rhs(2 * prec);
    for (std::size_t d = 0; d < dim; ++d) {
      if (decided[d]) continue;
      bool equal = true;
      for (std::size_t k = 1; k < den.size() && equal; ++k) {
        mpfr_mul(lhs, *num[k][d], *den[0], MPFR_RNDN);
        mpfr_mul(rhs, *num[0][d], *den[k], MPFR_RNDN);
        equal = mpfr_equal_p(lhs, rhs) != 0;
      }
      if (equal) t.o[d] = quotient_window(*num[0][d], *den[0]), decided[d] = true;
    }
    // LSE: base e rational for one split only (log of a sum of two or more e^L_s is
    // transcendental); base 2 for one class whose weight sum is a power of two.
    if (live.size() == 1 && !r.base2) {
      mpfr_set_d(x, m, MPFR_RNDN);
      t.lse = mpfr_zero_p(x) ? RefValue::zero(false) : RefValue::from_exact(x);
      lse_decided = true;
    } else if (r.base2 && classes.size() == 1) {
      const long e = static_cast<long>(mpfr_get_exp(*den[0])) - 1;
      if (mpfr_cmp_ui_2exp(*den[0], 1, e) == 0) {
        mpfr_set_d(x, m, MPFR_RNDN);
        mpfr_add_si(x, x, e, MPFR_RNDN);  // the top is M: exact at this precision
        t.lse = mpfr_zero_p(x) ? RefValue::zero(false) : RefValue::from_exact(x);
        lse_decided = true;
      }
    }
  }

  // The rest directly at P bits: O = sum w O / sum w, w = b^(L - M) and LSE = M + log_b sum w,
  // |error| <= 2^(8 - P) (sum w |O| / sum w + |O|) (each term two roundings, the sums one per
  // addition, at most 8 splits).
  for (mpfr_prec_t p = 640 + static_cast<mpfr_prec_t>(span_bits);; p *= 4) {
    Mpfr arg(400), den(p), num(p), mag(p), x(p), v(p), err(p);
    std::vector<MpfrBox> w;
    mpfr_set_zero(den, 1);
    for (std::size_t s : live) {
      mpfr_set_d(arg, r.lse[s], MPFR_RNDN);
      mpfr_sub_d(arg, arg, m, MPFR_RNDN);  // exact: FP32 values differ by at most 2^129, to 2^-149
      w.push_back(std::make_unique<Mpfr>(p));
      if (r.base2) mpfr_exp2(*w.back(), arg, MPFR_RNDN);
      else mpfr_exp(*w.back(), arg, MPFR_RNDN);
      mpfr_add(den, den, *w.back(), MPFR_RNDN);
    }
    bool all = true;
    for (std::size_t d = 0; d < dim; ++d) {
      if (std::isnan(t.magnitude[d])) continue;
      mpfr_set_zero(num, 1), mpfr_set_zero(mag, 1);
      for (std::size_t k = 0; k < live.size(); ++k) {
        mpfr_mul_d(x, *w[k], r.o[live[k]][d], MPFR_RNDN);
        mpfr_add(num, num, x, MPFR_RNDN);
        mpfr_abs(x, x, MPFR_RNDN);
        mpfr_add(mag, mag, x, MPFR_RNDN);
      }
      mpfr_div(v, num, den, MPFR_RNDN);
      mpfr_div(mag, mag, den, MPFR_RNDN);
      t.magnitude[d] = mpfr_get_d(mag, MPFR_RNDN);
      if (decided[d]) continue;
      mpfr_abs(err, v, MPFR_RNDU);
      mpfr_add(err, err, mag, MPFR_RNDU);
      mpfr_mul_2si(err, err, 8 - p, MPFR_RNDU);
      if (const auto win = window_within(v, err)) t.o[d] = *win, decided[d] = true;
      else all = false;
    }
    if (!lse_decided) {
      if (r.base2) mpfr_log2(v, den, MPFR_RNDN);
      else mpfr_log(v, den, MPFR_RNDN);
      mpfr_abs(err, v, MPFR_RNDU);
      mpfr_add_d(v, v, m, MPFR_RNDN);
      mpfr_add_d(err, err, std::fabs(m) + 1.0, MPFR_RNDU);
      mpfr_mul_2si(err, err, 8 - p, MPFR_RNDU);
      if (const auto win = window_within(v, err)) t.lse = *win, lse_decided = true;
      else all = false;
    }
    if (all) return t;
    if (p > (1 << 18)) throw std::runtime_error("brute force: a window not decided at 2^18 bits");
  }
}

SplitRow read_row(const CombineCase& cc, std::int64_t b, std::int64_t h, std::int64_t i) {
  const AttentionShape& a = cc.c.attention;
  SplitRow r;
  r.base2 = a.lse_base2;
  for (std::int64_t s = 0; s < a.splits; ++s) {
    r.lse.push_back(cc.in.at("LSE_part").value(static_cast<std::size_t>(lse_at(a, s, b, h, i))));
    r.o.emplace_back();
    for (std::int64_t d = 0; d < a.head_dim; ++d)
      r.o.back().push_back(cc.in.at("O_part").value(static_cast<std::size_t>(o_at(a, s, b, h, i, d))));
  }
  return r;
}

bool same_magnitude(double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return std::fabs(x - y) <= 1e-12 * std::fabs(y) + 1e-300;  // subnormal weights: absolute
}

// Every row of a case against the brute force; "" or the first mismatch.
std::string mismatch(const CombineCase& cc, const CombineReference& r, const std::string& what) {
  const AttentionShape& a = cc.c.attention;
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        const SplitRow row = read_row(cc, b, h, i);
        const Truth t = brute_force(row);
        std::string lses;
        for (double l : row.lse) lses += fmt::format(" {}", l);
        const std::string where =
            fmt::format("{} ({},{},{}) base {} LSE_part [{} ]", what, b, h, i, a.lse_base2 ? "2" : "e", lses);
        for (std::int64_t d = 0; d < a.head_dim; ++d) {
          const RefValue& got = r.at(b, h, i, d);
          if (!(got == t.o[static_cast<std::size_t>(d)])) {
            std::string os;
            for (const auto& o : row.o) os += fmt::format(" {}", o[static_cast<std::size_t>(d)]);
            return fmt::format("{} O_part d {} [{} ]: reference {}, brute force {}", where, d, os, to_string(got),
                               to_string(t.o[static_cast<std::size_t>(d)]));
          }
          if (!same_magnitude(r.magnitude[static_cast<std::size_t>(r.index(b, h, i, d))],
                              t.magnitude[static_cast<std::size_t>(d)]))
            return fmt::format("{} d {}: magnitude {} vs {}", where, d, r.magnitude[r.index(b, h, i, d)],
                               t.magnitude[static_cast<std::size_t>(d)]);
        }
        if (!(r.lse[static_cast<std::size_t>(r.row(b, h, i))] == t.lse))
          return fmt::format("{}: LSE reference {}, brute force {}", where, to_string(r.lse[r.row(b, h, i)]),
                             to_string(t.lse));
        if (r.lse_spread[static_cast<std::size_t>(r.row(b, h, i))] != t.spread)
          return fmt::format("{}: lse_spread {} vs {}", where, r.lse_spread[r.row(b, h, i)], t.spread);
      }
  return "";
}

// ---------------------------------------------------------------------------------------
// Random cases with many ties: LSEs from small integers, quarters and short random gaps
// (equal groups, base-2 rational weights), O values from a small set or constant along a
// column (equal means: exact outputs), empty splits holding NaN, and now and then a gap of
// 10^4 (a sub-class dominating by e^-10000: the near path).

double random_value(Format f, Bits& bits, int style) {
  constexpr double kSmall[] = {0.0, 1.0, -1.0, 2.0, 0.5, 3.0, -0.25, -2.0};
  if (style == 0) return kSmall[bits.in(0, 7)];
  const double band = style == 1 ? 16.0 : 1e30;  // ordinary values; anything finite (subnormals, huge)
  for (;;) {
    const double v = decode(f, bits.next() & info(f).code_mask());
    if (std::isfinite(v) && std::fabs(v) <= band && (style == 2 || v == 0 || std::fabs(v) >= 1.0 / 64)) return v;
  }
}

double random_lse(Bits& bits, int style, double base) {
  double gap = 0;
  switch (style == 3 ? static_cast<int>(bits.in(0, 2)) : style) {
    case 0: gap = static_cast<double>(bits.in(0, 4)); break;               // integers: ties, base-2 rationals
    case 1: gap = static_cast<double>(bits.in(0, 16)) / 4; break;          // quarters
    default: gap = to_unit_closed_open(bits.next()) * (bits.chance(0.5) ? 2.0 : 200.0); break;
  }
  if (bits.chance(1.0 / 1000)) gap += bits.chance(0.5) ? 1e4 : 1e4 + 0.5;  // dominated by e^-10000 or 2^-10000
  return static_cast<float>(base - gap);
}

CombineCase random_case(std::uint64_t seed) {
  Bits bits(seed, 97, 0);
  CombineCase cc;
  const bool base2 = bits.chance(0.5);
  const Format f = kPartFormats[bits.in(0, 2)];
  cc.c = combine_case(bits.in(1, 4), bits.in(1, 4), bits.in(1, 64), bits.in(1, 4), bits.in(1, 8), base2, f,
                      bits.chance(0.5) ? AttentionLayout::BHSD : AttentionLayout::BSHD);
  const AttentionShape& a = cc.c.attention;
  const double empty_share = std::array{0.0, 0.15, 0.4}[bits.in(0, 2)];
  const int lse_style = static_cast<int>(bits.in(0, 3)), value_style = static_cast<int>(bits.in(0, 2));
  Tensor o(f, static_cast<std::size_t>(attention_view(cc.c, "O_part").elements()));
  Tensor l(Format::FP32, static_cast<std::size_t>(attention_view(cc.c, "LSE_part").elements()));
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        const double base = bits.chance(0.5) ? static_cast<double>(bits.in(-5, 5))
                                             : static_cast<float>((to_unit_closed_open(bits.next()) - 0.5) * 60);
        std::vector<bool> empty(static_cast<std::size_t>(a.splits));
        for (std::int64_t s = 0; s < a.splits; ++s) {
          empty[s] = bits.chance(empty_share);
          const double lse = empty[s] ? -INFINITY : random_lse(bits, lse_style, base);
          l.set_value(static_cast<std::size_t>(lse_at(a, s, b, h, i)), lse);
        }
        for (std::int64_t d = 0; d < a.head_dim; ++d) {
          const bool constant = bits.chance(0.3);  // one value in every split: an exact mean
          const double common = random_value(f, bits, value_style);
          for (std::int64_t s = 0; s < a.splits; ++s) {
            double v = constant ? common : random_value(f, bits, value_style);
            if (empty[s] && bits.chance(0.5)) v = NAN;                               // never read
            else if (bits.chance(0.002)) v = bits.chance(0.5) ? NAN : -INFINITY;     // poisons O_d
            o.set_value(static_cast<std::size_t>(o_at(a, s, b, h, i, d)), v);
          }
        }
      }
  cc.in["O_part"] = std::move(o);
  cc.in["LSE_part"] = std::move(l);
  return cc;
}

// A one-row case (batch, heads, seq_q 1) from LSEs and O rows ([split][d]).
CombineCase one_row(bool base2, const std::vector<double>& lse, const std::vector<std::vector<double>>& o,
                    Format f = Format::FP32) {
  CombineCase cc;
  const auto splits = static_cast<std::int64_t>(lse.size()), dim = static_cast<std::int64_t>(o[0].size());
  cc.c = combine_case(1, 1, 1, dim, splits, base2, f);
  Tensor ot(f, static_cast<std::size_t>(splits * dim)), lt(Format::FP32, lse.size());
  for (std::int64_t s = 0; s < splits; ++s) {
    lt.set_value(static_cast<std::size_t>(s), lse[static_cast<std::size_t>(s)]);
    for (std::int64_t d = 0; d < dim; ++d)
      ot.set_value(static_cast<std::size_t>(s * dim + d), o[static_cast<std::size_t>(s)][static_cast<std::size_t>(d)]);
  }
  cc.in["O_part"] = std::move(ot);
  cc.in["LSE_part"] = std::move(lt);
  return cc;
}

RefValue exact(double x) {
  Mpfr m(64, x);
  return RefValue::from_exact(m);
}
// The window of x (a 128-bit number) with the sticky bit: a value just above |x|.
RefValue just_beyond(double x) {
  RefValue r = exact(x);
  r.inexact = true;
  return r;
}
// The window just below |x| (x a 128-bit number): |x| - 2^-128 |x| or so, sticky.
RefValue just_within(double x) {
  Mpfr m(128, x);
  if (x > 0) mpfr_nextbelow(m);
  else mpfr_nextabove(m);
  RefValue r = RefValue::from_exact(m);
  r.inexact = true;
  return r;
}
// The window of a transcendental value computed at 4000 bits by fn.
template <class Fn>
RefValue window_at_4000_bits(Fn&& fn) {
  Mpfr x(4000), err(64);
  fn(x.get());
  mpfr_abs(err, x, MPFR_RNDU);
  mpfr_mul_2si(err, err, -3900, MPFR_RNDU);
  const auto w = window_within(x, err);
  if (!w) throw std::runtime_error("not decided at 4000 bits");
  return *w;
}

}  // namespace

// Five random cases per RapidCheck case, about 200 rows each: 10^5 rows and 2.5 * 10^5
// outputs per run.
RC_GTEST_PROP(CombineReference, MatchesBruteForceMpfr, ()) {
  const auto base = *rc::gen::arbitrary<std::uint64_t>();
  for (std::uint64_t seed = base; seed < base + 5; ++seed) {
    const CombineCase cc = random_case(seed);
    const std::string bad = mismatch(cc, combine_reference(cc.c, cc.in, 1), fmt::format("seed {}", seed));
    if (!bad.empty()) RC_FAIL(bad);
  }
}

TEST(CombineReference, EqualLsesGiveTheExactMean) {
  const CombineCase cc = one_row(false, {1.5, 1.5}, {{1.0, -3.0, 0.5}, {2.0, 1.0, 0.5}});
  const CombineReference r = combine_reference(cc.c, cc.in, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0), exact(1.5));
  EXPECT_EQ(r.at(0, 0, 0, 1), exact(-1.0));
  EXPECT_EQ(r.at(0, 0, 0, 2), exact(0.5));
  // LSE = 1.5 + ln 2, transcendental
  const RefValue lse = window_at_4000_bits([](mpfr_ptr x) {
    mpfr_const_log2(x, MPFR_RNDN);
    mpfr_add_d(x, x, 1.5, MPFR_RNDN);
  });
  EXPECT_EQ(r.lse[0], lse) << to_string(r.lse[0]) << " vs " << to_string(lse);
  EXPECT_EQ(r.lse_spread[0], 1.5);
  EXPECT_EQ(r.magnitude[1], 2.0);
  EXPECT_EQ(mismatch(cc, r, "equal"), "");
}

TEST(CombineReference, OneNonEmptySplitIsExact) {
  for (bool base2 : {false, true}) {
    const CombineCase cc =
        one_row(base2, {-INFINITY, 0.75, -INFINITY}, {{NAN, INFINITY}, {0.1f, -7.0}, {-INFINITY, NAN}});
    const CombineReference r = combine_reference(cc.c, cc.in, 1);
    EXPECT_EQ(r.at(0, 0, 0, 0), exact(0.1f));
    EXPECT_EQ(r.at(0, 0, 0, 1), exact(-7.0));
    EXPECT_EQ(r.lse[0], exact(0.75));
    EXPECT_EQ(r.magnitude[0], static_cast<double>(0.1f));
    EXPECT_EQ(mismatch(cc, r, "one"), "");
  }
  const CombineCase zero = one_row(false, {-0.0, -INFINITY}, {{-0.0}, {1.0}});  // exact zeros are +0
  const CombineReference r = combine_reference(zero.c, zero.in, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0), RefValue::zero(false));
  EXPECT_EQ(r.lse[0], RefValue::zero(false));
}

TEST(CombineReference, AllEmptyIsZeroAndMinusInfinity) {
  for (bool base2 : {false, true}) {
    const CombineCase cc = one_row(base2, {-INFINITY, -INFINITY}, {{NAN, 1.0}, {2.0, NAN}});
    const CombineReference r = combine_reference(cc.c, cc.in, 1);
    EXPECT_EQ(r.at(0, 0, 0, 0), RefValue::zero(false));
    EXPECT_EQ(r.at(0, 0, 0, 1), RefValue::zero(false));
    EXPECT_EQ(r.lse[0], RefValue::infinity(true));
    EXPECT_EQ(r.magnitude[0], 0.0);
    EXPECT_EQ(r.lse_spread[0], 0.0);
  }
}

TEST(CombineReference, NanInANonEmptySplitPoisonsItsColumn) {
  const CombineCase cc = one_row(false, {0.0, -1.0}, {{NAN, 1.0}, {1.0, 2.0}});
  const CombineReference r = combine_reference(cc.c, cc.in, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0).kind, RefValue::Kind::NaN);
  EXPECT_TRUE(std::isnan(r.magnitude[0]));
  EXPECT_EQ(r.at(0, 0, 0, 1).kind, RefValue::Kind::Finite);
  EXPECT_EQ(mismatch(cc, r, "nan"), "");
}

TEST(CombineReference, Base2PowersOfTwoAreExact) {
  {  // 2^3 + 2^2 + 2^2 = 2^4; O = (8 * 1 + 4 * 2 + 4 * 4) / 16 = 2
    const CombineCase cc = one_row(true, {3.0, 2.0, 2.0}, {{1.0}, {2.0}, {4.0}});
    const CombineReference r = combine_reference(cc.c, cc.in, 1);
    EXPECT_EQ(r.lse[0], exact(4.0));
    EXPECT_EQ(r.at(0, 0, 0, 0), exact(2.0));
  }
  {  // 1 + 2^-1 = 3/2: LSE = log2(3/2) irrational; O = (1 + 4 / 2) / (3/2) = 2, (1 + 1) / (3/2) = 4/3
    const CombineCase cc = one_row(true, {0.0, -1.0}, {{1.0, 1.0}, {4.0, 2.0}});
    const CombineReference r = combine_reference(cc.c, cc.in, 1);
    EXPECT_EQ(r.at(0, 0, 0, 0), exact(2.0));
    Mpfr four(64, 4.0), three(64, 3.0);
    Mpfr q(128);
    const int t = mpfr_div(q, four, three, MPFR_RNDZ);
    RefValue third = RefValue::from_exact(q);
    third.inexact = t != 0;
    EXPECT_EQ(r.at(0, 0, 0, 1), third);
    EXPECT_TRUE(third.inexact);
    const RefValue lse = window_at_4000_bits([](mpfr_ptr x) {
      mpfr_set_d(x, 1.5, MPFR_RNDN);
      mpfr_log2(x, x, MPFR_RNDN);
    });
    EXPECT_EQ(r.lse[0], lse);
    EXPECT_EQ(mismatch(cc, r, "base 2"), "");
  }
  {  // quarters in two fractional classes with one ratio: O rational = 3 exactly
    const CombineCase cc = one_row(true, {0.25, -0.5, -1.75}, {{3.0}, {3.0}, {3.0}});
    const CombineReference r = combine_reference(cc.c, cc.in, 1);
    EXPECT_EQ(r.at(0, 0, 0, 0), exact(3.0));
    EXPECT_EQ(mismatch(cc, r, "quarters"), "");
  }
}

// A split 10^4 below the others: O within e^-10000 of the dominant split's value, decided
// next to it by the sign of the rest, in every format and rounding.
TEST(CombineReference, DominantSplitDecidedNextToItsValue) {
  for (bool base2 : {false, true}) {
    const CombineCase up = one_row(base2, {5.0, -9995.0}, {{1.0, -1.0, 0.0}, {3.0, -3.0, 2.0}});
    const CombineReference r = combine_reference(up.c, up.in, 1);
    EXPECT_EQ(r.at(0, 0, 0, 0), just_beyond(1.0));
    EXPECT_EQ(r.at(0, 0, 0, 1), just_beyond(-1.0));
    EXPECT_EQ(r.lse[0], just_beyond(5.0));
    const RefValue& o = r.at(0, 0, 0, 0);
    EXPECT_EQ(o.round_to(Format::FP32, Rounding::Up), encode(Format::FP32, std::nextafter(1.0f, 2.0f)));
    EXPECT_EQ(o.round_to(Format::BF16, Rounding::Down), encode(Format::BF16, 1.0));
    EXPECT_EQ(o.round_to(Format::FP16, Rounding::NearestEven), encode(Format::FP16, 1.0));
    EXPECT_EQ(mismatch(up, r, "dominant"), "");  // the third column: 2 e^-10000 / (1 + e^-10000)
    const CombineCase down = one_row(base2, {5.0, -9995.0}, {{1.0}, {-3.0}});
    const CombineReference rd = combine_reference(down.c, down.in, 1);
    EXPECT_EQ(rd.at(0, 0, 0, 0), just_within(1.0));
    EXPECT_EQ(rd.at(0, 0, 0, 0).round_to(Format::FP32, Rounding::Down),
              encode(Format::FP32, std::nextafter(1.0f, 0.0f)));
    EXPECT_EQ(rd.at(0, 0, 0, 0).round_to(Format::FP64, Rounding::NearestEven), encode(Format::FP64, 1.0));
    EXPECT_EQ(mismatch(down, rd, "dominant"), "");
  }
  // M = 0: LSE = log1p(e^-10000), itself of size e^-10000
  const CombineCase zero = one_row(false, {0.0, -1e4}, {{1.0}, {1.0}});
  EXPECT_EQ(mismatch(zero, combine_reference(zero.c, zero.in, 1), "M = 0"), "");
}

// Base 2: 2^0 and 2^-1 make the rational core (1 + 4/2) / (3/2) = 2; a split of another
// fractional class 10^4 binades below moves O off 2 by its sign only.
TEST(CombineReference, Base2RationalCoreWithAFarIrrationalSplit) {
  for (double far : {7.0, -7.0}) {
    const CombineCase cc = one_row(true, {0.0, -1.0, -10000.5}, {{1.0}, {4.0}, {far}});
    const CombineReference r = combine_reference(cc.c, cc.in, 1);
    EXPECT_EQ(r.at(0, 0, 0, 0), far > 0 ? just_beyond(2.0) : just_within(2.0)) << to_string(r.at(0, 0, 0, 0));
    EXPECT_EQ(mismatch(cc, r, "core"), "");
  }
  // One fractional class split by a gap of 2000 binades: rational, just above 1
  const CombineCase cc = one_row(true, {0.0, -2000.0}, {{1.0}, {5.0}});
  const CombineReference r = combine_reference(cc.c, cc.in, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0), just_beyond(1.0));
  EXPECT_EQ(mismatch(cc, r, "gap 2000"), "");
}

// Base 2, a split 5 * 10^6 binades below M in M's class, the top split's O zero: O is the
// rational 2^-4999999 / (1 + 2^-5000000), just below a power of two and decided next to it
// (Ziv's loop would need 5 * 10^6 bits).
TEST(CombineReference, Base2ZeroTopNextToAFarSplitOfItsClass) {
  const CombineCase cc = one_row(true, {5.0, -4999995.0}, {{0.0, 0.0, 1.0}, {2.0, -2.0, 2.0}});
  const CombineReference r = combine_reference(cc.c, cc.in, 1);
  Mpfr v(128);
  mpfr_set_ui_2exp(v, 1, -4999999, MPFR_RNDN);
  mpfr_nextbelow(v);
  RefValue below = RefValue::from_exact(v);
  below.inexact = true;
  EXPECT_EQ(r.at(0, 0, 0, 0), below) << to_string(r.at(0, 0, 0, 0));
  below.negative = true;
  EXPECT_EQ(r.at(0, 0, 0, 1), below);
  EXPECT_EQ(r.at(0, 0, 0, 2), just_beyond(1.0));
  EXPECT_EQ(r.lse[0], just_beyond(5.0));
}

// Weights far below MPFR's range (an "empty" split written as a huge negative LSE).
TEST(CombineReference, SentinelLsesDecidedBySign) {
  for (bool base2 : {false, true}) {
    {
      const CombineCase cc = one_row(base2, {3.0, -1e30f}, {{1.0, 0.0, -4.0}, {2.0, 2.0, -5.0}});
      const CombineReference r = combine_reference(cc.c, cc.in, 1);
      EXPECT_EQ(r.at(0, 0, 0, 0), just_beyond(1.0));
      EXPECT_EQ(r.at(0, 0, 0, 1), RefValue::tiny(false));
      EXPECT_EQ(r.at(0, 0, 0, 2), just_beyond(-4.0));
      EXPECT_EQ(r.lse[0], just_beyond(3.0));
      EXPECT_EQ(r.at(0, 0, 0, 1).round_to(Format::FP32, Rounding::Up), encode(Format::FP32, 0x1p-149));
      EXPECT_EQ(r.at(0, 0, 0, 1).round_to(Format::FP32, Rounding::NearestEven), encode(Format::FP32, 0.0));
    }
    {
      const CombineCase cc = one_row(base2, {0.0, -std::numeric_limits<float>::max()}, {{1.0}, {0.5}});
      const CombineReference r = combine_reference(cc.c, cc.in, 1);
      EXPECT_EQ(r.at(0, 0, 0, 0), just_within(1.0));
      EXPECT_EQ(r.lse[0], RefValue::tiny(false));
    }
  }
}

TEST(CombineReference, RefusesNanAndInfiniteLses) {
  for (double bad : {NAN, INFINITY}) {
    const CombineCase cc = one_row(false, {0.0, bad}, {{1.0}, {1.0}});
    EXPECT_THROW(combine_reference(cc.c, cc.in, 1), InputError);
  }
}

// Base-2 LSEs of one class each gap at most 2 span + 1024 below the last: one sub-class over
// more than 2^20 binades, beyond what the reference handles.
TEST(CombineReference, RefusesChainsBeyondItsSpan) {
  std::vector<double> lse{0.0};
  for (double span = 0; lse.size() < 8;) span = 3 * span + 1024, lse.push_back(-span);
  const CombineCase cc = one_row(true, lse, std::vector<std::vector<double>>(lse.size(), {1.0}));
  EXPECT_THROW(combine_reference(cc.c, cc.in, 1), InputError);
  lse.pop_back();  // 372736 binades: handled
  const CombineCase ok = one_row(true, lse, std::vector<std::vector<double>>(lse.size(), {1.0}));
  EXPECT_EQ(combine_reference(ok.c, ok.in, 1).at(0, 0, 0, 0), exact(1.0));
}

TEST(CombineReference, ThreadsDoNotChangeBits) {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const CombineCase cc = random_case(seed);
    const CombineReference one = combine_reference(cc.c, cc.in, 1), two = combine_reference(cc.c, cc.in, 2);
    EXPECT_EQ(one.values, two.values);
    EXPECT_EQ(one.lse, two.lse);
  }
}
