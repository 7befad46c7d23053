// The sliced path's dot products against the superaccumulator, element by element.
#pragma once

#include <span>
#include <string>

#include <fmt/format.h>

#include "references/exact_dot.hpp"
#include "references/sliced_gemm.hpp"

namespace ulpgate::test {

/// The first element (i, j) whose value or magnitude differs from ExactAccumulator's on
/// row i of a and row j of b (each of length k); "" when none does.
inline std::string first_difference(const SlicedDots& s, std::span<const float> a, std::span<const float> b,
                                    std::int64_t k) {
  ExactAccumulator acc;
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < s.n; ++j) {
      acc.clear();
      acc.add_products(a.subspan(static_cast<std::size_t>(i * k), static_cast<std::size_t>(k)),
                       b.subspan(static_cast<std::size_t>(j * k), static_cast<std::size_t>(k)));
      const auto e = static_cast<std::size_t>(i * s.n + j);
      if (!(s.value[e] == acc.value()))
        return fmt::format("element ({}, {}), K = {}: value {}, superaccumulator {}", i, j, k, to_string(s.value[e]),
                           to_string(acc.value()));
      if (!(s.magnitude[e] == acc.magnitude()))
        return fmt::format("element ({}, {}), K = {}: magnitude {}, superaccumulator {}", i, j, k,
                           to_string(s.magnitude[e]), to_string(acc.magnitude()));
    }
  return "";
}

}  // namespace ulpgate::test
