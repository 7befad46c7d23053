#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "distributions/fill.hpp"
#include "check/check.hpp"
#include "campaign/fuzz.hpp"
#include "check/ops/attention.hpp"
#include "check/ops/op.hpp"
#include "kernels/emulated/attention_models.hpp"
#include "check/runner.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "kernels/plugin/loader.hpp"
#include "tests/kernels/gemm_cases.hpp"

using namespace ulpgate;

TEST(Plugin, LoadsAndRunsHostKernelBitIdenticalToTheModel) {
  Registry reg;
  load_plugin(EXAMPLE_PLUGIN, reg);
  Kernel* k = reg.find("example.host_sgemm");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->traits().memory, Memory::Host);
  EXPECT_NE(k->description().find("(plugin "), std::string::npos);
  auto model = make_emulated_gemm(default_models()[0]);  // sequential FP32 FMA, like the plugin
  int compared = 0;
  for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Case c = test_support::gemm_case(9, 4, 33, Format::FP32, Format::FP32);
        c.gemm.layout = layout, c.gemm.trans_a = ta, c.gemm.trans_b = tb, c.gemm.batch = 3;
        c.gemm.lda = c.gemm.packed_ld(c.gemm.a_rows(), c.gemm.a_cols()) + 2;
        c.alpha = 0.75, c.beta = -1.5;
        c.types["C"] = Format::FP32;
        const auto in = test_support::fill(c, test_support::Fill::Normal, 11);
        const RunOutcome p = run_kernel(*k, c, in), m = run_kernel(*model, c, in);
        ASSERT_EQ(p.status, Disposition::Ok) << p.message;
        EXPECT_EQ(p.unwritten, 0);
        ASSERT_EQ(p.outputs.at("D").size_bytes(), m.outputs.at("D").size_bytes());
        EXPECT_EQ(std::memcmp(p.outputs.at("D").data(), m.outputs.at("D").data(), p.outputs.at("D").size_bytes()), 0);
        ++compared;
      }
  EXPECT_EQ(compared, 8);
  Case half = test_support::gemm_case(2, 2, 2, Format::FP16, Format::FP16);
  EXPECT_EQ(k->unsupported(half), "FP32 A, B, C, D and compute only");
  EXPECT_EQ(run_kernel(*k, half, test_support::fill(half, test_support::Fill::Normal)).status, Disposition::NotSupported);
}

TEST(Plugin, BadLibrariesAreInputErrors) {
  Registry reg;
  auto msg = [&](const std::string& path) {
    try {
      load_plugin(path, reg);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  EXPECT_EQ(msg("/nonexistent/plugin.so").rfind("--plugin /nonexistent/plugin.so: cannot load: ", 0), 0u);
  EXPECT_EQ(msg("libm.so.6"), "--plugin libm.so.6: no exported ulpgate_plugin_entry()");
  load_plugin(EXAMPLE_PLUGIN, reg);
  EXPECT_NE(msg(EXAMPLE_PLUGIN).find("already exists"), std::string::npos);
}

namespace {

// FP32 attention, heads 4, with kv_heads K/V heads (0: multi-head), both layouts' worth of
// shape: batch 2, causal, ragged kv_lengths, head_dim_v != head_dim.
Case fp32_attention(std::int64_t kv_heads, const std::string& kernel) {
  Case c = dtype_attention_case("fp32");
  AttentionShape& a = c.attention;
  a.batch = 2, a.heads = 4, a.kv_heads = kv_heads, a.seq_q = 5, a.seq_kv = 9, a.head_dim = 8, a.head_dim_v = 3;
  a.layout = AttentionLayout::BSHD, a.causal = true, a.kv_lengths = {9, 4};
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  c.seed = 5;
  c.kernel = kernel;
  validate(c);
  return c;
}

bool same_output(const RunOutcome& x, const RunOutcome& y) {
  return x.outputs.at("O").size_bytes() == y.outputs.at("O").size_bytes() &&
         std::memcmp(x.outputs.at("O").data(), y.outputs.at("O").data(), x.outputs.at("O").size_bytes()) == 0;
}

}  // namespace

// ABI version 2 carries kv_heads: the plugin runs grouped-query and multi-query cases and
// gives cpu.attn_naive's bits (the same arithmetic).
TEST(Plugin, AbiVersion2RunsGroupedQueryAttention) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V2, reg);
  Kernel* k = reg.find("test.attention_v2");
  ASSERT_NE(k, nullptr);
  auto naive = make_emulated_attention(AttentionModel{});
  for (std::int64_t kv_heads : {0, 2, 1}) {
    Case c = fp32_attention(kv_heads, k->name());
    EXPECT_EQ(k->unsupported(c), std::nullopt) << kv_heads;
    const auto in = fill_inputs(c);
    const RunOutcome p = run_kernel(*k, c, in), m = run_kernel(*naive, c, in);
    ASSERT_EQ(p.status, Disposition::Ok) << p.message;
    EXPECT_EQ(p.unwritten, 0);
    EXPECT_TRUE(same_output(p, m)) << "kv_heads " << kv_heads;
  }
}

