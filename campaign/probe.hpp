// The accumulation probe: known-answer dot products that make each property of a matrix
// unit's FP32 accumulation observable in the result's bits (block size, fraction bits kept
// after alignment, rounding, promotion length), after Fasi, Higham, Mikaitis and Pranesh
// (2021), in the block-FMA model of cpu.blockfma (kernels/emulated/gemm_models.hpp). The
// experiments and why each one works are in docs/concepts/probe.md.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/format.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

/// The unit under probe: sum_i p_i accumulated its way from 0, the products given exactly
/// (each a product of two inputs of the unit's formats, chosen by the caller's adapter).
using ProbeDot = std::function<float(std::span<const double> products)>;

struct ProbedAccumulation {
  int block = 0;                    ///< products per step
  /// Fraction bits kept after alignment; nullopt: at least frac_at_least (48 or 60 where
  /// the experiments' products hold no more; 23 for one product per step rounding to
  /// nearest-away, whose width is not probed).
  std::optional<int> frac;
  int frac_at_least = 0;
  /// The accumulator's rounding; nullopt: not observable (a width so narrow that the
  /// block's terms never sum past FP32's 24 bits: 2^(24 - frac) needs more terms than
  /// a step, or two steps, hold).
  std::optional<Rounding> rounding;
  /// Products per promotion of the partial sum to FP32; 0: none seen up to max_promote
  /// (or not observable: frac >= 23).
  int promote = 0;
  /// Random dot products on which the inferred model (kernels/emulated/gemm_models.hpp) gave
  /// the unit's result bit for bit (probe_accumulation throws if one differs).
  int validated = 0;
  /// The experiments ran at 2^scale_exponent (narrow formats: see probe_accumulation).
  int scale_exponent = 0;
  /// Products aligned by their factors' exponents (AccumulationModel::align_inputs);
  /// nullopt: not probed (probe_alignment needs a batch unit and a known width).
  std::optional<bool> align_inputs;
  /// The rounding is moot: no step's sum needs it (rounding then says toward zero).
  bool rounding_moot = false;
  /// Fraction bits of each step's result (AccumulationModel::out_bits): 23 (FP32's) unless
  /// a one-step sum that needs fewer bits than the width keeps comes back short.
  int out = 23;
  /// Each chunk of `promote` products dealt to its steps in groups of this many
  /// (AccumulationModel::interleave; 0: in order), seen in the block experiment as a tiny
  /// term lost again after it was first kept.
  int interleave = 0;
  /// The format whose exponent fields align the factors, where the unit converts its inputs
  /// first (FP8 mma.sync on sm_90 runs as FP16: E4M3 subnormals are FP16 normals); nullopt:
  /// the input format.
  std::optional<Format> align_format;
  /// The unit's accumulator format (ProbeBatch::accumulator): FP32, or FP16.
  Format accumulator = Format::FP32;
  std::string describe() const;
  /// Every parameter known (a width, or at least 48 bits, and a rounding): model() then
  /// stands for the unit.
  bool known() const { return (frac || frac_at_least >= 48) && rounding.has_value(); }
  /// The block-FMA model of these parameters (52 fraction bits for "at least 48", toward
  /// zero for an unknown rounding), aligned by the factors' exponents in `input` where
  /// align_inputs says so.
  AccumulationModel model(Format input) const;     ///< "block 4, 23 fraction bits, rz"
};

/// a = x, b = y with a b = p exactly, both normal finite values of `input` (so that no
/// unit's handling of subnormal inputs enters the experiments); nullopt where there is no
/// such pair. p is split into an odd integer M and a power of two; M into two factors that
/// fit the format's significand (trial division), the power between them.
std::optional<std::pair<double, double>> split_product(double p, Format input);

/// A GEMM kernel as a unit under probe: each dot product is D[0][0] of an mn x mn x K case
/// (row 0 of op(A) and column 0 of op(B) its factors, zeros elsewhere) with A and B in
/// `input` (FP32: A the products, B ones; otherwise each product split by split_product),
/// D FP32, alpha 1, beta 0, in the first layout and transpose the kernel takes, run in this
/// process (check/runner.hpp). Throws InputError when the kernel takes no such case,
/// std::runtime_error when a run fails, std::logic_error for a product the format cannot make.
ProbeDot kernel_unit(Kernel& kernel, Format input = Format::FP32, std::int64_t mn = 1);

/// A unit that takes many dot products at once, each given by its factors (exact values of
/// the unit's input format): a[d k + i] x b[d k + i] for dot d in [0, dots); K a multiple
/// of `step` (the unit's own k: an instruction's; the caller pads with zero factors).
struct ProbeBatch {
  Format input = Format::FP32;  ///< the format of the factors
  /// The format the unit converts the factors to before it multiplies them (FP8 mma.sync on
  /// sm_90: FP16; kernels/probe/mma_unit.hpp mma_converts_inputs); nullopt: none.
  std::optional<Format> converts_to;
  /// The unit's accumulator (C and D) format: FP32, or FP16 (mma.f16.f16acc); its results
  /// come back widened to FP32 exactly.
  Format accumulator = Format::FP32;
  int step = 1;
  std::function<std::vector<float>(const std::vector<double>& a, const std::vector<double>& b, std::int64_t dots,
                                   std::int64_t k)>
      run;
};

