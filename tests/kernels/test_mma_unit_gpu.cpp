// The tensor-core instructions as probe units (kernels/probe/mma_unit.hpp) on the device
// (label gpu: skips without a device of compute capability 8.9 or more):
//  - the fragments pair a_i with b_i: small-integer dot products, exact at any width, come
//    back exact (a wrong register layout pairs other elements and misses);
//  - the probe infers a block-FMA model of each instruction that reproduces the hardware
//    bit for bit on 100,000 random dot products (normal, cancelling, subnormal inputs).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "core/tensor.hpp"
#include "harness/probe.hpp"
#include "kernels/probe/mma_unit.hpp"

using namespace ulpgate;

TEST(MmaUnitGpu, FragmentsPairEveryFactorWithItsPartner) {
  if (!mma_available()) GTEST_SKIP() << "no CUDA device of compute capability 8.9 or more";
  for (const MmaInstruction& inst : mma_instructions()) {
    const Format stored = inst.input == Format::TF32 ? Format::FP32 : inst.input;
    const std::int64_t dots = 64, k = 3 * inst.k;
    std::vector<std::uint32_t> a(static_cast<std::size_t>(dots * k)), b(a.size());
    std::vector<double> want(static_cast<std::size_t>(dots), 0.0);
    for (std::int64_t d = 0; d < dots; ++d)
      for (std::int64_t i = 0; i < k; ++i) {
        const RandomBlock r = random_block(5, 1, static_cast<std::uint64_t>(d * k + i));
        // small integers and halves, as the format holds them (E5M2 rounds 4.5)
        const double x = static_cast<double>(static_cast<int>(r.w[0] % 7) - 3),
                     y = decode(stored, encode(stored, static_cast<double>(static_cast<int>(r.w[1] % 9) - 4) + (i % 2) * 0.5));
        a[static_cast<std::size_t>(d * k + i)] = static_cast<std::uint32_t>(code_to_storage(stored, encode(stored, x)));
        b[static_cast<std::size_t>(d * k + i)] = static_cast<std::uint32_t>(code_to_storage(stored, encode(stored, y)));
        want[static_cast<std::size_t>(d)] += x * y;
      }
    const std::vector<float> got = mma_dots(inst, a, b, dots, k);
    for (std::int64_t d = 0; d < dots; ++d)
      EXPECT_EQ(static_cast<double>(got[static_cast<std::size_t>(d)]), want[static_cast<std::size_t>(d)]) << inst.name << " dot " << d;
  }
}

TEST(MmaUnitGpu, ProbedModelsReproduceEveryInstructionBitForBit) {
  if (!mma_available()) GTEST_SKIP() << "no CUDA device of compute capability 8.9 or more";
  for (const char* name : {"mma.f16", "mma.bf16", "mma.tf32"}) {
    const MmaInstruction& inst = *find_mma_instruction(name);
    const auto [dot, batch] = mma_unit(inst.name);
    ProbedAccumulation p = probe_accumulation(dot, 512, 4096, 0, inst.input);
    p.align_inputs = probe_alignment(p, batch);
    ASSERT_TRUE(p.known()) << inst.name << ": " << p.describe();
    const BatchValidation v = validate_batched(p, batch, inst.input, 100000, 3);
    EXPECT_EQ(v.total(), 100000) << inst.name;
    std::printf("%s: %s; %lld normal, %lld cancelling, %lld subnormal dot products agree\n", inst.name.c_str(),
                p.describe().c_str(), static_cast<long long>(v.normal), static_cast<long long>(v.cancelling),
                static_cast<long long>(v.subnormal));
  }
}

// The FP8 instructions (m16n8k32) are not one block-FMA step per instruction: the probe's
// experiments read them as steps of 2 products with 25 fraction bits, and that model misses
// on random dot products (a finding, docs/results/probe_h200.md). When a model reproduces
// them, this test fails and the model moves to the test above.
TEST(MmaUnitGpu, Fp8InstructionsAreNotAPlainBlockFma) {
  if (!mma_available()) GTEST_SKIP() << "no CUDA device of compute capability 8.9 or more";
  for (const char* name : {"mma.e4m3", "mma.e5m2"}) {
    const auto [dot, batch] = mma_unit(name);
    ProbedAccumulation p = probe_accumulation(dot, 512, 4096, 0, batch.input);
    p.align_inputs = probe_alignment(p, batch);
    if (p.known())
      EXPECT_THROW(validate_batched(p, batch, batch.input, 100000, 3), std::runtime_error) << name << ": " << p.describe();
    // Hypotheses, reported (not asserted): the instruction's 32 products summed exactly in
    // pairs, then one block-FMA step of the 16 pair sums and the accumulator.
    for (const int block : {32, 16, 8})
      for (const int frac : {23, 24, 25, 26}) {
        ProbedAccumulation h;
        h.block = block, h.frac = frac, h.rounding = Rounding::TowardZero, h.pairs = true;
        try {
          const BatchValidation v = validate_batched(h, batch, batch.input, 20000, 5);
          std::printf("%s: pairs, block %d, frac %d, rz: agrees on %lld dot products\n", name, block, frac,
                      static_cast<long long>(v.total()));
        } catch (const std::runtime_error& e) {
          std::printf("%s: pairs, block %d, frac %d, rz: %s\n", name, block, frac, std::string(e.what()).substr(0, 160).c_str());
        }
      }
  }
}
