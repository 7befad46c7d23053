// Attention backward on the GPU: a naive FP32 backward (P and dS in global memory) and a
// FlashAttention-2 style backward on tensor cores (FP16 or BF16 Q, K, V, dO; mma.sync
// m16n8k16 with FP32 accumulation). Launch interface: kernels/attention/attention_backward.hpp.
//
// Flash backward, one block of 8 warps per (128-key block, batch x K/V head): K and V of the
// block stay in shared memory; the block walks the query heads of its group and their
// 64-row query blocks (Q, dO, LSE and D double-buffered, cp.async), warp w owning keys
// 16 w .. 16 w + 15. Per query block it recomputes S^T = K Q^T, P^T = exp2(scale log2(e) S^T
// - log2(e) LSE), dP^T = V dO^T and dS^T = P^T (dP^T - D) in FP32, rounds P and dS to the
// input type, accumulates dV += P^T dO and dK += dS^T Q in registers (FP32), writes dS to
// shared memory and computes dQ = dS K for the block's 64 rows (warps split rows x columns),
// added with float4 atomics into an FP32 workspace (deterministic: stored as this key block's
// partial, summed in key-block order afterwards). Small kernels form D = rowsum(dO o O) from
// the stored O beforehand and scale and convert dQ afterwards. flash_backward_k32 is the same
// algorithm with the warps tiled 4 x 2 over 32 keys x 32 queries (P^T and dS^T through shared
// memory), which reads fewer ldmatrix fragments per mma; kWarpKeys32 picks the registered one.
#include "kernels/attention/launch.hpp"
#include "kernels/attention/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ulpgate::attn {

// As declared in kernels/attention/attention_backward.hpp (which needs C++20 host headers).
struct BackwardOperands {
  Operand q, k, v, o, dout, dq, dk, dv;
  const float* lse = nullptr;
};

namespace {

constexpr long long kMaxSeq = 1LL << 30;
constexpr float kLog2e = 1.4426950408889634f;

unsigned grid_for(long long n) {
  return static_cast<unsigned>(n <= 0 ? 1 : (n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535);
}

// D_i = sum_d dO_id O_id (FP32), a warp per row of [batch][heads][seq_q].
__global__ void row_dot(Shape s, Operand dout, Operand o, float* dsum) {
  const long long rows = s.batch * s.heads * s.seq_q;
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (long long row = static_cast<long long>(blockIdx.x) * warps + threadIdx.x / 32; row < rows;
       row += static_cast<long long>(gridDim.x) * warps) {
    const long long i = row % s.seq_q, h = (row / s.seq_q) % s.heads, b = row / (s.seq_q * s.heads);
    float acc = 0.0f;
    for (long long d = lane; d < s.head_dim_v; d += 32)
      acc = fmaf(load(dout, dout.offset(b, h, i, d)), load(o, o.offset(b, h, i, d)), acc);
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
    if (lane == 0) dsum[row] = acc;
  }
}

// ---------------------------------------------------------------------------------------
// Naive: three passes, FP32 throughout.

// P[row][j] = exp(scale s - LSE), dS[row][j] = P (dO_i . v_j - D_i); 0 for a hidden key.
__global__ void naive_p_ds(Shape s, BackwardOperands io, const float* dsum, float* P, float* dS) {
  const long long rows = s.batch * s.heads * s.seq_q;
  for (long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; e < rows * s.seq_kv;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = e / s.seq_kv, j = e % s.seq_kv;
    const long long i = row % s.seq_q, h = (row / s.seq_q) % s.heads, b = row / (s.seq_q * s.heads), hk = h / s.group;
    float p = 0.0f, ds = 0.0f;
    if (s.visible(b, i, j)) {
      float dot = 0.0f;
      for (long long d = 0; d < s.head_dim; ++d)
        dot = fmaf(load(io.q, io.q.offset(b, h, i, d)), load(io.k, io.k.offset(b, hk, j, d)), dot);
      p = expf(s.scale * dot - io.lse[row]);
      float dp = 0.0f;
      for (long long d = 0; d < s.head_dim_v; ++d)
        dp = fmaf(load(io.dout, io.dout.offset(b, h, i, d)), load(io.v, io.v.offset(b, hk, j, d)), dp);
      ds = p * (dp - dsum[row]);
    }
    P[e] = p;
    dS[e] = ds;
  }
}

// dQ[b,h,i,d] = scale sum_j dS[row][j] K[j][d].
__global__ void naive_dq(Shape s, BackwardOperands io, const float* dS) {
  const long long rows = s.batch * s.heads * s.seq_q;
  for (long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; e < rows * s.head_dim;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = e / s.head_dim, d = e % s.head_dim;
    const long long i = row % s.seq_q, h = (row / s.seq_q) % s.heads, b = row / (s.seq_q * s.heads), hk = h / s.group;
    const float* r = dS + row * s.seq_kv;
    float acc = 0.0f;
    for (long long j = 0; j < s.seq_kv; ++j)
      if (r[j] != 0.0f) acc = fmaf(r[j], load(io.k, io.k.offset(b, hk, j, d)), acc);
    store(io.dq, io.dq.offset(b, h, i, d), acc * s.scale);
  }
}

// dK[b,hk,j,d] = scale sum_{h in group, i} dS Q, dV[b,hk,j,d] = sum P dO (one sum over the group).
__global__ void naive_dkdv(Shape s, BackwardOperands io, const float* P, const float* dS) {
  const long long kv_heads = s.heads / s.group, width = s.head_dim > s.head_dim_v ? s.head_dim : s.head_dim_v;
  const long long n = s.batch * kv_heads * s.seq_kv * width;
  for (long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long d = e % width, j = (e / width) % s.seq_kv, hk = (e / (width * s.seq_kv)) % kv_heads,
                    b = e / (width * s.seq_kv * kv_heads);
    float dk = 0.0f, dv = 0.0f;
    for (long long h = hk * s.group; h < (hk + 1) * s.group; ++h)
      for (long long i = 0; i < s.seq_q; ++i) {
        const long long at = ((b * s.heads + h) * s.seq_q + i) * s.seq_kv + j;
        if (d < s.head_dim && dS[at] != 0.0f) dk = fmaf(dS[at], load(io.q, io.q.offset(b, h, i, d)), dk);
        if (d < s.head_dim_v && P[at] != 0.0f) dv = fmaf(P[at], load(io.dout, io.dout.offset(b, h, i, d)), dv);
      }
    if (d < s.head_dim) store(io.dk, io.dk.offset(b, hk, j, d), dk * s.scale);
    if (d < s.head_dim_v) store(io.dv, io.dv.offset(b, hk, j, d), dv);
  }
}

// ---------------------------------------------------------------------------------------
// Flash.

constexpr int kBN = 128, kBM = 64, kWarps = 8, kThreads = kWarps * 32, kPad = 8;
static_assert(kBN == 16 * kWarps, "a warp per 16 keys");
template <int D>
constexpr int kBwdSmemBytes = (2 * kBN + 4 * kBM) * (D + kPad) * 2 + kBN * (kBM + kPad) * 2 + 2 * 2 * kBM * 4;
static_assert(kBwdSmemBytes<128> <= 227 * 1024, "fits one block per SM");
template <int D>
constexpr int kBwdSmemBytesK32 = kBwdSmemBytes<D> + kBN * (kBM + kPad) * 2;  // P^T beside dS^T
static_assert(kBwdSmemBytesK32<128> <= 227 * 1024, "fits one block per SM");





// R rows x D halves of a (b, h) slice from row `first` on into shared memory at `dst` (row
// stride D + kPad halves); rows at or past `limit` are zero-filled.
template <int D, int R>
__device__ __forceinline__ void load_rows(std::uint32_t dst, const std::uint16_t* base, int stride, int first, int limit) {
  constexpr int kChunks = D / 8, kStep = kThreads / kChunks;
  static_assert(R % kStep == 0, "whole passes");
  const int piece = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
  base += piece * 8;
  dst += static_cast<std::uint32_t>((r0 * (D + kPad) + piece * 8) * 2);
#pragma unroll
  for (int it = 0; it < R / kStep; ++it) {
    const int row = first + r0 + it * kStep;
    const bool in = row < limit;
    cp_async16(dst + it * kStep * (D + kPad) * 2, base + static_cast<long long>(in ? row : 0) * stride, in ? 16 : 0);
  }
}

// Two adjacent elements of a 16-bit or FP32 output (one 4- or 8-byte store where aligned).
__device__ __forceinline__ void store_pair(const Operand& o, long long at, float x0, float x1) {
  if (o.format == kFp16 && (reinterpret_cast<std::uintptr_t>(static_cast<__half*>(o.out) + at) & 3) == 0) {
    *reinterpret_cast<__half2*>(static_cast<__half*>(o.out) + at) = __floats2half2_rn(x0, x1);
  } else if (o.format == kBf16 && (reinterpret_cast<std::uintptr_t>(static_cast<__nv_bfloat16*>(o.out) + at) & 3) == 0) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(o.out) + at) = __floats2bfloat162_rn(x0, x1);
  } else if (o.format == kFp32 && (reinterpret_cast<std::uintptr_t>(static_cast<float*>(o.out) + at) & 7) == 0) {
    *reinterpret_cast<float2*>(static_cast<float*>(o.out) + at) = make_float2(x0, x1);
  } else {
    store(o, at, x0);
    store(o, at + 1, x1);
  }
}