/// A tensor-core instruction (kernels/probe/mma_unit.hpp) as a unit: one dot product at a
/// time (its products split by split_product, zero padded to the instruction's k) and in
/// batches. Throws InputError for an unknown instruction name.
std::pair<ProbeDot, ProbeBatch> mma_unit(const std::string& instruction);

/// Whether the unit aligns products by their factors' exponents (AccumulationModel::
/// align_inputs): (1.5 x 1.5), (-1.5 x 1.5) and 2^-frac in one step (at the experiments'
/// scale) leave 2^-frac when aligned by the exponent sum 0 and nothing when aligned by the
/// product 2.25's leading bit 1. nullopt: not observable (width unknown, blocks of fewer
/// than 3, or terms the format cannot make). Throws std::runtime_error for another result.
std::optional<bool> probe_alignment(const ProbedAccumulation& p, const ProbeBatch& unit);

/// A unit with both interfaces probed: the experiments (probe_accumulation, not validated),
/// the alignment (probe_alignment) and the alignment format (the batch's converts_to).
ProbedAccumulation probe_unit(const ProbeDot& dot, const ProbeBatch& batch, int max_block = 512, int max_promote = 4096);

/// Random dot products checked against the probed model bit for bit, by class.
struct BatchValidation {
  std::int64_t normal = 0;       ///< normal inputs of both signs, exponents in [-4, 4]
  std::int64_t cancelling = 0;   ///< the second half the first half negated, one factor perturbed
  std::int64_t subnormal = 0;    ///< a quarter of the inputs subnormal in the input format
  std::int64_t total() const { return normal + cancelling + subnormal; }
};
/// One launch's worth of the random dot products below: `ids.size()` dots of `k` products
/// (a multiple of the unit's step; dot j's factors a[j k + q], b[j k + q], zero past
/// length[j]), each of a class (0 normal, 1 cancelling, 2 subnormal).
struct RandomDotBatch {
  std::int64_t k = 0;
  std::vector<double> a, b;
  std::vector<std::int64_t> ids, length;
  std::vector<int> cls;
};
/// Dots 0 .. dots-1 of the validation's random stream (lengths 1 .. span, classes as in
/// BatchValidation, factors exact in `input`), grouped by length padded to `step`.
void for_each_random_batch(Format input, std::int64_t dots, std::int64_t span, std::int64_t step, std::uint64_t seed,
                           const std::function<void(const RandomDotBatch&)>& f);

/// `dots` random dot products of K up to max(8 block, 3 promote) + 7 (rounded up to the
/// unit's step, zero factors appended for both) through `unit` and the block-FMA model of
/// `p` (which must be fully known: frac or at least 48 bits, and the rounding). Throws
/// std::runtime_error naming the first dot product on which they differ.
BatchValidation validate_batched(const ProbedAccumulation& p, const ProbeBatch& unit, Format input, std::int64_t dots,
                                 std::uint64_t seed = 1);

/// The unit's results on `dots` random dot products (lengths 1 .. span) written to `path`
/// (`ulpgate probe --dump DIR` names it DIR/UNIT.dots, characters other than letters,
/// digits, '.', '_' and '-' of the unit's name made '_')
/// for offline study of a unit no model describes yet: a text line
/// "ulpgate-dots 1 unit=U input=F step=S seed=N span=L", then per dot, little-endian:
/// uint32 length k, uint32 class, uint32 the result's FP32 bits, then k storage words of
/// a and k of b, each the input format's code (core/format.hpp) in as many bytes as its
/// width needs (TF32's 19-bit codes in 3). Returns the count.
std::int64_t dump_batched(const ProbeBatch& unit, const std::string& unit_name, std::int64_t dots, std::int64_t span,
                          const std::string& path, std::uint64_t seed = 1);

/// A dump read back: the unit's name, input format and step, and each dot's factors (exact
/// values, zero padding not stored), class and result. Throws InputError naming the problem
/// for a file that is not a whole dump.
struct DumpedDot {
  std::vector<double> a, b;
  int cls = 0;
  float result = 0;
};
struct DotDump {
  std::string unit;
  Format input = Format::FP32;
  int step = 1;
  std::vector<DumpedDot> dots;
};
DotDump read_dots(const std::string& path);

/// A GEMM kernel as a batch unit: up to mn dot products per mn x mn x K case, dot d in
/// D[d][d] (row d of op(A) and column d of op(B) its factors), K a multiple of 16.
ProbeBatch kernel_batch(Kernel& kernel, Format input = Format::FP32, std::int64_t mn = 1);

/// Runs the experiments above on `dot`, trying blocks up to max_block and promotion
/// lengths up to max_promote, and validates the result on `validate` random dot products.
/// input: the format the unit's products come from. For FP32 the experiments are as above.
/// For narrower formats every product must be a product of two normal values of the
/// format: the tiny term of the block experiment is the smallest such power of two (2^-28
/// for FP16 and E5M2, 2^-12 for E4M3; BF16 and TF32 reach 2^-100), which also bounds the
/// widths observed; an experiment whose terms the format cannot make is left unobserved
/// (the rounding, typically: its terms 2 - 2^-w need w + 1 significant bits); validation
/// draws products of random pairs of the format's values.
/// Throws std::runtime_error for a unit the block-FMA model does not describe.
ProbedAccumulation probe_accumulation(const ProbeDot& dot, int max_block = 512, int max_promote = 4096,
                                      int validate = 1000, Format input = Format::FP32,
                                      Format accumulator = Format::FP32);

}  // namespace ulpgate
