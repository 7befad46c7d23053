// `ulpgate bench`'s arithmetic (campaign/bench.hpp): order statistics of the timed runs and
// the FLOP count of each case, on known answers.
#include <gtest/gtest.h>

#include "campaign/bench.hpp"
#include "check/ops/attention_backward.hpp"
#include "kernels/builtin.hpp"

using namespace ulpgate;

TEST(Bench, TimingStatisticsOnKnownSets) {
  const BenchTiming odd = timing_of({5, 1, 4, 2, 3});
  EXPECT_EQ(odd.median_ms, 3);
  EXPECT_EQ(odd.min_ms, 1);
  EXPECT_EQ(odd.max_ms, 5);
  EXPECT_EQ(odd.reps, 5);
  const BenchTiming even = timing_of({4, 1, 3, 2});
  EXPECT_EQ(even.median_ms, 2.5);
  std::vector<double> twenty;
  for (int i = 20; i >= 1; --i) twenty.push_back(i);  // 1 .. 20, reversed
  const BenchTiming t = timing_of(twenty);
  EXPECT_EQ(t.median_ms, 10.5);
  EXPECT_EQ(t.p10_ms, 2);   // nearest rank: ceil(0.1 x 20) = 2nd
  EXPECT_EQ(t.p90_ms, 18);  // ceil(0.9 x 20) = 18th
  EXPECT_EQ(timing_of({7}).p90_ms, 7);
  EXPECT_THROW(timing_of({}), std::logic_error);
}

TEST(Bench, FlopsOfGemmAndAttention) {
  Case g;
  g.gemm.batch = 3, g.gemm.m = 10, g.gemm.n = 20, g.gemm.k = 30;
  EXPECT_EQ(case_flops(g), 2.0 * 3 * 10 * 20 * 30);
  Case a;
  a.op = Op::Attention;
  a.attention.batch = 2, a.attention.heads = 3, a.attention.seq_q = 4, a.attention.seq_kv = 4, a.attention.head_dim = 8;
  EXPECT_EQ(case_flops(a), 2.0 * 16 * 3 * (2 * 16));  // 2 (D + Dv) per pair, 16 pairs, 3 heads, 2 batches
  a.attention.causal = true;                          // 1 + 2 + 3 + 4 = 10 pairs of 16
  EXPECT_EQ(case_flops(a), 2.0 * 16 * 3 * (2 * 10));
  a.attention.seq_kv = 6;  // the diagonal moves right by 2: 3 + 4 + 5 + 6 = 18
  EXPECT_EQ(case_flops(a), 2.0 * 16 * 3 * (2 * 18));
  a.attention.kv_lengths = {6, 2};  // batch 1 sees at most 2 keys per query: 8
  EXPECT_EQ(case_flops(a), 2.0 * 16 * 3 * (18 + 8));
  a.attention.head_dim_v = 24;
  EXPECT_EQ(case_flops(a), 2.0 * (8 + 24) * 3 * (18 + 8));
  // Causal square at S = 4096: S (S + 1) / 2 pairs, about half of S^2.
  Case big;
  big.op = Op::Attention;
  big.attention.batch = 4, big.attention.heads = 16, big.attention.seq_q = big.attention.seq_kv = 4096, big.attention.head_dim = 128;
  const double full = case_flops(big);
  big.attention.causal = true;
  EXPECT_NEAR(case_flops(big) / full, 4097.0 / 8192.0, 1e-12);
}

// A backward timed with its O and LSE from a forward kernel: the row says which, the checked
// output passes as with the exact forward's; a forward kernel that does not take the case
// leaves the row not supported, with the reason. Windows count only the visible pairs.
TEST(Bench, BackwardTakesItsForwardFromAKernel) {
  Registry reg = builtin_registry();
  Kernel* backward = reg.resolve("cpu.attn_bwd_naive");
  Kernel* forward = reg.resolve("cpu.attn_naive");
  ASSERT_TRUE(backward && forward);
  Case c = dtype_attention_backward_case("bf16");
  c.attention.seq_q = 24, c.attention.seq_kv = 40, c.attention.head_dim = 16;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}, {"dO", "normal(0,1)"}};
  c.seed = 3;
  BenchOptions o;
  o.reps = 1, o.warmup = 0;
  const BenchRow row = bench_kernel(*backward, c, o, forward);
  ASSERT_EQ(row.status, "ok");
  EXPECT_TRUE(row.checked && row.passed) << row.verdict;
  EXPECT_NE(row.notes.at("forward").find("cpu.attn_naive"), std::string::npos);
  const BenchRow exact = bench_kernel(*backward, c, o);
  EXPECT_EQ(exact.notes.count("forward"), 0u);
  EXPECT_TRUE(exact.checked && exact.passed) << exact.verdict;
  const BenchRow refused = bench_kernel(*backward, c, o, reg.resolve("cpu.fp32_seq"));
  EXPECT_EQ(refused.status.rfind("not supported: forward kernel cpu.fp32_seq", 0), 0u) << refused.status;

  Case w = c;
  w.op = Op::Attention;
  w.attention.window_left = 3, w.attention.window_right = 0;  // 4 keys per query: 24 x 4 pairs
  EXPECT_EQ(case_flops(w), 2.0 * (16 + 16) * 24 * 4);
}