// Adds four consecutive floats at p (16-byte aligned): one vector atomic on sm_90.
__device__ __forceinline__ void add_quad(float* p, float x0, float x1, float x2, float x3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), make_float4(x0, x1, x2, x3));
#else
  atomicAdd(p, x0);
  atomicAdd(p + 1, x1);
  atomicAdd(p + 2, x2);
  atomicAdd(p + 3, x3);
#endif
}

// Adds two consecutive floats at p (8-byte aligned): one vector atomic on sm_90.
__device__ __forceinline__ void add_pair(float* p, float x0, float x1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x0, x1));
#else
  atomicAdd(p, x0);
  atomicAdd(p + 1, x1);
#endif
}

// dq_acc: [batch][heads][seq_q][D] FP32 (Det: one such slice per key block, this block's at
// blockIdx.x). dK and dV are written here, dQ by dq_convert.
template <int D, bool Bf16, bool Det, bool NoD, bool Quad>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward(Shape s, BackwardOperands io, const float* dsum, float* dq_acc) {
  constexpr int LD = D + kPad, LDS = kBM + kPad;
  constexpr int QT = kBM / 8, KQ = kBM / 16, DT = D / 8, DK = D / 16, KB = kBN / 16;
  constexpr std::uint32_t kRow = LD * 2, kQBytes = kBM * LD * 2;
  extern __shared__ __align__(16) std::uint16_t smem[];
  const std::uint32_t ks = smem_u32(smem), vs = ks + kBN * kRow, qs = vs + kBN * kRow, dos = qs + 2 * kQBytes,
                      dss = dos + 2 * kQBytes;
  std::uint16_t* ds_s = smem + (2 * kBN + 4 * kBM) * LD;
  float* stats = reinterpret_cast<float*>(ds_s + kBN * LDS);  // [buffer][lse2 x kBM, D x kBM]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long kv_heads = s.heads / s.group, bhk = blockIdx.y, b = bhk / kv_heads, hk = bhk % kv_heads;
  const int seq_q = static_cast<int>(s.seq_q), seq_kv = static_cast<int>(s.seq_kv);
  const int n0 = blockIdx.x * kBN, kw0 = n0 + 16 * warp;
  const long long kv_len64 = s.kv_lengths ? (s.kv_lengths[b] < s.seq_kv ? s.kv_lengths[b] : s.seq_kv) : s.seq_kv;
  const int kv_len = static_cast<int>(kv_len64 < 0 ? 0 : kv_len64);
  const int diag_off = seq_kv - seq_q;  // row i sees key j <= i + diag_off (causal)
  const int m_blocks = (seq_q + kBM - 1) / kBM;
  int m_first = 0;
  if (s.causal && n0 - diag_off > 0) m_first = (n0 - diag_off) / kBM;  // the first row that sees key n0
  const int m_count = n0 < kv_len && m_first < m_blocks ? m_blocks - m_first : 0;
  const int iters = m_count * static_cast<int>(s.group);

  const auto* kg = static_cast<const std::uint16_t*>(io.k.p) + io.k.offset(b, hk, 0, 0);
  const auto* vg = static_cast<const std::uint16_t*>(io.v.p) + io.v.offset(b, hk, 0, 0);
  const int q_stride = static_cast<int>(io.q.offset(0, 0, 1, 0)), k_stride = static_cast<int>(io.k.offset(0, 0, 1, 0)),
            v_stride = static_cast<int>(io.v.offset(0, 0, 1, 0)), o_stride = static_cast<int>(io.dout.offset(0, 0, 1, 0));
  const float scale2 = s.scale * kLog2e;

  // Iteration it: query head hk group + it / m_count, query block m_first + it % m_count.
  const auto fetch = [&](int it, int buf) {
    const long long h = hk * s.group + it / m_count;
    const int m0 = (m_first + it % m_count) * kBM;
    load_rows<D, kBM>(qs + buf * kQBytes, static_cast<const std::uint16_t*>(io.q.p) + io.q.offset(b, h, 0, 0), q_stride, m0, seq_q);
    load_rows<D, kBM>(dos + buf * kQBytes, static_cast<const std::uint16_t*>(io.dout.p) + io.dout.offset(b, h, 0, 0), o_stride,
                      m0, seq_q);
    cp_async_commit();
    if (threadIdx.x < kBM) {
      const int i = m0 + threadIdx.x;
      const long long row = (b * s.heads + h) * s.seq_q + i;
      stats[buf * 2 * kBM + threadIdx.x] = i < seq_q ? io.lse[row] * kLog2e : INFINITY;
      stats[buf * 2 * kBM + kBM + threadIdx.x] = i < seq_q ? dsum[row] : 0.0f;
    }
  };

  // ldmatrix lane offsets (bytes): A of a row-major tile (rows lane % 16, columns 8 (lane / 16));
  // B of a [n][k] tile (n lane % 8 + 8 (lane / 16), k 8 ((lane / 8) % 2)); B of a [k][n] tile
  // by .trans (k lane % 16, n 8 (lane / 16)).
  const std::uint32_t a_lane = static_cast<std::uint32_t>(((lane & 15) * LD + 8 * (lane >> 4)) * 2);
  const std::uint32_t b_lane = static_cast<std::uint32_t>((((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1)) * 2);
  const std::uint32_t bt_lane = a_lane;
  const std::uint32_t ds_lane = static_cast<std::uint32_t>((((lane & 7) + 8 * (lane >> 4)) * LDS + 8 * ((lane >> 3) & 1)) * 2);

  float dk_acc[DT][4], dv_acc[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[dt][e] = dv_acc[dt][e] = 0.0f;

  if (iters > 0) {
    load_rows<D, kBN>(ks, kg, k_stride, n0, seq_kv);
    load_rows<D, kBN>(vs, vg, v_stride, n0, seq_kv);
    fetch(0, 0);
  }

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    const long long h = hk * s.group + it / m_count;
    const int m0 = (m_first + it % m_count) * kBM;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < iters) fetch(it + 1, buf ^ 1);
    const std::uint32_t qbuf = qs + buf * kQBytes, dobuf = dos + buf * kQBytes;
    const float* st = stats + buf * 2 * kBM;

    const int last_row = (m0 + kBM < seq_q ? m0 + kBM : seq_q) - 1;
    const bool active = kw0 < kv_len && (!s.causal || kw0 <= last_row + diag_off);  // warp-uniform
    if (active) {
      // S^T = K_w Q^T and dP^T = V_w dO^T: 16 keys x 64 queries each.
      float sacc[QT][4], pacc[QT][4];
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[nt][e] = pacc[nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < DK; ++kk) {
        std::uint32_t ka[4], va[4];
        ldsm_x4(ka, ks + a_lane + 16 * warp * kRow + kk * 32);
        ldsm_x4(va, vs + a_lane + 16 * warp * kRow + kk * 32);
#pragma unroll
        for (int np = 0; np < QT / 2; ++np) {
          std::uint32_t qb[4], ob[4];
          ldsm_x4(qb, qbuf + b_lane + np * 16 * kRow + kk * 32);
          ldsm_x4(ob, dobuf + b_lane + np * 16 * kRow + kk * 32);
          mma16816<Bf16>(sacc[2 * np], ka, qb[0], qb[1]);
          mma16816<Bf16>(sacc[2 * np + 1], ka, qb[2], qb[3]);
          mma16816<Bf16>(pacc[2 * np], va, ob[0], ob[1]);
          mma16816<Bf16>(pacc[2 * np + 1], va, ob[2], ob[3]);
        }
      }
      // P, dS; this thread's keys kw0 + g (e 0, 1) and kw0 + g + 8 (e 2, 3), queries
      // m0 + 8 nt + 2 t + (e & 1). Hidden pairs get P = dS = 0.
      const bool full = kw0 + 16 <= kv_len && m0 + kBM <= seq_q && (!s.causal || kw0 + 15 <= m0 + diag_off);
      std::uint32_t pa[KQ][4], da[KQ][4];
#pragma unroll
      for (int nt = 0; nt < QT; ++nt) {
        const float2 l2 = *reinterpret_cast<const float2*>(st + 8 * nt + 2 * t);
        const float2 dd = *reinterpret_cast<const float2*>(st + kBM + 8 * nt + 2 * t);
        float p[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = exp2f(fmaf(sacc[nt][e], scale2, -((e & 1) ? l2.y : l2.x)));
          if (!full) {
            const int j = kw0 + g + 8 * (e >> 1), i = m0 + 8 * nt + 2 * t + (e & 1);
            const bool vis = i < seq_q && j < kv_len && (!s.causal || j <= i + diag_off);
            if (!vis) p[e] = 0.0f;
          }
          if constexpr (NoD) ds[e] = p[e] * pacc[nt][e];  // the planted bug: no D correction
          else ds[e] = p[e] * (pacc[nt][e] - ((e & 1) ? dd.y : dd.x));
        }
        pa[nt / 2][(nt % 2) * 2 + 0] = pack_round<Bf16>(p[0], p[1]);
        pa[nt / 2][(nt % 2) * 2 + 1] = pack_round<Bf16>(p[2], p[3]);
        da[nt / 2][(nt % 2) * 2 + 0] = pack_round<Bf16>(ds[0], ds[1]);
        da[nt / 2][(nt % 2) * 2 + 1] = pack_round<Bf16>(ds[2], ds[3]);
        *reinterpret_cast<std::uint32_t*>(ds_s + (16 * warp + g) * LDS + 8 * nt + 2 * t) = da[nt / 2][(nt % 2) * 2];
        *reinterpret_cast<std::uint32_t*>(ds_s + (16 * warp + g + 8) * LDS + 8 * nt + 2 * t) = da[nt / 2][(nt % 2) * 2 + 1];
      }
      // dV += P^T dO, dK += dS^T Q: k steps of 16 queries, pairs of n8 d tiles by ldmatrix.trans.
#pragma unroll
      for (int kq = 0; kq < KQ; ++kq)
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          std::uint32_t ob[4], qb[4];
          ldsm_x4_trans(ob, dobuf + bt_lane + kq * 16 * kRow + dp * 32);
          ldsm_x4_trans(qb, qbuf + bt_lane + kq * 16 * kRow + dp * 32);
          mma16816<Bf16>(dv_acc[2 * dp], pa[kq], ob[0], ob[1]);
          mma16816<Bf16>(dv_acc[2 * dp + 1], pa[kq], ob[2], ob[3]);
          mma16816<Bf16>(dk_acc[2 * dp], da[kq], qb[0], qb[1]);
          mma16816<Bf16>(dk_acc[2 * dp + 1], da[kq], qb[2], qb[3]);
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < QT; ++nt) {
        *reinterpret_cast<std::uint32_t*>(ds_s + (16 * warp + g) * LDS + 8 * nt + 2 * t) = 0u;
        *reinterpret_cast<std::uint32_t*>(ds_s + (16 * warp + g + 8) * LDS + 8 * nt + 2 * t) = 0u;
      }
    }
    __syncthreads();

    // dQ(64 rows) = dS K over the block's keys that any of the rows sees: warp w takes rows
    // 16 (w % 4) and columns (D / 2)(w / 4) of them.
    int key_end = kv_len - n0;
    if (s.causal && last_row + diag_off + 1 - n0 < key_end) key_end = last_row + diag_off + 1 - n0;
    const int k_steps = key_end <= 0 ? 0 : key_end >= kBN ? KB : (key_end + 15) / 16;
    const int qr0 = 16 * (warp % 4), dc0 = (D / 2) * (warp / 4);
    float qacc[DT / 2][4];
#pragma unroll
    for (int nt = 0; nt < DT / 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) qacc[nt][e] = 0.0f;
    for (int kk = 0; kk < k_steps; ++kk) {
      std::uint32_t a[4];
      ldsm_x4_trans(a, dss + ds_lane + kk * 16 * LDS * 2 + qr0 * 2);
#pragma unroll
      for (int dp = 0; dp < DT / 4; ++dp) {
        std::uint32_t kb[4];
        ldsm_x4_trans(kb, ks + bt_lane + kk * 16 * kRow + (dc0 + 16 * dp) * 2);
        mma16816<Bf16>(qacc[2 * dp], a, kb[0], kb[1]);
        mma16816<Bf16>(qacc[2 * dp + 1], a, kb[2], kb[3]);
      }
    }
    if (k_steps > 0) {
      float* base = dq_acc + ((b * s.heads + h) * s.seq_q) * D;
      if constexpr (Det) {
        base += static_cast<long long>(blockIdx.x) * s.batch * s.heads * s.seq_q * D;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = m0 + qr0 + g + 8 * half;
          if (i >= seq_q) continue;
#pragma unroll
          for (int nt = 0; nt < DT / 2; ++nt)
            *reinterpret_cast<float2*>(base + static_cast<long long>(i) * D + dc0 + 8 * nt + 2 * t) =
                make_float2(qacc[nt][2 * half], qacc[nt][2 * half + 1]);
        }
      } else if constexpr (!Quad) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = m0 + qr0 + g + 8 * half;
          if (i >= seq_q) continue;
#pragma unroll
          for (int nt = 0; nt < DT / 2; ++nt)
            add_pair(base + static_cast<long long>(i) * D + dc0 + 8 * nt + 2 * t, qacc[nt][2 * half], qacc[nt][2 * half + 1]);
        }
      } else {
        // Lanes t and t ^ 1 trade pairs: the even lane adds columns 2t .. 2t + 3 of row g, the
        // odd lane columns 2t - 2 .. 2t + 1 of row g + 8, each one float4 atomic per tile.
        const bool odd = t & 1;
        const int i = m0 + qr0 + g + (odd ? 8 : 0);
#pragma unroll
        for (int nt = 0; nt < DT / 2; ++nt) {
          const float send0 = odd ? qacc[nt][0] : qacc[nt][2], send1 = odd ? qacc[nt][1] : qacc[nt][3];
          const float r0 = __shfl_xor_sync(0xFFFFFFFFu, send0, 1), r1 = __shfl_xor_sync(0xFFFFFFFFu, send1, 1);
          if (i >= seq_q) continue;
          float* p = base + static_cast<long long>(i) * D + dc0 + 8 * nt + 2 * (t & ~1);
          if (odd) add_quad(p, r0, r1, qacc[nt][2], qacc[nt][3]);
          else add_quad(p, qacc[nt][0], qacc[nt][1], r0, r1);
        }
      }
    }
  }

  // dK = scale dK_acc, dV = dV_acc for the warp's keys below seq_kv (zero for hidden keys).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = kw0 + g + 8 * half;
    if (j >= seq_kv) continue;
    const long long krow = io.dk.offset(b, hk, j, 0), vrow = io.dv.offset(b, hk, j, 0);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      store_pair(io.dk, krow + 8 * dt + 2 * t, dk_acc[dt][2 * half] * s.scale, dk_acc[dt][2 * half + 1] * s.scale);
      store_pair(io.dv, vrow + 8 * dt + 2 * t, dv_acc[dt][2 * half], dv_acc[dt][2 * half + 1]);
    }
  }
}

