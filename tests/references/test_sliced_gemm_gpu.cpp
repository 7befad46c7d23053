// The sliced exact GEMM on the GPU (references/sliced_gemm_gpu.hpp): element for element
// the same as the CPU emulation (plans, the 192-bit sums, conditions, certification) and
// bit-identical to the superaccumulator, on >= 1,000 random cases of every input format and
// on the adversarial dot-input families (cancellation, subnormals, spans that force the
// fallback, Inf/NaN, signed zeros), with K not a multiple of anything, K past one int32
// chunk, and B's columns split into many product blocks. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstdio>
#include <fmt/format.h>

#include "core/format.hpp"
#include "references/exact_dot.hpp"
#include "distributions/gendot.hpp"
#include "references/gemm_reference.hpp"
#include "references/sliced_gemm_gpu.hpp"
#include "tests/references/gemm_cases.hpp"
#include "tests/references/dot_inputs.hpp"
#include "tests/references/sliced_check.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

// "" when the GPU's elements equal the emulation's in every field.
std::string compare_elements(const SlicedDots& gpu, const SlicedDots& cpu) {
  if (gpu.stacked_a != cpu.stacked_a || gpu.stacked_b != cpu.stacked_b)
    return fmt::format("stacked rows {} x {}, emulation {} x {}", gpu.stacked_a, gpu.stacked_b, cpu.stacked_a, cpu.stacked_b);
  for (std::int64_t j = 0; j < gpu.n; ++j)
    for (std::int64_t i = 0; i < gpu.m; ++i) {
      const std::size_t e = gpu.index(i, j);
      if (gpu.certified[e] != cpu.certified[e] || gpu.condition[e] != cpu.condition[e] ||
          gpu.limb[0][e] != cpu.limb[0][e] || gpu.limb[1][e] != cpu.limb[1][e] || gpu.limb[2][e] != cpu.limb[2][e])
        return fmt::format("element ({}, {}): certified {} / {}, condition {:a} / {:a}, limbs {:x} {:x} {:x} / {:x} {:x} {:x}",
                           i, j, gpu.certified[e], cpu.certified[e], gpu.condition[e], cpu.condition[e], gpu.limb[2][e],
                           gpu.limb[1][e], gpu.limb[0][e], cpu.limb[2][e], cpu.limb[1][e], cpu.limb[0][e]);
    }
  if (gpu.recomputed != cpu.recomputed) return fmt::format("recomputed {}, emulation {}", gpu.recomputed, cpu.recomputed);
  return "";
}

// A value of format f: ordinary (normal(0, 1)-like magnitudes), with a chance of the
// format's extremes (subnormals, the largest finite), of zeros and of specials.
float draw(Bits& bits, Format f, double specials, double extremes) {
  const FormatInfo& fi = info(f);
  if (bits.chance(specials)) return bits.chance(0.5) ? INFINITY : NAN;
  if (bits.chance(0.02)) return bits.chance(0.5) ? 0.0f : -0.0f;
  if (bits.chance(extremes)) {  // any finite code: subnormals and extremes
    for (;;) {
      const Code c = bits.next() & fi.code_mask();
      if (is_finite(f, c)) return static_cast<float>(decode(f, c));
    }
  }
  const double v = std::ldexp(1.0 + static_cast<double>(bits.next() >> 12) * 0x1p-52, static_cast<int>(bits.in(-8, 2)));
  return static_cast<float>(decode(f, encode(f, bits.chance(0.5) ? -v : v)));
}

}  // namespace

