// Generating a case's inputs: the entry point the runner calls.
//
// Every value is a pure function of (case seed, operand stream, LOGICAL coordinates): the
// element op(A)[b][i][k] gets the same value whatever the layout, transposes, leading
// dimensions or attention layout, so metamorphic tests ((AB)^T = B^T A^T) and layout fuzzing
// compare like with like. Values are drawn in FP64 and rounded (RNE, IEEE overflow) to the
// operand's format: the reference sees exactly the bits the kernel sees.
//
// Logical coordinates, linear index (row-major over them) and feature ("channel") axis:
//   A     op(A)[b][i][k]      index (b*M + i)*K + k        channel k
//   B     op(B)[b][k][j]      index (b*K + k)*N + j        channel k
//   C     C[b][i][j]          index (b*M + i)*N + j        channel j
//   bias  bias[j]             index j                      channel j
//   Q,K   X[b][h][s][d]       index ((b*H + h)*S + s)*D + d channel d
//   V     V[b][h][s][d]       same, D = head_dim_v          channel d
// Reduction axis (softmax normalisation, weights' default fan_in): k for A and B, d for Q
// and K, s for V, the last axis for C and bias.
//
// Streams (rng.hpp): stream word = operand | draw << 8 | sub-stream << 16, with operand
//   A = 1, B = 2, C = 3, bias = 4, Q = 5, K = 6, V = 7
// and draw 0 the element's main bits, 1 modifiers (outliers, specials), 2 a third uniform,
// 3..252 rejection-sampling retries, 254 GenDot pairs (sub-stream = pair number, counter =
// 2i, 2i+1 for entry i), 255 per-line draws (counter = channel, row, column or batch).
//
// Padding elements (leading-dimension gaps) hold padding_poison(format), a NaN, so a
// kernel that reads padding shows it. amax on an FP8 operand writes case.scales[operand]:
// the stored value times the scale is the intended value, as cuBLASLt's A/B scale pointers.
// On any other operand amax stores its base unscaled and writes no scale (scales are
// FP8-only, core/case.hpp's takes_scale).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "distributions/sampling.hpp"
#include "distributions/spec.hpp"
#include "core/case.hpp"
#include "core/tensor.hpp"

namespace ulpgate {

inline constexpr std::uint32_t kStreamA = 1, kStreamB = 2, kStreamC = 3, kStreamBias = 4,
                               kStreamQ = 5, kStreamK = 6, kStreamV = 7;

/// The operand stream of "A", "B", "C", "bias", "Q", "K" or "V"; throws InputError otherwise.
std::uint32_t operand_stream(std::string_view operand);

/// The NaN written into padding: a quiet NaN with payload 0x5A5A... (FP64/FP32/TF32/FP16/
/// BF16/E5M2), distinct from the canonical NaN; E4M3 has one NaN per sign, so -NaN (0xFF).
Code padding_poison(Format f);

/// Generates every input of the case (c.inputs()): each tensor has the operand's full
/// storage size (batches, leading-dimension padding) in its format. Specs come from c.dist
/// (kDefaultDist when absent). May write c.scales (amax, FP8 operands) and c.attention.kv_lengths
/// (masked). Throws InputError for a bad spec or one that does not fit the case; the message
/// names the operand, e.g. `case.dist.A: dist "normal(0,)": empty argument 2`.
std::map<std::string, Tensor> fill_inputs(Case& c);

/// The exact-by-construction bound used by exact(max=0): the largest power of two m such
/// that m is exact in the operand format and reduction_length * m^2 <= 2^p, p the smaller
/// precision of the output and compute formats (GEMM: D and compute; attention: compute),
/// so every partial sum of products is an integer below 2^p: exact in the accumulator and
/// the output. At least 1 (then exactness needs reduction_length <= 2^p).
double exact_auto_max(const Case& c, std::string_view operand);

/// out[i - begin] = sampling::sample_core(s, seed, stream, i, (i / channel_stride) % channels)
/// for i in [begin, end): the loop fill_inputs draws with. Where the CPU has FMA instructions it
/// runs a copy built with them (std::fma inline instead of a library call) unless allow_fma
/// is false; the bits are the same either way (tests/distributions/test_fill.cpp).
void sample_core_range(const sampling::Sampler& s, std::uint64_t seed, std::uint32_t stream, std::int64_t begin,
                       std::int64_t end, std::int64_t channel_stride, std::int64_t channels, double* out,
                       bool allow_fma = true);

}  // namespace ulpgate
