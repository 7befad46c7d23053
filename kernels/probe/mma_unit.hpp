// Tensor-core instructions as units under probe: a warp runs a chain of one
// mma.sync instruction over a dot product, row 0 of A and column 0 of B holding its
// factors (every other element zero) and the accumulator fed back as C from one
// instruction to the next, as a GEMM's main loop does; D[0][0] is the result.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/format.hpp"

namespace ulpgate {

struct MmaInstruction {
  std::string name;  ///< "mma.f16": the probe's name for it
  std::string ptx;   ///< "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
  Format input;      ///< the format of A and B
  int k;             ///< products per instruction (per D element)
  Format accumulator = Format::FP32;  ///< C and D: FP32, or FP16 (mma.f16.f16acc)
  /// A Hopper warpgroup instruction (wgmma.mma_async m64n8kK, sm_90a): four warps, A from
  /// registers, B from shared memory through a matrix descriptor.
  bool warpgroup = false;
};

/// The instructions built in: FP16, BF16 (m16n8k16), TF32 (m16n8k8), E4M3 and E5M2
/// (m16n8k32; sm_89 and later) with FP32 accumulation, and FP16 with FP16 accumulation
/// (mma.f16.f16acc: D[0][0] widened to FP32 exactly); wgmma.f16, .bf16, .tf32, .e4m3,
/// .e5m2 (m64n8kK, FP32 accumulation; sm_90a).
const std::vector<MmaInstruction>& mma_instructions();
const MmaInstruction* find_mma_instruction(const std::string& name);

/// Whether this machine can run the warpgroup instructions (compute capability 9.0; the
/// code is sm_90a's, so a build without 90a among its architectures gives NaN).
bool wgmma_available();

/// Whether this build and machine can run them (CUDA, a device of compute capability 8.9
/// or more).
bool mma_available();

/// The format this device's code converts the instruction's inputs to before a tensor-core
/// instruction of that format, where it does: FP16 for the FP8 instructions on compute
/// capability 9.x (the sm_90a code is F2FP.F16.E4M3.UNPACK_B / .E5M2 then two
/// HMMA.16816.F32 from C = 0 and an FADD into the accumulator, cuobjdump of this file's
/// kernels, docs/results/probe_h200.md); nullopt otherwise.
std::optional<Format> mma_converts_inputs(const MmaInstruction& inst);

/// D[0][0] of `dots` chains of the instruction: dot d's factors are a[d k + i] and
/// b[d k + i] (storage words of the instruction's input format, TF32 as FP32 words), k a
/// multiple of the instruction's k. Throws std::runtime_error on a CUDA error or without
/// a device.
std::vector<float> mma_dots(const MmaInstruction& inst, const std::vector<std::uint32_t>& a,
                            const std::vector<std::uint32_t>& b, std::int64_t dots, std::int64_t k);

}  // namespace ulpgate
