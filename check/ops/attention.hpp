// The attention op: dtypes, generator, tolerance model, comparison with the exact
// reference, and metamorphic relations. The tolerance model and its derivation are in the
// README ("Attention tolerance"); in short, for O element (b, h, i, d) with condition term
// c = sum_j p_j |v_jd| (exact), n visible keys, S = max_j |scale| sum_d |q_id k_jd| and
// u = 2^(1 - accumulator bits):
//   eps     = 2 (2 u_in + gamma(head_dim + 2)) S + 2 u (1 + 2 S)   relative error of each p_j
//   allowed = (2 eps / (1 - eps) + u_P + u_in + 3 gamma(n + 2)) c
//             + n (eta_P + eta_acc) max_j |v_jd| + 4 eta_acc
// (u_P, eta_P: unit in the last place and smallest subnormal of the format P is rounded to,
// when the kernel declares one), plus O's own rounding u_O |x| and half its smallest
// subnormal, as for GEMM. Fully masked rows must give 0.
//
// Relations (run when the case passed; bitwise repeatability, common to every op, is
// checked in check/check):
//   - V scaling: V scaled by 2 doubles O exactly where nothing can underflow or overflow
//     (nonzero |v| in [2^-20, max/4], score spread 2S <= 64, O normal, and the visible
//     v_jd of one sign, so that no partial sum cancels into the subnormals); for a kernel
//     that declares itself not deterministic, O(2V) within tolerance of its own reference;
//   - key shift: the same vector added to every key (chosen so the largest score grows by
//     about 100: exp overflows FP32 without the max subtraction) gives O within tolerance
//     of its exact reference;
//   - key permutation: keys and values permuted together (within each batch's visible
//     keys, non-causal cases) give O within tolerance of the same exact O;
//   - batch independence: the last batch run alone (batch 1) passes against its own
//     reference (a kernel may pick another split for another size, so bits may differ).
#pragma once

#include "check/ops/op.hpp"

namespace ulpgate {

/// The attention module (op_module(Op::Attention)).
const OpModule& attention_module();

/// An attention case for a named input type: fp32, fp16, bf16 (Q, K, V and O of that
/// type) or e4m3 (O bf16); compute fp32, bhsd, one batch and head, 4 queries, 8 keys,
/// head_dim 64; O of type out where given. Throws InputError for another name.
Case dtype_attention_case(std::string_view dtype, std::optional<Format> out = std::nullopt);

/// The queries (the same in every batch and head) whose reference the comparison computes:
/// all of them when the exact reference affords it (about 0.3 s of it per case), else a
/// sample of at least 16: the first two, the last four, both sides of the last 64- and
/// 128-query tile boundaries, and queries spread evenly (offset by the case's seed). The
/// other outputs are judged only for NaN or Inf (OutputComparison::unreferenced).
std::vector<std::int64_t> referenced_queries(const Case& c);

}  // namespace ulpgate
