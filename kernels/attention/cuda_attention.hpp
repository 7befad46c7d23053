// Attention kernels on the GPU, registered as cuda.attn_*: the naive three-pass
// attention, online softmax and a FlashAttention-2 style kernel. Built with CUDA only.
#pragma once

#include <memory>
#include <vector>

#include "kernels/kernel.hpp"

namespace ulpgate {

/// cuda.attn_naive: S = scale Q K^T (masked keys -inf), P = softmax(S) row by row, O = P V / l,
/// each pass its own kernel, FP32 throughout; any head_dim, causal, kv_lengths, GQA, BHSD and
/// BSHD, inputs FP32/TF32/FP16/BF16/E4M3/E5M2, output FP32/FP16/BF16/E4M3/E5M2.
/// cuda.attn_online: online softmax in one pass over the keys (FP32 SIMT, a warp per query
/// row, keys in blocks of 32, the accumulator rescaled when the running max grows).
/// cuda.attn_flash.fp16 / .bf16: FlashAttention-2 style on tensor cores (flash.cu).
std::vector<std::unique_ptr<Kernel>> make_attention_kernels();

/// Planted bugs (not registered; the GPU tests show the harness catching them):
/// cuda.attn_naive with the unsafe softmax exp(S) (the row's max not subtracted);
std::unique_ptr<Kernel> make_planted_naive_no_max();
/// cuda.attn_online without the rescale when the max grows;
std::unique_ptr<Kernel> make_planted_online_no_rescale();
/// cuda.attn_flash.fp16 with the same bug planted.
std::unique_ptr<Kernel> make_planted_flash_no_rescale();

}  // namespace ulpgate
