// The CUDA attention kernels' host side, without a GPU: what each declares about its
// arithmetic and what it refuses before running. The kernels themselves: test_attention_gpu.
#include <gtest/gtest.h>

#include <string>

#include "core/case.hpp"
#include "kernels/attention/cuda_attention.hpp"

using namespace ulpgate;

namespace {

Kernel* find(const std::vector<std::unique_ptr<Kernel>>& ks, const std::string& name) {
  for (const auto& k : ks)
    if (k->name() == name) return k.get();
  return nullptr;
}

Case fp16_case(const std::string& kernel) {
  Case c;
  c.op = Op::Attention;
  c.attention.batch = 2, c.attention.heads = 2, c.attention.seq_q = 64, c.attention.seq_kv = 64, c.attention.head_dim = 64;
  c.types = {{"Q", Format::FP16}, {"K", Format::FP16}, {"V", Format::FP16}, {"O", Format::FP16}, {"compute", Format::FP32}};
  c.kernel = kernel;
  return c;
}

}  // namespace

// Flash rounds P to its input type; cuDNN too, and its fused engine flushes FP32 subnormal
// results (H200, cuDNN 9.19: BF16 outputs near 2^-126 came back as zeros).
TEST(AttentionKernels, DeclareTheirArithmetic) {
  const auto ks = make_attention_kernels();
  for (const char* name : {"cuda.attn_naive", "cuda.attn_online", "cuda.attn_flash.fp16", "cuda.attn_flash.bf16"}) {
    const Kernel* k = find(ks, name);
    ASSERT_NE(k, nullptr) << name;
    EXPECT_FALSE(k->traits().flushes_subnormals) << name;
  }
  EXPECT_EQ(find(ks, "cuda.attn_flash.fp16")->traits().p_bits, 11);
  EXPECT_EQ(find(ks, "cuda.attn_flash.bf16")->traits().p_bits, 8);
  EXPECT_EQ(find(ks, "cuda.attn_naive")->traits().p_bits, 24);  // P in FP32, declared
  if (!find(ks, "cudnn.sdpa.fp16")) GTEST_SKIP() << "built without cuDNN (the cuDNN kernels' traits)";
  for (const char* name : {"cudnn.sdpa.fp16", "cudnn.sdpa.bf16"}) {
    const Kernel* k = find(ks, name);
    ASSERT_NE(k, nullptr) << name;
    EXPECT_TRUE(k->traits().flushes_subnormals) << name;
  }
  EXPECT_EQ(find(ks, "cudnn.sdpa.bf16")->traits().p_bits, 8);
}

// cuDNN leaves the rows of a batch without keys undefined: such cases are refused before the
// run, whether the lengths are given or the masked(...) family will empty a batch when the
// inputs are filled (the H200's generated cases failed at run time before).
TEST(AttentionKernels, CudnnRefusesBatchesWithoutKeysBeforeRunning) {
  const auto ks = make_attention_kernels();
  const Kernel* k = find(ks, "cudnn.sdpa.fp16");
  if (!k) GTEST_SKIP() << "built without cuDNN";
  Case c = fp16_case(k->name());
  EXPECT_FALSE(k->unsupported(c));
  Case given = c;
  given.attention.kv_lengths = {64, 0};
  ASSERT_TRUE(k->unsupported(given));
  EXPECT_NE(k->unsupported(given)->find("without keys"), std::string::npos);
  Case masked = c;
  masked.dist = {{"Q", "masked(frac=0.25)"}};
  ASSERT_TRUE(k->unsupported(masked));
  EXPECT_NE(k->unsupported(masked)->find("masked(frac=0.25)"), std::string::npos);
  // The flash kernel takes both (its rows without keys are 0).
  const Kernel* flash = find(ks, "cuda.attn_flash.fp16");
  EXPECT_FALSE(flash->unsupported(given));
  EXPECT_FALSE(flash->unsupported(masked));
}
