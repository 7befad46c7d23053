// CPU models of split-KV attention's combine step (attention_combine): the partial outputs
// O_s and log-sum-exps LSE_s of each query row merged in FP32 as FlashAttention's and
// FlashInfer's combine kernels do, and planted bugs of this op class for the tests.
// Arithmetic and conventions: docs/kernels/cpu-models.md.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/kernel.hpp"

namespace ulpgate {

/// cpu.attn_combine, per query row in FP32 (exp/exp2 and log/log2 by the case's LSE base):
/// m = max LSE_s over the non-empty splits (LSE_s != -inf; an empty split's O_s is never
/// read), w_s = exp(LSE_s - m), l = sum w_s and acc = sum w_s O_s in split order (FMA),
/// O = acc / l rounded once to O's format, LSE = m + log l; a row of empty splits only:
/// O = 0, LSE = -inf. Each flag below plants one bug (they combine).
struct AttentionCombineModel {
  /// Empty splits not skipped: m = max over every LSE_s, so a row of empty splits computes
  /// exp(-inf - -inf) = NaN, and an empty split's O_s is read (weight 0, but 0 x NaN
  /// garbage is NaN). FlashInfer #4051. Name: ",no_empty_guard".
  bool no_empty_guard = false;
  /// The other base's exp and log: exp2/log2 for a natural-log case, exp/log for a base-2
  /// one. Name: ",wrong_base".
  bool wrong_base = false;
  /// w_s = exp(LSE_s) without the max subtracted, LSE = log l: exp overflows past LSE 88.7
  /// (base 2: 128) and underflows below about -103 (-149). Name: ",no_max_shift".
  bool no_max_shift = false;
  /// O = acc, not acc / l: the weights never normalised by the merged LSE. Name:
  /// ",no_normalize".
  bool no_normalize = false;
  /// O stored at its bhsd offsets whatever the case's layout (FlagGems #5235): a bshd case
  /// with heads > 1 and seq_q > 1 gets its rows transposed. Name: ",bhsd_store".
  bool bhsd_store = false;
  /// The last split left out (a loop bound off by one). Name: ",drop_last".
  bool drop_last = false;

  bool planted() const { return no_empty_guard || wrong_base || no_max_shift || no_normalize || bhsd_store || drop_last; }
  /// "cpu.attn_combine", or with its bugs: "cpu.attn_combine:no_max_shift,drop_last".
  std::string name() const;
  /// Parses a name as above; nullopt if it is not a combine model name. Throws InputError
  /// for one with unknown parameters.
  static std::optional<AttentionCombineModel> parse(const std::string& name);
};

/// A host kernel that computes attention_combine cases under the model.
std::unique_ptr<Kernel> make_emulated_attention_combine(const AttentionCombineModel& m);

/// The models registered by default (the correct one only).
std::vector<AttentionCombineModel> default_attention_combine_models();

}  // namespace ulpgate
