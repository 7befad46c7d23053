// FlashAttention-2 style forward pass on tensor cores: FP16 or BF16 Q, K, V,
// mma.sync m16n8k16 with FP32 accumulation, head_dim 64 or 128. 128 query rows per block
// of 4 warps, 64-key tiles of K and V double-buffered through shared memory with cp.async,
// online softmax in log2 units with P rounded to the input type before P V. The blocking,
// shared-memory layout, pipeline, fragments and masking are explained in
// docs/kernels/attention.md ("How the flash kernel works").
#include "kernels/attention/launch.hpp"
#include "kernels/attention/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ulpgate::attn {
namespace {

constexpr long long kMaxSeq = 1LL << 30;  // seq_q, seq_kv below it: row and key indices fit in int
constexpr int kRows = 128, kWarps = 4, kThreads = kWarps * 32, kWarpRows = kRows / kWarps, kPad = 8;
constexpr int kKeys = 64;
template <int D>
constexpr int kSmemBytes = (kRows + 4 * kKeys) * (D + kPad) * 2;  // Q, 2 x K, 2 x V
static_assert(kSmemBytes<128> == 104448 && kSmemBytes<64> == 55296, "two blocks per SM (228 KB)");
static_assert(kWarpRows == 32, "two m16 tiles per warp");


// The same with a zero accumulator in (the first k step of S = Q K^T).
template <bool Bf16>
__device__ __forceinline__ void mma16816_zero(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const float z = 0.0f;
  if constexpr (Bf16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
#else
  (void)a, (void)b0, (void)b1;
  d[0] = d[1] = d[2] = d[3] = __int_as_float(0x7FC00000);
#endif
}



// p = exp2(y) for P. BF16: exp2f (ex2.approx.f32, subnormal results kept: BF16 has them down
// to 2^-133). FP16: ex2.approx.ftz.f32 (FlashAttention-2's, one MUFU without exp2f's
// subnormal fix-up), which differs from exp2f only where exp2f's result is below 2^-126: such
// a p rounds to 0 in FP16 either way, and in l it is far below half an ulp of the row's final
// sum (about 1 or more: the row's max contributes p = 1), so O is the same barring exact ties.
template <bool Bf16>
__device__ __forceinline__ float exp2_p(float y) {
  if constexpr (Bf16) {
    return exp2f(y);
  } else {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
  }
}


// R rows x D halves of an operand's (b, h) slice from row `first` on into shared memory at
// `dst` (row stride D + kPad halves); rows at or past `limit` are zero. `base` is the slice's
// row 0 and `stride` its row stride in elements (Operand::offset's, both layouts). Thread
// tid copies the 16-byte pieces tid % (D / 8) of rows tid / (D / 8) + k kThreads / (D / 8).
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
    const bool in = row < limit;  // a row past the tensor: 0 bytes read (from its row 0), 16 zeros written
    cp_async16(dst + it * kStep * (D + kPad) * 2, base + static_cast<long long>(in ? row : 0) * stride, in ? 16 : 0);
  }
}

