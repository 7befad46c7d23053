// The attention kernels' device launches, behind a plain interface so that the
// .cu files need no C++20 host headers: kernels/attention/cuda_attention.cpp registers them.
#pragma once

#include <cuda_runtime.h>
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace ulpgate::attn {

// Storage formats the passes read and write (core/format.hpp's names, as plain codes).
enum FormatCode : int { kFp32 = 0, kTf32 = 1, kFp16 = 2, kBf16 = 3, kE4m3 = 4, kE5m2 = 5 };

// An operand's storage on the device: its format's words and the view's extents.
struct Operand {
  const void* p = nullptr;
  void* out = nullptr;
  int format = kFp32;
  long long batch = 1, heads = 1, seq = 1, dim = 1;
  bool bshd = false;
#ifdef __CUDACC__
  __device__ long long offset(long long b, long long h, long long s, long long d) const {
    return bshd ? ((b * seq + s) * heads + h) * dim + d : ((b * heads + h) * seq + s) * dim + d;
  }
#endif
};

struct Shape {
  long long batch, heads, seq_q, seq_kv, head_dim, head_dim_v, group;  // group: query heads per K/V head
  bool causal;
  float scale;
  const long long* kv_lengths;  // device, one per batch; nullptr: all seq_kv
  float* lse = nullptr;         // device [batch][heads][seq_q]: each row's ln sum_j exp(s_j), -inf
                                // without a key; nullptr: not asked for
#ifdef __CUDACC__
  __device__ bool visible(long long b, long long i, long long j) const {
    const long long len = kv_lengths ? kv_lengths[b] : seq_kv;
    return j < len && (!causal || j <= i + (seq_kv - seq_q));
  }
#endif
};

#ifdef __CUDACC__
// An operand's element `at` as a float, and a float stored into an output in its format
// (rounded to nearest; FP8 saturating).
inline __device__ float load(const Operand& o, long long at) {
  switch (o.format) {
    case kFp16: return __half2float(static_cast<const __half*>(o.p)[at]);
    case kBf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(o.p)[at]);
    case kE4m3: return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(o.p)[at]);
    case kE5m2: return static_cast<float>(static_cast<const __nv_fp8_e5m2*>(o.p)[at]);
    case kTf32: return __uint_as_float(static_cast<const unsigned*>(o.p)[at] & 0xFFFFE000u);
    default: return static_cast<const float*>(o.p)[at];
  }
}

inline __device__ void store(const Operand& o, long long at, float v) {
  switch (o.format) {
    case kFp16: static_cast<__half*>(o.out)[at] = __float2half_rn(v); break;
    case kBf16: static_cast<__nv_bfloat16*>(o.out)[at] = __float2bfloat16_rn(v); break;
    case kE4m3: static_cast<__nv_fp8_e4m3*>(o.out)[at] = __nv_fp8_e4m3(v); break;  // saturating
    case kE5m2: static_cast<__nv_fp8_e5m2*>(o.out)[at] = __nv_fp8_e5m2(v); break;
    default: static_cast<float*>(o.out)[at] = v; break;
  }
}
#endif

/// The three passes on `stream`: S (rows x seq_kv floats) and l (rows floats) are scratch,
/// rows = batch x heads x seq_q. `subtract_max` false plants the unsafe softmax exp(S) without
/// the row's max (for the harness's tests). Returns the launch error, if any.
cudaError_t naive_attention(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                            float* S, float* l, bool subtract_max, cudaStream_t stream);

/// Online softmax in one pass over the keys (FP32 SIMT): a warp per query row, keys in blocks
/// of 32 (a score per lane), the running max and sum and the accumulator rescaled when the
/// max grows; head_dim_v at most 256 (8 accumulator elements per lane). `rescale` false
/// plants the classic bug (no rescale when the max grows), for the harness's tests.
cudaError_t online_attention(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                             bool rescale, cudaStream_t stream);
inline constexpr long long kOnlineMaxHeadDimV = 256;

/// FlashAttention-2 style forward pass (kernels/attention/flash.cu): Q, K, V all FP16 or all
/// BF16 (q.format), head_dim = head_dim_v = 64 or 128, O FP32/FP16/BF16, tensor cores
/// (mma.sync m16n8k16) with FP32 accumulation, P rounded to the input type before P V;
/// batch x heads at most 65535, seq_q and seq_kv below 2^30 (else cudaErrorInvalidValue).
/// Blocks of 128 query rows (4 warps x 32), 64-key tiles, K and V double-buffered (cp.async),
/// fragments by ldmatrix. `rescale` false plants the classic bug (the accumulator and sum not
/// rescaled when the running max grows; FP16 inputs).
cudaError_t flash_attention(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                            bool rescale, cudaStream_t stream);

}  // namespace ulpgate::attn