// A plugin built against ABI version 1 has no kv_heads and would read K and V as having
// `heads` heads: it still loads and runs multi-head cases, but a grouped-query case is
// "not supported" by it with the reason, never handed to it.
TEST(Plugin, AbiVersion1IsNeverHandedGroupedQueryCases) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V1, reg);
  Kernel* k = reg.find("test.attention_v1");
  ASSERT_NE(k, nullptr);
  auto naive = make_emulated_attention(AttentionModel{});
  Case mha = fp32_attention(0, k->name());
  const auto in = fill_inputs(mha);
  const RunOutcome p = run_kernel(*k, mha, in);
  ASSERT_EQ(p.status, Disposition::Ok) << p.message;
  EXPECT_TRUE(same_output(p, run_kernel(*naive, mha, in)));
  Case same = fp32_attention(4, k->name());  // kv_heads == heads: multi-head, written out
  EXPECT_EQ(k->unsupported(same), std::nullopt);
  for (std::int64_t kv_heads : {2, 1}) {
    Case gqa = fp32_attention(kv_heads, k->name());
    EXPECT_EQ(k->unsupported(gqa),
              fmt::format("built against plugin ABI version 1, which cannot describe grouped-query attention "
                          "(kv_heads {} of 4 heads); rebuild it against version {}",
                          kv_heads, 10));
    const RunOutcome r = run_kernel(*k, gqa, fill_inputs(gqa));
    EXPECT_EQ(r.status, Disposition::NotSupported);
    EXPECT_NE(r.message.find("ABI version 1"), std::string::npos) << r.message;
  }
}

// A campaign of kernel `name` over FP32 cases of op in the small size regime.
RunRecord small_fp32_campaign(Registry& reg, const char* name, Op op, std::int64_t cases, std::uint64_t seed,
                              std::int64_t max_k) {
  FuzzOptions o;
  o.targets = {{name, "fp32", op}};
  o.cases = cases, o.seed = seed, o.max_k = max_k, o.sizes = SizeSchedule::Small;
  return run_fuzz(reg, o);
}

TEST(Plugin, UnknownAbiVersionIsAnInputError) {
  Registry reg;
  try {
    load_plugin(ATTENTION_PLUGIN_V11, reg);
    FAIL() << "a version-11 plugin loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), fmt::format("--plugin {}: ABI version 11, this ulpgate speaks 1 to 10", ATTENTION_PLUGIN_V11));
  }
  EXPECT_EQ(reg.find("test.attention_v11"), nullptr);
}

