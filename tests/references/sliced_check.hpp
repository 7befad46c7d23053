// The sliced path's dot products against the superaccumulator, element by element.
#pragma once

#include <span>
#include <string>

#include <fmt/format.h>

#include "references/exact_dot.hpp"
#include "references/sliced_gemm.hpp"

namespace ulpgate::test {

/// The first element (i, j) of row i of a and row j of b (each of length k) where the
/// sliced path is wrong: a certified value or condition other than ExactAccumulator's, a
/// certified element of a row or column not captured or of a zero sum, or an element of a
/// captured row and column with a nonzero sum left uncertified. "" when there is none.
inline std::string first_difference(const SlicedDots& s, std::span<const float> a, std::span<const float> b,
                                    std::int64_t k) {
  ExactAccumulator acc;
  std::int64_t uncertified = 0;
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < s.n; ++j) {
      acc.clear();
      acc.add_products(a.subspan(static_cast<std::size_t>(i * k), static_cast<std::size_t>(k)),
                       b.subspan(static_cast<std::size_t>(j * k), static_cast<std::size_t>(k)));
      const RefValue want = acc.value();
      const std::size_t e = s.index(i, j);
      const bool captured = s.a_plan[i].captured && s.b_plan[j].captured;
      const bool should = captured && want.kind != RefValue::Kind::Zero;
      uncertified += !s.certified[e];
      if (!s.certified[e]) {
        if (should)
          return fmt::format("element ({}, {}), K = {}: captured, sum {}, but not certified", i, j, k, to_string(want));
        continue;
      }
      if (!should)
        return fmt::format("element ({}, {}), K = {}: certified, but captured {} and sum {}", i, j, k, captured,
                           to_string(want));
      if (!(s.value(i, j) == want))
        return fmt::format("element ({}, {}), K = {}: value {}, superaccumulator {}", i, j, k, to_string(s.value(i, j)),
                           to_string(want));
      const double cond = acc.magnitude().to_double();
      if (s.condition[e] != cond)
        return fmt::format("element ({}, {}), K = {}: condition {:a}, superaccumulator {:a}", i, j, k, s.condition[e],
                           cond);
      acc.clear();
      for (const double p : s.pieces(i, j))
        if (p != 0.0) acc.add(p);
      if (!(acc.value() == want))
        return fmt::format("element ({}, {}), K = {}: pieces sum to {}, superaccumulator {}", i, j, k,
                           to_string(acc.value()), to_string(want));
    }
  if (uncertified != s.recomputed)
    return fmt::format("{} elements uncertified, {} counted as recomputed", uncertified, s.recomputed);
  return "";
}

}  // namespace ulpgate::test
