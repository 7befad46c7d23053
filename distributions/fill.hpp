// Generating a case's inputs: the entry point the runner calls.
//
// Every value is a pure function of (case seed, operand stream, LOGICAL coordinates), never of
// the memory layout, so layout fuzzing and the transposition relation compare like with like;
// it is drawn in FP64 and rounded once to the operand's format, the bits the reference reads.
// Coordinates, streams, draw numbers and padding: see docs/concepts/cases.md.
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
                               kStreamQ = 5, kStreamK = 6, kStreamV = 7,
                               kStreamDO = 8, kStreamOPart = 9, kStreamLsePart = 10;

/// The operand stream of "A", "B", "C", "bias", "Q", "K", "V", "dO", "O_part" or "LSE_part";
/// throws InputError otherwise.
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
