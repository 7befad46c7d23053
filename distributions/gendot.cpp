#include "distributions/gendot.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format_mpfr.hpp"
#include "core/rng.hpp"

namespace ulpgate {
namespace {

// Condition numbers up to this are served by all-positive data (cond exactly 2, which is
// within 10x of any request in [2, 20]).
constexpr double kPositiveOnlyCond = 20.0;
// Beyond 2^1000 neither cond nor S/cond fit a double comfortably.
constexpr int kMaxBinades = 1000;

// Binades one cancellation step may remove: its rounding error is <= |d_{i-1}| 2^-p, so a
// step of s binades leaves the target at least 2^(p-s) = 8 times larger than the error.
int step_binades(Format f) { return std::max(1, info(f).precision() - 3); }

// Headroom above the top product's half-exponent: the significand (< 2), the exponent
// jitter (1), the running sum of the first half (which can exceed its largest term by
// about sqrt(n)), and the cancelling pair's factor of up to 2.
int high_margin(std::size_t n) {
  return 4 + static_cast<int>(std::ceil(std::log2(static_cast<double>(n) + 1.0) / 4.0));
}

// Cancellation steps needed to bring the running dot down by B binades (+3 for the slack
// of the first half's sum), s binades at a time, plus the final exact step.
std::size_t steps_needed(int binades, int step) {
  return static_cast<std::size_t>((binades + 3 + step - 1) / step + 1);
}

int max_binades(std::size_t n, Format f) {
  if (n < 2) return 0;
  const auto& fi = info(f);
  const int by_range = 2 * (fi.emax() - high_margin(n)) - 2 * fi.emin() - 4;
  const long long by_steps = static_cast<long long>(n - 2) * step_binades(f) - 3;
  return static_cast<int>(std::min<long long>({by_range, by_steps, kMaxBinades}));
}

double signed_pow2(bool negative, double significand, int exponent) {
  const double v = std::ldexp(significand, exponent);
  return negative ? -v : v;
}

// Enough bits that every sum of products of values of any format here is exact: products
// of doubles span 2^-2148 .. 2^2048, plus 64 bits of carries.
constexpr mpfr_prec_t kExactPrec = 2148 + 2048 + 64 + 64;

}  // namespace

double gendot_max_cond(std::size_t n, Format format) {
  return std::max(kPositiveOnlyCond, std::ldexp(1.0, max_binades(n, format)));
}

namespace {

// One entry's random draws.
struct Draw {
  double ux, uy, ut;    // significands - 1, in [0, 1)
  bool sx, sy, st;      // signs of x, y and of the target
  int jitter;           // -1, 0, 1: exponent split between x and y
  std::uint32_t pick;   // product exponent choice (first half)
  std::uint32_t key;    // permutation key
};

Draw draw_entry(std::uint64_t seed, std::uint32_t stream, std::size_t i) {
  const RandomBlock a = random_block(seed, stream, 2 * static_cast<std::uint64_t>(i));
  const RandomBlock b = random_block(seed, stream, 2 * static_cast<std::uint64_t>(i) + 1);
  return Draw{to_unit_closed_open(low64(a)), to_unit_closed_open(high64(a)),
              to_unit_closed_open(high64(b)), (b.w[0] & 1) != 0, (b.w[0] & 2) != 0,
              (b.w[0] & 4) != 0, static_cast<int>((b.w[0] >> 3) % 3) - 1, b.w[1], b.w[0] >> 8};
}

void check_gendot_args(std::size_t n, double cond, Format format) {
  if (n == 0) throw InputError("gendot: the vectors must have length >= 1");
  if (!(cond >= 2.0) || !std::isfinite(cond))
    throw InputError(fmt::format("gendot: cond must be finite and >= 2 (2 sum|x y| / |x.y| is "
                                 "never below 2), got {}", cond));
  const double max_cond = gendot_max_cond(n, format);
  if (cond > max_cond)
    throw InputError(fmt::format("gendot: cond={:g} is beyond what length {} in {} reaches "
                                 "(max {:g})", cond, n, name(format), max_cond));
}

// Ill-conditioned pairs: a first half of products whose exponents span the wanted binades,
// then a second half that cancels the running dot product step by step down to about
// 2 S / cond. The exact dot product and sum |x y| are kept as the pairs are made.
class IllConditionedDot {
 public:
  IllConditionedDot(std::size_t n, double cond, Format format, const std::vector<Draw>& draws)
      : n_(n), cond_(cond), format_(format), draws_(draws), dot_(kExactPrec), sum_abs_(kExactPrec),
        t_(kExactPrec) {
    const auto& fi = info(format);
    binades_ = static_cast<int>(std::ceil(std::log2(cond)));
    m_ = std::min(n - 1, std::max(steps_needed(binades_, step_binades(format)), n - n / 2));
    // Product exponents of the first half span [low, low + binades]; centre them in the
    // range that keeps every entry normal and finite (see max_binades).
    const int low_bound = 2 * fi.emin() + 4;
    const int high_bound = 2 * (fi.emax() - high_margin(n)) - binades_;
    low_ = static_cast<int>(std::floor((low_bound + high_bound) / 2.0));
    mpfr_set_zero(dot_, 1);
    mpfr_set_zero(sum_abs_, 1);
    out_.x.resize(n);
    out_.y.resize(n);
  }

