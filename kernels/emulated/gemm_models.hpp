// CPU models of how GEMM hardware accumulates (sequential FMA, pairwise, block FMA with
// optional promotion): they run everywhere (CI included) and give the expected bits of a
// kernel that accumulates a known way, so checks can hold such a kernel to exactly those
// bits. Each model's arithmetic, its inputs and the FP32 epilogue order: see
// docs/kernels/cpu-models.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/format.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

struct AccumulationModel {
  enum class Order { SequentialFma, Pairwise, BlockFma };
  Order order = Order::SequentialFma;
  int block = 1;       ///< BlockFma: products added to the accumulator in one step (1..512)
  int frac_bits = 23;  ///< BlockFma: fraction bits kept after alignment (1..52)
  Rounding rounding = Rounding::NearestEven;  ///< rounding of the FP32 accumulator
  /// BlockFma: every `promote` products (a multiple of block) the block accumulator is
  /// added to an FP32 accumulator (round to nearest even) and restarts from 0, as FP8
  /// tensor-core GEMMs promote partial sums to CUDA cores; 0: never.
  int promote = 0;
  /// BlockFma: a product is aligned by the sum of its factors' exponent fields in
  /// align_format (a subnormal factor counts as that format's smallest normal exponent), not
  /// by its own leading bit (one more, where the significands' product is 2 or more): frac_bits
  /// below that exponent keep one more bit of such products. The H200's mma.sync does this
  /// (the probe, docs/results/probe_h200.md); the accumulator's exponent in the alignment is
  /// its exponent field's, at least -126 (FP32's smallest normal) when it is zero or
  /// subnormal, so nothing below 2^(-126 - frac_bits) is kept. Name: ",align=fp16" (the
  /// input format).
  bool align_inputs = false;
  Format align_format = Format::FP32;
  /// B's format for the alignment where it is not A's (mixed FP8 GEMMs); nullopt: A's.
  /// Name: ",align=e4m3/e5m2".
  std::optional<Format> align_format_b{};
  /// BlockFma: fraction bits of the step's result (1..23): the exact sum is rounded with
  /// `rounding` to out_bits bits below its own leading bit before it is stored as FP32 (and
  /// fed to the next step), as Hopper's FP8 tensor cores keep an e8m13 accumulator
  /// (Khattak and Mikaitis 2025); 23: FP32's own precision. Name: ",out=13".
  int out_bits = 23;
  /// BlockFma with promote: each chunk of `promote` products is dealt to its promote/block
  /// steps in groups of `interleave` products, round robin (0: in order). The H200 runs
  /// mma.sync m16n8k32 FP8 as two FP16 m16n8k16 (the compiler's code: F2FP.F16.E4M3 then
  /// HMMA.16816 from C = 0, then FADD to the accumulator), the first of k = 0,1, 4,5, ...,
  /// 28,29 and the second of the rest: block=16,promote=32,interleave=2. Name:
  /// ",interleave=2".
  int interleave = 0;
  /// BlockFma: the format each step's result is rounded to and kept in (the accumulator
  /// registers): FP32, or FP16 for FP16-accumulating tensor cores (mma.sync .f16.f16.f16.f16).
  /// With align_inputs the accumulator's exponent takes part in the alignment at no less
  /// than this format's smallest normal exponent. Name: ",acc=fp16".
  Format acc_format = Format::FP32;
  /// SequentialFma: K cut into split_k contiguous parts, each accumulated from 0, the
  /// partial sums then added in order in FP32 (round to nearest even), as split-K kernels
  /// reduce their slices. Name: ":splitk=4".
  int split_k = 1;
  /// TF32 compute: how A and B are rounded to TF32 first (cvt.rna: to nearest, ties away).
  /// Name: ",in=rz".
  Rounding input_rounding = Rounding::NearestAway;
  /// With a bias or a GELU: alpha acc + beta C rounded to D's format before the bias is
  /// added or the GELU applied, as cuBLASLt does for a 16-bit D. Name: ":epi=rounded".
  bool epilogue_rounded = false;

  /// Kernel name: "cpu.fp32_seq", "cpu.fp32_pairwise", "cpu.blockfma:block=16,frac=13,round=rz"
  /// (",promote=N" when promoting; sequential and pairwise add ":round=rz" etc. when not RNE).
  std::string name() const;
  /// Parses a name as above; nullopt if it is not a model name. Throws InputError for a
  /// model name with bad parameters.
  static std::optional<AccumulationModel> parse(const std::string& name);
};

/// AccumulationModel::interleave's dealing: the position in the dot product (the unit's
/// order) of the product that is q-th in step order (chunk q / promote, step (q % promote) /
/// block, j-th product of that step); q itself where interleave is 0.
std::int64_t interleaved_position(std::int64_t q, int block, int promote, int interleave);

/// The dot product sum_k a[k] b[k] accumulated under the model, starting from acc0.
float model_dot(const AccumulationModel& m, const double* a, const double* b, std::int64_t k,
                float acc0 = 0.0f);

/// The FP32 epilogue above, and the final rounding to D's format; rounded_before_bias: with
/// a bias or a GELU, alpha acc + beta C rounded to D's format before the bias or the GELU.
Code model_epilogue(const Case& c, float acc, double c_value, double bias_value, bool rounded_before_bias = false);

/// A host GEMM kernel that computes the case under the model.
std::unique_ptr<Kernel> make_emulated_gemm(const AccumulationModel& m);

/// The models registered by default.
std::vector<AccumulationModel> default_models();

}  // namespace ulpgate
