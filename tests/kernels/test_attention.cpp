// The CUDA attention kernels' host side, without a GPU: what each declares about its
// arithmetic and what it refuses before running. The kernels themselves: test_attention_gpu
// and test_attention_backward_gpu.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>

#include "check/ops/attention_backward.hpp"
#include "core/case.hpp"
#include "kernels/attention/cuda_attention.hpp"
#include "kernels/attention/cudnn_backward_kernel.hpp"

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

// cuDNN's fused backward: fp16 and bf16, each atomic and deterministic; P and dS in the inputs'
// 16-bit type, subnormal results flushed (as its forward), dQ atomic only where not deterministic.
TEST(AttentionKernels, CudnnBackwardDeclaresItsArithmetic) {
  const auto ks = make_cudnn_attention_backward_kernels();
  if (ks.empty()) GTEST_SKIP() << "built without cuDNN";
  ASSERT_EQ(ks.size(), 4u);
  struct Expected {
    const char* name;
    int p_bits;
    bool deterministic;
  };
  for (const Expected& e : {Expected{"cudnn.sdpa_bwd.fp16", 11, false}, Expected{"cudnn.sdpa_bwd.bf16", 8, false},
                            Expected{"cudnn.sdpa_bwd.fp16.det", 11, true}, Expected{"cudnn.sdpa_bwd.bf16.det", 8, true}}) {
    const Kernel* k = find(ks, e.name);
    ASSERT_NE(k, nullptr) << e.name;
    const KernelTraits t = k->traits();
    EXPECT_EQ(t.memory, Memory::Device) << e.name;
    EXPECT_EQ(t.p_bits, e.p_bits) << e.name;
    EXPECT_EQ(t.deterministic, e.deterministic) << e.name;
    EXPECT_EQ(t.atomic_dq, !e.deterministic) << e.name;
    EXPECT_TRUE(t.flushes_subnormals) << e.name;
    EXPECT_TRUE(t.thread_safe) << e.name;
    EXPECT_FALSE(t.writes_lse) << e.name;
    EXPECT_NE(k->description().find(e.deterministic ? "deterministic" : "atomics"), std::string::npos) << k->description();
  }
}

// What the backward graph takes (grouped heads, BSHD, bottom-right causal with seq_q < seq_kv,
// padding and batches without keys when not causal) and what it refuses before running, with the reason.
TEST(AttentionKernels, CudnnBackwardRefusesWhatItsGraphCannotTake) {
  const auto ks = make_cudnn_attention_backward_kernels();
  if (ks.empty()) GTEST_SKIP() << "built without cuDNN";
  const Kernel* k = find(ks, "cudnn.sdpa_bwd.fp16");
  ASSERT_NE(k, nullptr);
  // The kernel's reason, or "supported".
  const auto with = [&](const std::function<void(Case&)>& change) {
    Case c = dtype_attention_backward_case("fp16");
    c.kernel = k->name();
    AttentionShape& a = c.attention;
    a.batch = 2, a.heads = 4, a.kv_heads = 2, a.seq_q = 64, a.seq_kv = 128, a.head_dim = 64;
    a.layout = AttentionLayout::BSHD;
    change(c);
    validate(c);
    return k->unsupported(c).value_or("supported");
  };
  EXPECT_EQ(with([](Case&) {}), "supported");
  EXPECT_EQ(with([](Case& c) { c.attention.causal = true; }), "supported");  // bottom-right, seq_q < seq_kv
  EXPECT_EQ(with([](Case& c) { c.attention.kv_lengths = {128, 64}; }), "supported");
  EXPECT_EQ(with([](Case& c) { c.attention.seq_q = 128, c.attention.kv_lengths = {128, 0}; }), "supported");
  const std::string padded_causal =
      "causal with kv_lengths below seq_kv: cuDNN's backward aligns the causal diagonal to each batch's own length, "
      "the case to seq_kv";
  EXPECT_EQ(with([](Case& c) { c.attention.causal = true, c.attention.kv_lengths = {128, 64}; }), padded_causal);
  EXPECT_EQ(with([](Case& c) { c.attention.seq_q = 128, c.attention.causal = true, c.attention.kv_lengths = {128, 0}; }),
            padded_causal);
  EXPECT_EQ(with([](Case& c) { c.attention.causal = true, c.attention.kv_lengths = {128, 128}; }), "supported");
  EXPECT_EQ(with([](Case& c) { c.attention.head_dim = 256; }), "supported");
  EXPECT_EQ(with([](Case& c) { c.attention.seq_q = 1; }), "supported");  // decode
  EXPECT_EQ(with([](Case& c) {
              for (const char* op : {"Q", "K", "V", "O", "dO", "dQ", "dK", "dV"}) c.types[op] = Format::BF16;
            }),
            "Q must be fp16 for this kernel, got bf16");
  EXPECT_EQ(with([](Case& c) { c.types["dQ"] = Format::FP32; }), "dQ must be fp16 for this kernel, got fp32");
  EXPECT_EQ(with([](Case& c) { c.attention.head_dim = 100; }),
            "head_dim 100 (head_dim_v 100): equal, a multiple of 8, at most 256");
  EXPECT_EQ(with([](Case& c) { c.attention.head_dim_v = 32; }),
            "head_dim 64 (head_dim_v 32): equal, a multiple of 8, at most 256");
  EXPECT_EQ(with([](Case& c) { c.attention.seq_q = 1, c.attention.seq_kv = 1; }),
            "seq_q = seq_kv = 1: cuDNN's SDPA backward refuses it");
  EXPECT_EQ(with([](Case& c) { c.attention.seq_q = 200, c.attention.causal = true; }),
            "causal with seq_q > seq_kv: cuDNN's bottom-right causal mask needs seq_q <= seq_kv");
  Case forward = fp16_case(k->name());
  EXPECT_EQ(k->unsupported(forward).value_or(""), "attention backward only");
}
