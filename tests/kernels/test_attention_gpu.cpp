// The attention kernels on the GPU (kernels/attention/) through the one check path
// on the attention generator's cases: every input format, both layouts, causal, kv_lengths,
// GQA, seq_q != seq_kv (label gpu: skips without a device); the flash kernels on a grid of
// the shapes they take (tails of both tiles, causal with seq_q != seq_kv, kv_lengths, GQA,
// both layouts, the three output formats); a planted missing rescale caught in each.
#include <gtest/gtest.h>

#include <cstdio>

#include <fmt/format.h>
#include <rapidcheck.h>

#include "core/case.hpp"
#include "check/check.hpp"
#include "check/ops/op.hpp"
#include "kernels/attention/cuda_attention.hpp"
#include "kernels/device.hpp"
#include "kernels/kernel.hpp"

using namespace ulpgate;

TEST(AttentionGpu, EveryKernelPassesGeneratedCases) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::printf("[ device ] %s\n", device_description().c_str());
  for (auto& k : make_attention_kernels()) {
    int run = 0, passed = 0, skipped = 0;
    const bool ok = rc::check(k->name() + " on generated attention cases", [&] {
      Case c = *op_module(Op::Attention).generate("", k.get(), GenLimits{1024, false});
      c.kernel = k->name();
      if (k->unsupported(c)) {
        ++skipped;
        return;
      }
      RC_LOG() << to_json(c).dump() << "\n";  // the shrunk case, replayable (ulpgate replay)
      const Evaluation ev = evaluate(*k, c, {});
      ++run;
      if (ev.run.status != Disposition::Ok) RC_FAIL(fmt::format("{}: {}", name(ev.run.status), ev.run.message));
      RC_ASSERT(ev.run.unwritten == 0);
      RC_ASSERT(ev.run.inputs_modified.empty());
      if (!ev.verdict.passed) RC_FAIL(ev.verdict.reasons.front());
      ++passed;
    });
    EXPECT_TRUE(ok) << k->name();
    std::printf("[ attention ] %s: %d of %d cases passed, %d not supported\n", k->name().c_str(), passed, run, skipped);
  }
}

// How many of the generated cases a planted kernel takes fail their check (printed).
static int generated_failures(Kernel& k) {
  int run = 0, failed = 0;
  rc::check(k.name() + " on generated attention cases", [&] {
    Case c = *op_module(Op::Attention).generate("", &k, GenLimits{1024, false});
    c.kernel = k.name();
    if (k.unsupported(c)) return;
    const Evaluation ev = evaluate(k, c, {});
    ++run;
    failed += !ev.verdict.passed;
  });
  std::printf("[ attention ] %s: %d of %d generated cases failed\n", k.name().c_str(), failed, run);
  return failed;
}

// The planted bug (no rescale of the accumulator when the running max grows) is caught on
// generated cases: some case fails its check.
TEST(AttentionGpu, MissingRescaleIsCaught) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_GT(generated_failures(*make_planted_online_no_rescale()), 0);
}

// The unsafe softmax exp(S) without the row's max: scores with a spread of 40 (logits(std=40))
// pass about 88.7 and exp overflows, which the correct naive kernel survives; the planted one
// fails there and on some generated cases.
TEST(AttentionGpu, NaiveMissingMaxIsCaught) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  auto planted = make_planted_naive_no_max();
  auto kernels = make_attention_kernels();
  Kernel& naive = *kernels.front();
  ASSERT_EQ(naive.name(), "cuda.attn_naive");
  Case c;
  c.op = Op::Attention;
  c.attention.batch = 2, c.attention.heads = 2, c.attention.seq_q = 16, c.attention.seq_kv = 100, c.attention.head_dim = 32;
  c.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP32}, {"compute", Format::FP32}};
  c.dist = {{"Q", "logits(std=40)"}, {"V", "normal(0,1)"}};
  c.seed = 3;
  c.kernel = naive.name();
  const Evaluation good = evaluate(naive, c, {});
  EXPECT_TRUE(good.verdict.passed) << good.verdict.reasons.front();
  c.kernel = planted->name();
  const Evaluation bad = evaluate(*planted, c, {});
  EXPECT_FALSE(bad.verdict.passed);
  std::printf("[ attention ] %s on logits(std=40): %s\n", planted->name().c_str(),
              bad.verdict.reasons.empty() ? "passed" : bad.verdict.reasons.front().c_str());
  EXPECT_GT(generated_failures(*planted), 0);
}

