// Random GEMM cases for the reference tests: every epilogue, layout, transpose, padding,
// batch, format and scale, with values from any finite code (or small integers), a pure
// function of the seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/case.hpp"
#include "core/format.hpp"
#include "core/tensor.hpp"
#include "tests/references/dot_inputs.hpp"

namespace ulpgate::test {

inline constexpr Format kInputFormats[] = {Format::FP32, Format::TF32, Format::FP16,
                                           Format::BF16, Format::E4M3, Format::E5M2};

inline Tensor random_tensor(Format f, std::int64_t n, Bits& bits, bool small_integers, double max_abs) {
  Tensor t(f, static_cast<std::size_t>(n));
  for (std::int64_t e = 0; e < n; ++e) {
    double v;
    if (small_integers) {
      v = static_cast<double>(bits.in(-8, 8));
    } else {
      do v = decode(f, bits.next() & info(f).code_mask());
      while (!std::isfinite(v) || std::fabs(v) > max_abs);
    }
    t.set_value(static_cast<std::size_t>(e), v);
  }
  return t;
}

struct GemmCase {
  Case c;
  std::map<std::string, Tensor> in;
};

inline GemmCase random_case(std::uint64_t seed) {
  Bits bits(seed, 77, 0);
  GemmCase gc;
  Case& c = gc.c;
  GemmShape& g = c.gemm;
  g.m = bits.in(1, 9), g.n = bits.in(1, 9), g.k = bits.in(1, 40), g.batch = bits.in(1, 3);
  c.epilogue = static_cast<Epilogue>(bits.in(0, 7));
  const bool gelu = has_gelu(c.epilogue);
  if (gelu) g.k = std::min<std::int64_t>(g.k, 8);
  g.layout = bits.chance(0.5) ? Layout::RowMajor : Layout::ColMajor;
  g.trans_a = bits.chance(0.5), g.trans_b = bits.chance(0.5);
  auto pad = [&](std::int64_t need) { return bits.chance(0.5) ? 0 : need + bits.in(0, 3); };
  g.lda = pad(g.packed_ld(g.a_rows(), g.a_cols()));
  g.ldb = pad(g.packed_ld(g.b_rows(), g.b_cols()));
  g.ldc = pad(g.packed_ld(g.m, g.n));
  const bool small = !gelu && bits.chance(0.3);
  c.types["A"] = bits.chance(0.1) ? Format::FP64 : kInputFormats[bits.in(0, 5)];
  c.types["B"] = kInputFormats[bits.in(0, 5)];
  c.types["D"] = kAllFormats[bits.in(0, 6)];
  c.types["compute"] = Format::FP32;
  const double alphas[] = {1.0, 0.5, -2.0, 0.1, 3.0};
  c.alpha = bits.chance(0.2) ? 0x1.5555555555555p-2 * static_cast<double>(bits.in(1, 9)) : alphas[bits.in(0, 4)];
  c.beta = bits.chance(0.5) ? 0.0 : alphas[bits.in(0, 4)];
  if (c.beta != 0.0) c.types["C"] = kAllFormats[bits.in(0, 6)];
  if (has_bias(c.epilogue)) c.types["bias"] = kAllFormats[bits.in(0, 6)];
  if (bits.chance(0.3))
    for (const char* op : {"A", "B", "C", "D"}) {
      const double s = bits.chance(0.5) ? 0.25 : 1.0 / 3.0;
      if (c.types.count(op) && takes_scale(c.types.at(op))) c.scales[op] = s;  // FP8 only (validate)
    }
  // GELU cases keep the pre-activation moderate so the naive formula stays affordable.
  const double max_abs = gelu ? 1.5 : 1e300;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), cv = gemm_view(c, "C");
  gc.in["A"] = random_tensor(c.types["A"], av.elements(), bits, small, max_abs);
  gc.in["B"] = random_tensor(c.types["B"], bv.elements(), bits, small, max_abs);
  if (c.beta != 0.0) gc.in["C"] = random_tensor(c.types["C"], cv.elements(), bits, small, max_abs);
  if (has_bias(c.epilogue)) gc.in["bias"] = random_tensor(c.types["bias"], g.n, bits, small, max_abs);
  validate(c);
  return gc;
}

}  // namespace ulpgate::test
