// The attention backward kernels on the GPU (kernels/attention/backward.cu) through the one
// check path (label gpu: skips without a device): generated cases for each kernel and input
// type, the edge cases (decode, one key, fully masked rows, empty batches, grouped heads, BSHD,
// head_dim 128, a 64-key tail past a 128-key block), the planted missing D correction caught,
// and the deterministic variants repeating dQ bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "campaign/fuzz.hpp"
#include "check/check.hpp"
#include "check/ops/attention_backward.hpp"
#include "check/ops/op.hpp"
#include "check/runner.hpp"
#include "core/case.hpp"
#include "kernels/attention/attention_backward.hpp"
#include "kernels/device.hpp"
#include "kernels/emulated/attention_backward_models.hpp"
#include "kernels/kernel.hpp"

using namespace ulpgate;

namespace {

// The input type a kernel takes ("" for the naive kernel: every backward dtype).
std::vector<std::string> dtypes_of(const std::string& kernel) {
  if (kernel.find(".fp16") != std::string::npos) return {"fp16"};
  if (kernel.find(".bf16") != std::string::npos) return {"bf16"};
  return {"fp32", "fp16", "bf16"};
}

// A backward case of a dtype with the given shape; inputs normal(0,1), dO normal(0,1).
Case backward_case(const std::string& dtype, const std::function<void(AttentionShape&)>& shape, std::uint64_t seed) {
  Case c = dtype_attention_backward_case(dtype);
  shape(c.attention);
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}, {"dO", "normal(0,1)"}};
  c.seed = seed;
  validate(c);
  return c;
}

struct Edge {
  std::string what;
  std::function<void(AttentionShape&)> shape;
};

std::vector<Edge> edge_cases() {
  return {
      {"decode: seq_q 1", [](AttentionShape& a) { a.batch = 2, a.heads = 2, a.seq_q = 1, a.seq_kv = 200; }},
      {"one key: seq_kv 1", [](AttentionShape& a) { a.batch = 2, a.heads = 2, a.seq_q = 65, a.seq_kv = 1; }},
      {"causal, seq_q > seq_kv (fully masked rows)",
       [](AttentionShape& a) { a.batch = 1, a.heads = 2, a.seq_q = 100, a.seq_kv = 40, a.causal = true; }},
      {"kv_lengths {0, 65}", [](AttentionShape& a) { a.batch = 2, a.heads = 2, a.seq_q = 33, a.seq_kv = 65, a.kv_lengths = {0, 65}; }},
      {"GQA: heads 8, kv_heads 2",
       [](AttentionShape& a) { a.batch = 1, a.heads = 8, a.kv_heads = 2, a.seq_q = 17, a.seq_kv = 60; }},
      {"BSHD", [](AttentionShape& a) { a.batch = 2, a.heads = 3, a.seq_q = 40, a.seq_kv = 70, a.layout = AttentionLayout::BSHD; }},
      {"head_dim 128", [](AttentionShape& a) { a.batch = 1, a.heads = 2, a.seq_q = 30, a.seq_kv = 127, a.head_dim = 128; }},
      {"seq_kv 192 (a 64-key tail) with kv_lengths {192, 129}",
       [](AttentionShape& a) { a.batch = 2, a.heads = 1, a.seq_q = 20, a.seq_kv = 192, a.kv_lengths = {192, 129}; }},
      {"causal, GQA 4/2, BSHD, kv_lengths {129, 64}, seq_kv 192",
       [](AttentionShape& a) {
         a.batch = 2, a.heads = 4, a.kv_heads = 2, a.seq_q = 10, a.seq_kv = 192, a.causal = true;
         a.layout = AttentionLayout::BSHD, a.kv_lengths = {129, 64};
       }},
      {"causal self-attention 129, scale 0.5",
       [](AttentionShape& a) { a.batch = 1, a.heads = 1, a.seq_q = 63, a.seq_kv = 129, a.causal = true, a.softmax_scale = 0.5; }},
  };
}

}  // namespace

