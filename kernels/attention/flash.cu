// FlashAttention-2 style forward pass on tensor cores (issue 19): FP16 or BF16 Q, K, V,
// mma.sync m16n8k16 with FP32 accumulation, head_dim 64 or 128.
//
// A block of 4 warps takes 64 query rows of one (batch, head) (16 rows per warp, kept in
// registers as mma A fragments for the whole pass) and streams the keys in tiles of 64
// through shared memory (cp.async, 16 bytes a copy). Per tile each warp computes its 16 x
// 64 scores S = Q K^T (FP32), masks them (causal, kv_lengths, the K tail), updates its rows'
// running max m and sum l (scores in log2 units: exp2 of scale log2(e) s), rescales its
// output accumulator by exp2(m_old - m_new), rounds P = exp2(s - m) to the input type (as
// FlashAttention does before P V) and accumulates O += P V from the same registers (the
// score accumulator's layout is the A fragment's). At the end O / l is written in O's
// format (0 for a row that sees no key).
#include "kernels/attention/launch.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ulpgate::attn {
namespace {

constexpr int kRows = 64, kKeys = 64, kWarps = 4, kPad = 8;  // pad: rows of D + 8 halves, no bank conflicts

template <bool Bf16>
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (Bf16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)a, (void)b0, (void)b1;
  d[0] = __int_as_float(0x7FC00000);
#endif
}

