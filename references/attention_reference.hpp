// Attention ground truth: O[b,h,i,:] = softmax(scale * q_i K^T + mask) V, and the row's
// log-sum-exp, as RefValues that round correctly to any format: exact where O is rational,
// otherwise certified by Ziv's strategy (O is then transcendental, so it terminates).
// The error bound, zero signs and fully masked rows: see docs/concepts/references.md.
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

/// Attention reference values, indexed logically: O element (b, h, i, d) is at
/// ((b * heads + h) * seq_q + i) * head_dim_v + d and LSE (b, h, i) at
/// (b * heads + h) * seq_q + i, whatever the case's layout.
struct AttentionReference {
  std::int64_t batch = 0, heads = 0, seq_q = 0, head_dim_v = 0;
  Format o_format = Format::FP16;
  std::vector<RefValue> values;   ///< O before its rounding
  std::vector<double> magnitude;  ///< sum_j p_j |v_jd| (the condition term), to double precision
  std::vector<RefValue> lse;      ///< natural log of sum_j exp(scale q_i.k_j) over visible j

  std::int64_t row(std::int64_t b, std::int64_t h, std::int64_t i) const { return (b * heads + h) * seq_q + i; }
  std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return row(b, h, i) * head_dim_v + d;
  }
  const RefValue& at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return values[index(b, h, i, d)];
  }
  /// The correctly rounded (RNE) value in O's format.
  Code expected(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return at(b, h, i, d).round_to(o_format);
  }
};

/// Computes the reference for an attention case from its inputs "Q", "K", "V" (each in
/// its operand's format, laid out as the case says). Throws InputError if a tensor is
/// missing, of the wrong format, or too small. rows (size batch * heads * seq_q, indexed as
/// AttentionReference::row), when given, names the query rows to compute; the others are
/// left +0 (values, LSE) with magnitude 0.
AttentionReference attention_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                                       unsigned threads = default_threads(), const std::vector<char>* rows = nullptr);

}  // namespace ulpgate
