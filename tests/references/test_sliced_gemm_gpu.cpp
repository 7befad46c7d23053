// The sliced path's integer products on the GPU (references/sliced_gemm_gpu.hpp): equal to
// the CPU emulation on random digit planes (extremes, ragged K, K past the int32 chunk),
// and the dot products through them bit-identical to the superaccumulator on every
// dot-input family. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "kernels/kernel.hpp"
#include "references/exact_dot.hpp"
#include "references/sliced_gemm_gpu.hpp"
#include "tests/references/dot_inputs.hpp"
#include "tests/references/sliced_check.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

TEST(SlicedGemmGpu, DigitProductsEqualTheCpuEmulation) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const DigitGemm gpu = gpu_digit_gemm();
  for (std::uint64_t c = 0; c < 100; ++c) {
    Bits bits(41, 1, c);
    // (n past one 128-thread block; case 0: K past three int32 chunks)
    const std::int64_t m = c == 0 ? 2 : bits.in(1, 40), n = c == 0 ? 3 : bits.in(1, 130);
    const std::int64_t k = c == 0 ? 3 * kInt32Chunk + 5 : bits.in(1, 3000);
    const bool extreme = bits.chance(0.3);  // every digit +-127: the largest sums
    std::vector<std::int8_t> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k));
    for (auto* v : {&a, &b})
      for (auto& x : *v)
        x = static_cast<std::int8_t>(extreme ? (bits.chance(0.5) ? 127 : -127) : bits.in(-127, 127));
    if (c == 0) std::fill(b.begin(), b.end(), std::int8_t{127}), std::fill(a.begin(), a.end(), std::int8_t{127});
    std::vector<std::int64_t> want(static_cast<std::size_t>(m * n)), got(want.size(), -1);
    cpu_digit_gemm(a.data(), b.data(), m, n, k, want.data());
    gpu(a.data(), b.data(), m, n, k, got.data());
    ASSERT_EQ(got, want) << "case " << c << ": m " << m << " n " << n << " k " << k;
  }
}

TEST(SlicedGemmGpu, DotsBitIdenticalToTheSuperaccumulator) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const DigitGemm gpu = gpu_digit_gemm();
  std::int64_t elements = 0, certified = 0;
  for (const Family fam : kFamilies)
    for (std::uint64_t c = 0; c < 100; ++c) {
      const DotMatrices g = make_dot_matrices(fam, 9, c * 16, 1 + static_cast<std::int64_t>(c % 5),
                                              1 + static_cast<std::int64_t>((c / 5) % 7), 3000);
      const SlicedDots s = sliced_dots(g.a, g.m, g.b, g.n, g.k, gpu);
      ASSERT_EQ(first_difference(s, g.a, g.b, g.k), "") << name(fam) << " case " << c;
      const std::int64_t m = g.m, n = g.n;
      elements += m * n, certified += m * n - s.recomputed;
    }
  RecordProperty("elements", static_cast<int>(elements));
  RecordProperty("certified", static_cast<int>(certified));
  std::printf("%lld elements, %lld certified by the GPU's digit products\n", static_cast<long long>(elements),
              static_cast<long long>(certified));
  EXPECT_GT(certified, 1000);
}