// The same backward with a warp per 32 keys x 32 queries of S^T and dP^T (warps 4 along
// keys x 2 along queries), P^T and dS^T through shared memory, dV and dK by warps 4 along
// keys x 2 along columns and dQ by warps 2 along rows x 4 along columns: every warp reads
// two A and two B fragments per eight mma in each product, where a warp per 16 keys reads
// one A and four B (about 144 ldmatrix per warp and query block instead of 184 at D = 128).
template <int D, bool Bf16, bool Det, bool NoD, bool Quad>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_k32(Shape s, BackwardOperands io, const float* dsum, float* dq_acc) {
  constexpr int LD = D + kPad, LDS = kBM + kPad;
  constexpr int DK = D / 16, KQ = kBM / 16, KB = kBN / 16, N2 = D / 16, N3 = D / 32;
  constexpr std::uint32_t kRow = LD * 2, kQBytes = kBM * LD * 2, kSRow = LDS * 2;
  extern __shared__ __align__(16) std::uint16_t smem[];
  const std::uint32_t ks = smem_u32(smem), vs = ks + kBN * kRow, qs = vs + kBN * kRow, dos = qs + 2 * kQBytes,
                      pss = dos + 2 * kQBytes, dss = pss + kBN * kSRow;
  std::uint16_t* p_s = smem + (2 * kBN + 4 * kBM) * LD;
  std::uint16_t* ds_s = p_s + kBN * LDS;
  float* stats = reinterpret_cast<float*>(ds_s + kBN * LDS);  // [buffer][lse2 x kBM, D x kBM]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long kv_heads = s.heads / s.group, bhk = blockIdx.y, b = bhk / kv_heads, hk = bhk % kv_heads;
  const int seq_q = static_cast<int>(s.seq_q), seq_kv = static_cast<int>(s.seq_kv);
  const int n0 = blockIdx.x * kBN;
  const int kw = 32 * (warp % 4), kw0 = n0 + kw;  // the warp's keys in S^T, dP^T, dV, dK
  const int qw = 32 * (warp / 4);                 // its queries in S^T and dP^T
  const int dc2 = (D / 2) * (warp / 4);           // its columns of dV and dK
  const int qr3 = 32 * (warp % 2), dc3 = (D / 4) * (warp / 2);  // its rows and columns of dQ
  const long long kv_len64 = s.kv_lengths ? (s.kv_lengths[b] < s.seq_kv ? s.kv_lengths[b] : s.seq_kv) : s.seq_kv;
  const int kv_len = static_cast<int>(kv_len64 < 0 ? 0 : kv_len64);
  const int diag_off = seq_kv - seq_q;  // row i sees key j <= i + diag_off (causal)
  const int m_blocks = (seq_q + kBM - 1) / kBM;
  int m_first = 0;
  if (s.causal && n0 - diag_off > 0) m_first = (n0 - diag_off) / kBM;  // the first row that sees key n0
  const int m_count = n0 < kv_len && m_first < m_blocks ? m_blocks - m_first : 0;
  const int iters = m_count * static_cast<int>(s.group);

  const auto* kg = static_cast<const std::uint16_t*>(io.k.p) + io.k.offset(b, hk, 0, 0);
  const auto* vg = static_cast<const std::uint16_t*>(io.v.p) + io.v.offset(b, hk, 0, 0);
  const int q_stride = static_cast<int>(io.q.offset(0, 0, 1, 0)), k_stride = static_cast<int>(io.k.offset(0, 0, 1, 0)),
            v_stride = static_cast<int>(io.v.offset(0, 0, 1, 0)), o_stride = static_cast<int>(io.dout.offset(0, 0, 1, 0));
  const float scale2 = s.scale * kLog2e;

  const auto fetch = [&](int it, int buf) {
    const long long h = hk * s.group + it / m_count;
    const int m0 = (m_first + it % m_count) * kBM;
    load_rows<D, kBM>(qs + buf * kQBytes, static_cast<const std::uint16_t*>(io.q.p) + io.q.offset(b, h, 0, 0), q_stride, m0, seq_q);
    load_rows<D, kBM>(dos + buf * kQBytes, static_cast<const std::uint16_t*>(io.dout.p) + io.dout.offset(b, h, 0, 0), o_stride,
                      m0, seq_q);
    cp_async_commit();
    if (threadIdx.x < kBM) {
      const int i = m0 + threadIdx.x;
      const long long row = (b * s.heads + h) * s.seq_q + i;
      stats[buf * 2 * kBM + threadIdx.x] = i < seq_q ? io.lse[row] * kLog2e : INFINITY;
      stats[buf * 2 * kBM + kBM + threadIdx.x] = i < seq_q ? dsum[row] : 0.0f;
    }
  };

  const std::uint32_t a_lane = static_cast<std::uint32_t>(((lane & 15) * LD + 8 * (lane >> 4)) * 2);
  const std::uint32_t b_lane = static_cast<std::uint32_t>((((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1)) * 2);
  const std::uint32_t bt_lane = a_lane;
  const std::uint32_t as_lane = static_cast<std::uint32_t>(((lane & 15) * LDS + 8 * (lane >> 4)) * 2);
  const std::uint32_t ds_lane = static_cast<std::uint32_t>((((lane & 7) + 8 * (lane >> 4)) * LDS + 8 * ((lane >> 3) & 1)) * 2);

  float dk_acc[2][N2][4], dv_acc[2][N2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < N2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk_acc[mt][nt][e] = dv_acc[mt][nt][e] = 0.0f;

  if (iters > 0) {
    load_rows<D, kBN>(ks, kg, k_stride, n0, seq_kv);
    load_rows<D, kBN>(vs, vg, v_stride, n0, seq_kv);
    fetch(0, 0);
  }

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    const long long h = hk * s.group + it / m_count;
    const int m0 = (m_first + it % m_count) * kBM;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < iters) fetch(it + 1, buf ^ 1);
    const std::uint32_t qbuf = qs + buf * kQBytes, dobuf = dos + buf * kQBytes;
    const float* st = stats + buf * 2 * kBM;
    const int last_row = (m0 + kBM < seq_q ? m0 + kBM : seq_q) - 1;

    // S^T and dP^T of the warp's 32 keys x 32 queries; P^T and dS^T into shared memory.
    const int wq0 = m0 + qw, w_last = (wq0 + 32 < seq_q ? wq0 + 32 : seq_q) - 1;
    if (kw0 < kv_len && wq0 < seq_q && (!s.causal || kw0 <= w_last + diag_off)) {  // warp-uniform
      float sacc[2][4][4], pacc[2][4][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sacc[mt][nt][e] = pacc[mt][nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < DK; ++kk) {
        std::uint32_t ka[2][4], va[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          ldsm_x4(ka[mt], ks + a_lane + (kw + 16 * mt) * kRow + kk * 32);
          ldsm_x4(va[mt], vs + a_lane + (kw + 16 * mt) * kRow + kk * 32);
        }
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          std::uint32_t qb[4], ob[4];
          ldsm_x4(qb, qbuf + b_lane + (qw + 16 * np) * kRow + kk * 32);
          ldsm_x4(ob, dobuf + b_lane + (qw + 16 * np) * kRow + kk * 32);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma16816<Bf16>(sacc[mt][2 * np], ka[mt], qb[0], qb[1]);
            mma16816<Bf16>(sacc[mt][2 * np + 1], ka[mt], qb[2], qb[3]);
            mma16816<Bf16>(pacc[mt][2 * np], va[mt], ob[0], ob[1]);
            mma16816<Bf16>(pacc[mt][2 * np + 1], va[mt], ob[2], ob[3]);
          }
        }
      }
      // This thread's keys kw0 + 16 mt + g (e 0, 1) and + 8 (e 2, 3), queries wq0 + 8 nt +
      // 2 t + (e & 1). Hidden pairs get P = dS = 0.
      const bool full = kw0 + 32 <= kv_len && wq0 + 32 <= seq_q && (!s.causal || kw0 + 31 <= wq0 + diag_off);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float2 l2 = *reinterpret_cast<const float2*>(st + qw + 8 * nt + 2 * t);
        const float2 dd = *reinterpret_cast<const float2*>(st + kBM + qw + 8 * nt + 2 * t);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          float p[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            p[e] = exp2f(fmaf(sacc[mt][nt][e], scale2, -((e & 1) ? l2.y : l2.x)));
            if (!full) {
              const int j = kw0 + 16 * mt + g + 8 * (e >> 1), i = wq0 + 8 * nt + 2 * t + (e & 1);
              const bool vis = i < seq_q && j < kv_len && (!s.causal || j <= i + diag_off);
              if (!vis) p[e] = 0.0f;
            }
            if constexpr (NoD) ds[e] = p[e] * pacc[mt][nt][e];  // the planted bug: no D correction
            else ds[e] = p[e] * (pacc[mt][nt][e] - ((e & 1) ? dd.y : dd.x));
          }
          const int at = (kw + 16 * mt + g) * LDS + qw + 8 * nt + 2 * t;
          *reinterpret_cast<std::uint32_t*>(p_s + at) = pack_round<Bf16>(p[0], p[1]);
          *reinterpret_cast<std::uint32_t*>(p_s + at + 8 * LDS) = pack_round<Bf16>(p[2], p[3]);
          *reinterpret_cast<std::uint32_t*>(ds_s + at) = pack_round<Bf16>(ds[0], ds[1]);
          *reinterpret_cast<std::uint32_t*>(ds_s + at + 8 * LDS) = pack_round<Bf16>(ds[2], ds[3]);
        }
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int at = (kw + 16 * mt + g + 8 * half) * LDS + qw + 8 * nt + 2 * t;
            *reinterpret_cast<std::uint32_t*>(p_s + at) = 0u;
            *reinterpret_cast<std::uint32_t*>(ds_s + at) = 0u;
          }
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q for the warp's 32 keys and D / 2 columns (skipped where no
    // row of the block sees any of its keys: P and dS are zero there).
    if (kw0 < kv_len && (!s.causal || kw0 <= last_row + diag_off)) {
#pragma unroll
      for (int kq = 0; kq < KQ; ++kq) {
        std::uint32_t pa[2][4], da[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          ldsm_x4(pa[mt], pss + as_lane + (kw + 16 * mt) * kSRow + kq * 32);
          ldsm_x4(da[mt], dss + as_lane + (kw + 16 * mt) * kSRow + kq * 32);
        }
#pragma unroll
        for (int dp = 0; dp < N2 / 2; ++dp) {
          std::uint32_t ob[4], qb[4];
          ldsm_x4_trans(ob, dobuf + bt_lane + kq * 16 * kRow + (dc2 + 16 * dp) * 2);
          ldsm_x4_trans(qb, qbuf + bt_lane + kq * 16 * kRow + (dc2 + 16 * dp) * 2);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma16816<Bf16>(dv_acc[mt][2 * dp], pa[mt], ob[0], ob[1]);
            mma16816<Bf16>(dv_acc[mt][2 * dp + 1], pa[mt], ob[2], ob[3]);
            mma16816<Bf16>(dk_acc[mt][2 * dp], da[mt], qb[0], qb[1]);
            mma16816<Bf16>(dk_acc[mt][2 * dp + 1], da[mt], qb[2], qb[3]);
          }
        }
      }
    }

    // dQ(64 rows) = dS K over the block's keys that any of the rows sees: the warp's 32 rows
    // and D / 4 columns.
    int key_end = kv_len - n0;
    if (s.causal && last_row + diag_off + 1 - n0 < key_end) key_end = last_row + diag_off + 1 - n0;
    const int k_steps = key_end <= 0 ? 0 : key_end >= kBN ? KB : (key_end + 15) / 16;
    if (k_steps == 0 || m0 + qr3 >= seq_q) continue;
    float qacc[2][N3][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < N3; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) qacc[mt][nt][e] = 0.0f;
    for (int kk = 0; kk < k_steps; ++kk) {
      std::uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) ldsm_x4_trans(a[mt], dss + ds_lane + kk * 16 * kSRow + (qr3 + 16 * mt) * 2);
