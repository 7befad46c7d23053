// Large operands are sampled on the GPU (distributions/fill_gpu.cu): the filled tensors
// are the CPU's bit for bit, for every per-element family and modifier, in every input
// format (label gpu: skips without a device).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "fill_test_util.hpp"
#include "distributions/fill_gpu.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

// Fills gpu's inputs where large operands may go to the GPU and cpu's with ULPGATE_FILL=cpu:
// whether every input has the same bytes both ways.
bool same_inputs_both_ways(Case& gpu, Case& cpu) {
  ::unsetenv("ULPGATE_FILL");
  const auto on_gpu = fill_inputs(gpu);
  ::setenv("ULPGATE_FILL", "cpu", 1);
  const auto on_cpu = fill_inputs(cpu);
  ::unsetenv("ULPGATE_FILL");
  if (on_gpu.size() != on_cpu.size()) return false;
  for (const auto& [op, a] : on_gpu) {
    const Tensor& b = on_cpu.at(op);
    if (a.size_bytes() != b.size_bytes() || std::memcmp(a.data(), b.data(), a.size_bytes()) != 0) return false;
  }
  return true;
}

}  // namespace

TEST(FillGpu, LargeOperandsEqualTheCpuFillOnEveryFamily) {
  if (!detail::gpu_fill_available()) GTEST_SKIP() << "no CUDA device";
  // A is 1024 x 8192 (2^23 values: the GPU path), B 8192 x 16 (the CPU path either way).
  const char* dists[] = {"normal(0,1)", "uniform(-3,5)", "lognormal(-1,2)", "student_t(3,0.5)", "cauchy(0,0.01)",
                         "activations(std=1,rate=0.01,scale=20)", "weights(gain=1)", "sparse(density=0.1,std=1)",
                         "relu(mean=0,std=1)", "positive(1)", "near_overflow(lo=0.5,hi=1)", "subnormal(rate=0.5)",
                         "exact(max=4,frac=3)", "specials(nan=0.01,inf=0.01,negzero=0.1,base=student_t(3))",
                         "outliers(rate=0.001,scale=100,base=normal(0,1))", "amax(frac=1,base=normal(0,1))"};
  int compared = 0;
  for (const Format f : {Format::FP32, Format::FP16, Format::BF16, Format::E4M3, Format::E5M2})
    for (const char* dist : dists) {
      std::string spec = dist;
      if (f == Format::E4M3 && spec.rfind("specials", 0) == 0) spec = "specials(nan=0.01,inf=0,negzero=0.1,base=student_t(3))";
      Case gpu = gemm_case(1024, 16, 8192, f, spec, "normal(0,1)", 1, 77);
      if (f == Format::E4M3 || f == Format::E5M2) gpu.types["D"] = Format::FP32;
      Case cpu = gpu;
      EXPECT_TRUE(same_inputs_both_ways(gpu, cpu)) << name(f) << " " << dist;
      EXPECT_EQ(gpu.scales, cpu.scales) << name(f) << " " << dist;
      ++compared;
    }
  EXPECT_EQ(compared, 80);
}

// Stored in order (packed, any transpose or layout, batches) the GPU writes the storage
// words itself; padded it samples and the CPU stores: the same bits either way.
TEST(FillGpu, LargeOperandsInEveryLayoutEqualTheCpuFill) {
  if (!detail::gpu_fill_available()) GTEST_SKIP() << "no CUDA device";
  int compared = 0;
  for (const Format f : {Format::FP32, Format::BF16, Format::E4M3})
    for (const bool trans_a : {false, true})
      for (const Layout layout : {Layout::RowMajor, Layout::ColMajor})
        for (const std::int64_t pad : {0, 3}) {
          Case gpu = gemm_case(512, 16, 8192, f, "specials(nan=0.01,inf=0,negzero=0.1,base=student_t(3))", "", 2, 78);
          if (f == Format::E4M3) gpu.types["D"] = Format::FP32;
          gpu.gemm.trans_a = trans_a, gpu.gemm.layout = layout;
          if (pad) gpu.gemm.lda = gpu.gemm.packed_ld(gpu.gemm.a_rows(), gpu.gemm.a_cols()) + pad;
          Case cpu = gpu;
          EXPECT_TRUE(same_inputs_both_ways(gpu, cpu))
              << name(f) << " trans_a " << trans_a << " layout " << static_cast<int>(layout) << " pad " << pad;
          ++compared;
        }
  EXPECT_EQ(compared, 24);
}

// Operands of several staging chunks (2^24 values each) and a tail: every chunk goes
// through the page-locked pair in turn, in every word size; B stored transposed (K
// fastest) is sampled in storage order on the GPU too.
TEST(FillGpu, OperandsOfManyChunksInAnyAxisOrderEqualTheCpuFill) {
  if (!detail::gpu_fill_available()) GTEST_SKIP() << "no CUDA device";
  for (const Format f : {Format::FP32, Format::BF16, Format::E5M2})
    for (const bool trans_b : {false, true}) {
      // A: 2^26 + 3 x 2^14 values; B: 16384 x 1029
      Case gpu = gemm_case(4099, 1029, 16384, f, "student_t(3,0.5)", "uniform(-2,3)", 1, 79);
      if (f == Format::E5M2) gpu.types["D"] = Format::FP32;
      gpu.gemm.trans_b = trans_b;
      Case cpu = gpu;
      EXPECT_TRUE(same_inputs_both_ways(gpu, cpu)) << name(f) << " trans_b " << trans_b;
    }
}

// Attention operands in both layouts (BSHD puts the head axis inside the sequence axis).
TEST(FillGpu, AttentionOperandsInBothLayoutsEqualTheCpuFill) {
  if (!detail::gpu_fill_available()) GTEST_SKIP() << "no CUDA device";
  for (const AttentionLayout layout : {AttentionLayout::BHSD, AttentionLayout::BSHD}) {
    Case gpu = attention_case(2, 3, 8, 16411, 128, Format::FP16, "normal(0,2)", 80);  // K, V: 2^23 + 4224 values
    gpu.attention.layout = layout;
    Case cpu = gpu;
    EXPECT_TRUE(same_inputs_both_ways(gpu, cpu)) << static_cast<int>(layout);
  }
}