// ABI version 7 hands over the served variants: the plugin that applies them passes a
// campaign whose cases draw them, its twin that ignores the sinks fails it, and a version-6
// kernel (no declaration) is never handed such a case.
TEST(Plugin, AbiVersion7AppliesServedVariants) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V7, reg);
  load_plugin(ATTENTION_PLUGIN_V6, reg);
  ASSERT_NE(reg.find("test.attention_v7"), nullptr);
  EXPECT_EQ(reg.find("test.attention_v7")->traits().attention_variants, kAttnWindow | kAttnSoftcap | kAttnAlibi | kAttnSinks);
  EXPECT_EQ(reg.find("test.attention_v6")->traits().attention_variants, 0u);
  Case c = fp32_attention(2, "test.attention_v6");
  c.attention.sinks.assign(static_cast<std::size_t>(c.attention.heads), 1.0);
  const RunOutcome old = run_kernel(*reg.find("test.attention_v6"), c, fill_inputs(c));
  EXPECT_EQ(old.status, Disposition::NotSupported);
  EXPECT_NE(old.message.find("sinks"), std::string::npos) << old.message;
  for (const char* name : {"test.attention_v7", "test.attention_v7_no_sink"}) {
    const RunRecord r = small_fp32_campaign(reg, name, Op::Attention, 12, 2, 64);
    int failed = 0, served = 0;
    for (const CaseResult& cr : r.cases) {
      failed += !cr.verdict.passed;
      served += (attention_variants(cr.spec) & (kAttnSoftcap | kAttnAlibi | kAttnSinks)) != 0;
    }
    EXPECT_GT(served, 0) << name;
    if (std::string(name) == "test.attention_v7") EXPECT_EQ(failed, 0) << name;
    else EXPECT_GT(failed, 0) << name;
  }
}

// ABI version 8 hands over paged K/V: the plugin that follows the page table passes a
// campaign whose cases draw pages, its twin that reads table entry e as page e fails it, and
// the version-7 plugin (no page table in its ABI) is never handed a paged case.
TEST(Plugin, AbiVersion8ReadsPagedKv) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V8, reg);
  load_plugin(ATTENTION_PLUGIN_V7, reg);
  ASSERT_NE(reg.find("test.attention_v8"), nullptr);
  EXPECT_EQ(reg.find("test.attention_v8")->traits().attention_variants, kAllAttentionVariants & ~(kAttnKvScales | kAttnKvHeadScales));
  Case c = fp32_attention(2, "test.attention_v7");
  page_kv(c.attention, 3, 1);
  const RunOutcome old = run_kernel(*reg.find("test.attention_v7"), c, fill_inputs(c));
  EXPECT_EQ(old.status, Disposition::NotSupported);
  EXPECT_NE(old.message.find("paged"), std::string::npos) << old.message;
  for (const char* name : {"test.attention_v8", "test.attention_v8_no_table"}) {
    const RunRecord r = small_fp32_campaign(reg, name, Op::Attention, 12, 2, 64);
    int failed = 0, paged = 0;
    for (const CaseResult& cr : r.cases) failed += !cr.verdict.passed, paged += cr.spec.attention.paged();
    EXPECT_GT(paged, 0) << name;
    if (std::string(name) == "test.attention_v8") EXPECT_EQ(failed, 0) << name;
    else EXPECT_GT(failed, 0) << name;
  }
}

// ABI version 9 hands over an FP8 K/V cache's per-head scales: the plugin that applies them
// passes a campaign whose cases draw them (per tensor and per head), its twin applying head
// 0's scale to every head fails it, and the version-8 plugin (which cannot declare them) is
// never handed a scaled case.
TEST(Plugin, AbiVersion9ReadsPerHeadKvScales) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V9, reg);
  load_plugin(ATTENTION_PLUGIN_V8, reg);
  ASSERT_NE(reg.find("test.attention_v9"), nullptr);
  EXPECT_EQ(reg.find("test.attention_v9")->traits().attention_variants, kAllAttentionVariants);
  Case c = fp32_attention(2, "test.attention_v8");
  apply_kv_cache(c, "e4m3:0.5:head");
  const RunOutcome old = run_kernel(*reg.find("test.attention_v8"), c, fill_inputs(c));
  EXPECT_EQ(old.status, Disposition::NotSupported);
  for (const char* name : {"test.attention_v9", "test.attention_v9_head0"}) {
    const RunRecord r = small_fp32_campaign(reg, name, Op::Attention, 24, 2, 64);
    int failed = 0, per_head = 0;
    for (const CaseResult& cr : r.cases) failed += !cr.verdict.passed, per_head += !cr.spec.head_scales.empty();
    EXPECT_GT(per_head, 0) << name;
    if (std::string(name) == "test.attention_v9") EXPECT_EQ(failed, 0) << name;
    else EXPECT_GT(failed, 0) << name;
  }
}

