// Small helpers shared by the kernel tests: GEMM cases and simple input fills.
#pragma once

#include <cmath>
#include <map>
#include <string>

#include "core/case.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"
#include "check/runner.hpp"

namespace ulpgate::test_support {

inline Case gemm_case(std::int64_t m, std::int64_t n, std::int64_t k, Format in, Format out,
                      Format compute = Format::FP32) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = m, c.gemm.n = n, c.gemm.k = k;
  c.types = {{"A", in}, {"B", in}, {"D", out}, {"compute", compute}};
  return c;
}

enum class Fill { SmallIntegers, Normal, Positive };

/// Fills every input of the case (padding too) from the counter RNG. SmallIntegers are in
/// [-4, 4]: every product and every partial sum of a short dot product is exact, so every
/// correct kernel gives the same bits.
inline std::map<std::string, Tensor> fill(const Case& c, Fill how, std::uint64_t seed = 1) {
  std::map<std::string, Tensor> in;
  std::uint32_t stream = 0;
  for (const auto& op : c.inputs()) {
    const Format f = c.types.at(op);
    Tensor t(f, static_cast<std::size_t>(gemm_view(c, op).elements()));
    for (std::size_t i = 0; i < t.size(); ++i) {
      const RandomBlock r = random_block(seed, stream, i);
      const double u = to_unit_open_closed(low64(r)), v = to_unit_closed_open(high64(r));
      double x = 0;
      switch (how) {
        case Fill::SmallIntegers: x = static_cast<double>(static_cast<int>(r.w[0] % 9) - 4); break;
        case Fill::Normal: x = std::sqrt(-2 * std::log(u)) * std::cos(2 * M_PI * v); break;
        case Fill::Positive: x = v; break;
      }
      t.set_value(i, x);
    }
    in.emplace(op, std::move(t));
    ++stream;
  }
  return in;
}

}  // namespace ulpgate::test_support
