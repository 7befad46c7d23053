// CPU models of attention kernels: they run everywhere (CI included) and stand for the
// three ways GPU attention kernels compute softmax(scale Q K^T + mask) V in FP32:
//
//   v1 naive   three passes per query: all scores s_j = fl(scale * fl(q . k_j)) (FP32 FMA
//              chain over head_dim), m = max s_j, p_j = exp(s_j - m), l = sum p_j, then
//              O_d = (sum_j p_j v_jd) / l; every operation FP32, round to nearest
//   v2 online  one pass over blocks of `block` keys (Milakov & Gimelshein 2018): per block
//              the running max m grows to m', the running sum l and the output
//              accumulator are rescaled by exp(m - m'), then the block's p_j = exp(s_j - m')
//              are added; O = acc / l at the end
//   v3 flash   v2 with P rounded to FP16 or BF16 before P V, as FlashAttention-2's tensor
//              cores take it (the row sum l keeps the FP32 p_j)
// v2 and v3 take ",exp2" for FlashAttention-2's exponentials (exp2 with log2 e folded in);
// every model takes ",ftz": every FP32 result below the smallest normal flushed to zero,
// inputs kept (nvcc --use_fast_math, as FlashAttention builds, around tensor-core products
// that take subnormal operands; cuDNN's fused engine).
//
// The softmax scale is the case's, or 1/sqrt(head_dim), rounded to FP32. A query that sees
// no key gets O = +0 (the documented convention, references/attention_reference.hpp).
// Grouped-query and multi-query cases (kv_heads) run as they are: query head h reads K/V
// head kv_head(h), so every model supports them.
// "rescale=off" plants a classic bug for tests and demonstrations: the online accumulator
// is not rescaled when the running max grows.
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