#pragma unroll
      for (int dp = 0; dp < N3 / 2; ++dp) {
        std::uint32_t kb[4];
        ldsm_x4_trans(kb, ks + bt_lane + kk * 16 * kRow + (dc3 + 16 * dp) * 2);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma16816<Bf16>(qacc[mt][2 * dp], a[mt], kb[0], kb[1]);
          mma16816<Bf16>(qacc[mt][2 * dp + 1], a[mt], kb[2], kb[3]);
        }
      }
    }
    float* base = dq_acc + ((b * s.heads + h) * s.seq_q) * D;
    if constexpr (Det) base += static_cast<long long>(blockIdx.x) * s.batch * s.heads * s.seq_q * D;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int r0 = m0 + qr3 + 16 * mt + g;
#pragma unroll
      for (int nt = 0; nt < N3; ++nt) {
        const int c = dc3 + 8 * nt + 2 * t;
        if constexpr (Det) {
          if (r0 < seq_q) *reinterpret_cast<float2*>(base + static_cast<long long>(r0) * D + c) = make_float2(qacc[mt][nt][0], qacc[mt][nt][1]);
          if (r0 + 8 < seq_q)
            *reinterpret_cast<float2*>(base + static_cast<long long>(r0 + 8) * D + c) = make_float2(qacc[mt][nt][2], qacc[mt][nt][3]);
        } else if constexpr (Quad) {
          // Lanes t and t ^ 1 trade pairs: the even lane adds columns 2t .. 2t + 3 of row g,
          // the odd lane columns 2t - 2 .. 2t + 1 of row g + 8.
          const bool odd = t & 1;
          const float send0 = odd ? qacc[mt][nt][0] : qacc[mt][nt][2], send1 = odd ? qacc[mt][nt][1] : qacc[mt][nt][3];
          const float x0 = __shfl_xor_sync(0xFFFFFFFFu, send0, 1), x1 = __shfl_xor_sync(0xFFFFFFFFu, send1, 1);
          const int i = r0 + (odd ? 8 : 0);
          if (i >= seq_q) continue;
          float* p = base + static_cast<long long>(i) * D + dc3 + 8 * nt + 2 * (t & ~1);
          if (odd) add_quad(p, x0, x1, qacc[mt][nt][2], qacc[mt][nt][3]);
          else add_quad(p, qacc[mt][nt][0], qacc[mt][nt][1], x0, x1);
        } else {
          if (r0 < seq_q) add_pair(base + static_cast<long long>(r0) * D + c, qacc[mt][nt][0], qacc[mt][nt][1]);
          if (r0 + 8 < seq_q) add_pair(base + static_cast<long long>(r0 + 8) * D + c, qacc[mt][nt][2], qacc[mt][nt][3]);
        }
      }
    }
  }

  // dK = scale dK_acc, dV = dV_acc for the warp's keys below seq_kv (zero for hidden keys).
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = kw0 + 16 * mt + g + 8 * half;
      if (j >= seq_kv) continue;
      const long long krow = io.dk.offset(b, hk, j, 0), vrow = io.dv.offset(b, hk, j, 0);