template <int D, bool Bf16, bool Rescale>
__global__ void __launch_bounds__(kThreads, 2) flash_forward(Shape s, Operand q, Operand k, Operand v, Operand o) {
  constexpr int BN = kKeys, LD = D + kPad, NT = BN / 8, KS = BN / 16, DT = D / 8;
  constexpr std::uint32_t kTileBytes = BN * LD * 2;
  extern __shared__ __align__(16) std::uint16_t smem[];
  const std::uint32_t qs = smem_u32(smem), ks = qs + kRows * LD * 2, vs = ks + 2 * kTileBytes;  // ks, vs: two buffers each
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Row and key indices in int: flash_attention takes seq_q and seq_kv below 2^30.
  const long long bh = blockIdx.y, b = bh / s.heads, h = bh % s.heads, hk = h / s.group;
  const int seq_q = static_cast<int>(s.seq_q), seq_kv = static_cast<int>(s.seq_kv);
  const int qblock = s.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // causal: heavy blocks first
  const int q0 = qblock * kRows, wq0 = q0 + kWarpRows * warp;
  const long long kv_len64 = s.kv_lengths ? (s.kv_lengths[b] < s.seq_kv ? s.kv_lengths[b] : s.seq_kv) : s.seq_kv;
  const int kv_len = static_cast<int>(kv_len64 < 0 ? 0 : kv_len64);
  const int diag_off = seq_kv - seq_q;  // row i sees key j <= i + diag_off (causal)
  // Keys this block can see: below kv_len and, causal, up to its last row's diagonal; the
  // same for this warp's rows (none if they all lie past seq_q).
  int kv_end = kv_len, warp_kv_end = wq0 < seq_q ? kv_len : 0;
  if (s.causal) {
    const int last = q0 + kRows - 1 < seq_q ? q0 + kRows - 1 : seq_q - 1;
    if (last + diag_off + 1 < kv_end) kv_end = last + diag_off + 1;
    const int wlast = wq0 + kWarpRows - 1 < seq_q ? wq0 + kWarpRows - 1 : seq_q - 1;
    if (wlast + diag_off + 1 < warp_kv_end) warp_kv_end = wlast + diag_off + 1;
  }
  const int n_tiles = kv_end > 0 ? (kv_end + BN - 1) / BN : 0;

  const auto* qg = static_cast<const std::uint16_t*>(q.p) + q.offset(b, h, 0, 0);
  const auto* kg = static_cast<const std::uint16_t*>(k.p) + k.offset(b, hk, 0, 0);
  const auto* vg = static_cast<const std::uint16_t*>(v.p) + v.offset(b, hk, 0, 0);
  const int q_stride = static_cast<int>(q.offset(0, 0, 1, 0)), k_stride = static_cast<int>(k.offset(0, 0, 1, 0)),
            v_stride = static_cast<int>(v.offset(0, 0, 1, 0));  // dim, or heads x dim (BSHD)

  float scale2 = s.scale * 1.4426950408889634f;  // scores in log2 units
  if (n_tiles > 0) {
    load_rows<D, kRows>(qs, qg, q_stride, q0, seq_q);
    cp_async_commit();
    load_rows<D, BN>(ks, kg, k_stride, 0, seq_kv);
    cp_async_commit();
    load_rows<D, BN>(vs, vg, v_stride, 0, seq_kv);
    cp_async_commit();
    if (scale2 < 0.0f) {  // negate this thread's own pieces of Q (its copies are visible to it after the wait)
      cp_async_wait<2>();
      constexpr int kChunks = D / 8, kStep = kThreads / kChunks;
      const int piece = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
#pragma unroll
      for (int it = 0; it < kRows / kStep; ++it) {
        uint4* p = reinterpret_cast<uint4*>(smem + (r0 + it * kStep) * LD + piece * 8);
        uint4 x = *p;
        x.x ^= 0x80008000u, x.y ^= 0x80008000u, x.z ^= 0x80008000u, x.w ^= 0x80008000u;
        *p = x;
      }
      scale2 = -scale2;
    }
  }

  // Per-lane ldmatrix offsets (bytes): Q rows 32 warp + lane % 16 (+16 for the second m
  // tile), columns 8 (lane / 16); K keys lane % 8 + 8 (lane / 16), columns 8 ((lane / 8) % 2);
  // V keys lane % 16, columns 8 (lane / 16).
  const std::uint32_t q_addr = qs + static_cast<std::uint32_t>(((kWarpRows * warp + (lane & 15)) * LD + 8 * (lane >> 4)) * 2);
  const std::uint32_t k_lane = static_cast<std::uint32_t>((((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1)) * 2);
  const std::uint32_t v_lane = static_cast<std::uint32_t>(((lane & 15) * LD + 8 * (lane >> 4)) * 2);

  float oacc[2][DT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) oacc[mt][dt][0] = oacc[mt][dt][1] = oacc[mt][dt][2] = oacc[mt][dt][3] = 0.0f;
  // This thread's rows: r = 2 mt + half is row wq0 + 16 mt + 8 half + g (l: this thread's part).
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  for (int jt = 0; jt < n_tiles; ++jt) {
    const int j0 = jt * BN;
    const std::uint32_t kbuf = ks + static_cast<std::uint32_t>(jt & 1) * kTileBytes;
    const std::uint32_t vbuf = vs + static_cast<std::uint32_t>(jt & 1) * kTileBytes;
    // K(j+1) into the other K buffer (K(j-1)'s: every warp passed the previous iteration's
    // second barrier, after its S), then wait for K(j).
    const std::uint32_t other = static_cast<std::uint32_t>((jt + 1) & 1) * kTileBytes;
    if (jt + 1 < n_tiles) load_rows<D, BN>(ks + other, kg, k_stride, j0 + BN, seq_kv);
    cp_async_commit();
    cp_async_wait<2>();
    __syncthreads();
    // V(j+1) into the other V buffer (V(j-1)'s: every warp has passed this barrier, after its P V).
    if (jt + 1 < n_tiles) load_rows<D, BN>(vs + other, vg, v_stride, j0 + BN, seq_kv);
    cp_async_commit();

    const bool active = j0 < warp_kv_end;  // warp-uniform: some row of this warp sees a key of the tile
    std::uint32_t pa[2][KS][4];             // P as A fragments: m tile, key step of 16
    if (active) {
      // S = Q K^T: k steps of 16 d; per step two Q A fragments and, per pair of n8 key tiles,
      // one K ldmatrix.x4 feeding four mma.
      float sacc[2][NT][4];
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t qa[2][4];
        ldsm_x4(qa[0], q_addr + kk * 32);
        ldsm_x4(qa[1], q_addr + 16 * LD * 2 + kk * 32);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          std::uint32_t kb[4];
          ldsm_x4(kb, kbuf + k_lane + np * 16 * LD * 2 + kk * 32);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            if (kk == 0) {
              mma16816_zero<Bf16>(sacc[mt][2 * np], qa[mt], kb[0], kb[1]);
              mma16816_zero<Bf16>(sacc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
            } else {
              mma16816<Bf16>(sacc[mt][2 * np], qa[mt], kb[0], kb[1]);
              mma16816<Bf16>(sacc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
            }
          }
        }
      }
      // Masking, only where some key of the tile is hidden from the warp's first row (and so
      // maybe from others): row i sees key j iff i < seq_q, j < kv_len and, causal, j <= i +
      // diag_off. `vis`: how many of the tile's keys row r sees (a prefix of the tile).
      const bool full = j0 + BN <= kv_len && (!s.causal || j0 + BN - 1 <= wq0 + diag_off);
      if (!full) {
        int vis[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i = wq0 + 16 * (r / 2) + 8 * (r % 2) + g;
          int end = kv_len;
          if (s.causal && i + diag_off + 1 < end) end = i + diag_off + 1;
          if (i >= seq_q) end = 0;
          end -= j0;
          vis[r] = end;  // <= 0: none; >= BN: all
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (8 * nt + 2 * t + (e & 1) >= vis[2 * mt + e / 2]) sacc[mt][nt][e] = -INFINITY;
      }
      // The rows' new max (raw scores, then scaled: the max of the scaled scores for a scale
      // >= 0), alpha = exp2(m_old - m_new).
      float alpha[4], mu[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int mt = r / 2, e0 = 2 * (r % 2);
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(sacc[mt][nt][e0], sacc[mt][nt][e0 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
        const float m_new = fmaxf(m[r], mx == -INFINITY ? -INFINITY : mx * scale2);
        alpha[r] = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);  // m = -inf: exp2(-inf) = 0
        if constexpr (!Rescale) alpha[r] = m[r] == -INFINITY ? alpha[r] : 1.0f;  // the planted bug
        m[r] = m_new;
        l[r] *= alpha[r];
        mu[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row without a key so far: its p are all 0
      }
      if (__any_sync(0xFFFFFFFFu, alpha[0] != 1.0f || alpha[1] != 1.0f || alpha[2] != 1.0f || alpha[3] != 1.0f)) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            oacc[mt][dt][0] *= alpha[2 * mt], oacc[mt][dt][1] *= alpha[2 * mt];
            oacc[mt][dt][2] *= alpha[2 * mt + 1], oacc[mt][dt][3] *= alpha[2 * mt + 1];
          }
      }
      // P = exp2(s scale log2(e) - m) (one FFMA): summed in FP32 into l, rounded to the input
      // type for P V. The C layout of n8 tile nt is the A fragment of key step nt / 2:
      // registers 0, 1 (its first 8 keys) or 2, 3 (its second); rows g (p[0], p[1]) and g + 8.
      // A masked score (-inf) gives exp2(-inf) = 0, except with a scale of 0 (-inf x 0 is a
      // NaN): there, and only on a masked tile, masked p are set to 0 explicitly.
      const auto softmax_p = [&](auto guard) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int r = 2 * mt + e / 2;
              const float x = sacc[mt][nt][e];
              p[e] = exp2_p<Bf16>(fmaf(x, scale2, -mu[r]));
              if constexpr (decltype(guard)::value) p[e] = x == -INFINITY ? 0.0f : p[e];
              l[r] += p[e];
            }
            pa[mt][nt / 2][(nt % 2) * 2 + 0] = pack_round<Bf16>(p[0], p[1]);
            pa[mt][nt / 2][(nt % 2) * 2 + 1] = pack_round<Bf16>(p[2], p[3]);
          }
      };
      if (!full && scale2 == 0.0f) softmax_p(std::true_type{});
      else softmax_p(std::false_type{});
    }

    // Wait for V(j); after this barrier every warp is done with K(j) too.
    cp_async_wait<2>();
    __syncthreads();
    if (active) {
      // O += P V: per key step of 16 and pair of n8 d tiles, one V ldmatrix.x4.trans feeding
      // four mma.
#pragma unroll
      for (int kst = 0; kst < KS; ++kst)
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          std::uint32_t vb[4];
          ldsm_x4_trans(vb, vbuf + v_lane + kst * 16 * LD * 2 + dp * 32);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma16816<Bf16>(oacc[mt][2 * dp], pa[mt][kst], vb[0], vb[1]);
            mma16816<Bf16>(oacc[mt][2 * dp + 1], pa[mt][kst], vb[2], vb[3]);
          }
        }
    }
  }

  // The rows' sums over the quad, then O / l: two adjacent columns per store (8-byte aligned
  // O: every pair starts at an even element), else one at a time.
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
  }
  const bool pairs = (reinterpret_cast<std::uintptr_t>(o.out) & 7) == 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int mt = r / 2, e0 = 2 * (r % 2);
    const int i = wq0 + 16 * mt + 8 * (r % 2) + g;
    if (i >= seq_q) continue;
    // The log-sum-exp (m is in log2 units): (m + log2 l) ln 2, -inf for a row without a key.
    if (s.lse && t == 0) s.lse[bh * s.seq_q + i] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * 0.6931471805599453f : -INFINITY;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const long long row = o.offset(b, h, i, 0);
    if (pairs && o.format == kFp16) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<__half2*>(static_cast<__half*>(o.out) + row + 8 * dt + 2 * t) =
            __floats2half2_rn(oacc[mt][dt][e0] * inv, oacc[mt][dt][e0 + 1] * inv);
    } else if (pairs && o.format == kBf16) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(o.out) + row + 8 * dt + 2 * t) =
            __floats2bfloat162_rn(oacc[mt][dt][e0] * inv, oacc[mt][dt][e0 + 1] * inv);
    } else if (pairs && o.format == kFp32) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<float2*>(static_cast<float*>(o.out) + row + 8 * dt + 2 * t) =
            make_float2(oacc[mt][dt][e0] * inv, oacc[mt][dt][e0 + 1] * inv);
    } else {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int c = 0; c < 2; ++c) store(o, row + 8 * dt + 2 * t + c, oacc[mt][dt][e0 + c] * inv);
    }
  }
}

