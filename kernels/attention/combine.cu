// Split-KV attention's combine step on the GPU (FlashAttention's / FlashInfer's merge of
// partial states), FP32 SIMT. Launch interface: kernels/attention/attention_combine.hpp.
//
// A block per (query row, chunk of up to 256 columns): the block's max of the row's LSE_s
// over the non-empty splits, then per chunk of 256 splits the weights w_s = exp(LSE_s - max)
// (correctly rounded: weight()) in shared memory, and each thread adds its column's w_s O_s
// in split order (FMA, four loads in flight) and the weights' sum l in the same order, so
// that it needs no reduction. Every block of a row computes l alike; the first writes the
// row's LSE = max + log l (log correctly rounded too).
#include "kernels/attention/launch.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ulpgate::attn {
namespace {

constexpr int kMaxThreads = 256;  // columns per block
constexpr int kSplitChunk = 256;  // weights staged in shared memory at a time
constexpr float kEmpty = -1.0f;   // a staged weight that marks an empty split (weights are >= 0 or NaN)

template <class T>
__device__ float to_float(T x);
template <>
__device__ float to_float(float x) { return x; }
template <>
__device__ float to_float(__half x) { return __half2float(x); }
template <>
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// exp(t) or 2^t of an FP32 argument, correctly rounded to FP32 but for the rarest hard cases
// (FP64 exp within an FP64 ulp, rounded once), as glibc's expf and exp2f give it. CUDA's expf
// and exp2f are within 2 ulps, which moved O up to 4 ulps of its magnitude from the same sum
// with glibc's weights (H100, 2 to 300 splits). A weight costs one FP64 exp per split and
// row, nothing beside the row's loads.
__device__ float weight(float t, bool base2) {
  const double x = static_cast<double>(t);
  return static_cast<float>(base2 ? exp2(x) : exp(x));
}

template <class T>
__global__ void __launch_bounds__(kMaxThreads) combine_rows(Operand o_part, const float* lse_part, Operand o, float* lse,
                                                            long long splits, bool base2) {
  __shared__ float w[kSplitChunk];
  __shared__ float warp_max[kMaxThreads / 32];
  const long long rows = o.batch * o.heads * o.seq, row = blockIdx.x;
  const long long i = row % o.seq, h = (row / o.seq) % o.heads, b = row / (o.seq * o.heads);
  const long long d = static_cast<long long>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  const T* part = static_cast<const T*>(o_part.p);

  // The max over the non-empty splits; fmaxf passes over a NaN LSE_s (the row's result is
  // NaN through its weight all the same).
  float m = -INFINITY;
  int nonempty = 0;
  for (long long s = threadIdx.x; s < splits; s += blockDim.x) {
    const float x = lse_part[s * rows + row];
    if (x != -INFINITY) m = fmaxf(m, x), nonempty = 1;
  }
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  if (lane == 0) warp_max[warp] = m;
  const bool any = __syncthreads_or(nonempty);  // also orders warp_max
  m = warp_max[0];
  for (int k = 1; k < warps; ++k) m = fmaxf(m, warp_max[k]);

  float acc = 0.0f, l = 0.0f;
  for (long long s0 = 0; any && s0 < splits; s0 += kSplitChunk) {
    const int n = static_cast<int>(splits - s0 < kSplitChunk ? splits - s0 : kSplitChunk);
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
      const float x = lse_part[(s0 + t) * rows + row];
      w[t] = x == -INFINITY ? kEmpty : weight(x - m, base2);
    }
    __syncthreads();
    // Four splits' loads in flight, added in split order; an empty split's O_s is never read.
    int t = 0;
    for (; t + 4 <= n; t += 4) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        v[u] = d < o.dim && w[t + u] != kEmpty ? to_float(part[o_part.offset((s0 + t + u) * o.batch + b, h, i, d)]) : 0.0f;
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (w[t + u] != kEmpty) l += w[t + u], acc = fmaf(w[t + u], v[u], acc);
    }
    for (; t < n; ++t)
      if (w[t] != kEmpty) {
        l += w[t];
        if (d < o.dim) acc = fmaf(w[t], to_float(part[o_part.offset((s0 + t) * o.batch + b, h, i, d)]), acc);
      }
    __syncthreads();  // w is restaged next chunk
  }
  if (d < o.dim) store(o, o.offset(b, h, i, d), any ? acc / l : 0.0f);
  if (lse && blockIdx.y == 0 && threadIdx.x == 0)
    lse[row] = any ? m + static_cast<float>(base2 ? log2(static_cast<double>(l)) : log(static_cast<double>(l))) : -INFINITY;
}

template <class T>
cudaError_t launch(const Operand& o_part, const float* lse_part, const Operand& o, float* lse, long long splits, bool base2,
                   cudaStream_t stream) {
  const long long rows = o.batch * o.heads * o.seq;
  const long long threads = o.dim >= kMaxThreads ? kMaxThreads : (o.dim + 31) / 32 * 32;
  const long long chunks = (o.dim + threads - 1) / threads;
  if (rows <= 0 || rows >= (1LL << 31) || chunks > 65535 || splits < 1) return cudaErrorInvalidValue;
  combine_rows<T><<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(chunks)), static_cast<unsigned>(threads), 0,
                    stream>>>(o_part, lse_part, o, lse, splits, base2);
  return cudaGetLastError();
}

}  // namespace

cudaError_t combine_attention_states(const Operand& o_part, const float* lse_part, const Operand& o, float* lse,
                                     long long splits, bool lse_base2, cudaStream_t stream) {
  switch (o_part.format) {
    case kFp32: return launch<float>(o_part, lse_part, o, lse, splits, lse_base2, stream);
    case kFp16: return launch<__half>(o_part, lse_part, o, lse, splits, lse_base2, stream);
    case kBf16: return launch<__nv_bfloat16>(o_part, lse_part, o, lse, splits, lse_base2, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ulpgate::attn