#pragma unroll
      for (int nt = 0; nt < N2; ++nt) {
        const int c = dc2 + 8 * nt + 2 * t;
        store_pair(io.dk, krow + c, dk_acc[mt][nt][2 * half] * s.scale, dk_acc[mt][nt][2 * half + 1] * s.scale);
        store_pair(io.dv, vrow + c, dv_acc[mt][nt][2 * half], dv_acc[mt][nt][2 * half + 1]);
      }
    }
}

// dQ = scale x the workspace (Det: the key blocks' partials summed in order), in dQ's format.
__global__ void dq_convert(Shape s, Operand dq, const float* acc, long long parts) {
  const long long n = s.batch * s.heads * s.seq_q * s.head_dim;
  for (long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    float sum = acc[e];
    for (long long p = 1; p < parts; ++p) sum += acc[p * n + e];
    const long long d = e % s.head_dim, i = (e / s.head_dim) % s.seq_q, h = (e / (s.head_dim * s.seq_q)) % s.heads,
                    b = e / (s.head_dim * s.seq_q * s.heads);
    store(dq, dq.offset(b, h, i, d), sum * s.scale);
  }
}

// The registered kernels' tiling: a warp per 32 keys x 32 queries (flash_backward_k32), else
// per 16 keys (flash_backward).
constexpr bool kWarpKeys32 = false;