TEST(SlicedGemmGpu, EqualsTheEmulationOnEveryInputFormat) {
  if (!gpu_sliced_available()) GTEST_SKIP() << "no CUDA device";
  const SlicedPath gpu = gpu_sliced_path(kMaxSliceDigits, std::size_t{1} << 16);  // many column blocks
  const Format formats[] = {Format::FP32, Format::TF32, Format::FP16, Format::BF16, Format::E4M3, Format::E5M2};
  std::int64_t elements = 0, certified = 0;
  for (const Format f : formats)
    for (std::uint64_t c = 0; c < 1000; ++c) {
      Bits bits(61, static_cast<std::uint32_t>(f), c);
      const std::int64_t m = bits.in(1, 24), n = bits.in(1, 40), k = bits.in(1, 700);
      // a tenth of the cases with Inf and NaN, a fifth with the format's extremes (rows
      // spanning more than 62 bits: recomputed)
      const double specials = bits.chance(0.1) ? 0.002 : 0.0, extremes = bits.chance(0.2) ? 0.03 : 0.0;
      std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k));
      for (auto& x : a) x = draw(bits, f, specials, extremes);
      for (auto& x : b) x = draw(bits, f, specials, extremes);
      const SlicedDots g = gpu(a, m, b, n, k), e = cpu_sliced_dots(a, m, b, n, k);
      ASSERT_EQ(compare_elements(g, e), "") << name(f) << " case " << c << ": m " << m << " n " << n << " k " << k;
      if (c % 10 == 0) { ASSERT_EQ(first_difference(g, a, b, k), "") << name(f) << " case " << c; }
      elements += m * n, certified += m * n - g.recomputed;
    }
  std::printf("%lld elements, %lld certified by the GPU's digit products\n", static_cast<long long>(elements),
              static_cast<long long>(certified));
  EXPECT_GT(certified, elements / 2);
}

TEST(SlicedGemmGpu, BitIdenticalToTheSuperaccumulatorOnEveryFamily) {
  if (!gpu_sliced_available()) GTEST_SKIP() << "no CUDA device";
  const SlicedPath gpu = gpu_sliced_path();
  std::int64_t elements = 0, certified = 0;
  for (const Family fam : kFamilies)
    for (std::uint64_t c = 0; c < 150; ++c) {
      const DotMatrices g = make_dot_matrices(fam, 9, c * 16, 1 + static_cast<std::int64_t>(c % 5),
                                              1 + static_cast<std::int64_t>((c / 5) % 7), 3000);
      const SlicedDots s = gpu(g.a, g.m, g.b, g.n, g.k);
      ASSERT_EQ(first_difference(s, g.a, g.b, g.k), "") << name(fam) << " case " << c;
      ASSERT_EQ(compare_elements(s, cpu_sliced_dots(g.a, g.m, g.b, g.n, g.k)), "") << name(fam) << " case " << c;
      elements += g.m * g.n, certified += g.m * g.n - s.recomputed;
    }
  std::printf("%lld elements, %lld certified by the GPU's digit products\n", static_cast<long long>(elements),
              static_cast<long long>(certified));
  EXPECT_GT(certified, 1000);
}

// K past one int32 chunk (two GEMMs per digit set, summed in the combination), with the
// largest digit products: rows of -128 2^lowest-scaled values against each other.
TEST(SlicedGemmGpu, KPastOneInt32Chunk) {
  if (!gpu_sliced_available()) GTEST_SKIP() << "no CUDA device";
  const std::int64_t k = kInt32Chunk + 37, m = 3, n = 2;
  Bits bits(5, 5, 0);
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k));
  for (auto& x : a) x = bits.chance(0.9) ? -128.0f : make_float(bits, -3, 3);
  for (auto& x : b) x = bits.chance(0.9) ? -128.0f : make_float(bits, -3, 3);
  const SlicedDots s = gpu_sliced_path()(a, m, b, n, k);
  EXPECT_EQ(s.products, 2 * 2);
  EXPECT_EQ(first_difference(s, a, b, k), "");
  EXPECT_EQ(compare_elements(s, cpu_sliced_dots(a, m, b, n, k)), "");
}

// Ill-conditioned dot products (Ogita-Rump-Oishi GenDot) up to each format's limit: row i
// of A and column i of B are one GenDot pair, so the diagonal cancels to condition numbers
// up to 1e40 (FP32); every element bit-identical, certified or recomputed.
TEST(SlicedGemmGpu, GenDotUpToTheFormatsLimits) {
  if (!gpu_sliced_available()) GTEST_SKIP() << "no CUDA device";
  const SlicedPath gpu = gpu_sliced_path();
  const Format formats[] = {Format::FP32, Format::TF32, Format::FP16, Format::BF16, Format::E4M3, Format::E5M2};
  std::int64_t diagonal_certified = 0;
  for (const Format f : formats)
    for (std::uint64_t c = 0; c < 40; ++c) {
      Bits bits(71, static_cast<std::uint32_t>(f), c);
      const std::size_t k = static_cast<std::size_t>(bits.in(2, 300));
      const std::int64_t m = 4;
      std::vector<float> a, b;
      for (std::int64_t i = 0; i < m; ++i) {
        const double cond = std::min(std::pow(10.0, 0.5 + 39.5 * to_unit_closed_open(bits.next())), gendot_max_cond(k, f));
        const DotPair p = gendot(k, std::max(cond, 2.0), f, c, static_cast<std::uint32_t>(i));
        a.insert(a.end(), p.x.begin(), p.x.end());
        b.insert(b.end(), p.y.begin(), p.y.end());
      }
      const SlicedDots s = gpu(a, m, b, m, static_cast<std::int64_t>(k));
      ASSERT_EQ(first_difference(s, a, b, static_cast<std::int64_t>(k)), "") << name(f) << " case " << c;
      ASSERT_EQ(compare_elements(s, cpu_sliced_dots(a, m, b, m, static_cast<std::int64_t>(k))), "") << name(f) << " case " << c;
      for (std::int64_t i = 0; i < m; ++i) diagonal_certified += s.certified[s.index(i, i)];
    }
  std::printf("%lld of 960 ill-conditioned diagonal elements certified by the digits\n", static_cast<long long>(diagonal_certified));
  EXPECT_GT(diagonal_certified, 100);
}

