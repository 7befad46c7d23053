// cuDNN's fused attention behind a plain interface: the forward (kernels/attention/
// cudnn_sdpa.cpp) and the backward (kernels/attention/cudnn_sdpa_backward.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace ulpgate::attn {

struct SdpaShape {
  bool bf16 = false;  ///< Q, K, V, O in BF16 (else FP16)
  std::int64_t batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_kv = 1, head_dim = 64;
  bool causal = false;  ///< top-left aligned: only for seq_q == seq_kv
  bool padded = false;  ///< per-batch key lengths (seq_kv pointers given)
  bool bshd = false;
  bool stats = false;  ///< write the softmax stats (the log-sum-exp, FP32 [b][h][s]) to `lse`
  float scale = 1.0f;
};

/// Runs attention on `stream` (device pointers; seq_q / seq_kv: device int32 per batch when
/// padded) and returns the engine used ("engine N (heuristics A, config i of n)"). Throws
/// KernelUnsupported when no cuDNN engine takes the graph, KernelError on failure.
std::string cudnn_sdpa(const SdpaShape& s, const void* q, const void* k, const void* v, void* o, float* lse,
                       const int* seq_q, const int* seq_kv, void* stream);

struct SdpaBackwardShape {
  bool bf16 = false;  ///< Q, K, V, O, dO, dQ, dK, dV in BF16 (else FP16)
  std::int64_t batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_kv = 1, head_dim = 64;
  /// Bottom-right aligned to seq_kv and seq_q, padded or not (key j visible to query i where
  /// j <= i + seq_kv - seq_q): seq_q <= seq_kv.
  bool causal = false;
  bool padded = false;  ///< per-batch key lengths (seq_kv pointers given)
  bool bshd = false;
  /// dQ straight from the dS K matmul, without the FP32 accumulator that key blocks add into
  /// atomically: the cuDNN frontend's deterministic algorithm on Hopper (its dP workspace path).
  bool deterministic = false;
  float scale = 1.0f;
};

/// The attention backward on `stream` (device pointers): dQ, dK, dV from Q, K, V, the forward's
/// O, dO and its softmax stats `lse` (natural log-sum-exp, FP32 [b][h][s_q]); seq_q / seq_kv:
/// device int32 per batch when padded. dK and dV are per K/V head (summed over the group's
/// query heads). Returns the engine used ("engine N (heuristics A, config i of n)"). Throws
/// KernelUnsupported when no cuDNN engine takes the graph, KernelError on failure.
std::string cudnn_sdpa_backward(const SdpaBackwardShape& s, const void* q, const void* k, const void* v, const void* o,
                                const void* dout, const float* lse, void* dq, void* dk, void* dv, const int* seq_q,
                                const int* seq_kv, void* stream);

/// The cuDNN library's version at run time ("9.19.0").
std::string cudnn_version();

}  // namespace ulpgate::attn