template <int D, bool Bf16, bool Det, bool NoD, bool K32 = kWarpKeys32, bool Quad = true>
cudaError_t launch_flash(const Shape& s, const BackwardOperands& io, const float* dsum, float* acc, cudaStream_t stream) {
  constexpr int smem = K32 ? kBwdSmemBytesK32<D> : kBwdSmemBytes<D>;
  const auto kernel = [] {
    if constexpr (K32) return flash_backward_k32<D, Bf16, Det, NoD, Quad>;
    else return flash_backward<D, Bf16, Det, NoD, Quad>;
  }();
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((s.seq_kv + kBN - 1) / kBN), static_cast<unsigned>(s.batch * (s.heads / s.group)));
  kernel<<<grid, kThreads, smem, stream>>>(s, io, dsum, acc);
  return cudaGetLastError();
}

}  // namespace

long long flash_backward_workspace_floats(const Shape& s, bool deterministic) {
  const long long slice = s.batch * s.heads * s.seq_q * s.head_dim;
  return deterministic ? slice * ((s.seq_kv + kBN - 1) / kBN) : slice;
}

cudaError_t naive_attention_backward(const Shape& s, const BackwardOperands& io, float* dsum, float* P, float* dS,
                                     cudaStream_t stream) {
  const long long rows = s.batch * s.heads * s.seq_q;
  row_dot<<<grid_for(rows * 32), 256, 0, stream>>>(s, io.dout, io.o, dsum);
  naive_p_ds<<<grid_for(rows * s.seq_kv), 256, 0, stream>>>(s, io, dsum, P, dS);
  naive_dq<<<grid_for(rows * s.head_dim), 256, 0, stream>>>(s, io, dS);
  const long long width = s.head_dim > s.head_dim_v ? s.head_dim : s.head_dim_v;
  naive_dkdv<<<grid_for(s.batch * (s.heads / s.group) * s.seq_kv * width), 256, 0, stream>>>(s, io, P, dS);
  return cudaGetLastError();
}