  DotPair make() {
    spread_half();
    cancelling_half();
    return std::move(out_);
  }

 private:
  void spread_half() {
    for (std::size_t i = 0; i < n_ - m_; ++i) {
      const Draw& d = draws_[i];
      const int pe = i == 0 ? low_ + binades_ : low_ + static_cast<int>(d.pick % (binades_ + 1));
      const int ex = static_cast<int>(std::floor(pe / 2.0)) + (i == 0 ? 0 : d.jitter);
      out_.x[i] = round_to(format_, signed_pow2(d.sx, 1.0 + d.ux, ex));
      out_.y[i] = round_to(format_, signed_pow2(d.sy, 1.0 + d.uy, pe - ex));
      add_pair(out_.x[i], out_.y[i]);
    }
  }

  // Targets descend geometrically from |d_n2| to about the final 2 S / cond; S at the end is
  // between S_n2 and about 3 S_n2 (the cancelling products sum to about 2 |d_n2|).
  void cancelling_half() {
    const int g0 = log2_abs(dot_, low_);
    const double s_estimate = 2.0 * mpfr_get_d(sum_abs_, MPFR_RNDN);
    const int g_final = static_cast<int>(std::floor(std::log2(2.0 * s_estimate / cond_)));
    for (std::size_t j = 1; j <= m_; ++j) {
      const std::size_t i = n_ - m_ + j - 1;
      const Draw& d = draws_[i];
      if (j < m_) {
        const double g = g0 + (g_final - g0) * static_cast<double>(j) / static_cast<double>(m_);
        mpfr_set_d(t_, signed_pow2(d.st, 1.0 + d.ut, static_cast<int>(std::floor(g))), MPFR_RNDN);
      } else {
        set_last_target(d.st);
      }
      const int ex = static_cast<int>(std::floor(log2_abs(dot_, log2_abs(t_, low_)) / 2.0));
      out_.x[i] = round_to(format_, signed_pow2(d.sx, 1.0 + d.ux, ex));
      mpfr_sub(t_, t_, dot_, MPFR_RNDN);  // exact
      mpfr_div_d(t_, t_, out_.x[i], MPFR_RNDN);
      const Code yc = encode_exact(format_, t_);
      if (!is_finite(format_, yc))
        throw std::logic_error(fmt::format("gendot: entry {} overflowed {} (cond {:g}, n {})", i,
                                           name(format_), cond_, n_));
      out_.y[i] = decode(format_, yc);
      add_pair(out_.x[i], out_.y[i]);
    }
  }

