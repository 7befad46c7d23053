// Attention ground truth: O[b,h,i,:] = softmax(scale * q_i K^T + mask) V, and the row's
// log-sum-exp, as RefValues that round correctly to any format.
//
// Semantics follow core/case.hpp (bhsd/bshd layouts, kv_lengths padding, causal
// bottom-right aligned, query head h reading K/V head kv_head(h)). The scale is case.attention.softmax_scale when given, else exactly
// 1/sqrt(head_dim) (the real number, not its FP32 rounding).
//
// How it is exact: the scores q_i . k_j are exact (superaccumulator). Keys with equal
// scores are grouped (their V rows summed exactly). If every group has the same mean V
// value, O is that mean, a rational computed exactly. Otherwise O is transcendental
// (Lindemann-Weierstrass: exp of distinct algebraic numbers are linearly independent), so
// Ziv's strategy terminates: exp, sums and the division are evaluated in MPFR at P bits
// with the bound |O~ - O| <= 2^(5 - P) (2 max|t| + 2) sum_j p_j |v_j|, P doubling until
// the 128-bit window is decided. The LSE is handled the same way (exact only for one
// visible key).
//
// An exactly zero output is +0 (a kernel's sum starts from +0, so -0 terms cannot make
// it -0). Fully masked rows (no visible key): O = +0 and LSE = -inf. Real kernels disagree here
// (0, NaN, or garbage); this is the convention the analyzers compare against.
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
