// The attention backward op: dQ, dK, dV from Q, K, V, dO and the forward's O and LSE.
// Dtypes, generator, the derived inputs, the tolerance bound of the fused backward's rounding
// points (derivation: docs/concepts/precision.md, "Attention backward"), the comparison with
// the exact gradients and the relations.
#pragma once

#include "check/ops/op.hpp"

namespace ulpgate {

/// The attention backward module (op_module(Op::AttentionBackward)).
const OpModule& attention_backward_module();

/// A backward case for a named input type (fp32, fp16, bf16): Q, K, V, O, dO and the
/// gradients of that type, LSE fp32, compute fp32, bhsd, one batch and head, 4 queries,
/// 8 keys, head_dim 64. Throws InputError for another name.
Case dtype_attention_backward_case(std::string_view dtype);

/// The forward case of a backward case: the same shape, Q, K, V, O and LSE types.
Case forward_case(const Case& backward);

/// The forward's outputs a backward case reads, from its Q, K and V in `inputs`: O, the
/// exact attention output rounded once to O's format (to nearest even), and LSE, the exact
/// log-sum-exp rounded once to FP32, +inf for a row that sees no key (FlashAttention's
/// convention: exp(s - LSE) is then 0 for every key).
void add_forward_outputs(const Case& c, Inputs& inputs);

}  // namespace ulpgate
