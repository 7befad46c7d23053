// Attention kernels on the GPU (issue 19), registered as cuda.attn_*: the first rung, the
// naive three-pass attention with FP32 intermediates in global memory. Built with CUDA only.
#pragma once

#include <memory>
#include <vector>

#include "kernels/kernel.hpp"

namespace ulpgate {

/// cuda.attn_naive: S = scale Q K^T (masked keys -inf), P = softmax(S) row by row, O = P V / l,
/// each pass its own kernel, FP32 throughout; any head_dim, causal, kv_lengths, GQA, BHSD and
/// BSHD, inputs FP32/TF32/FP16/BF16/E4M3/E5M2, output FP32/FP16/BF16/E4M3/E5M2.
std::vector<std::unique_ptr<Kernel>> make_attention_kernels();

}  // namespace ulpgate
