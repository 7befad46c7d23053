// attention_combine ground truth: the split-KV partial states (O_s, LSE_s) of each query row
// merged into O and LSE as RefValues that round correctly to any format: exact where the
// value is rational, otherwise certified by interval arithmetic in MPFR.
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

/// Combine reference values, indexed logically whatever the case's layout: O element
/// (b, h, i, d) at ((b * heads + h) * seq_q + i) * head_dim + d, LSE (b, h, i) at
/// (b * heads + h) * seq_q + i.
///   base e:  LSE = ln sum_s e^LSE_s,     O_d = sum_s e^(LSE_s - LSE) O_s,d
///   base 2:  LSE = log2 sum_s 2^LSE_s,   O_d = sum_s 2^(LSE_s - LSE) O_s,d
/// over the row's non-empty splits (LSE_s > -inf; an empty split's O_s is never read, NaN or
/// not). A row of empty splits: O = +0, LSE = -inf. Every exact zero is +0. A NaN or Inf O_s,d
/// in a non-empty split makes O_d NaN (magnitude NaN) whatever its weight. A value below
/// 2^-1100 that is decided only by its sign (a weight of e^-(10^30)) is RefValue::tiny.
struct CombineReference {
  std::int64_t batch = 0, heads = 0, seq_q = 0, head_dim = 0;
  bool lse_base2 = false;
  std::vector<RefValue> values;    ///< O before its rounding
  std::vector<double> magnitude;   ///< sum_s w_s |O_s,d| (w_s the normalised weights) to double precision
  std::vector<RefValue> lse;       ///< LSE in the case's base
  std::vector<double> lse_spread;  ///< per row: max |LSE_s| over its non-empty splits (0 for none), for error bounds

  std::int64_t row(std::int64_t b, std::int64_t h, std::int64_t i) const { return (b * heads + h) * seq_q + i; }
  std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return row(b, h, i) * head_dim + d;
  }
  const RefValue& at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return values[static_cast<std::size_t>(index(b, h, i, d))];
  }
};

/// The reference of an attention_combine case from its inputs "O_part" (the case's O_part
/// format) and "LSE_part" (FP32), laid out as attention_view says. Throws InputError if a
/// tensor is missing, of the wrong format or too small, if an LSE_part value is NaN or +inf,
/// or if a row's base-2 LSEs chain over more than 2^20 binades without a gap that separates
/// them (see the .cpp); std::logic_error if a value stays undecided at 2^22 bits (a bug).
CombineReference combine_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                                   unsigned threads = default_threads());

}  // namespace ulpgate