// Two floats rounded to nearest into the input type, packed low then high.
template <bool Bf16>
__device__ __forceinline__ std::uint32_t pack_round(float lo, float hi) {
  if constexpr (Bf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

__device__ __forceinline__ std::uint32_t pack16(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// rows x D halves of an operand's (b, h) from row `first` on into shared memory (row stride
// D + kPad); rows past `limit` are zero. 16-byte copies: D is a multiple of 8 and every row
// starts on a multiple of 8 elements in both layouts.
template <int D>
__device__ void load_tile(std::uint16_t* tile, const Operand& x, long long b, long long h, long long first, long long limit) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  const auto* base = static_cast<const std::uint16_t*>(x.p);
  for (int c = threadIdx.x; c < kRows * kChunks; c += kWarps * 32) {
    const int r = c / kChunks, piece = c % kChunks;
    std::uint16_t* dst = tile + r * (D + kPad) + piece * 8;
    const long long row = first + r;
    if (row < limit) {
      cp_async16(dst, base + x.offset(b, h, row, piece * 8));
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

template <int D, bool Bf16, bool Rescale>
__global__ void __launch_bounds__(kWarps * 32) flash_forward(Shape s, Operand q, Operand k, Operand v, Operand o) {
  extern __shared__ __align__(16) std::uint16_t smem[];
  std::uint16_t* qs = smem;
  std::uint16_t* ks = qs + kRows * (D + kPad);
  std::uint16_t* vs = ks + kKeys * (D + kPad);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long bh = blockIdx.y, b = bh / s.heads, h = bh % s.heads, hk = h / s.group;
  const long long q0 = static_cast<long long>(blockIdx.x) * kRows;
  const long long kv_len = s.kv_lengths ? (s.kv_lengths[b] < s.seq_kv ? s.kv_lengths[b] : s.seq_kv) : s.seq_kv;
  // Keys this block can see: below kv_len and, causal, up to its last row's diagonal.
  long long kv_end = kv_len;
  if (s.causal) {
    const long long last_row = (q0 + kRows - 1 < s.seq_q ? q0 + kRows - 1 : s.seq_q - 1);
    const long long diag = last_row + (s.seq_kv - s.seq_q) + 1;
    if (diag < kv_end) kv_end = diag;
  }

  load_tile<D>(qs, q, b, h, q0, s.seq_q);
  cp_async_wait_all();
  __syncthreads();
  // This warp's Q fragments: rows 16 warp + g (+8), columns 16 kk + 2t (+1) and + 8.
  std::uint32_t qa[D / 16][4];
  {
    const std::uint16_t* r0 = qs + (16 * warp + g) * (D + kPad);
    const std::uint16_t* r1 = r0 + 8 * (D + kPad);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qa[kk][0] = *reinterpret_cast<const std::uint32_t*>(r0 + 16 * kk + 2 * t);
      qa[kk][1] = *reinterpret_cast<const std::uint32_t*>(r1 + 16 * kk + 2 * t);
      qa[kk][2] = *reinterpret_cast<const std::uint32_t*>(r0 + 16 * kk + 2 * t + 8);
      qa[kk][3] = *reinterpret_cast<const std::uint32_t*>(r1 + 16 * kk + 2 * t + 8);
    }
  }
  const float scale2 = s.scale * 1.4426950408889634f;  // scores in log2 units
  float oacc[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) oacc[dt][0] = oacc[dt][1] = oacc[dt][2] = oacc[dt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8 (l: this thread's part)
  const long long row_i[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};

  for (long long j0 = 0; j0 < kv_end; j0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<D>(ks, k, b, hk, j0, s.seq_kv);
    load_tile<D>(vs, v, b, hk, j0, s.seq_kv);
    cp_async_wait_all();
    __syncthreads();
    // S = Q K^T: 8 tiles of 8 keys; B fragment (k = d, n = key): K[key g][d 2t, 2t+1] and + 8.
    float sacc[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
      sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.0f;
      const std::uint16_t* kr = ks + (8 * nt + g) * (D + kPad);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        mma16816<Bf16>(sacc[nt], qa[kk], *reinterpret_cast<const std::uint32_t*>(kr + 16 * kk + 2 * t),
                       *reinterpret_cast<const std::uint32_t*>(kr + 16 * kk + 2 * t + 8));
    }
    // Mask and scale; the rows' new max.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const long long i = row_i[r], j = j0 + 8 * nt + 2 * t + (e & 1);
        const bool seen = i < s.seq_q && j < kv_len && (!s.causal || j <= i + (s.seq_kv - s.seq_q));
        const float x = seen ? sacc[nt][e] * scale2 : -INFINITY;
        sacc[nt][e] = x;
        mx[r] = fmaxf(mx[r], x);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      alpha[r] = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);  // m = -inf: exp2(-inf) = 0
      if constexpr (!Rescale) alpha[r] = m[r] == -INFINITY ? alpha[r] : 1.0f;  // the planted bug
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      oacc[dt][0] *= alpha[0], oacc[dt][1] *= alpha[0];
      oacc[dt][2] *= alpha[1], oacc[dt][3] *= alpha[1];
    }
    // P = exp2(x - m): summed in FP32 into l, rounded to the input type for P V.
    std::uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        p[e] = sacc[nt][e] == -INFINITY ? 0.0f : exp2f(sacc[nt][e] - m[r]);
        l[r] += p[e];
      }
      // C layout of tile nt -> A fragment of key step nt / 2: registers 0, 1 (first 8 keys)
      // or 2, 3 (second 8 keys); rows g (p[0], p[1]) and g + 8 (p[2], p[3]).
      pa[nt / 2][(nt % 2) * 2 + 0] = pack_round<Bf16>(p[0], p[1]);
      pa[nt / 2][(nt % 2) * 2 + 1] = pack_round<Bf16>(p[2], p[3]);
    }
    // O += P V: B fragment (k = key, n = d): V[key 2t, 2t+1][d] and keys + 8.
#pragma unroll
    for (int ks2 = 0; ks2 < kKeys / 16; ++ks2) {
      const std::uint16_t* v0 = vs + (16 * ks2 + 2 * t) * (D + kPad);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const int d = 8 * dt + g;
        const std::uint32_t b0 = pack16(v0[d], v0[(D + kPad) + d]);
        const std::uint32_t b1 = pack16(v0[8 * (D + kPad) + d], v0[9 * (D + kPad) + d]);
        mma16816<Bf16>(oacc[dt], pa[ks2], b0, b1);
      }
    }
  }
  // The rows' sums over the quad, then O / l.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const long long i = row_i[r];
    if (i >= s.seq_q) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int c = 0; c < 2; ++c) store(o, o.offset(b, h, i, 8 * dt + 2 * t + c), oacc[dt][2 * r + c] * inv);
  }
}

template <int D, bool Bf16, bool Rescale>
cudaError_t launch(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(kRows + 2 * kKeys) * (D + kPad) * sizeof(std::uint16_t);
  cudaError_t e = cudaFuncSetAttribute(flash_forward<D, Bf16, Rescale>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((s.seq_q + kRows - 1) / kRows), static_cast<unsigned>(s.batch * s.heads));
  flash_forward<D, Bf16, Rescale><<<grid, kWarps * 32, smem, stream>>>(s, q, k, v, o);
  return cudaGetLastError();
}

}  // namespace

cudaError_t flash_attention(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                            bool rescale, cudaStream_t stream) {
  const bool bf16 = q.format == kBf16, d64 = s.head_dim == 64;
  if (!rescale)  // the planted bug, FP16 and head_dim 64/128 only
    return d64 ? launch<64, false, false>(s, q, k, v, o, stream) : launch<128, false, false>(s, q, k, v, o, stream);
  if (d64) return bf16 ? launch<64, true, true>(s, q, k, v, o, stream) : launch<64, false, true>(s, q, k, v, o, stream);
  return bf16 ? launch<128, true, true>(s, q, k, v, o, stream) : launch<128, false, true>(s, q, k, v, o, stream);
}

}  // namespace ulpgate::attn
