// Evaluation of a kernel on a case: what the kernel's declared precision implies.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "harness/check.hpp"

using namespace ulpgate;

namespace {

// A TF32 tensor-core model: FP32 inputs rounded to TF32 (to nearest, as the hardware
// conversion does), products and sums in FP32. Row-major, no transposes, beta = 0.
class Tf32Model final : public Kernel {
 public:
  std::string name() const override { return "test.tf32"; }
  std::string description() const override { return "inputs rounded to TF32, FP32 FMA"; }
  KernelTraits traits() const override { return {Memory::Host, true}; }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.types.at("compute") != Format::TF32 || c.beta != 0.0 || c.gemm.trans_a || c.gemm.trans_b ||
        c.gemm.layout != Layout::RowMajor || c.gemm.batch != 1)
      return "not this case";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const auto* a = static_cast<const float*>(io.in.at("A"));
    const auto* b = static_cast<const float*>(io.in.at("B"));
    auto* d = static_cast<float*>(io.out.at("D"));
    const auto& g = c.gemm;
    const auto tf32 = [](float v) { return static_cast<float>(round_to(Format::TF32, v)); };
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        float acc = 0.0f;
        for (std::int64_t k = 0; k < g.k; ++k) acc = std::fma(tf32(a[i * g.k + k]), tf32(b[k * g.n + j]), acc);
        d[i * g.n + j] = static_cast<float>(c.alpha) * acc;
      }
  }
};

}  // namespace

// An FP32 input within half a TF32 unit of FLT_MAX rounds to Inf in TF32: the D elements it
// reaches may be Inf although the exact result is finite. Accepted as an overflow for a
// kernel that rounds its inputs (tolerance input_bits), an unexpected Inf otherwise.
TEST(Evaluate, InputRoundingThatOverflowsIsAnOverflow) {
  Case c;
  c.gemm.m = 1, c.gemm.n = 2, c.gemm.k = 2;
  c.types = {{"A", Format::FP32}, {"B", Format::FP32}, {"D", Format::FP32}, {"compute", Format::TF32}};
  Tensor a(Format::FP32, 2), b(Format::FP32, 4);
  a.set_value(0, 0.25), a.set_value(1, 0.5);
  b.set_value(0, FLT_MAX), b.set_value(1, 1.0);  // row 0 of B: FLT_MAX rounds to Inf in TF32
  b.set_value(2, 1.0), b.set_value(3, 2.0);
  const std::map<std::string, Tensor> in{{"A", a}, {"B", b}};
  Tf32Model k;
  const Evaluation ev = evaluate_with_inputs(k, c, in, {});
  ASSERT_EQ(ev.tolerance.input_bits, 11);
  ASSERT_EQ(ev.metrics.size(), 1u);
  EXPECT_EQ(ev.metrics[0].overflowed, 1);  // D[0][0] = Inf, exact 0.25 FLT_MAX + 0.5
  EXPECT_EQ(ev.metrics[0].unexpected_inf, 0);
  EXPECT_TRUE(ev.verdict.passed) << ev.verdict.reasons.front();

  EvaluationOptions as_given;  // a model that says it uses its inputs as given
  as_given.tolerance = ToleranceModel{};
  const Evaluation strict = evaluate_with_inputs(k, c, in, as_given);
  EXPECT_EQ(strict.metrics[0].unexpected_inf, 1);
  EXPECT_FALSE(strict.verdict.passed);
}