// gemm_reference through the GPU path gives the CPU's reference field for field on 1,000
// random cases: every epilogue, layout, transpose, padding, batch, format and scale.
TEST(GemmReferenceGpu, SameReferenceAsTheCpu) {
  if (!gpu_sliced_available()) GTEST_SKIP() << "no CUDA device";
  std::int64_t elements = 0, recomputed = 0;
  for (std::uint64_t seed = 0; seed < 1000; ++seed) {
    const GemmCase gc = random_case(seed);
    set_reference_path(ReferencePath::Cpu);
    const GemmReference cpu = gemm_reference(gc.c, gc.in, 2);
    set_reference_path(ReferencePath::Gpu);
    const GemmReference gpu = gemm_reference(gc.c, gc.in, 2);
    set_reference_path(ReferencePath::Auto);
    ASSERT_EQ(gpu.values, cpu.values) << "seed " << seed;
    ASSERT_EQ(gpu.condition, cpu.condition) << "seed " << seed;
    ASSERT_EQ(gpu.magnitude, cpu.magnitude) << "seed " << seed;
    ASSERT_EQ(gpu.intermediate, cpu.intermediate) << "seed " << seed;
    EXPECT_EQ(cpu.path, "cpu");
    if (gpu.recomputed < 0) continue;  // FP64 A: the sliced path does not apply
    EXPECT_EQ(gpu.path, "gpu");
    elements += static_cast<std::int64_t>(gpu.values.size()), recomputed += gpu.recomputed;
  }
  std::printf("%lld elements, %lld recomputed on the CPU\n", static_cast<long long>(elements), static_cast<long long>(recomputed));
  EXPECT_LT(recomputed, elements * 3 / 4);
}

// auto: a case of kGpuReferenceTerms product terms takes the GPU, a smaller one the CPU,
// and both give the CPU's values.
TEST(GemmReferenceGpu, AutoTakesTheGpuForLargeCases) {
  if (!gpu_sliced_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::int64_t size : {64, 1024}) {
    Case c;
    c.op = Op::Gemm;
    c.gemm.m = c.gemm.n = c.gemm.k = size;
    c.types = {{"A", Format::BF16}, {"B", Format::BF16}, {"D", Format::FP32}, {"compute", Format::FP32}};
    validate(c);
    Bits bits(3, 3, static_cast<std::uint64_t>(size));
    std::map<std::string, Tensor> in;
    for (const char* op : {"A", "B"}) {
      Tensor t(Format::BF16, static_cast<std::size_t>(size * size));
      for (std::int64_t e = 0; e < size * size; ++e) t.set_value(static_cast<std::size_t>(e), make_float(bits, -8, 2));
      in.emplace(op, std::move(t));
    }
    set_reference_path(ReferencePath::Auto);
    const GemmReference automatic = gemm_reference(c, in);
    set_reference_path(ReferencePath::Cpu);
    const GemmReference cpu = gemm_reference(c, in);
    set_reference_path(ReferencePath::Auto);
    EXPECT_EQ(automatic.path, static_cast<double>(size) * size * size >= kGpuReferenceTerms ? "gpu" : "cpu") << size;
    EXPECT_EQ(automatic.values, cpu.values) << size;
    EXPECT_EQ(automatic.condition, cpu.condition) << size;
  }
}
