// The tensor-core instructions as probe units (kernels/probe/mma_unit.hpp) on the device
// (label gpu: skips without a device of compute capability 8.9 or more):
//  - the fragments pair a_i with b_i: small-integer dot products, exact at any width, come
//    back exact (a wrong register layout pairs other elements and misses);
//  - the probe infers a block-FMA model of each instruction that reproduces the hardware
//    bit for bit on 100,000 random dot products (normal, cancelling, subnormal inputs);
//  - FP8 on sm_90 is two interleaved FP16 steps per instruction.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "core/tensor.hpp"
#include "campaign/probe.hpp"
#include "kernels/probe/mma_unit.hpp"

using namespace ulpgate;

TEST(MmaUnitGpu, FragmentsPairEveryFactorWithItsPartner) {
  if (!mma_available()) GTEST_SKIP() << "no CUDA device of compute capability 8.9 or more";
  for (const MmaInstruction& inst : mma_instructions()) {
    if (inst.warpgroup && !wgmma_available()) continue;  // wgmma: compute capability 9.0 only
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
  for (const MmaInstruction& inst : mma_instructions()) {
    if (inst.warpgroup && !wgmma_available()) continue;  // wgmma: compute capability 9.0 only
    const auto [dot, batch] = mma_unit(inst.name);
    const ProbedAccumulation p = probe_unit(dot, batch);
    ASSERT_TRUE(p.known()) << inst.name << ": " << p.describe();
    std::printf("%s: %s\n", inst.name.c_str(), p.model(inst.input).name().c_str());
    const BatchValidation v = validate_batched(p, batch, inst.input, 100000, 3);
    EXPECT_EQ(v.total(), 100000) << inst.name;
    std::printf("%s: %s; %lld normal, %lld cancelling, %lld subnormal dot products agree\n", inst.name.c_str(),
                p.describe().c_str(), static_cast<long long>(v.normal), static_cast<long long>(v.cancelling),
                static_cast<long long>(v.subnormal));
  }
}

// On sm_90 the FP8 instructions run as two FP16 m16n8k16 steps of interleaved pairs of
// products, from 0, added to the accumulator in FP32 (the compiler's code; the probe finds
// the same structure from its experiments above).
TEST(MmaUnitGpu, Fp8InstructionsAreTwoInterleavedFp16Steps) {
  if (!mma_available()) GTEST_SKIP() << "no CUDA device of compute capability 8.9 or more";
  for (const char* name : {"mma.e4m3", "mma.e5m2"}) {
    const MmaInstruction& inst = *find_mma_instruction(name);
    if (!mma_converts_inputs(inst)) GTEST_SKIP() << "not compute capability 9.x: native FP8 instructions";
    const auto [dot, batch] = mma_unit(name);
    const ProbedAccumulation p = probe_unit(dot, batch);
    EXPECT_EQ(p.model(inst.input).name(), "cpu.blockfma:block=16,frac=25,round=rz,promote=32,align=fp16,interleave=2") << name;
  }
}
