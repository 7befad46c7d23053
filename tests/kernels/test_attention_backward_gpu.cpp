// The attention backward kernels on the GPU (kernels/attention/backward.cu, and cuDNN's fused
// backward where the build has cuDNN) through the one check path (label gpu: skips without a
// device): generated cases for each kernel and input type, the edge cases (decode, one key,
// fully masked rows, empty batches, grouped heads, BSHD, head_dim 128, a 64-key tail past a
// 128-key block), the planted missing D correction caught, and the deterministic variants
// repeating dQ bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
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
#include "kernels/attention/cudnn_backward_kernel.hpp"
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

// What is wrong with dQ's rows: a NaN anywhere, or a nonzero in a row that sees no key
// (its gradient is exactly 0); "" when nothing is.
std::string dq_row_problem(const Case& c, const Tensor& dq) {
  const AttentionShape& a = c.attention;
  const AttentionView qv = attention_view(c, "dQ");
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        const bool masked = attention_visible_count(c, b, i) == 0;
        for (std::int64_t d = 0; d < a.head_dim; ++d) {
          const double x = dq.value(static_cast<std::size_t>(qv.offset(b, h, i, d)));
          if (std::isnan(x)) return fmt::format("dQ[{}][{}][{}][{}] is NaN", b, h, i, d);
          if (masked && x != 0.0) return fmt::format("masked row {} (batch {}, head {}): dQ[{}] = {:a}, not 0", i, b, h, d, x);
        }
      }
  return "";
}

// How many of `repeats` runs after the first gave other dQ bits (dK and dV must repeat bit for
// bit in every kernel); nullopt when the kernel declined the case at run time.
std::optional<int> dq_differences(Kernel& k, Case& c, int repeats) {
  const Inputs in = case_inputs(c);
  const RunOutcome first = run_kernel(k, c, in);
  if (first.status == Disposition::NotSupported) return std::nullopt;
  EXPECT_EQ(first.status, Disposition::Ok) << k.name() << ": " << first.message;
  if (first.status != Disposition::Ok) return 0;
  int differing = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    const RunOutcome again = run_kernel(k, c, in);
    EXPECT_EQ(again.status, Disposition::Ok) << k.name() << ": " << again.message;
    if (again.status != Disposition::Ok) continue;
    for (const char* out : {"dK", "dV"})
      EXPECT_EQ(std::memcmp(first.outputs.at(out).data(), again.outputs.at(out).data(), first.outputs.at(out).size_bytes()), 0)
          << k.name() << " " << out;
    const Tensor &a = first.outputs.at("dQ"), &b = again.outputs.at("dQ");
    differing += std::memcmp(a.data(), b.data(), a.size_bytes()) != 0;
  }
  return differing;
}

// The case of the determinism tests: several key blocks, several query blocks per key block,
// two query heads on one K/V head.
Case determinism_case(const std::string& dtype) {
  return backward_case(dtype, [](AttentionShape& a) {
    a.batch = 1, a.heads = 2, a.kv_heads = 1, a.seq_q = 130, a.seq_kv = 520, a.head_dim = 64;
  }, 77);
}

// Whether a generated case's failure is the arithmetic's, not the kernel's: the CPU model
// `model_name` (the kernel's arithmetic) fails the same case too; printed under `tag` if so.
bool fails_as_model_does(const CaseResult& c, const std::string& model_name, const char* tag) {
  auto model = make_emulated_attention_backward(*AttentionBackwardModel::parse(model_name));
  Case mc = c.spec;
  mc.kernel = model->name();
  const CaseResult m = check_case(*model, mc, {});
  if (m.verdict.passed) return false;
  std::printf("[ %s ] %s: %s fails, and so does %s: %s\n", tag, c.target.c_str(), shape_text(c.spec).c_str(),
              model->name().c_str(), m.verdict.reasons.front().c_str());
  return true;
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
    if (c.kernel != "cuda.attn_bwd_naive" && c.target.find(" fp32 ") == std::string::npos &&
        fails_as_model_does(c, "cpu.attn_bwd_flash:block=128,p=" + dtype + ",exp2", "attn_bwd")) {
      ++model_fails[c.target];
      continue;
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
        EXPECT_EQ(dq_row_problem(c, ev.run.outputs.at("dQ")), "") << k->name() << " " << e.what;
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
    Case c = determinism_case(dtypes_of(k->name()).front());
    c.kernel = k->name();
    const std::optional<int> differing = dq_differences(*k, c, 5);
    ASSERT_TRUE(differing.has_value()) << k->name() << ": not supported";
    const bool det = !k->traits().atomic_dq;
    std::printf("[ attn_bwd ] %s: dQ differed in %d of 5 repeats%s\n", k->name().c_str(), *differing,
                det ? " (deterministic)" : " (atomic dQ)");
    if (det) {
      EXPECT_EQ(*differing, 0) << k->name();
    }
  }
}

