// Dot-product inputs for the reference tests: families of FP32 data that stress an exact
// accumulator (extreme exponents, subnormal products, heavy and exact cancellation, signed
// zeros, specials, exact-by-construction integers). Each input is a pure function of
// (family, seed, index) through Philox, so a failure names the one input to replay.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/format.hpp"
#include "core/rng.hpp"

namespace ulpgate::test {

enum class Family : int {
  AnyFp32,        ///< every finite FP32 bit pattern: products 2^-298 .. 2^256
  FormatCodes,    ///< codes of TF32, FP16, BF16, E4M3, E5M2 (and FP32)
  Narrow,         ///< "ordinary" data: exponents in [-6, 6]
  Cancellation,   ///< pairs cancelling exactly or to the last bit, plus tiny terms
  Subnormal,      ///< subnormal and tiny operands, some ordinary ones
  Extreme,        ///< huge and tiny products together, huge ones cancelling
  Zeros,          ///< signed zeros and exact cancellation: IEEE sign rules
  Specials,       ///< Inf and NaN among ordinary values
  SmallIntegers,  ///< exact by construction: the naive FP64 sum is exact
  Spread,         ///< exponent spreads of 0..80 binades: 1, 2, 3 and 4 SIMD slice levels
};
inline constexpr Family kFamilies[] = {Family::AnyFp32,     Family::FormatCodes,
                                       Family::Narrow,      Family::Cancellation,
                                       Family::Subnormal,   Family::Extreme,
                                       Family::Zeros,       Family::Specials,
                                       Family::SmallIntegers, Family::Spread};
inline const char* name(Family f) {
  constexpr const char* names[] = {"any_fp32",  "format_codes", "narrow",   "cancellation",
                                   "subnormal", "extreme",      "zeros",    "specials",
                                   "small_integers", "spread"};
  return names[static_cast<int>(f)];
}

/// A stream of random words for one input.
class Bits {
 public:
  Bits(std::uint64_t seed, std::uint32_t stream, std::uint64_t index)
      : seed_(seed), stream_(stream), base_(index << 24) {}
  std::uint64_t next() {
    if (used_ == 2) {
      block_ = random_block(seed_, stream_, base_ + counter_++);
      used_ = 0;
    }
    return used_++ == 0 ? low64(block_) : high64(block_);
  }
  /// Uniform in [lo, hi].
  std::int64_t in(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return to_unit_closed_open(next()) < p; }