namespace {

using FlashLaunch = cudaError_t (*)(const Shape&, const BackwardOperands&, const float*, float*, cudaStream_t);

// D, the cleared dQ workspace, the flash kernel, dQ scaled and converted.
cudaError_t run_flash(const Shape& s, const BackwardOperands& io, float* dsum, float* acc, bool deterministic, FlashLaunch launch,
                      cudaStream_t stream) {
  if (s.seq_q >= kMaxSeq || s.seq_kv >= kMaxSeq || (s.head_dim != 64 && s.head_dim != 128) || s.head_dim_v != s.head_dim)
    return cudaErrorInvalidValue;
  const long long rows = s.batch * s.heads * s.seq_q;
  row_dot<<<grid_for(rows * 32), 256, 0, stream>>>(s, io.dout, io.o, dsum);
  const long long n_acc = flash_backward_workspace_floats(s, deterministic);
  cudaError_t e = cudaMemsetAsync(acc, 0, static_cast<size_t>(n_acc) * sizeof(float), stream);
  if (e != cudaSuccess) return e;
  e = launch(s, io, dsum, acc, stream);
  if (e != cudaSuccess) return e;
  const long long parts = deterministic ? (s.seq_kv + kBN - 1) / kBN : 1;
  dq_convert<<<grid_for(rows * s.head_dim), 256, 0, stream>>>(s, io.dq, acc, parts);
  return cudaGetLastError();
}

}  // namespace

