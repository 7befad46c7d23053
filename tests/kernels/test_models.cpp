#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "tests/kernels/gemm_cases.hpp"

using namespace ulpgate;
using O = AccumulationModel::Order;

namespace {
float dot(const AccumulationModel& m, std::vector<double> a) {
  std::vector<double> ones(a.size(), 1.0);
  return model_dot(m, a.data(), ones.data(), static_cast<std::int64_t>(a.size()));
}
}  // namespace

// Summation order and alignment decide these bits; each model must give its own answer.
TEST(Models, KnownAnswersSeparateTheModels) {
  const double t = 0x1p-24;  // half an FP32 ulp of 1
  const std::vector<double> x = {1.0, t, t, t};
  EXPECT_EQ(dot({O::SequentialFma, 1, 23, Rounding::NearestEven}, x), 1.0f);  // every step ties to even
  EXPECT_EQ(dot({O::Pairwise, 1, 23, Rounding::NearestEven}, x), 1.0f + 0x1p-23f);  // (1 + t) + (t + t)
  EXPECT_EQ(dot({O::SequentialFma, 1, 23, Rounding::Up}, x), 1.0f + 3 * 0x1p-23f);
  EXPECT_EQ(dot({O::BlockFma, 4, 23, Rounding::TowardZero}, x), 1.0f);  // t's are shifted out
  EXPECT_EQ(dot({O::BlockFma, 4, 25, Rounding::TowardZero}, x), 1.0f + 0x1p-23f);  // 1 + 1.5 ulp, RZ
  EXPECT_EQ(dot({O::BlockFma, 4, 25, Rounding::NearestEven}, x), 1.0f + 0x1p-22f);  // 1 + 1.5 ulp, RNE
  // two steps: 1 + t truncates to 1 (RZ), then 1 + t + t = 1 + 1 ulp exactly
  EXPECT_EQ(dot({O::BlockFma, 2, 25, Rounding::TowardZero}, x), 1.0f + 0x1p-23f);
  // Truncation is toward zero for negative terms too: -t rounds away from -1's side.
  EXPECT_EQ(dot({O::BlockFma, 4, 23, Rounding::TowardZero}, {1.0, -t, 0, 0}), 1.0f);
  EXPECT_EQ(dot({O::BlockFma, 4, 24, Rounding::TowardZero}, {1.0, -0x1p-25, 0, 0}), 1.0f);
  // Cancellation, zeros, specials.
  EXPECT_EQ(dot({O::BlockFma, 4, 23, Rounding::TowardZero}, {0x1p100, 1.0, -0x1p100, 0}), 0.0f);
  EXPECT_EQ(dot({O::SequentialFma, 1, 23, Rounding::NearestEven}, {0x1p100, 1.0, -0x1p100}), 0.0f);  // 1 is absorbed
  EXPECT_EQ(dot({O::Pairwise, 1, 23, Rounding::NearestEven}, {0x1p100, -0x1p100, 1.0, 0.0}), 1.0f);  // (big - big) + (1 + 0)
  // An all-zero block keeps IEEE addition's sign, starting from the +0 accumulator.
  EXPECT_FALSE(std::signbit(dot({O::BlockFma, 4, 23, Rounding::TowardZero}, {-0.0, -0.0})));
  EXPECT_TRUE(std::isnan(dot({O::BlockFma, 4, 23, Rounding::TowardZero}, {INFINITY, -INFINITY})));
  EXPECT_EQ(dot({O::Pairwise, 1, 23, Rounding::NearestEven}, {INFINITY, 1.0}), INFINITY);
}

// Exact data: every model is exact when no partial sum needs rounding.
RC_GTEST_PROP(Models, ExactOnSmallIntegers, ()) {
  const auto k = *rc::gen::inRange<std::int64_t>(1, 300);
  std::vector<double> a(k), b(k);
  double exact = 0;
  for (std::int64_t i = 0; i < k; ++i) {
    a[i] = *rc::gen::inRange(-8, 9);
    b[i] = *rc::gen::inRange(-8, 9);
    exact += a[i] * b[i];
  }
  for (const auto& m : default_models()) RC_ASSERT(static_cast<double>(model_dot(m, a.data(), b.data(), k)) == exact);
}

