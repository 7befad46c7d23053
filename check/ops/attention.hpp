// The attention op: dtypes, generator, tolerance model, comparison with the exact
// reference, and metamorphic relations. The tolerance bound and its derivation are in
// docs/concepts/precision.md (the per-element bound, attention); the relations (V scaling,
// key shift, key permutation, batch independence) in docs/concepts/relations.md.
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

/// Inside a generator (rc::gen::exec): in one case of three where kernel k applies sliding
/// windows (KernelTraits::attention_variants), a window near an edge: a size of 1, 2, 16, 63,
/// 64, 65, 127, 128, 129, seq_kv / 2, seq_kv - 1 or seq_kv, minus 1, plus 0 or plus 1, written
/// in one of the conventions window_from_convention() reads (each library's off-by-one lands
/// on drawn cases), causal or not as already drawn; kept where k supports the case.
void draw_window(Case& c, const Kernel* k);

}  // namespace ulpgate