  // Last step: t = +-2 S / cond with S including this pair's |x y| ~ |d - t|.
  void set_last_target(bool negative) {
    const double s_before = mpfr_get_d(sum_abs_, MPFR_RNDN);
    const double d_now = mpfr_get_d(dot_, MPFR_RNDN);
    double target = 2.0 * (s_before + std::fabs(d_now)) / cond_;
    if (negative) target = -target;
    target = 2.0 * (s_before + std::fabs(d_now - target)) / cond_;
    mpfr_set_d(t_, negative ? -target : target, MPFR_RNDN);
  }

  // Products of two doubles need 106 bits; kept in their own exact temporary.
  void add_pair(double x, double y) {
    mpfr_set_d(xm_, x, MPFR_RNDN);
    mpfr_set_d(ym_, y, MPFR_RNDN);
    mpfr_mul(prod_, xm_, ym_, MPFR_RNDN);  // exact: 2 x 53 bits <= 128
    mpfr_add(dot_, dot_, prod_, MPFR_RNDN);
    mpfr_abs(prod_, prod_, MPFR_RNDN);
    mpfr_add(sum_abs_, sum_abs_, prod_, MPFR_RNDN);
  }

  static int log2_abs(mpfr_srcptr v, int fallback) {
    return mpfr_zero_p(v) ? fallback : static_cast<int>(mpfr_get_exp(v)) - 1;
  }

  std::size_t n_;
  double cond_;
  Format format_;
  const std::vector<Draw>& draws_;
  int binades_ = 0, low_ = 0;
  std::size_t m_ = 0;  // entries of the cancelling half
  Mpfr dot_, sum_abs_, t_, xm_{64}, ym_{64}, prod_{128};
  DotPair out_;
};

// One random permutation for both vectors, so pairs stay pairs.
DotPair permuted(const DotPair& in, const std::vector<Draw>& draws) {
  const std::size_t n = in.x.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return draws[a].key != draws[b].key ? draws[a].key < draws[b].key : a < b;
  });
  DotPair out;
  out.x.resize(n);
  out.y.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    out.x[i] = in.x[order[i]];
    out.y[i] = in.y[order[i]];
  }
  return out;
}

}  // namespace

DotPair gendot(std::size_t n, double cond, Format format, std::uint64_t seed, std::uint32_t stream) {
  check_gendot_args(n, cond, format);
  std::vector<Draw> draws(n);
  for (std::size_t i = 0; i < n; ++i) draws[i] = draw_entry(seed, stream, i);
  if (cond <= kPositiveOnlyCond) {
    DotPair out;
    out.x.resize(n);
    out.y.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      out.x[i] = round_to(format, 1.0 + draws[i].ux);
      out.y[i] = round_to(format, 1.0 + draws[i].uy);
    }
    return out;
  }
  return permuted(IllConditionedDot(n, cond, format, draws).make(), draws);
}

double exact_dot_condition(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) throw std::invalid_argument("exact_dot_condition: lengths differ");
  Mpfr dot(kExactPrec), sum_abs(kExactPrec), a(64), b(64), prod(128);
  mpfr_set_zero(dot, 1);
  mpfr_set_zero(sum_abs, 1);
  for (std::size_t i = 0; i < x.size(); ++i) {
    mpfr_set_d(a, x[i], MPFR_RNDN);
    mpfr_set_d(b, y[i], MPFR_RNDN);
    mpfr_mul(prod, a, b, MPFR_RNDN);  // exact
    mpfr_add(dot, dot, prod, MPFR_RNDN);
    mpfr_abs(prod, prod, MPFR_RNDN);
    mpfr_add(sum_abs, sum_abs, prod, MPFR_RNDN);
  }
  if (mpfr_zero_p(dot)) return INFINITY;
  mpfr_abs(dot, dot, MPFR_RNDN);
  mpfr_mul_2ui(sum_abs, sum_abs, 1, MPFR_RNDN);
  mpfr_div(sum_abs, sum_abs, dot, MPFR_RNDN);
  return mpfr_get_d(sum_abs, MPFR_RNDN);
}

}  // namespace ulpgate