cudaError_t flash_attention_backward(const Shape& s, const BackwardOperands& io, float* dsum, float* acc, bool deterministic,
                                     bool planted_no_d, cudaStream_t stream) {
  const bool bf16 = io.q.format == kBf16, d64 = s.head_dim == 64;
  FlashLaunch launch;
  if (planted_no_d) launch = d64 ? launch_flash<64, false, false, true> : launch_flash<128, false, false, true>;
  else if (deterministic)
    launch = d64 ? (bf16 ? launch_flash<64, true, true, false> : launch_flash<64, false, true, false>)
                 : (bf16 ? launch_flash<128, true, true, false> : launch_flash<128, false, true, false>);
  else
    launch = d64 ? (bf16 ? launch_flash<64, true, false, false> : launch_flash<64, false, false, false>)
                 : (bf16 ? launch_flash<128, true, false, false> : launch_flash<128, false, false, false>);
  return run_flash(s, io, dsum, acc, deterministic, launch, stream);
}

cudaError_t flash_attention_backward_lab(const Shape& s, const BackwardOperands& io, float* dsum, float* acc, bool warp_keys_32,
                                         bool quad_atomics, cudaStream_t stream) {
  if (s.head_dim != 128) return cudaErrorInvalidValue;
  const bool bf16 = io.q.format == kBf16;
  FlashLaunch launch;
  if (warp_keys_32)
    launch = quad_atomics ? (bf16 ? launch_flash<128, true, false, false, true, true> : launch_flash<128, false, false, false, true, true>)
                          : (bf16 ? launch_flash<128, true, false, false, true, false> : launch_flash<128, false, false, false, true, false>);
  else
    launch = quad_atomics ? (bf16 ? launch_flash<128, true, false, false, false, true> : launch_flash<128, false, false, false, false, true>)
                          : (bf16 ? launch_flash<128, true, false, false, false, false> : launch_flash<128, false, false, false, false, false>);
  return run_flash(s, io, dsum, acc, false, launch, stream);
}

}  // namespace ulpgate::attn