// With one product per step and enough alignment bits the block model is a plain FMA
// (RNE) when operands share a binade range; and more fraction bits never hurt.
RC_GTEST_PROP(Models, BlockModelConvergesToSequential, ()) {
  const auto k = *rc::gen::inRange<std::int64_t>(1, 64);
  std::vector<double> a(k), b(k);
  for (std::int64_t i = 0; i < k; ++i) {
    a[i] = static_cast<float>(*rc::gen::inRange(-1000000, 1000000) * 0x1p-20);
    b[i] = static_cast<float>(*rc::gen::inRange(-1000000, 1000000) * 0x1p-20);
  }
  const float seq = model_dot({O::SequentialFma, 1, 23, Rounding::NearestEven}, a.data(), b.data(), k);
  const float blk = model_dot({O::BlockFma, 1, 52, Rounding::NearestEven}, a.data(), b.data(), k);
  RC_ASSERT(seq == blk);  // 52 bits hold every product and partial sum of this data exactly
}

TEST(Models, Names) {
  for (const auto& m : default_models()) {
    const auto back = AccumulationModel::parse(m.name());
    ASSERT_TRUE(back.has_value()) << m.name();
    EXPECT_EQ(back->name(), m.name());
  }
  EXPECT_EQ(AccumulationModel::parse("cpu.blockfma:block=8,frac=13,round=rz")->block, 8);
  EXPECT_EQ(AccumulationModel::parse("cpu.fp32_seq:round=rz")->rounding, Rounding::TowardZero);
  EXPECT_FALSE(AccumulationModel::parse("cublas.fp32").has_value());
  auto msg = [](const char* name) {
    try {
      AccumulationModel::parse(name);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(msg("cpu.blockfma:block=0,frac=13"), "kernel 'cpu.blockfma:block=0,frac=13': block must be an integer in [1, 512], got '0'");
  EXPECT_EQ(msg("cpu.blockfma:block=4"), "kernel 'cpu.blockfma:block=4': cpu.blockfma needs block=N and frac=N (e.g. cpu.blockfma:block=16,frac=23,round=rz)");
  EXPECT_EQ(msg("cpu.fp32_seq:block=4"), "kernel 'cpu.fp32_seq:block=4': unknown parameter 'block'");
  EXPECT_EQ(msg("cpu.fp32_seq:round=up"), "kernel 'cpu.fp32_seq:round=up': round must be rne, rna, rz, ru or rd, got 'up'");
  const std::string promoted = "cpu.blockfma:block=16,frac=13,round=rz,promote=128";
  EXPECT_EQ(AccumulationModel::parse(promoted)->promote, 128);
  EXPECT_EQ(AccumulationModel::parse(promoted)->name(), promoted);
  EXPECT_EQ(msg("cpu.blockfma:block=16,frac=13,promote=24"),
            "kernel 'cpu.blockfma:block=16,frac=13,promote=24': promote must be a multiple of block (16)");
  EXPECT_EQ(msg("cpu.fp32_seq:promote=4"), "kernel 'cpu.fp32_seq:promote=4': unknown parameter 'promote'");
}

// Promotion: the block accumulator (13 fraction bits, truncating) restarts from 0 every 4
// products, its sum added to FP32 with one rounding to nearest. 1 then 2^-14: lost in the
// 1's chunk (aligned to 1, 2^-14 is below 13 bits), kept in the next one.
TEST(Models, PromotionRestartsTheBlockAccumulator) {
  const AccumulationModel m = *AccumulationModel::parse("cpu.blockfma:block=2,frac=13,round=rz,promote=4");
  const auto dot = [&](std::vector<double> p) {
    const std::vector<double> ones(p.size(), 1.0);
    return model_dot(m, p.data(), ones.data(), static_cast<std::int64_t>(p.size()));
  };
  EXPECT_EQ(dot({1, 0, 0, 0x1p-14}), 1.0f);
  EXPECT_EQ(dot({1, 0, 0, 0, 0x1p-14}), 1.0f + 0x1p-14f);
  EXPECT_EQ(dot({1, 0, 0, 0, 0x1p-14, 0x1p-14}), 1.0f + 0x1p-13f);  // the new chunk sums them exactly
  // acc0 is the FP32 accumulator the chunks are added to
  const std::vector<double> p = {0x1p-14}, one = {1.0};
  EXPECT_EQ(model_dot(m, p.data(), one.data(), 1, 1.0f), 1.0f + 0x1p-14f);
}

TEST(Models, EpilogueOrderAndOutputRounding) {
  Case c = test_support::gemm_case(1, 1, 1, Format::FP32, Format::BF16);
  c.alpha = 2.0;
  EXPECT_EQ(decode(Format::BF16, model_epilogue(c, 1.5f, 0, 0)), 3.0);
  c.epilogue = Epilogue::BiasRelu;
  c.types["bias"] = Format::FP32;
  EXPECT_EQ(decode(Format::BF16, model_epilogue(c, 1.5f, 0, -5.0)), 0.0);
  c.epilogue = Epilogue::Gelu;
  EXPECT_EQ(decode(Format::BF16, model_epilogue(c, 0.5f, 0, 0)), round_to(Format::BF16, static_cast<float>(0.5 * 1.0 * (1 + std::erf(1 / std::sqrt(2.0))))));
  c = test_support::gemm_case(1, 1, 1, Format::E4M3, Format::E4M3);
  c.scales = {{"D", 0.5}};
  EXPECT_EQ(model_epilogue(c, 2000.0f, 0, 0), 0x7Eu);  // 1000 saturates to 448 for FP8 outputs
}

// A narrower accumulator (out=N): each step's exact sum is rounded to N fraction bits below
// its own leading bit, not FP32's 23; the alignment width (frac) is separate. 1 + 0.4375 =
// 1.0111b: three bits keep 1.011 (toward zero) or tie up to 1.100 (nearest even); a carry
// past the leading term (1.5 + 1.5 + 0.125 = 3.125 = 11.001b) loses the 2^-3 bit the
// alignment kept.
TEST(Models, NarrowAccumulatorRoundsEachStepsSum) {
  const auto m = [](const char* name) { return *AccumulationModel::parse(name); };
  EXPECT_EQ(dot(m("cpu.blockfma:block=2,frac=30,round=rz,out=3"), {1.0, 0.4375}), 1.375f);
  EXPECT_EQ(dot(m("cpu.blockfma:block=2,frac=30,round=rne,out=3"), {1.0, 0.4375}), 1.5f);
  EXPECT_EQ(dot(m("cpu.blockfma:block=2,frac=30,round=rz"), {1.0, 0.4375}), 1.4375f);
  EXPECT_EQ(dot(m("cpu.blockfma:block=3,frac=3,round=rz"), {1.5, 1.5, 0.125}), 3.125f);
  EXPECT_EQ(dot(m("cpu.blockfma:block=3,frac=3,round=rz,out=3"), {1.5, 1.5, 0.125}), 3.0f);
  EXPECT_EQ(dot(m("cpu.blockfma:block=3,frac=3,round=rz,out=3"), {-1.5, -1.5, -0.125}), -3.0f);  // toward zero
  EXPECT_EQ(dot(m("cpu.blockfma:block=3,frac=3,round=rd,out=3"), {-1.5, -1.5, -0.125}), -3.25f);  // grid 2^-2 below 2^1
  // Step by step: the 13-bit accumulator fed to the next step loses what a 23-bit one keeps.
  EXPECT_EQ(dot(m("cpu.blockfma:block=1,frac=30,round=rz,out=13"), {1.0, 0x1p-14}), 1.0f);
  EXPECT_EQ(dot(m("cpu.blockfma:block=1,frac=30,round=rz"), {1.0, 0x1p-14}), 1.0f + 0x1p-14f);
  for (const char* round_trip : {"cpu.blockfma:block=16,frac=25,round=rz,promote=32,align=fp16,interleave=2",
                                 "cpu.blockfma:block=32,frac=13,round=rz,align=e4m3/e5m2,out=13"})
    EXPECT_EQ(AccumulationModel::parse(round_trip)->name(), round_trip);
  const std::string name = "cpu.blockfma:block=32,frac=13,round=rz,promote=128,align=e4m3,out=13";
  EXPECT_EQ(AccumulationModel::parse(name)->name(), name);
  EXPECT_THROW(AccumulationModel::parse("cpu.blockfma:block=32,frac=13,out=24"), InputError);
}