template <int D, bool Bf16, bool Rescale>
cudaError_t launch(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o, cudaStream_t stream) {
  constexpr int smem = kSmemBytes<D>;
  cudaError_t e = cudaFuncSetAttribute(flash_forward<D, Bf16, Rescale>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  // Two blocks per SM need the largest shared-memory carve-out (a hint; L1 is not used: cp.async.cg).
  e = cudaFuncSetAttribute(flash_forward<D, Bf16, Rescale>, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((s.seq_q + kRows - 1) / kRows), static_cast<unsigned>(s.batch * s.heads));
  flash_forward<D, Bf16, Rescale><<<grid, kThreads, smem, stream>>>(s, q, k, v, o);
  return cudaGetLastError();
}

}  // namespace

cudaError_t flash_attention(const Shape& s, const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                            bool rescale, cudaStream_t stream) {
  const bool bf16 = q.format == kBf16, d64 = s.head_dim == 64;
  if (s.seq_q >= kMaxSeq || s.seq_kv >= kMaxSeq) return cudaErrorInvalidValue;  // indices in int
  if (!rescale)  // the planted bug, FP16 and head_dim 64/128 only
    return d64 ? launch<64, false, false>(s, q, k, v, o, stream) : launch<128, false, false>(s, q, k, v, o, stream);
  if (d64) return bf16 ? launch<64, true, true>(s, q, k, v, o, stream) : launch<64, false, true>(s, q, k, v, o, stream);
  return bf16 ? launch<128, true, true>(s, q, k, v, o, stream) : launch<128, false, true>(s, q, k, v, o, stream);
}

}  // namespace ulpgate::attn
