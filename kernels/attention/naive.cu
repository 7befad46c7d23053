#include "kernels/attention/naive_passes.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace ulpgate::attn {
namespace {

__device__ float load(const Operand& o, long long at) {
  switch (o.format) {
    case kFp16: return __half2float(static_cast<const __half*>(o.p)[at]);
    case kBf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(o.p)[at]);
    case kE4m3: return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(o.p)[at]);
    case kE5m2: return static_cast<float>(static_cast<const __nv_fp8_e5m2*>(o.p)[at]);
    case kTf32: return __uint_as_float(static_cast<const unsigned*>(o.p)[at] & 0xFFFFE000u);
    default: return static_cast<const float*>(o.p)[at];
  }
}

__device__ void store(const Operand& o, long long at, float v) {
  switch (o.format) {
    case kFp16: static_cast<__half*>(o.out)[at] = __float2half_rn(v); break;
    case kBf16: static_cast<__nv_bfloat16*>(o.out)[at] = __float2bfloat16_rn(v); break;
    case kE4m3: static_cast<__nv_fp8_e4m3*>(o.out)[at] = __nv_fp8_e4m3(v); break;  // saturating
    case kE5m2: static_cast<__nv_fp8_e5m2*>(o.out)[at] = __nv_fp8_e5m2(v); break;
    default: static_cast<float*>(o.out)[at] = v; break;
  }
}


// Pass 1: S[row][j] = scale * (q_row . k_j), -inf for a key the query does not see.
__global__ void scores(Shape s, Operand q, Operand k, float* S) {
  const long long rows = s.batch * s.heads * s.seq_q;
  for (long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; e < rows * s.seq_kv;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = e / s.seq_kv, j = e % s.seq_kv;
    const long long i = row % s.seq_q, h = (row / s.seq_q) % s.heads, b = row / (s.seq_q * s.heads);
    float v = -INFINITY;
    if (s.visible(b, i, j)) {
      float dot = 0.0f;
      for (long long d = 0; d < s.head_dim; ++d)
        dot = fmaf(load(q, q.offset(b, h, i, d)), load(k, k.offset(b, h / s.group, j, d)), dot);
      v = s.scale * dot;
    }
    S[e] = v;
  }
}

// Pass 2: each row's max m, P = exp(S - m) in place, l = sum P (0 for a row that sees no key).
__global__ void softmax_rows(Shape s, float* S, float* l) {
  const long long rows = s.batch * s.heads * s.seq_q;
  for (long long row = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; row < rows;
       row += static_cast<long long>(gridDim.x) * blockDim.x) {
    float* r = S + row * s.seq_kv;
    float m = -INFINITY;
    for (long long j = 0; j < s.seq_kv; ++j) m = fmaxf(m, r[j]);
    float sum = 0.0f;
    for (long long j = 0; j < s.seq_kv; ++j) {
      const float p = m == -INFINITY ? 0.0f : expf(r[j] - m);
      r[j] = p;
      sum += p;
    }
    l[row] = sum;
  }
}

// Pass 3: O[row][d] = sum_j P[row][j] V[j][d] / l (0 where l is 0).
__global__ void weighted_values(Shape s, const float* P, const float* l, Operand v, Operand o) {
  const long long rows = s.batch * s.heads * s.seq_q;
  for (long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; e < rows * s.head_dim_v;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = e / s.head_dim_v, d = e % s.head_dim_v;
    const long long i = row % s.seq_q, h = (row / s.seq_q) % s.heads, b = row / (s.seq_q * s.heads);
    const float* p = P + row * s.seq_kv;
    float acc = 0.0f;
    for (long long j = 0; j < s.seq_kv; ++j)
      if (p[j] != 0.0f) acc = fmaf(p[j], load(v, v.offset(b, h / s.group, j, d)), acc);
    store(o, o.offset(b, h, i, d), l[row] > 0.0f ? acc / l[row] : 0.0f);
  }
}

unsigned grid_for(long long n) { return static_cast<unsigned>(n <= 0 ? 1 : (n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535); }

}  // namespace

cudaError_t naive_attention(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                            float* S, float* l, cudaStream_t stream) {
  const long long rows = s.batch * s.heads * s.seq_q;
  scores<<<grid_for(rows * s.seq_kv), 256, 0, stream>>>(s, q, k, S);
  softmax_rows<<<grid_for(rows), 256, 0, stream>>>(s, S, l);
  weighted_values<<<grid_for(rows * s.head_dim_v), 256, 0, stream>>>(s, S, l, v, o);
  return cudaGetLastError();
}

}  // namespace ulpgate::attn
