// Attention backward kernels on the GPU, registered as cuda.attn_bwd_*: a naive FP32
// backward and a FlashAttention-2 style backward on tensor cores (kernels/attention/
// backward.cu), with the device launches they are built from. Built with CUDA only.
#pragma once

#include <memory>
#include <vector>

#include "kernels/attention/launch.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

namespace attn {

/// The operands of a backward launch: Q, K, V, dO, O in (p), dQ, dK, dV out (out), and the
/// forward's log-sum-exp, [batch][heads][seq_q] FP32, natural log (+inf for a row without a key).
struct BackwardOperands {
  Operand q, k, v, o, dout, dq, dk, dv;
  const float* lse = nullptr;
};

/// Keys per block of the flash backward (one thread block each).
inline constexpr long long kFlashBackwardKeys = 128;

/// Floats of the flash backward's dQ workspace: batch x heads x seq_q x head_dim, times the
/// key blocks when deterministic (one partial per key block, summed in order).
long long flash_backward_workspace_floats(const Shape& s, bool deterministic);

/// Naive backward on `stream`, FP32 throughout: D = rowsum(dO o O) into dsum (batch x heads x
/// seq_q floats); P and dS (batch x heads x seq_q x seq_kv floats each) in global memory; then
/// dQ, dK, dV each a kernel of its own. Any head_dim and head_dim_v, every input format load()
/// reads, outputs as store() writes.
cudaError_t naive_attention_backward(const Shape& s, const BackwardOperands& io, float* dsum, float* P, float* dS,
                                     cudaStream_t stream);

/// FlashAttention-2 style backward on `stream`: Q, K, V, dO all FP16 or all BF16 (q.format),
/// head_dim = head_dim_v = 64 or 128, dQ, dK, dV FP32, FP16 or BF16, batch x kv_heads at most
/// 65535, sequences below 2^30 (else cudaErrorInvalidValue). dsum: batch x heads x seq_q
/// floats; acc: flash_backward_workspace_floats(s, deterministic) floats. deterministic: dQ
/// without atomics (per-key-block partials summed in order). planted_no_d plants dS = P dP
/// without the D correction (FP16 inputs).
cudaError_t flash_attention_backward(const Shape& s, const BackwardOperands& io, float* dsum, float* acc, bool deterministic,
                                     bool planted_no_d, cudaStream_t stream);

/// The flash backward's tilings and dQ atomics side by side, for timing them in one run
/// (dev/bench_attention_backward --variants): warp_keys_32 gives each warp 32 keys x 32 queries
/// of S^T and dP^T (P^T and dS^T through shared memory), else 16 keys x the block's 64 queries
/// (P^T and dS^T kept in registers); quad_atomics adds dQ by float4 atomics, else float2.
/// flash_attention_backward runs one of them (kWarpKeys32 in backward.cu) with float4. head_dim
/// 128, atomic dQ only (else cudaErrorInvalidValue); operands and workspace as
/// flash_attention_backward.
cudaError_t flash_attention_backward_lab(const Shape& s, const BackwardOperands& io, float* dsum, float* acc, bool warp_keys_32,
                                         bool quad_atomics, cudaStream_t stream);

}  // namespace attn

/// cuda.attn_bwd_naive: FP32 backward (P and dS in FP32, global memory), any head_dim, inputs
/// FP32/FP16/BF16 (and the other formats load() reads), outputs FP32/FP16/BF16.
/// cuda.attn_bwd_flash.fp16 / .bf16: FlashAttention-2 style on tensor cores, dQ by atomics;
/// cuda.attn_bwd_flash.fp16.det / .bf16.det: the same with dQ summed in a fixed order.
std::vector<std::unique_ptr<Kernel>> make_attention_backward_kernels();

/// Planted bug (not registered; the GPU tests show the harness catching it):
/// cuda.attn_bwd_flash.fp16 with dS = P dP, the D correction left out.
std::unique_ptr<Kernel> make_planted_flash_backward_no_d();

}  // namespace ulpgate