 private:
  std::uint64_t seed_;
  std::uint32_t stream_;
  std::uint64_t base_, counter_ = 0;
  RandomBlock block_{};
  int used_ = 2;
};

/// (-1)^s * 1.m * 2^e as a float, e in FP32's range or below (then subnormal or 0).
inline float make_float(Bits& b, int e_lo, int e_hi) {
  const int e = static_cast<int>(b.in(e_lo, e_hi));
  const float m = 1.0f + static_cast<float>(b.next() >> 41) * 0x1p-23f;
  const float v = std::ldexp(m, e);  // below 2^-126 this rounds into the subnormals
  return (b.next() & 1) ? -v : v;
}

struct DotInput {
  std::vector<float> x, y;
};

inline std::size_t random_length(Bits& b, std::size_t max_len) {
  const double u = to_unit_closed_open(b.next());
  std::size_t n = u < 0.7 ? b.in(0, 32) : u < 0.95 ? b.in(33, 300) : b.in(301, 3000);
  return std::min(n, max_len);
}

inline DotInput make_dot(Family fam, std::uint64_t seed, std::uint64_t index,
                         std::size_t max_len = 3000) {
  Bits b(seed, 1000 + static_cast<std::uint32_t>(fam), index);
  const std::size_t n = random_length(b, max_len);
  DotInput d;
  d.x.reserve(n + 8);
  d.y.reserve(n + 8);
  auto push = [&](float a, float c) { d.x.push_back(a); d.y.push_back(c); };
  auto any_finite = [&]() {
    std::uint32_t w = static_cast<std::uint32_t>(b.next());
    if ((w & 0x7F800000u) == 0x7F800000u) w &= ~0x00800000u;  // exponent 254: finite
    return std::bit_cast<float>(w);
  };
  switch (fam) {
    case Family::AnyFp32:
      for (std::size_t i = 0; i < n; ++i) push(any_finite(), any_finite());
      break;
    case Family::FormatCodes: {
      constexpr Format fs[] = {Format::FP32, Format::TF32, Format::FP16,
                               Format::BF16, Format::E4M3, Format::E5M2};
      const Format f = fs[b.in(0, 5)], g = fs[b.in(0, 5)];
      auto code_value = [&](Format fmt) {
        for (;;) {
          const Code c = b.next() & info(fmt).code_mask();
          if (is_finite(fmt, c)) return static_cast<float>(decode(fmt, c));
        }
      };
      for (std::size_t i = 0; i < n; ++i) push(code_value(f), code_value(g));
      break;
    }
    case Family::Narrow:
      for (std::size_t i = 0; i < n; ++i) push(make_float(b, -6, 6), make_float(b, -6, 6));
      break;
    case Family::Cancellation: {
      const int spread = static_cast<int>(b.in(0, 60));
      for (std::size_t i = 0; i + 1 < n; i += 2) {
        const float a = make_float(b, -spread, spread), c = make_float(b, -spread, spread);
        push(a, c);
        switch (b.in(0, 3)) {
          case 0: push(-a, c); break;                                    // exact
          case 1: push(c, -a); break;                                    // exact, swapped
          case 2: push(-a, std::nextafter(c, b.chance(0.5) ? INFINITY : -INFINITY)); break;
          default: push(a * 0.5f, -2.0f * c); break;                     // exact, rescaled
        }
      }
      const int tiny = static_cast<int>(b.in(0, 3));
      for (int i = 0; i < tiny; ++i) push(make_float(b, -149, -100), make_float(b, -149, 0));
      break;
    }
    case Family::Subnormal:
      for (std::size_t i = 0; i < n; ++i) {
        if (b.chance(0.1)) push(make_float(b, -20, 0), make_float(b, -20, 0));
        else push(make_float(b, -149, -110), make_float(b, -149, -100));
      }
      break;
    case Family::Extreme:
      for (std::size_t i = 0; i < n; ++i) {
        const bool huge = b.chance(0.5);
        const float a = huge ? make_float(b, 100, 127) : make_float(b, -149, -120);
        const float c = huge ? make_float(b, 100, 127) : make_float(b, -149, -120);
        push(a, c);
        if (huge && b.chance(0.8)) push(-a, c);
      }
      break;
    case Family::Zeros:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t k = b.next() % 8;
        const float z = (b.next() & 1) ? -0.0f : 0.0f;
        if (k < 6) push(z, make_float(b, -149, 127));  // a signed zero product
        else {
          const float a = make_float(b, -149, 127), c = make_float(b, -149, 127);
          push(a, c);
          push(-a, c);  // exact cancellation: +0 under RNE
        }
      }
      if (b.chance(0.3)) {  // only -0 products: the sum is -0
        for (std::size_t i = 0; i < d.x.size(); ++i) {
          d.x[i] = -0.0f;
          d.y[i] = std::fabs(d.y[i]) + 1.0f;
        }
      }
      break;
    case Family::Specials:
      for (std::size_t i = 0; i < n; ++i) {
        const double u = to_unit_closed_open(b.next());
        float a = make_float(b, -10, 10);
        if (u < 0.02) a = INFINITY;
        else if (u < 0.04) a = -INFINITY;
        else if (u < 0.05) a = NAN;
        else if (u < 0.07) a = 0.0f;
        push(a, b.chance(0.05) ? 0.0f : make_float(b, -10, 10));
      }
      break;
    case Family::SmallIntegers: {
      const int k = static_cast<int>(b.in(-20, 20));
      for (std::size_t i = 0; i < n; ++i)
        push(std::ldexp(static_cast<float>(b.in(-64, 64)), k),
             std::ldexp(static_cast<float>(b.in(-64, 64)), -k / 2));
      break;
    }
    case Family::Spread: {
      // Operand exponents within w binades put the products within about 2w + 48: one
      // slice level up to w = 2, two to 27, three to 52, four to 78, bins beyond.
      const int w = static_cast<int>(b.in(0, 80)), lo = -w / 2 - 3;
      for (std::size_t i = 0; i < n; ++i) {
        const float a = make_float(b, lo, lo + w), c = make_float(b, lo, lo + w);
        push(a, c);
        if (b.chance(0.3)) push(-a, c);
      }
      break;
    }
  }
  // Shuffle so cancelling pairs are not adjacent (and land in different bin tables).
  for (std::size_t i = d.x.size(); i > 1; --i) {
    const std::size_t j = b.next() % i;
    std::swap(d.x[i - 1], d.x[j]);
    std::swap(d.y[i - 1], d.y[j]);
  }
  return d;
}

/// A GEMM of dot inputs: m rows of op(A) (row-major, m x k) and n columns of op(B) (held as
/// rows, n x k) from inputs index, index + 1, ... of one family, every one zero padded or cut
/// to the length k of the first.
struct DotMatrices {
  std::int64_t m = 0, n = 0, k = 0;
  std::vector<float> a, b;
};
inline DotMatrices make_dot_matrices(Family fam, std::uint64_t seed, std::uint64_t index, std::int64_t m,
                                     std::int64_t n, std::size_t max_len) {
  DotMatrices g;
  g.m = m, g.n = n, g.k = static_cast<std::int64_t>(make_dot(fam, seed, index, max_len).x.size());
  for (std::int64_t r = 0; r < std::max(m, n); ++r) {
    DotInput d = make_dot(fam, seed, index + static_cast<std::uint64_t>(r), max_len);
    d.x.resize(static_cast<std::size_t>(g.k)), d.y.resize(static_cast<std::size_t>(g.k));
    if (r < m) g.a.insert(g.a.end(), d.x.begin(), d.x.end());
    if (r < n) g.b.insert(g.b.end(), d.y.begin(), d.y.end());
  }
  return g;
}

/// Total dot products the default test run checks; ULPGATE_REF_DOTS overrides.
inline std::uint64_t dots_budget() {
  if (const char* s = std::getenv("ULPGATE_REF_DOTS")) return std::strtoull(s, nullptr, 10);
  return 1'000'000;
}

}  // namespace ulpgate::test
