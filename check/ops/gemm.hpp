// The GEMM op: dtypes, generator, tolerance terms, comparison with the exact reference,
// metamorphic relations (A scaled by 2, the transposed problem), and the sweep's precision
// calibrator. When each relation applies and why: see docs/concepts/relations.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "check/ops/op.hpp"

namespace ulpgate {

/// A GEMM case for a named input type: fp64, fp32 and fp16/bf16 (D fp32, compute fp32),
/// tf32 (FP32 data, compute tf32), e4m3 / e5m2 (B e4m3 for e5m2: cuBLASLt has no
/// E5M2 x E5M2); row-major with B stored N x K (the FP8 "TN" form), D fp32 unless
/// out is given. Throws InputError for an unknown name.
Case dtype_gemm_case(std::string_view dtype, std::int64_t m, std::int64_t n, std::int64_t k,
                     std::optional<Format> out = std::nullopt);

/// The GEMM module (op_module(Op::Gemm)).
const OpModule& gemm_module();

/// batch x M x N x K up to which the precision rule's scale and the effective-bits
/// calibrator (each an O(M N K) pass on the CPU) cover every element of D; past it, a
/// sample of about this many terms (beyond every fuzz regime: 2^27).
inline constexpr double kPrecisionTerms = 0x1p28;
/// The elements of D (rows x cols, the same in every batch) that the precision rule and the
/// calibrator cover: every one up to kPrecisionTerms; past it the rows that the budget
/// affords with every column, at least 16, and when 16 full rows are too many, the columns
/// it affords with those rows, at least 64. Either sample holds the first two, the last
/// four, both sides of the last 64- and 128-wide tile boundaries, and indices spread evenly
/// (offset by the case's seed). Other elements have no precision scale: the tolerance bound
/// alone judges them.
struct PrecisionSample {
  std::vector<std::int64_t> rows, cols;  ///< sorted
  bool all(const GemmShape& g) const {
    return static_cast<std::int64_t>(rows.size()) == g.m && static_cast<std::int64_t>(cols.size()) == g.n;
  }
};
PrecisionSample precision_sample(const Case& c);

/// The transposed problem on the same memory: D^T = op(B)^T op(A)^T in the other layout,
/// A and B (types, scales, leading dimensions) swapped, no distributions (the inputs are
/// given: B's tensor as A, A's as B). For cases without a bias (it runs along D's columns).
Case transposed_gemm_case(const Case& c);

/// The comparison of a GEMM case's transposed problem (check/ops/gemm.cpp: other layout,
/// A and B swapped, no bias) built from the case's own: every per-element vector moved from
/// (b, i, j) to (b, j, i), shape {batch, N, M}. The transposition relation judges against it
/// instead of computing the same exact sums again.
OutputComparison transposed_reference(const OutputComparison& cmp);

inline constexpr int kCalibrationBits = 32;  // n 2^-32 << 1 for every K we sweep

/// v rounded to nearest (ties to even) at `bits` significant bits (1..52; 53 and more: v),
/// relative to v's own exponent, with no exponent range below (a subnormal keeps `bits`
/// bits): ldexp(nearbyint(ldexp(v, bits - 1 - ilogb(v))), ilogb(v) - bits + 1).
double round_to_bits(double v, int bits);

/// sum_k a[k] b[k] accumulated sequentially, each partial sum rounded to nearest (ties to
/// even) at `bits` bits of precision (2..52): the sweep's calibrator (docs/concepts/sweeps.md).
double calibration_dot(const double* a, const double* b, std::int64_t k, int bits);

}  // namespace ulpgate