// ABI version 6 hands over attention backward cases: the plugin's backward passes its
// campaign (declaring atomic dQ), its no-D twin fails it, and a version-5 plugin is never
// handed a backward case.
TEST(Plugin, AbiVersion6RunsAttentionBackward) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V6, reg);
  load_plugin(ATTENTION_PLUGIN_V5, reg);
  Kernel* bwd = reg.find("test.attention_bwd_v6");
  ASSERT_NE(bwd, nullptr);
  EXPECT_TRUE(bwd->traits().atomic_dq);
  EXPECT_EQ(bwd->traits().p_bits, 24);
  EXPECT_FALSE(reg.find("test.attention_v5")->traits().atomic_dq);
  Case c = op_module(Op::AttentionBackward).basic_case("fp32");
  c.kernel = "test.attention_v5";
  EXPECT_EQ(reg.find("test.attention_v5")->unsupported(c),
            "built against plugin ABI version 5, which has no attention backward op; rebuild it against version 10");
  for (const char* name : {"test.attention_bwd_v6", "test.attention_bwd_v6_no_d"}) {
    const RunRecord r = small_fp32_campaign(reg, name, Op::AttentionBackward, 8, 5, 128);
    int failed = 0, ok = 0;
    for (const CaseResult& cr : r.cases) failed += !cr.verdict.passed, ok += cr.status == Disposition::Ok;
    EXPECT_GT(ok, 0) << name;
    if (std::string(name) == "test.attention_bwd_v6")
      EXPECT_EQ(failed, 0) << name;
    else
      EXPECT_GT(failed, 0) << name;
  }
}

