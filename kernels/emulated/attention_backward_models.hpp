// CPU models of attention backward kernels: dQ, dK, dV from Q, K, V, dO and the forward's O
// and LSE, computed in FP32 the two ways GPU kernels do (naive: P and dS kept in FP32; flash:
// FlashAttention-2's tiling, P and dS rounded to 16 bits before the products, dQ accumulated
// across key blocks), with the exp2 and ftz variants and planted bugs for the tests.
// Arithmetic and conventions: docs/kernels/cpu-models.md.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/format.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

struct AttentionBackwardModel {
  /// Keys per block (1..4096); 0: one block of all keys (the naive model).
  int block = 0;
  /// The format P and dS are rounded to before P^T dO, dS K and dS^T Q: FP32 (naive, no
  /// rounding), FP16 or BF16 (flash).
  Format p_format = Format::FP32;
  /// Exponentials as FlashAttention-2 computes them: exp2f(fmaf(q.k, c, -LSE log2 e)) with
  /// c = fl32(scale log2 e). Name: ",exp2".
  bool exp2 = false;
  /// FP32 results below the smallest normal flushed to sign-preserving zero. Name: ",ftz".
  bool ftz = false;
  /// Per query head dK and dV rounded to their formats, then summed over the heads of a
  /// K/V group in FP32 and rounded again (FlashAttention-2's grouped-query backward: its
  /// expanded dK, dV summed by the caller). Name: ",group_round".
  bool group_round = false;
  /// Planted bug: dS = P dP, without the D correction. Name: ",no_d".
  bool no_d = false;

  /// "cpu.attn_bwd_naive", "cpu.attn_bwd_flash:block=64,p=bf16" with ",exp2", ",ftz",
  /// ",group_round" and ",no_d".
  std::string name() const;
  /// Parses a name as above; nullopt if it is not an attention backward model name. Throws
  /// InputError for one with bad parameters.
  static std::optional<AttentionBackwardModel> parse(const std::string& name);
};

/// A host kernel that computes the backward case under the model.
std::unique_ptr<Kernel> make_emulated_attention_backward(const AttentionBackwardModel& m);

/// The models registered by default (correct ones only).
std::vector<AttentionBackwardModel> default_attention_backward_models();

}  // namespace ulpgate
