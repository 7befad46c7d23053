// CPU models of attention kernels: they run everywhere (CI included) and stand for the
// three ways GPU attention kernels compute softmax(scale Q K^T + mask) V in FP32 (naive,
// online, flash), with the exp2, ftz and planted no-rescale variants. Each model's
// arithmetic, scale and conventions: see docs/kernels/cpu-models.md.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/format.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

struct AttentionModel {
  enum class Variant { Naive, Online, Flash };
  Variant variant = Variant::Naive;
  int block = 64;                 ///< Online, Flash: keys per block (1..4096)
  Format p_format = Format::FP16; ///< Flash: the format P is rounded to (fp16 or bf16)
  bool rescale = true;            ///< false: the planted no-rescale bug
  /// Online, Flash: exponentials as FlashAttention-2 computes them, exp2 with log2(e) folded
  /// into the softmax scale: p = exp2f(fmaf(q.k, c, -m c)) with c = fl32(scale log2 e) and m
  /// the row's largest unscaled score; LSE = m scale + ln l. Name: ",exp2".
  bool exp2 = false;
  /// FP32 results below the smallest normal flushed to sign-preserving zero. Name: ",ftz".
  bool ftz = false;

  /// "cpu.attn_naive", "cpu.attn_online:block=64", "cpu.attn_flash:block=64,p=bf16",
  /// with ",exp2", ",ftz" and ",rescale=off" for the planted bug.
  std::string name() const;
  /// Parses a name as above; nullopt if it is not an attention model name. Throws
  /// InputError for a model name with bad parameters.
  static std::optional<AttentionModel> parse(const std::string& name);
};

/// A host attention kernel that computes the case under the model.
std::unique_ptr<Kernel> make_emulated_attention(const AttentionModel& m);

/// The models registered by default (correct ones only).
std::vector<AttentionModel> default_attention_models();

}  // namespace ulpgate