// ABI version 10 hands over attention combine cases: the plugin's combine passes a designed
// case and campaigns of FP32 and BF16 partial states, its twin without the empty-split guard
// fails them, and version 9's kernels (which could not tell the op from another) are never
// handed one.
TEST(Plugin, AbiVersion10RunsAttentionCombine) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V10, reg);
  load_plugin(ATTENTION_PLUGIN_V9, reg);
  load_plugin(ATTENTION_PLUGIN_V6, reg);
  Kernel* good = reg.find("test.attention_combine_v10");
  Kernel* bad = reg.find("test.attention_combine_v10_no_guard");
  ASSERT_TRUE(good && bad);
  EXPECT_TRUE(good->traits().writes_lse);
  Case basic = op_module(Op::AttentionCombine).basic_case("fp32");
  for (auto [old, abi] : {std::pair{"test.attention_v9", 9}, {"test.attention_v9_head0", 9}, {"test.attention_bwd_v6", 6}}) {
    basic.kernel = old;
    EXPECT_EQ(reg.find(old)->unsupported(basic),
              fmt::format("built against plugin ABI version {}, which has no attention combine op; rebuild it against "
                          "version 10", abi));
    EXPECT_EQ(run_kernel(*reg.find(old), basic, fill_inputs(basic)).status, Disposition::NotSupported) << old;
  }
  EXPECT_EQ(reg.find("test.attention_v10")->unsupported(basic), "attention only");  // its supports() says so

  // BF16 partial states in base 2, BSHD, half the splits empty (whole rows too), with the LSE.
  Case c = op_module(Op::AttentionCombine).basic_case("bf16");
  AttentionShape& a = c.attention;
  a.batch = 2, a.heads = 3, a.seq_q = 2, a.head_dim = 16, a.splits = 5, a.layout = AttentionLayout::BSHD, a.lse_base2 = true;
  c.types["O"] = Format::FP32, c.types["LSE"] = Format::FP32;
  c.dist["LSE_part"] = "lse(mean=100,std=8,empty=0.5)";
  c.seed = 3;
  validate(c);
  c.kernel = good->name();
  const CaseResult ok = check_case(*good, c, EvaluationOptions{});
  EXPECT_TRUE(ok.verdict.passed) << fmt::format("{}", fmt::join(ok.verdict.reasons, "; "));
  ASSERT_EQ(ok.metrics.size(), 2u);
  EXPECT_EQ(ok.metrics[1].output, "LSE");
  c.kernel = bad->name();
  EXPECT_FALSE(check_case(*bad, c, EvaluationOptions{}).verdict.passed);

  for (const char* dtype : {"fp32", "bf16"})
    for (Kernel* k : {good, bad}) {
      FuzzOptions o;
      o.targets = {{k->name(), dtype, Op::AttentionCombine}};
      o.cases = 12, o.seed = 4, o.sizes = SizeSchedule::Small;
      const RunRecord r = run_fuzz(reg, o);
      int failed = 0, ok_runs = 0, with_lse = 0;
      for (const CaseResult& cr : r.cases) {
        failed += !cr.verdict.passed, ok_runs += cr.status == Disposition::Ok;
        with_lse += cr.spec.types.count("LSE") > 0;
      }
      EXPECT_GT(ok_runs, 0) << k->name() << " " << dtype;
      EXPECT_GT(with_lse, 0) << k->name() << " " << dtype;
      if (k == good)
        EXPECT_EQ(failed, 0) << k->name() << " " << dtype;
      else
        EXPECT_GT(failed, 0) << k->name() << " " << dtype;
    }
}

// ABI version 3 hands over the log-sum-exp output: the plugin writes it where a case asks
// for it (judged like any kernel's), and a version-2 plugin is never handed such a case.
TEST(Plugin, AbiVersion3WritesTheLogSumExp) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V3, reg);
  load_plugin(ATTENTION_PLUGIN_V2, reg);
  Kernel* v3 = reg.find("test.attention_v3");
  Kernel* v2 = reg.find("test.attention_v2");
  ASSERT_NE(v3, nullptr);
  ASSERT_NE(v2, nullptr);
  Case c = fp32_attention(2, v3->name());
  c.types["LSE"] = Format::FP32;
  EXPECT_EQ(v3->unsupported(c), std::nullopt);
  EXPECT_EQ(v2->unsupported(c),
            "built against plugin ABI version 2, which has no log-sum-exp output; rebuild it against version 10");
  const CaseResult r = check_case(*v3, c, EvaluationOptions{});
  EXPECT_TRUE(r.verdict.passed) << fmt::format("{}", fmt::join(r.verdict.reasons, "; "));
  ASSERT_EQ(r.metrics.size(), 2u);
  EXPECT_EQ(r.metrics[1].output, "LSE");
  EXPECT_EQ(r.metrics[1].elements, c.attention.batch * c.attention.heads * c.attention.seq_q);
}

namespace {

// A small FP32 attention campaign of one plugin kernel, in this process.
RunRecord attention_campaign(Registry& reg, const std::string& kernel) {
  FuzzOptions o;
  o.targets = {{kernel, "fp32", Op::Attention}};
  o.cases = 12;
  o.seed = 11;
  o.max_k = 64;
  o.sizes = SizeSchedule::Small;
  return run_fuzz(reg, o);
}

}  // namespace

