#include <gtest/gtest.h>
#include <ulpgate/ulpgate.hpp>

// My kernel: D = A B summed in FP32 (products of BF16 values are exact in FP32), rounded
// to BF16; skip_last leaves out the last product (a bug).
ulpgate::HostFunction my_gemm(bool skip_last) {
  return [=](const ulpgate::Case& c, const ulpgate::Values& in, ulpgate::Values& out) {
    const std::vector<double>&a = in.at("A"), &b = in.at("B");
    const std::int64_t m = c.gemm.m, n = c.gemm.n, k = c.gemm.k;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float sum = 0;
        for (std::int64_t p = 0; p < k - skip_last; ++p) sum += float(a[i * k + p] * b[p * n + j]);
        out["D"][i * n + j] = ulpgate::round_to(ulpgate::Format::BF16, sum);
      }
  };
}

TEST(MyGemm, Bf16) {
  const ulpgate::Case c = ulpgate::gemm_case({.m = 32, .n = 16, .k = 300, .dtype = "bf16", .out = "bf16"});
  const ulpgate::Result good = ulpgate::run(my_gemm(false), c), bad = ulpgate::run(my_gemm(true), c);
  EXPECT_TRUE(good.passed) << good;
  EXPECT_FALSE(bad.passed) << bad;
  EXPECT_GT(bad.metrics.at(0).max_ulp, 1) << bad;
}
