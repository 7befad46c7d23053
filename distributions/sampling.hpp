// Per-element sampling, identical bits on the CPU and the GPU: only correctly rounded,
// never contracted operations, and log/exp/sin/cos built from them rather than taken from
// libm (CUDA's and glibc's differ in the last bits). See docs/concepts/cases.md.
//
// This header is compiled by nvcc as C++17 (see the top-level CMakeLists.txt): no C++20 here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/rng.hpp"

namespace ulpgate::sampling {

// ---- correctly rounded primitives, never contracted ----------------------------------------
ULPGATE_HD double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
ULPGATE_HD double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
ULPGATE_HD double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
ULPGATE_HD double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
ULPGATE_HD double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
ULPGATE_HD double fma_rn(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
ULPGATE_HD std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
ULPGATE_HD double from_bits(std::uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
/// 2^k for -1022 <= k <= 1023, built from bits (exact).
ULPGATE_HD double pow2(int k) { return from_bits(static_cast<std::uint64_t>(k + 1023) << 52); }
ULPGATE_HD double quiet_nan() { return from_bits(0x7FF8000000000000ull); }
ULPGATE_HD double infinity() { return from_bits(0x7FF0000000000000ull); }

// ---- transcendental helpers -----------------------------------------------------------------

/// Natural logarithm of x > 0 (finite): x = m 2^e with m in [sqrt(1/2), sqrt(2)),
/// log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172: the odd series to s^23 leaves
/// a truncation error below 2^-60.
ULPGATE_HD double log_pos(double x) {
  int e = 0;
  if (x < 0x1p-1022) {  // subnormal: scale into the normal range first (exact)
    x = mul(x, 0x1p54);
    e = -54;
  }
  const std::uint64_t u = bits_of(x);
  e += static_cast<int>((u >> 52) & 0x7FF) - 1023;
  double m = from_bits((u & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);  // [1, 2)
  if (m > 1.4142135623730951) {
    m = mul(m, 0.5);
    e += 1;
  }
  const double s = div(sub(m, 1.0), add(m, 1.0));
  const double s2 = mul(s, s);
  // 2/3 + s2 (2/5 + s2 (2/7 + ...)), Horner with explicit fma.
  double p = 2.0 / 23.0;
  p = fma_rn(p, s2, 2.0 / 21.0);
  p = fma_rn(p, s2, 2.0 / 19.0);
  p = fma_rn(p, s2, 2.0 / 17.0);
  p = fma_rn(p, s2, 2.0 / 15.0);
  p = fma_rn(p, s2, 2.0 / 13.0);
  p = fma_rn(p, s2, 2.0 / 11.0);
  p = fma_rn(p, s2, 2.0 / 9.0);
  p = fma_rn(p, s2, 2.0 / 7.0);
  p = fma_rn(p, s2, 2.0 / 5.0);
  p = fma_rn(p, s2, 2.0 / 3.0);
  const double log_m = fma_rn(mul(s, s2), p, add(s, s));
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;  // trailing zeros: e * kLn2Hi is exact
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  const double de = static_cast<double>(e);
  return add(mul(de, kLn2Hi), fma_rn(de, kLn2Lo, log_m));
}

/// e^x: x = k ln2 + r, |r| <= ln2/2, Taylor to r^13 (truncation < 2^-60), times 2^k.
ULPGATE_HD double exp_rn(double x) {
  if (x != x) return x;
  if (x > 709.78) return infinity();
  if (x < -745.2) return 0.0;
  constexpr double kInvLn2 = 0x1.71547652b82fep0;
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  const double kd = floor(add(mul(x, kInvLn2), 0.5));
  const int k = static_cast<int>(kd);
  const double r = sub(sub(x, mul(kd, kLn2Hi)), mul(kd, kLn2Lo));
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = fma_rn(p, r, 1.0 / 479001600.0);
  p = fma_rn(p, r, 1.0 / 39916800.0);
  p = fma_rn(p, r, 1.0 / 3628800.0);
  p = fma_rn(p, r, 1.0 / 362880.0);
  p = fma_rn(p, r, 1.0 / 40320.0);
  p = fma_rn(p, r, 1.0 / 5040.0);
  p = fma_rn(p, r, 1.0 / 720.0);
  p = fma_rn(p, r, 1.0 / 120.0);
  p = fma_rn(p, r, 1.0 / 24.0);
  p = fma_rn(p, r, 1.0 / 6.0);
  p = fma_rn(p, r, 0.5);
  p = fma_rn(p, r, 1.0);
  p = fma_rn(p, r, 1.0);
  // 2^k in two exact steps so that results near the under/overflow thresholds are right.
  const int k1 = k / 2, k2 = k - k1;
  return mul(mul(p, pow2(k1)), pow2(k2));
}

/// sin and cos of 2 pi t for t in [0, 1): the quadrant comes from t exactly (4t is exact),
/// the remaining angle is at most pi/4, where Taylor series to degree 17/18 are accurate
/// to about 1 ulp.
ULPGATE_HD void sincos_turns(double t, double& s, double& c) {
  const double t4 = mul(t, 4.0);  // exact
  const double qd = floor(t4);
  int q = static_cast<int>(qd) & 3;
  double f = sub(t4, qd);  // exact, [0, 1): fraction of a quarter turn
  const bool reflect = f > 0.5;
  if (reflect) f = sub(1.0, f);  // exact
  constexpr double kPiOver2Hi = 0x1.921fb54442d18p0;
  constexpr double kPiOver2Lo = 0x1.1a62633145c07p-54;
  const double a = fma_rn(f, kPiOver2Hi, mul(f, kPiOver2Lo));
  const double a2 = mul(a, a);
  double ps = -1.0 / 355687428096000.0;  // -1/17!
  ps = fma_rn(ps, a2, 1.0 / 1307674368000.0);
  ps = fma_rn(ps, a2, -1.0 / 6227020800.0);
  ps = fma_rn(ps, a2, 1.0 / 39916800.0);
  ps = fma_rn(ps, a2, -1.0 / 362880.0);
  ps = fma_rn(ps, a2, 1.0 / 5040.0);
  ps = fma_rn(ps, a2, -1.0 / 120.0);
  ps = fma_rn(ps, a2, 1.0 / 6.0);
  const double sin_a = sub(a, mul(mul(a, a2), ps));
  double pc = 1.0 / 6402373705728000.0;  // 1/18!
  pc = fma_rn(pc, a2, -1.0 / 20922789888000.0);
  pc = fma_rn(pc, a2, 1.0 / 87178291200.0);
  pc = fma_rn(pc, a2, -1.0 / 479001600.0);
  pc = fma_rn(pc, a2, 1.0 / 3628800.0);
  pc = fma_rn(pc, a2, -1.0 / 40320.0);
  pc = fma_rn(pc, a2, 1.0 / 720.0);
  pc = fma_rn(pc, a2, -1.0 / 24.0);
  pc = fma_rn(pc, a2, 0.5);
  const double cos_a = fma_rn(-a2, pc, 1.0);
  // Angle within the quadrant: f (pi/2), or (1 - f)(pi/2) when reflected (sin <-> cos).
  double sq = reflect ? cos_a : sin_a, cq = reflect ? sin_a : cos_a;
  switch (q) {
    case 0: s = sq; c = cq; break;
    case 1: s = cq; c = -sq; break;
    case 2: s = -sq; c = -cq; break;
    default: s = -cq; c = sq; break;
  }
}

// ---- streams ---------------------------------------------------------------------------------

/// A stream word is operand (bits 0-7) | draw (bits 8-15) | sub-stream (bits 16-31); see
/// docs/concepts/cases.md for the numbering. Draw 0 holds an element's main bits.
ULPGATE_HD std::uint32_t with_draw(std::uint32_t stream, std::uint32_t draw) {
  return (stream & ~0xFF00u) | (draw << 8);
}
inline constexpr std::uint32_t kDrawModifiers = 1;  ///< outliers / special values
inline constexpr std::uint32_t kDrawExtra = 2;      ///< a family's third uniform
inline constexpr std::uint32_t kDrawRetryFirst = 3; ///< rejection sampling attempts 3..252
inline constexpr std::uint32_t kDrawRetryLast = 252;
inline constexpr std::uint32_t kDrawGenDot = 254;   ///< gendot pairs (sub-stream = pair)
inline constexpr std::uint32_t kDrawLine = 255;     ///< per-channel / per-row / per-batch draws

ULPGATE_HD double unit(std::uint64_t seed, std::uint32_t stream, std::uint64_t index) {
  return to_unit_closed_open(low64(random_block(seed, stream, index)));
}

/// A standard normal by Box-Muller (no rejection, so one Philox block per value).
ULPGATE_HD double normal_from(const RandomBlock& r) {
  const double u1 = to_unit_open_closed(low64(r));
  const double u2 = to_unit_closed_open(high64(r));
  double s, c;
  sincos_turns(u2, s, c);
  return mul(sqrt_rn(mul(-2.0, log_pos(u1))), c);
}

// ---- families ----------------------------------------------------------------------------------

/// The per-element families. Joint constructions (gendot, softmax normalisation, amax
/// scaling, attention logits/sinks/masking) are layered on these in fill.cpp.
enum class Kind : std::uint8_t {
  Uniform,       ///< a = lo, b = hi
  Normal,        ///< a = mean, b = std
  LogNormal,     ///< exp(a + b z)
  StudentT,      ///< a = nu, b = scale (Bailey's polar method)
  Cauchy,        ///< a = location, b = scale
  Activations,   ///< a = std, b = outlier channel rate, c = outlier channel scale
  SoftmaxWeight, ///< exp(a z): unnormalised; fill.cpp normalises along the reduction axis
  Sparse,        ///< a = density, b = std
  Relu,          ///< max(0, a + b z)
  Positive,      ///< |b z|
  NearOverflow,  ///< magnitude uniform in [a, b], random sign
  Subnormal,     ///< a = rate; b = smallest subnormal, c = subnormal codes, d = min normal
  Exact,         ///< integers in [-a, a] times b
  Lse,           ///< a + b z rounded to a multiple of d (d > 0), -inf w.p. c (an empty split)
};

/// A family with every parameter resolved to a number (format and shape already folded in)
/// plus the per-element modifiers. Trivially copyable: passed by value to device kernels.
struct Sampler {
  Kind kind = Kind::Normal;
  double a = 0.0, b = 1.0, c = 0.0, d = 0.0;
  double outlier_rate = 0.0, outlier_scale = 1.0;  ///< each element times scale w.p. rate
  double nan_rate = 0.0, inf_rate = 0.0, negzero_rate = 0.0;
};

/// The family's value (FP64, before modifiers and rounding) of the element with logical
/// linear index `index` and feature coordinate `channel` (docs/concepts/cases.md) on operand stream
/// `stream` (draw bits 0).
ULPGATE_HD double sample_core(const Sampler& s, std::uint64_t seed, std::uint32_t stream,
                              std::uint64_t index, std::uint64_t channel) {
  const RandomBlock r = random_block(seed, stream, index);
  double v = 0.0;
  switch (s.kind) {
    case Kind::Uniform:
      v = fma_rn(sub(s.b, s.a), to_unit_closed_open(low64(r)), s.a);
      break;
    case Kind::Normal:
      v = fma_rn(s.b, normal_from(r), s.a);
      break;
    case Kind::LogNormal:
      v = exp_rn(fma_rn(s.b, normal_from(r), s.a));
      break;
    case Kind::StudentT: {
      // Bailey (1994): U, V uniform on (-1, 1) inside the unit disc, W = U^2 + V^2,
      // T = U sqrt(nu (W^(-2/nu) - 1) / W). Attempts are draws 0, 3, 4, ...: a pure function
      // of the index. 250 rejections in a row have probability 0.215^250: never.
      RandomBlock t = r;
      for (std::uint32_t draw = kDrawRetryFirst; draw <= kDrawRetryLast + 1; ++draw) {
        const double uu = sub(mul(2.0, to_unit_closed_open(low64(t))), 1.0);
        const double vv = sub(mul(2.0, to_unit_closed_open(high64(t))), 1.0);
        const double w = fma_rn(uu, uu, mul(vv, vv));
        if (w > 0.0 && w < 1.0) {
          const double wp = exp_rn(mul(div(-2.0, s.a), log_pos(w)));
          v = mul(s.b, mul(uu, sqrt_rn(div(mul(s.a, sub(wp, 1.0)), w))));
          break;
        }
        t = random_block(seed, with_draw(stream, draw), index);
      }
      break;
    }
    case Kind::Cauchy: {
      // tan(pi (u - 1/2)) = -cot(pi u); u in (0, 1) strictly, so sin(pi u) > 0.
      const double u = mul(add(static_cast<double>(low64(r) >> 11), 0.5), 0x1p-53);
      double sn, cs;
      sincos_turns(mul(u, 0.5), sn, cs);
      v = fma_rn(s.b, div(-cs, sn), s.a);
      break;
    }
    case Kind::Activations: {
      // Outlier channels: a few feature columns much larger than the rest (Dettmers et al.,
      // LLM.int8(), 2022). Whether a channel is one depends on the channel alone.
      const double z = mul(s.a, normal_from(r));
      const bool outlier = unit(seed, with_draw(stream, kDrawLine), channel) < s.b;
      v = outlier ? mul(z, s.c) : z;
      break;
    }
    case Kind::SoftmaxWeight:
      v = exp_rn(mul(s.a, normal_from(r)));
      break;
    case Kind::Sparse: {
      const bool keep = unit(seed, with_draw(stream, kDrawExtra), index) < s.a;
      v = keep ? mul(s.b, normal_from(r)) : 0.0;
      break;
    }
    case Kind::Relu: {
      const double z = fma_rn(s.b, normal_from(r), s.a);
      v = z > 0.0 ? z : 0.0;
      break;
    }
    case Kind::Positive: {
      const double z = mul(s.b, normal_from(r));
      v = z < 0.0 ? -z : z;
      break;
    }
    case Kind::NearOverflow: {
      const double m = fma_rn(sub(s.b, s.a), to_unit_closed_open(low64(r)), s.a);
      v = (r.w[2] & 1u) ? -m : m;
      break;
    }
    case Kind::Subnormal: {
      const bool sub_normal = unit(seed, with_draw(stream, kDrawExtra), index) < s.a;
      double m;
      if (sub_normal) {
        // A uniformly chosen nonzero subnormal code: i * smallest, 1 <= i < codes.
        const double i = add(floor(mul(to_unit_closed_open(low64(r)), sub(s.c, 1.0))), 1.0);
        m = mul(i, s.b);
      } else {
        // Otherwise in the lowest normal binades: [min normal, 16 min normal).
        m = mul(s.d, fma_rn(15.0, to_unit_closed_open(low64(r)), 1.0));
      }
      v = (r.w[2] & 1u) ? -m : m;
      break;
    }
    case Kind::Lse: {
      if (unit(seed, with_draw(stream, kDrawExtra), index) < s.c) {
        v = -infinity();
        break;
      }
      v = fma_rn(s.b, normal_from(r), s.a);
      if (s.d > 0) v = mul(floor(add(div(v, s.d), 0.5)), s.d);
      break;
    }
    case Kind::Exact: {
      const auto span = static_cast<std::uint64_t>(s.a) * 2 + 1;
      const auto i = static_cast<std::int64_t>(low64(r) % span) - static_cast<std::int64_t>(s.a);
      v = mul(static_cast<double>(i), s.b);
      break;
    }
  }
  return v;
}

/// Applies the outlier and special-value modifiers to element `index`'s value v (draw 1).
ULPGATE_HD double apply_modifiers(const Sampler& s, std::uint64_t seed, std::uint32_t stream,
                                  std::uint64_t index, double v) {
  if (s.outlier_rate > 0.0 || s.nan_rate > 0.0 || s.inf_rate > 0.0 || s.negzero_rate > 0.0) {
    const RandomBlock m = random_block(seed, with_draw(stream, kDrawModifiers), index);
    if (to_unit_closed_open(low64(m)) < s.outlier_rate) v = mul(v, s.outlier_scale);
    const double u = to_unit_closed_open(high64(m));
    if (u < s.nan_rate) {
      v = quiet_nan();
    } else if (u < add(s.nan_rate, s.inf_rate)) {
      v = (m.w[0] & 1u) ? -infinity() : infinity();
    } else if (u < add(add(s.nan_rate, s.inf_rate), s.negzero_rate)) {
      v = -0.0;
    }
  }
  return v;
}

/// sample_core then apply_modifiers: the complete per-element value.
ULPGATE_HD double sample(const Sampler& s, std::uint64_t seed, std::uint32_t stream,
                         std::uint64_t index, std::uint64_t channel) {
  return apply_modifiers(s, seed, stream, index, sample_core(s, seed, stream, index, channel));
}

}  // namespace ulpgate::sampling