// ABI version 4: a kernel says whether it writes the log-sum-exp (ulpgate_kernel.writes_lse).
// One that does not is never drawn or handed a case asking for it, and its campaign passes on
// O alone; a wrong O is still caught there (not by a missing LSE). Version-3 plugins, whose
// descriptor has no such field, still load and are asked about every case (supports() decides).
TEST(Plugin, AbiVersion4KernelsSayWhetherTheyWriteTheLogSumExp) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V4, reg);
  load_plugin(ATTENTION_PLUGIN_V3, reg);
  Kernel* with = reg.find("test.attention_v4");
  Kernel* without = reg.find("test.attention_v4_no_lse");
  Kernel* wrong = reg.find("test.attention_v4_wrong_o");
  Kernel* v3 = reg.find("test.attention_v3");
  ASSERT_TRUE(with && without && wrong && v3);
  EXPECT_TRUE(with->traits().writes_lse);
  EXPECT_FALSE(without->traits().writes_lse);
  EXPECT_TRUE(v3->traits().writes_lse);
  Case c = fp32_attention(2, without->name());
  c.types["LSE"] = Format::FP32;
  EXPECT_EQ(without->unsupported(c), "does not write the log-sum-exp output (its ulpgate_kernel.writes_lse is 0)");
  EXPECT_EQ(with->unsupported(c), std::nullopt);
  EXPECT_TRUE(check_case(*with, c, EvaluationOptions{}).verdict.passed);

  const RunRecord ok = attention_campaign(reg, without->name());
  ASSERT_EQ(ok.cases.size(), 12u);
  for (const auto& r : ok.cases) {
    EXPECT_EQ(r.spec.types.count("LSE"), 0u) << r.family;
    EXPECT_EQ(r.status, Disposition::Ok) << r.message;
    EXPECT_TRUE(r.verdict.passed) << r.family << ": " << fmt::format("{}", fmt::join(r.verdict.reasons, "; "));
  }
  const RunRecord bad = attention_campaign(reg, wrong->name());
  int failed = 0;
  for (const auto& r : bad.cases) {
    if (r.verdict.passed) continue;
    ++failed;
    // O's check, or a relation where the dropped key weighs too little for O's bound (a
    // far-negative row that one key holds, say) until the keys are permuted.
    EXPECT_TRUE(r.signature.rfind("O:", 0) == 0 || r.signature.rfind("relation:", 0) == 0) << r.signature;
    EXPECT_EQ(r.signature.find("LSE"), std::string::npos) << r.signature;
  }
  EXPECT_GT(failed, 6) << "the off-by-one in O was not caught";
  int drawn_with_lse = 0;
  for (const auto& r : attention_campaign(reg, with->name()).cases) drawn_with_lse += r.spec.types.count("LSE") > 0;
  EXPECT_GT(drawn_with_lse, 0) << "a kernel that writes the LSE is never asked for it";
}

// ABI version 5: a kernel declares its arithmetic in its descriptor (here cpu.attn_naive's,
// P kept in FP32), and the check uses it; a version-4 kernel, whose descriptor ends before
// those fields, declares nothing.
TEST(Plugin, AbiVersion5KernelsDeclareTheirArithmetic) {
  Registry reg;
  load_plugin(ATTENTION_PLUGIN_V5, reg);
  load_plugin(ATTENTION_PLUGIN_V4, reg);
  Kernel* v5 = reg.find("test.attention_v5");
  Kernel* v4 = reg.find("test.attention_v4");
  ASSERT_TRUE(v5 && v4);
  EXPECT_EQ(v5->traits().p_bits, 24);
  EXPECT_TRUE(v5->traits().writes_lse);
  EXPECT_EQ(v4->traits().p_bits, 0);
  EXPECT_EQ(v4->traits().accumulator_bits, 0);
  EXPECT_EQ(v4->traits().input_rounding, Rounding::NearestAway);
  for (const auto& r : attention_campaign(reg, v5->name()).cases)
    EXPECT_TRUE(r.verdict.passed) << r.family << ": " << fmt::format("{}", fmt::join(r.verdict.reasons, "; "));
}
