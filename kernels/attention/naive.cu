#include "kernels/attention/launch.hpp"

namespace ulpgate::attn {
namespace {

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

// Pass 2: each row's max m, P = exp(S - m) in place, l = sum P (0 for a row that sees no key),
// and the log-sum-exp m + ln l where asked for (-inf without a key).
// `subtract_max` false plants the classic unsafe softmax, P = exp(S): exact in real
// arithmetic, but exp overflows to Inf (and Inf / Inf is NaN) once a score passes about 88.7,
// and underflows to 0 rows whose scores all lie below about -103.
__global__ void softmax_rows(Shape s, float* S, float* l, bool subtract_max) {
  const long long rows = s.batch * s.heads * s.seq_q;
  for (long long row = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; row < rows;
       row += static_cast<long long>(gridDim.x) * blockDim.x) {
    float* r = S + row * s.seq_kv;
    float m = -INFINITY;
    for (long long j = 0; j < s.seq_kv; ++j) m = fmaxf(m, r[j]);
    float sum = 0.0f;
    for (long long j = 0; j < s.seq_kv; ++j) {
      const float p = m == -INFINITY ? 0.0f : subtract_max ? expf(r[j] - m) : expf(r[j]);
      r[j] = p;
      sum += p;
    }
    l[row] = sum;
    if (s.lse) s.lse[row] = sum > 0.0f ? (subtract_max ? m + logf(sum) : logf(sum)) : -INFINITY;
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

// A warp per query row: lane t scores key j0 + t of each block of 32 (q staged in shared
// memory), the block's max by shuffles, then every visible key's p broadcast in key order
// and added to the lane's accumulator elements d = t, t + 32, ...
__global__ void online_rows(Shape s, Operand q, Operand k, Operand v, Operand o, bool rescale) {
  extern __shared__ float qs[];  // head_dim floats per warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const long long rows = s.batch * s.heads * s.seq_q;
  float* qw = qs + warp * s.head_dim;
  for (long long row = static_cast<long long>(blockIdx.x) * warps + warp; row < rows;
       row += static_cast<long long>(gridDim.x) * warps) {
    const long long i = row % s.seq_q, h = (row / s.seq_q) % s.heads, b = row / (s.seq_q * s.heads), hk = h / s.group;
    for (long long d = lane; d < s.head_dim; d += 32) qw[d] = load(q, q.offset(b, h, i, d));
    __syncwarp();
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float m = -INFINITY, l = 0.0f;
    for (long long j0 = 0; j0 < s.seq_kv; j0 += 32) {
      const long long j = j0 + lane;
      float score = -INFINITY;
      if (j < s.seq_kv && s.visible(b, i, j)) {
        float dot = 0.0f;
        for (long long d = 0; d < s.head_dim; ++d) dot = fmaf(qw[d], load(k, k.offset(b, hk, j, d)), dot);
        score = s.scale * dot;
      }
      float block_max = score;
      for (int off = 16; off > 0; off /= 2) block_max = fmaxf(block_max, __shfl_xor_sync(0xFFFFFFFFu, block_max, off));
      if (block_max == -INFINITY) continue;  // no visible key in this block
      const float m_new = fmaxf(m, block_max);
      if (rescale && m_new > m && l > 0.0f) {
        const float r = expf(m - m_new);
        l *= r;
        for (int t = 0; t < 8; ++t) acc[t] *= r;
      }
      m = m_new;
      const float p = score == -INFINITY ? 0.0f : expf(score - m);
      for (int t = 0; t < 32 && j0 + t < s.seq_kv; ++t) {
        const float pt = __shfl_sync(0xFFFFFFFFu, p, t);
        if (pt == 0.0f) continue;
        l += pt;
        for (int e = 0; e < 8; ++e) {
          const long long d = lane + 32LL * e;
          if (d < s.head_dim_v) acc[e] = fmaf(pt, load(v, v.offset(b, hk, j0 + t, d)), acc[e]);
        }
      }
    }
    for (int e = 0; e < 8; ++e) {
      const long long d = lane + 32LL * e;
      if (d < s.head_dim_v) store(o, o.offset(b, h, i, d), l > 0.0f ? acc[e] / l : 0.0f);
    }
    if (s.lse && lane == 0) s.lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
    __syncwarp();
  }
}

}  // namespace

cudaError_t online_attention(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                             bool rescale, cudaStream_t stream) {
  const long long rows = s.batch * s.heads * s.seq_q;
  constexpr int kWarps = 4;
  const long long blocks = (rows + kWarps - 1) / kWarps;
  online_rows<<<static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535), 32 * kWarps,
                kWarps * s.head_dim * sizeof(float), stream>>>(s, q, k, v, o, rescale);
  return cudaGetLastError();
}

cudaError_t naive_attention(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                            float* S, float* l, bool subtract_max, cudaStream_t stream) {
  const long long rows = s.batch * s.heads * s.seq_q;
  scores<<<grid_for(rows * s.seq_kv), 256, 0, stream>>>(s, q, k, S);
  softmax_rows<<<grid_for(rows), 256, 0, stream>>>(s, S, l, subtract_max);
  weighted_values<<<grid_for(rows * s.head_dim_v), 256, 0, stream>>>(s, S, l, v, o);
  return cudaGetLastError();
}

}  // namespace ulpgate::attn
