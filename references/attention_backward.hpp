// Attention backward ground truth: dQ, dK, dV, the exact gradient of the exact attention
// function at the given Q, K, V and dO, as RefValues that round correctly to any format: exact
// where the gradient is rational, otherwise certified by Ziv's strategy. D_i = dO_i . O_i takes
// the exact O, not a kernel's stored (rounded) O. Definitions, exact zeros, error bounds and
// conventions: docs/concepts/references.md, "Attention backward".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "references/ref_value.hpp"

namespace ulpgate {

/// The gradients, indexed logically whatever the case's layout: dQ (b, h, i, d) at
/// ((b * heads + h) * seq_q + i) * head_dim + d; dK (b, hk, j, d) at
/// ((b * kv_heads + hk) * seq_kv + j) * head_dim + d, hk a K/V head; dV likewise over
/// head_dim_v.
struct AttentionGradients {
  std::int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0, head_dim_v = 0;
  Format dq_format = Format::FP16, dk_format = Format::FP16, dv_format = Format::FP16;
  std::vector<RefValue> dq, dk, dv;
  /// Condition terms, to double precision: dQ_id: |scale| sum_j P_ij (|dP_ij| + |D_i|) |k_jd|;
  /// dK_jd: |scale| sum_i P_ij (|dP_ij| + |D_i|) |q_id|; dV_jd: sum_i P_ij |dO_id| (i over the
  /// query rows of every head that reads K/V head hk).
  std::vector<double> dq_magnitude, dk_magnitude, dv_magnitude;

  std::int64_t q_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return ((b * heads + h) * seq_q + i) * head_dim + d;
  }
  std::int64_t k_index(std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) const {
    return ((b * kv_heads + hk) * seq_kv + j) * head_dim + d;
  }
  std::int64_t v_index(std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) const {
    return ((b * kv_heads + hk) * seq_kv + j) * head_dim_v + d;
  }
  /// The correctly rounded (RNE) values in the output formats.
  Code expected_dq(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return dq[q_index(b, h, i, d)].round_to(dq_format);
  }
  Code expected_dk(std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) const {
    return dk[k_index(b, hk, j, d)].round_to(dk_format);
  }
  Code expected_dv(std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) const {
    return dv[v_index(b, hk, j, d)].round_to(dv_format);
  }
};

/// The gradients of an attention case (forward or backward: is_attention(c.op)) from its inputs "Q", "K", "V"
/// (as attention_reference takes them) and "dO", laid out as O (attention_view(c, "O")) in
/// the format c.types["dO"], or c.types["O"] where the case names no dO. Output formats:
/// c.types "dQ", "dK", "dV" where named, else Q's, K's, V's. Throws InputError for a missing,
/// mistyped or short tensor and for a NaN or Inf input value (the check path sanitises them
/// first), std::runtime_error where a rounding is not decided at 2^18 bits.
AttentionGradients attention_backward_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                                                unsigned threads = default_threads());

namespace detail {
/// The same with Ziv's loop starting at first_precision bits (at least 130; the reference
/// starts at 192): tests start near 128 so that most decisions lean on the error bounds' edge.
AttentionGradients attention_backward_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                                                unsigned threads, long first_precision);
}  // namespace detail

}  // namespace ulpgate