TEST(AttentionBackwardGpu, GeneratedCasesPass) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::printf("[ device ] %s\n", device_description().c_str());
  Registry reg;
  for (auto& k : make_attention_backward_kernels()) reg.add(std::move(k));
  FuzzOptions o;
  for (const auto& k : reg.all())
    for (const std::string& dtype : dtypes_of(k->name())) o.targets.push_back({k->name(), dtype, Op::AttentionBackward});
  o.cases = 20;
  o.seed = 20261203;
  o.max_k = 1024;
  const RunRecord r = run_fuzz(reg, o);
  // A failure the CPU model of the same arithmetic (P and dS rounded to the 16-bit input
  // format, blocks of 128 keys, exp2) also shows is the arithmetic's (e.g. dS past FP16's
  // largest finite value), not the kernel's: counted and printed apart.
  std::map<std::string, int> passed, run, model_fails;
  for (const CaseResult& c : r.cases) {
    if (c.shrunk()) continue;
    ++run[c.target];
    if (c.verdict.passed) {
      ++passed[c.target];
      continue;
    }
    const std::string dtype = c.target.find(" fp16 ") != std::string::npos ? "fp16" : "bf16";
    if (c.kernel != "cuda.attn_bwd_naive" && c.target.find(" fp32 ") == std::string::npos) {
      auto model = make_emulated_attention_backward(*AttentionBackwardModel::parse("cpu.attn_bwd_flash:block=128,p=" + dtype + ",exp2"));
      Case mc = c.spec;
      mc.kernel = model->name();
      const CaseResult m = check_case(*model, mc, {});
      if (!m.verdict.passed) {
        ++model_fails[c.target];
        std::printf("[ attn_bwd ] %s: %s fails, and so does %s: %s\n", c.target.c_str(), shape_text(c.spec).c_str(),
                    model->name().c_str(), m.verdict.reasons.front().c_str());
        continue;
      }
    }
    ADD_FAILURE() << c.target << ": " << c.family << " " << shape_text(c.spec) << ": " << c.verdict.reasons.front() << "\n  "
                  << to_json(c.spec).dump();
  }
  for (const auto& [target, n] : run)
    std::printf("[ attn_bwd ] %s: %d of %d generated cases passed, %d failed as the CPU model of the arithmetic does\n",
                target.c_str(), passed[target], n, model_fails[target]);
  std::map<std::string, std::pair<int, int>> per_target;
  for (const auto& [target, n] : run) per_target[target] = {passed[target], n};
  EXPECT_TRUE(r.not_run.empty()) << to_json(r).at("not_run").dump();
  EXPECT_EQ(per_target.size(), o.targets.size());
}

TEST(AttentionBackwardGpu, EdgeCasesPass) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  int n = 0;
  for (auto& k : make_attention_backward_kernels())
    for (const std::string& dtype : dtypes_of(k->name())) {
      int passed = 0, total = 0;
      for (const Edge& e : edge_cases()) {
        Case c = backward_case(dtype, e.shape, 500 + n++);
        c.kernel = k->name();
        if (const auto why = k->unsupported(c)) {
          ADD_FAILURE() << k->name() << " " << dtype << " " << e.what << ": unsupported: " << *why;
          continue;
        }
        const Evaluation ev = evaluate(*k, c, {});
        ++total;
        EXPECT_EQ(ev.run.status, Disposition::Ok) << k->name() << " " << e.what << ": " << ev.run.message;
        EXPECT_EQ(ev.run.unwritten, 0) << k->name() << " " << e.what;
        if (ev.verdict.passed) ++passed;
        else ADD_FAILURE() << k->name() << " " << dtype << " " << e.what << ": " << ev.verdict.reasons.front();
        if (ev.run.status != Disposition::Ok) continue;
        // Rows that see no key: dQ exactly 0 (and no NaN anywhere).
        const AttentionShape& a = c.attention;
        const AttentionView qv = attention_view(c, "dQ");
        const Tensor& dq = ev.run.outputs.at("dQ");
        for (std::int64_t b = 0; b < a.batch; ++b)
          for (std::int64_t h = 0; h < a.heads; ++h)
            for (std::int64_t i = 0; i < a.seq_q; ++i) {
              const bool masked = attention_visible_count(c, b, i) == 0;
              for (std::int64_t d = 0; d < a.head_dim; ++d) {
                const double x = dq.value(static_cast<std::size_t>(qv.offset(b, h, i, d)));
                ASSERT_FALSE(std::isnan(x)) << k->name() << " " << e.what;
                if (masked) {
                  ASSERT_EQ(x, 0.0) << k->name() << " " << e.what << ": masked row " << i;
                }
              }
            }
      }
      std::printf("[ attn_bwd ] %s %s: %d of %d edge cases passed\n", k->name().c_str(), dtype.c_str(), passed, total);
    }
}