namespace {

// Cases the flash kernels take: FP16 or BF16 inputs, head_dim 64 or 128, over tile tails
// (1, 63, 64, 65, 200 rows and keys), causal with seq_q != seq_kv, kv_lengths (one of them
// 0), grouped-query heads, both layouts, O in FP32, FP16 or BF16, the log-sum-exp output in
// half of them, and large-magnitude scores (normal(0, 3) Q) whose running max moves.
std::vector<Case> flash_cases(Format in) {
  std::vector<Case> out;
  int n = 0;
  for (const std::int64_t d : {64, 128})
    for (const auto& [sq, skv] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {63, 65}, {64, 64}, {65, 200}, {200, 63}, {130, 257}})
      for (const bool causal : {false, true}) {
        Case c;
        c.op = Op::Attention;
        AttentionShape& a = c.attention;
        a.batch = 2, a.heads = 4, a.seq_q = sq, a.seq_kv = skv, a.head_dim = d, a.causal = causal;
        a.layout = n % 2 ? AttentionLayout::BSHD : AttentionLayout::BHSD;
        if (n % 3 == 1) a.kv_heads = 2;
        if (n % 4 == 2) a.kv_lengths = {skv, skv / 2};
        if (n % 8 == 6) a.kv_lengths = {0, skv};
        const Format o = n % 3 == 0 ? Format::FP32 : n % 3 == 1 ? Format::FP16 : Format::BF16;
        c.types = {{"Q", in}, {"K", in}, {"V", in}, {"O", o}, {"compute", Format::FP32}};
        if (n % 4 < 2) c.types["LSE"] = Format::FP32;  // the log-sum-exp in half of them
        c.dist = {{"Q", n % 2 ? "normal(0,3)" : "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "uniform(-1,1)"}};
        c.seed = static_cast<std::uint64_t>(100 + n);
        ++n;
        out.push_back(c);
      }
  return out;
}

}  // namespace

TEST(AttentionGpu, FlashPassesEveryShapeItTakes) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  for (auto& k : make_attention_kernels()) {
    if (k->name().rfind("cuda.attn_flash", 0) != 0) continue;
    const Format in = k->name() == "cuda.attn_flash.bf16" ? Format::BF16 : Format::FP16;
    int passed = 0, total = 0, with_lse = 0;
    double lse_max_ulp = 0;
    for (Case c : flash_cases(in)) {
      c.kernel = k->name();
      ASSERT_FALSE(k->unsupported(c).has_value()) << *k->unsupported(c);
      const Evaluation ev = evaluate(*k, c, {});
      ++total;
      EXPECT_EQ(ev.run.status, Disposition::Ok) << k->name() << ": " << ev.run.message;
      EXPECT_EQ(ev.run.unwritten, 0);
      if (c.types.count("LSE") && ev.run.status == Disposition::Ok) {
        EXPECT_EQ(ev.metrics.size(), 2u);
        if (ev.metrics.size() == 2) ++with_lse, lse_max_ulp = std::max(lse_max_ulp, ev.metrics[1].max_ulp);
      }
      if (ev.verdict.passed) ++passed;
      else ADD_FAILURE() << k->name() << " " << c.attention.seq_q << "x" << c.attention.seq_kv << " d " << c.attention.head_dim
                         << (c.attention.causal ? " causal" : "") << ": " << ev.verdict.reasons.front();
    }
    std::printf("[ flash ] %s: %d of %d cases passed; LSE judged in %d, max %.3g ulp\n", k->name().c_str(), passed, total,
                with_lse, lse_max_ulp);
    EXPECT_GT(with_lse, 0);
  }
}

TEST(AttentionGpu, FlashMissingRescaleIsCaught) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  auto k = make_planted_flash_no_rescale();
  int failed = 0, total = 0;
  for (Case c : flash_cases(Format::FP16)) {
    c.kernel = k->name();
    failed += !evaluate(*k, c, {}).verdict.passed;
    ++total;
  }
  std::printf("[ flash ] %s: %d of %d cases failed\n", k->name().c_str(), failed, total);
  EXPECT_GT(failed, total / 4);
}

// cuDNN's fused attention (cudnn.sdpa.*, when the build has cuDNN) on the flash shapes it
// takes (O in the input type; causal only with seq_q == seq_kv): every one must pass.
TEST(AttentionGpu, CudnnPassesEveryShapeItTakes) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  int kernels = 0;
  for (auto& k : make_attention_kernels()) {
    if (k->name().rfind("cudnn.sdpa", 0) != 0) continue;
    ++kernels;
    const Format in = k->name() == "cudnn.sdpa.bf16" ? Format::BF16 : Format::FP16;
    int passed = 0, total = 0, unsupported = 0, with_lse = 0;
    double lse_max_ulp = 0;
    for (Case c : flash_cases(in)) {
      c.types["O"] = in;
      c.kernel = k->name();
      if (k->unsupported(c)) {
        ++unsupported;
        continue;
      }
      const Evaluation ev = evaluate(*k, c, {});
      if (ev.run.status == Disposition::NotSupported) {
        if (unsupported++ == 0) std::printf("[ cudnn ] %s: not supported at run time: %s\n", k->name().c_str(), ev.run.message.c_str());
        continue;
      }
      ++total;
      EXPECT_EQ(ev.run.status, Disposition::Ok) << k->name() << ": " << ev.run.message;
      if (ev.metrics.size() == 2) ++with_lse, lse_max_ulp = std::max(lse_max_ulp, ev.metrics[1].max_ulp);
      if (ev.verdict.passed) ++passed;
      else ADD_FAILURE() << k->name() << " " << c.attention.seq_q << "x" << c.attention.seq_kv << " d " << c.attention.head_dim
                         << (c.attention.causal ? " causal" : "") << ": " << ev.verdict.reasons.front();
      if (total == 1)
        std::printf("[ cudnn ] %s: %s, cuDNN %s\n", k->name().c_str(), ev.run.notes.count("engine") ? ev.run.notes.at("engine").c_str() : "?",
                    ev.run.notes.count("cudnn") ? ev.run.notes.at("cudnn").c_str() : "?");
    }
    std::printf("[ cudnn ] %s: %d of %d cases passed, %d not supported; LSE (softmax stats) judged in %d, max %.3g ulp\n",
                k->name().c_str(), passed, total, unsupported, with_lse, lse_max_ulp);
    EXPECT_GT(total, 0);
    EXPECT_GT(with_lse, 0);
  }
  if (kernels == 0) GTEST_SKIP() << "this build has no cuDNN";
}
