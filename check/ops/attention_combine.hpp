// The attention combine op (split-KV decoding's merge of partial states): dtypes, generator,
// the tolerance of an FP32 combine, the comparison with the exact reference and the
// relations (split order, an appended empty split). Definition and bound:
// docs/concepts/split-kv.md.
#pragma once

#include "check/ops/op.hpp"

namespace ulpgate {

/// The attention combine module (op_module(Op::AttentionCombine)).
const OpModule& attention_combine_module();

/// A combine case for a named partial-output type (fp32, fp16, bf16): O_part of that type,
/// LSE_part, LSE and compute fp32, O of type out (default: O_part's), bhsd, one batch and
/// head, one query, head_dim 64, 4 splits, natural-log LSE. Throws InputError for another name.
Case dtype_attention_combine_case(std::string_view dtype, std::optional<Format> out = std::nullopt);

}  // namespace ulpgate