// cuDNN's fused backward (cudnn.sdpa_bwd.*, when the build has cuDNN) on generated cases: every
// case it runs must pass (or fail only as the CPU model of its arithmetic does); cases it
// declines, before the run or at run time, are printed and counted, and a kernel that declines
// every case fails.
TEST(AttentionBackwardGpu, CudnnGeneratedCasesPass) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Registry reg;
  for (auto& k : make_cudnn_attention_backward_kernels()) reg.add(std::move(k));
  if (reg.all().empty()) GTEST_SKIP() << "this build has no cuDNN";
  FuzzOptions o;
  for (const auto& k : reg.all()) o.targets.push_back({k->name(), dtypes_of(k->name()).front(), Op::AttentionBackward});
  o.cases = 20;
  o.seed = 20261204;
  o.max_k = 1024;
  const RunRecord r = run_fuzz(reg, o);
  std::map<std::string, int> passed, run, declined, model_fails;
  std::map<std::string, std::string> engine, first_declined;
  for (const CaseResult& c : r.cases) {
    if (c.shrunk()) continue;
    if (c.status == Disposition::NotSupported) {
      if (declined[c.target]++ == 0) first_declined[c.target] = shape_text(c.spec) + ": " + c.message;
      continue;
    }
    ++run[c.target];
    if (c.status == Disposition::Ok && engine[c.target].empty() && c.notes.count("engine"))
      engine[c.target] = c.notes.at("engine") + ", cuDNN " + (c.notes.count("cudnn") ? c.notes.at("cudnn") : "?");
    if (c.verdict.passed) {
      ++passed[c.target];
      continue;
    }
    const std::string dtype = c.target.find(" fp16 ") != std::string::npos ? "fp16" : "bf16";
    if (fails_as_model_does(c, "cpu.attn_bwd_flash:block=128,p=" + dtype + ",exp2,ftz,group_round", "cudnn_bwd")) {
      ++model_fails[c.target];
      continue;
    }
    ADD_FAILURE() << c.target << ": " << c.family << " " << shape_text(c.spec) << ": " << c.verdict.reasons.front() << "\n  "
                  << to_json(c.spec).dump();
  }
  for (const FuzzTarget& t : o.targets) {
    const std::string target = target_name(t);
    std::printf("[ cudnn_bwd ] %s: %d of %d cases run passed, %d failed as the CPU model of the arithmetic does, %d not "
                "supported%s%s; %s\n",
                target.c_str(), passed[target], run[target], model_fails[target], declined[target],
                first_declined[target].empty() ? "" : " (first: ", first_declined[target].empty() ? "" : (first_declined[target] + ")").c_str(),
                engine[target].empty() ? "no engine ran" : engine[target].c_str());
    EXPECT_GT(run[target], 0) << target << ": every generated case declined";
  }
  EXPECT_TRUE(r.not_run.empty()) << to_json(r).at("not_run").dump();
}

// cuDNN's fused backward on the edge cases it takes (the others are printed with its reason):
// each must pass, write every element, and give rows that see no key a zero dQ without NaN.
TEST(AttentionBackwardGpu, CudnnEdgeCasesPass) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const auto kernels = make_cudnn_attention_backward_kernels();
  if (kernels.empty()) GTEST_SKIP() << "this build has no cuDNN";
  int n = 0;
  for (const auto& k : kernels) {
    const std::string dtype = dtypes_of(k->name()).front();
    int passed = 0, total = 0, refused = 0, declined = 0;
    for (const Edge& e : edge_cases()) {
      Case c = backward_case(dtype, e.shape, 700 + n++);
      c.kernel = k->name();
      if (const auto why = k->unsupported(c)) {
        ++refused;
        std::printf("[ cudnn_bwd ] %s %s: refused: %s\n", k->name().c_str(), e.what.c_str(), why->c_str());
        continue;
      }
      const Evaluation ev = evaluate(*k, c, {});
      if (ev.run.status == Disposition::NotSupported) {
        ++declined;
        std::printf("[ cudnn_bwd ] %s %s: not supported at run time: %s\n", k->name().c_str(), e.what.c_str(), ev.run.message.c_str());
        continue;
      }
      ++total;
      EXPECT_EQ(ev.run.status, Disposition::Ok) << k->name() << " " << e.what << ": " << ev.run.message;
      EXPECT_EQ(ev.run.unwritten, 0) << k->name() << " " << e.what;
      if (ev.verdict.passed) ++passed;
      else ADD_FAILURE() << k->name() << " " << e.what << ": " << ev.verdict.reasons.front();
      if (ev.run.status == Disposition::Ok) {
        EXPECT_EQ(dq_row_problem(c, ev.run.outputs.at("dQ")), "") << k->name() << " " << e.what;
      }
    }
    std::printf("[ cudnn_bwd ] %s: %d of %d edge cases run passed, %d refused, %d not supported at run time\n", k->name().c_str(),
                passed, total, refused, declined);
    EXPECT_GT(total, 0) << k->name() << ": every edge case declined";
  }
}

// cuDNN's deterministic variants repeat dQ bit for bit (the atomic ones may not; printed); dK
// and dV repeat in all four.
TEST(AttentionBackwardGpu, CudnnDeterministicRepeatsDqBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const auto kernels = make_cudnn_attention_backward_kernels();
  if (kernels.empty()) GTEST_SKIP() << "this build has no cuDNN";
  int deterministic_run = 0;
  for (const auto& k : kernels) {
    Case c = determinism_case(dtypes_of(k->name()).front());
    c.kernel = k->name();
    const std::optional<int> differing = dq_differences(*k, c, 5);
    const bool det = !k->traits().atomic_dq;
    if (!differing) {
      std::printf("[ cudnn_bwd ] %s: not supported at run time\n", k->name().c_str());
      continue;
    }
    std::printf("[ cudnn_bwd ] %s: dQ differed in %d of 5 repeats%s\n", k->name().c_str(), *differing,
                det ? " (deterministic)" : " (atomic dQ)");
    if (det) {
      ++deterministic_run;
      EXPECT_EQ(*differing, 0) << k->name();
    }
  }
  EXPECT_GT(deterministic_run, 0) << "no deterministic cuDNN kernel ran";
}