TEST(AttentionBackwardGpu, RefusesOtherHeadDims) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  for (auto& k : make_attention_backward_kernels()) {
    Case c = backward_case(dtypes_of(k->name()).front(), [](AttentionShape& a) { a.head_dim = 96; }, 1);
    if (k->name() == "cuda.attn_bwd_naive") EXPECT_FALSE(k->unsupported(c).has_value());
    else EXPECT_EQ(k->unsupported(c).value_or(""), "head_dim 96 (head_dim_v 96): only 64 and 128, equal");
  }
}

// dS = P dP without the D correction: caught on the edge cases and on generated cases.
TEST(AttentionBackwardGpu, MissingDCorrectionIsCaught) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  auto planted = make_planted_flash_backward_no_d();
  int failed = 0, total = 0, n = 0;
  for (const Edge& e : edge_cases()) {
    Case c = backward_case("fp16", e.shape, 900 + n++);
    c.kernel = planted->name();
    const CaseResult r = check_case(*planted, c, {});
    ++total;
    if (!r.verdict.passed) ++failed;
  }
  std::printf("[ attn_bwd ] %s: %d of %d edge cases failed\n", planted->name().c_str(), failed, total);
  EXPECT_GT(failed, total / 2);
}

// The deterministic variants give the same dQ bits run after run on a case of several key
// blocks and query blocks per key block (the atomic variants may not; printed).
TEST(AttentionBackwardGpu, DeterministicRepeatsDqBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  for (auto& k : make_attention_backward_kernels()) {
    if (k->name() == "cuda.attn_bwd_naive") continue;
    Case c = backward_case(dtypes_of(k->name()).front(), [](AttentionShape& a) {
      a.batch = 1, a.heads = 2, a.kv_heads = 1, a.seq_q = 130, a.seq_kv = 520, a.head_dim = 64;
    }, 77);
    c.kernel = k->name();
    const Inputs in = case_inputs(c);
    int differing = 0;
    RunOutcome first = run_kernel(*k, c, in);
    ASSERT_EQ(first.status, Disposition::Ok) << first.message;
    for (int rep = 0; rep < 5; ++rep) {
      const RunOutcome again = run_kernel(*k, c, in);
      ASSERT_EQ(again.status, Disposition::Ok) << again.message;
      for (const char* out : {"dK", "dV"})
        EXPECT_EQ(std::memcmp(first.outputs.at(out).data(), again.outputs.at(out).data(), first.outputs.at(out).size_bytes()), 0)
            << k->name() << " " << out;
      const Tensor &a = first.outputs.at("dQ"), &b = again.outputs.at("dQ");
      differing += std::memcmp(a.data(), b.data(), a.size_bytes()) != 0;
    }
    const bool det = !k->traits().atomic_dq;
    std::printf("[ attn_bwd ] %s: dQ differed in %d of 5 repeats%s\n", k->name().c_str(), differing,
                det ? " (deterministic)" : " (atomic dQ)");
    if (det) {
      EXPECT_EQ(differing, 0) << k->name();
    }
  }
}
