// Steps 6-9's building blocks and step 7's kernel, a template on its tile shapes: the ladder
// (simt_fp32.cu) runs Step7Config, dev/sgemm_configs.cu times other shapes beside cuBLAS.
// Every shape adds an element's products in k order, one FMA each. CUDA C++17.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gemm/cp_async.cuh"
#include "kernels/gemm/simt_fp32.hpp"

namespace ulpgate::simt {

using i64 = std::int64_t;

__host__ __device__ constexpr i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// Tiles reaching past the matrix are padded, A with -0 and B with +0: their product -0 leaves
// every sum as it was, -0 included (a +0 product would turn a -0 sum into +0), so a padded
// tile adds exactly what the plain k loop adds.
constexpr float kPadA = -0.0f, kPadB = 0.0f;

// D(i, j) = alpha acc + beta C(i, j), rounded as alpha acc, then one FMA (cpu.fp32_seq's order).
__device__ __forceinline__ void store(const Problem& p, i64 b, i64 i, i64 j, float acc) {
  float v = __fmul_rn(p.alpha, acc);
  if (p.c) v = __fmaf_rn(p.beta, p.c[b * p.stride_c + i * p.ldc + j], v);
  p.d[b * p.stride_d + i * p.ldd + j] = v;
}

// acc[r][c] += a[r] b[c]: the register tile's outer product for one k.
template <int R, int C>
__device__ __forceinline__ void outer(float (&acc)[R][C], const float (&a)[R], const float (&b)[C]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[r][c] = __fmaf_rn(a[r], b[c], acc[r][c]);
}

// Four elements of P from (mn, k) along its contiguous index, padded past mn_end and k_end:
// one 16-byte load where the panel allows it (vec: 16-byte aligned, ld and batch stride
// multiples of 4, so a group starting at a multiple of 4 is aligned) and all four are inside.
__device__ __forceinline__ float4 fetch4(const Panel& P, bool vec, i64 b, i64 mn, i64 k, i64 mn_end, i64 k_end,
                                         float pad) {
  const bool inside = P.along_k ? mn < mn_end : k < k_end;  // the other index
  const i64 left = P.along_k ? k_end - k : mn_end - mn;     // elements left along the contiguous one
  if (!inside || left <= 0) return make_float4(pad, pad, pad, pad);
  const float* q = P.p + offset(P, b, mn, k);
  if (vec && left >= 4) return *reinterpret_cast<const float4*>(q);
  return make_float4(q[0], left > 1 ? q[1] : pad, left > 2 ? q[2] : pad, left > 3 ? q[3] : pad);
}

// Where unit u of thread tid lies in an MN x KT tile cut into units of W consecutive elements
// along the panel's contiguous index, consecutive threads on consecutive units (so that loads
// coalesce). W = 4: float4 groups, either storage order; W = 1: single elements, along k only.
template <int MN, int KT, int THREADS, int W>
__device__ __forceinline__ void place(bool along_k, int tid, int u, int& mn, int& k) {
  static_assert(MN * KT % (W * THREADS) == 0 && THREADS % (KT / W) == 0 && THREADS % (MN / 4) == 0,
                "whole units; a thread's units differ in one index");
  if (along_k) {
    mn = tid / (KT / W) + u * (THREADS / (KT / W)), k = tid % (KT / W) * W;
  } else {
    mn = tid % (MN / 4) * 4, k = tid / (MN / 4) + u * (THREADS / (MN / 4));
  }
}

// A thread's share of an MN x KT tile of a panel, as float4 groups along the contiguous index:
// fetched into registers, later put in shared memory as s[k * S + mn], so that the loads of
// the next tile are in flight while the current one computes.
template <int MN, int KT, int S, int THREADS>
struct TileLoader {
  static constexpr int kGroups = MN * KT / 4 / THREADS;
  static_assert(S % 4 == 0, "aligned rows");
  float4 r[kGroups];

  __device__ void fetch(const Panel& P, bool vec, i64 b, i64 mn0, i64 k0, i64 mn_end, i64 k_end, float pad,
                        int tid) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      int mn, k;
      place<MN, KT, THREADS, 4>(P.along_k, tid, g, mn, k);
      r[g] = fetch4(P, vec, b, mn0 + mn, k0 + k, mn_end, k_end, pad);
    }
  }
  __device__ void put(float* s, bool along_k, int tid) const {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      int mn, k;
      place<MN, KT, THREADS, 4>(along_k, tid, g, mn, k);
      if (along_k) {  // four k: a column of s
        s[(k + 0) * S + mn] = r[g].x, s[(k + 1) * S + mn] = r[g].y;
        s[(k + 2) * S + mn] = r[g].z, s[(k + 3) * S + mn] = r[g].w;
      } else {
        *reinterpret_cast<float4*>(&s[k * S + mn]) = r[g];
      }
    }
  }
};

// Index of a thread's r-th row (or column) when they are runs of 4 at STRIDE u + 4 q, u = r / 4.
template <int STRIDE>
__device__ __forceinline__ int split_index(int q, int r) { return r / 4 * STRIDE + 4 * q + r % 4; }

// The N values of a shared row at split_index<STRIDE>(q, 0..N-1): N / 4 float4 reads.
template <int STRIDE, int N>
__device__ __forceinline__ void load_runs(float (&v)[N], const float* row, int q) {
#pragma unroll
  for (int u = 0; u < N / 4; ++u) {
    const float4 x = *reinterpret_cast<const float4*>(row + u * STRIDE + 4 * q);
    v[4 * u] = x.x, v[4 * u + 1] = x.y, v[4 * u + 2] = x.z, v[4 * u + 3] = x.w;
  }
}

// D(i, j..j+3) from four sums, inside the matrix only: one 16-byte load of C and store of D
// where both allow it (vec_d) and all four are inside, element by element otherwise.
__device__ __forceinline__ void store4(const Problem& p, bool vec_d, i64 b, i64 i, i64 j, const float* acc) {
  if (i >= p.m) return;
  if (vec_d && j + 3 < p.n) {
    float4 v = make_float4(__fmul_rn(p.alpha, acc[0]), __fmul_rn(p.alpha, acc[1]), __fmul_rn(p.alpha, acc[2]),
                           __fmul_rn(p.alpha, acc[3]));
    if (p.c) {
      const float4 c = *reinterpret_cast<const float4*>(p.c + b * p.stride_c + i * p.ldc + j);
      v = make_float4(__fmaf_rn(p.beta, c.x, v.x), __fmaf_rn(p.beta, c.y, v.y), __fmaf_rn(p.beta, c.z, v.z),
                      __fmaf_rn(p.beta, c.w, v.w));
    }
    *reinterpret_cast<float4*>(p.d + b * p.stride_d + i * p.ldd + j) = v;
    return;
  }
  for (int q = 0; q < 4 && j + q < p.n; ++q) store(p, b, i, j + q, acc[q]);
}

// Where step 7's kernel puts its sums: D (step 7), this split's partial sums (step 8: row-major
// M x ldw per batch and split, ldw a multiple of 4), or atomically added into D (step 9).
enum class Sink { D, Partial, Atomic };
struct Split {
  int splits = 1;
  i64 k_chunk = 0;  // K range of split s: [s k_chunk, min(K, (s + 1) k_chunk))
  Sink sink = Sink::D;
  float* partial = nullptr;
  i64 ldw = 0;
};

constexpr i64 kMaxGridYZ = 65535;

// x: tiles along a row of the grid (up to 2^31 - 1); y and z capped, the kernels stride on.
inline dim3 grid(i64 x, i64 y, i64 z) {
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y < kMaxGridYZ ? y : kMaxGridYZ),
              static_cast<unsigned>(z < kMaxGridYZ ? z : kMaxGridYZ));
}

/// How step 7's tiles reach shared memory. Registers: tile t+1 fetched before tile t's FMAs
/// and put after them, two buffers (step 6's scheme). CpAsync: copied straight to shared
/// memory in a pipeline of STAGES buffers, STAGES - 1 tiles in flight, no registers held.
enum class Staging { Registers, CpAsync };

/// Step 7's shape: BM x BN block tiles walked BK at a time; each warp owns a WM x WN sub-tile,
/// its lanes LM x LN (LM = WM / TM, LN = WN / TN) each TM x TN sums as blocks of 4 x 4 spaced
/// 4 LM rows and 4 LN columns apart, so that per k a warp reads contiguous float4 runs of the
/// shared rows, each shared by several lanes. MIN_BLOCKS: __launch_bounds__'s blocks per SM
/// (registers per thread at most 64K / (threads x MIN_BLOCKS)).
template <int BM_, int BN_, int BK_, int WM_, int WN_, int TM_ = 8, int TN_ = 8, int MIN_BLOCKS = 1,
          Staging STAGING = Staging::Registers, int STAGES = 2>
struct WarptileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, TM = TM_, TN = TN_;
  static constexpr int kMinBlocks = MIN_BLOCKS, kStages = STAGES;
  static constexpr Staging kStaging = STAGING;
  static constexpr int kWarpsM = BM / WM, kThreads = BM / WM * (BN / WN) * 32;
  static constexpr int LM = WM / TM, LN = WN / TN;
  // Shared rows of BM + 4 floats: a tile stored along k is put four rows at a time, and the 4
  // pushes those rows' columns onto other banks; rows stay 16-byte aligned.
  static constexpr int SA = BM + 4, SB = BN + 4;
  static constexpr std::size_t kSmemBytes = sizeof(float) * STAGES * BK * (SA + SB);
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % TM == 0 && WN % TN == 0 && LM * LN == 32,
                "warps tile the block, 32 lanes the warp");
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "float4 runs");
  static_assert(BM * BK % (4 * kThreads) == 0 && BN * BK % (4 * kThreads) == 0, "whole float4 units per thread");
  static_assert(STAGING == Staging::CpAsync ? STAGES >= 2 : STAGES == 2, "registers stage two buffers");
};

// A thread's units (place<W>) of one panel's tiles, walked by pointer: unit u of the current
// tile starts at `at + u step` in memory and goes to s[dst + u ddst] in shared memory (the
// tile as s[k * S + mn]). Tiles wholly inside the panel load from there unchecked, the others
// through checks.
struct Walk {
  const float* at;      // unit 0 of the current tile (formed, not read, where outside the panel)
  i64 step, tile_step;  // to the next unit, to the next tile
  int dst, ddst;
};

template <int MN, int KT, int S, int THREADS, int W>
__device__ __forceinline__ Walk walk(const Panel& P, i64 b, i64 mn0, i64 k0, int tid) {
  int mn, k, mn1, k1;
  place<MN, KT, THREADS, W>(P.along_k, tid, 0, mn, k);
  place<MN, KT, THREADS, W>(P.along_k, tid, 1, mn1, k1);
  Walk w;
  w.at = P.p + offset(P, b, mn0 + mn, k0 + k);
  w.step = P.along_k ? (mn1 - mn) * P.ld : (k1 - k) * P.ld;
  w.tile_step = P.along_k ? KT : KT * P.ld;
  w.dst = k * S + mn, w.ddst = (k1 - k) * S + mn1 - mn;
  return w;
}

// Registers: the thread's float4 units of the tile at (mn0, k0); fast: the tile is inside and
// the panel aligned (vec).
template <int MN, int KT, int THREADS, int N>
__device__ __forceinline__ void fetch(float4 (&r)[N], const Walk& w, bool fast, const Panel& P, bool vec, i64 b,
                                      i64 mn0, i64 k0, i64 mn_end, i64 k_end, float pad, int tid) {
  if (fast) {
#pragma unroll
    for (int u = 0; u < N; ++u) r[u] = *reinterpret_cast<const float4*>(w.at + u * w.step);
  } else {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      int mn, k;
      place<MN, KT, THREADS, 4>(P.along_k, tid, u, mn, k);
      r[u] = fetch4(P, vec, b, mn0 + mn, k0 + k, mn_end, k_end, pad);
    }
  }
}

// ... and put in shared memory: along k, a unit is four k of one mn (a column of s).
template <int S, int N>
__device__ __forceinline__ void put(float* s, const float4 (&r)[N], const Walk& w, bool along_k) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    float* q = s + w.dst + u * w.ddst;
    if (along_k) {
      q[0] = r[u].x, q[S] = r[u].y, q[2 * S] = r[u].z, q[3 * S] = r[u].w;
    } else {
      *reinterpret_cast<float4*>(q) = r[u];
    }
  }
}

// cp.async: how a panel's tiles are copied. Along mn and aligned: 16-byte units (walk<4>).
// Along k: one float per copy, which transposes (walk<1>). Otherwise (along mn, unaligned),
// and every tile reaching past the panel: one float per copy, offsets computed in full.
enum class Copy { Vec16, AlongK4, Scalar4 };

__device__ __forceinline__ std::uint32_t shared_address(const float* q) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(q));
}

// Issues the copies of the MN x KT tile at (mn0, k0) to s[k * S + mn]. Past mn_end they
// zero-fill (rows and columns of D that are never stored); past k_end the pad is stored
// directly, as cp.async fills only +0 and A's pad is -0.
template <int MN, int KT, int S, int THREADS>
__device__ __forceinline__ void copy_tile(float* s, const Walk& w, Copy how, const Panel& P, i64 b, i64 mn0, i64 k0,
                                          i64 mn_end, i64 k_end, float pad, int tid) {
  if (how == Copy::Vec16 && mn0 + MN <= mn_end && k0 + KT <= k_end) {
#pragma unroll
    for (int u = 0; u < MN * KT / 4 / THREADS; ++u) cp_async16(shared_address(s + w.dst + u * w.ddst), w.at + u * w.step, 16);
  } else if (how == Copy::AlongK4 && mn0 + MN <= mn_end && k0 + KT <= k_end) {
#pragma unroll
    for (int u = 0; u < MN * KT / THREADS; ++u) cp_async4(shared_address(s + w.dst + u * w.ddst), w.at + u * w.step, 4);
  } else {
#pragma unroll
    for (int u = 0; u < MN * KT / THREADS; ++u) {
      const int e = tid + u * THREADS;
      const int mn = P.along_k ? e / KT : e % MN, k = P.along_k ? e % KT : e / MN;
      float* q = s + k * S + mn;
      if (k0 + k >= k_end) {
        *q = pad;
      } else {
        const bool inside = mn0 + mn < mn_end;
        cp_async4(shared_address(q), inside ? P.p + offset(P, b, mn0 + mn, k0 + k) : P.p, inside ? 4 : 0);
      }
    }
  }
}

// Stage s's BK k in order, each one outer product of the lane's TM values of A and TN of B.
template <class Cfg>
__device__ __forceinline__ void multiply(float (&acc)[Cfg::TM][Cfg::TN], const float* As, const float* Bs, int lm,
                                         int ln) {
#pragma unroll
  for (int kk = 0; kk < Cfg::BK; ++kk) {
    float a[Cfg::TM], b[Cfg::TN];
    load_runs<4 * Cfg::LM>(a, As + kk * Cfg::SA, lm);
    load_runs<4 * Cfg::LN>(b, Bs + kk * Cfg::SB, ln);
    outer(acc, a, b);
  }
}

// 7 warptile (Step7Config below): each warp computes a compact WM x WN region of D from
// float4 reads of shared memory, BK k per barrier; global loads walk by pointer and skip
// the checks on tiles inside the matrix. Steps 8 and 9 run it on K ranges (gridDim.z covers
// batch x split). Shared memory: Cfg::kSmemBytes, dynamic.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    warptile(Problem p, bool vec_a, bool vec_b, bool vec_d, Split sp) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, SA = Cfg::SA, SB = Cfg::SB, T = Cfg::kThreads;
  constexpr int LM = Cfg::LM, LN = Cfg::LN, STAGES = Cfg::kStages;
  extern __shared__ float4 smem[];
  float* const As = reinterpret_cast<float*>(smem);  // [stage][k][SA]
  float* const Bs = As + STAGES * BK * SA;           // [stage][k][SB]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = warp % Cfg::kWarpsM * Cfg::WM, col0 = warp / Cfg::kWarpsM * Cfg::WN;
  const int lm = lane % LM, ln = lane / LM;
  for (i64 z = blockIdx.z; z < p.batch * sp.splits; z += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, BM); y += gridDim.y) {
      const i64 b = z / sp.splits, s = z % sp.splits;
      const i64 i0 = y * BM, j0 = blockIdx.x * i64{BN};
      const i64 k_begin = s * sp.k_chunk, k_end = k_begin + sp.k_chunk < p.k ? k_begin + sp.k_chunk : p.k;
      const i64 tiles = ceil_div(k_end - k_begin, BK);
      float acc[Cfg::TM][Cfg::TN] = {};
      if constexpr (Cfg::kStaging == Staging::Registers) {
        Walk wa = walk<BM, BK, SA, T, 4>(p.a, b, i0, k_begin, tid), wb = walk<BN, BK, SB, T, 4>(p.b, b, j0, k_begin, tid);
        const bool inside_a = vec_a && i0 + BM <= p.m, inside_b = vec_b && j0 + BN <= p.n;
        float4 ra[BM * BK / 4 / T], rb[BN * BK / 4 / T];
        const auto load = [&](i64 k0) {
          fetch<BM, BK, T>(ra, wa, inside_a && k0 + BK <= k_end, p.a, vec_a, b, i0, k0, p.m, k_end, kPadA, tid);
          fetch<BN, BK, T>(rb, wb, inside_b && k0 + BK <= k_end, p.b, vec_b, b, j0, k0, p.n, k_end, kPadB, tid);
        };
        load(k_begin);
        put<SA>(As, ra, wa, p.a.along_k);
        put<SB>(Bs, rb, wb, p.b.along_k);
        __syncthreads();
        for (i64 t = 0; t < tiles; ++t) {
          const int cur = t & 1;
          const bool more = t + 1 < tiles;
          if (more) {
            wa.at += wa.tile_step, wb.at += wb.tile_step;
            load(k_begin + (t + 1) * BK);
          }
          multiply<Cfg>(acc, As + cur * BK * SA + row0, Bs + cur * BK * SB + col0, lm, ln);
          if (more) {  // the other buffer: everyone finished reading it before the last barrier
            put<SA>(As + (cur ^ 1) * BK * SA, ra, wa, p.a.along_k);
            put<SB>(Bs + (cur ^ 1) * BK * SB, rb, wb, p.b.along_k);
          }
          __syncthreads();
        }
      } else {
        const Copy how_a = !p.a.along_k ? (vec_a ? Copy::Vec16 : Copy::Scalar4) : Copy::AlongK4;
        const Copy how_b = !p.b.along_k ? (vec_b ? Copy::Vec16 : Copy::Scalar4) : Copy::AlongK4;
        Walk wa = how_a == Copy::Vec16 ? walk<BM, BK, SA, T, 4>(p.a, b, i0, k_begin, tid)
                                       : walk<BM, BK, SA, T, 1>(p.a, b, i0, k_begin, tid);
        Walk wb = how_b == Copy::Vec16 ? walk<BN, BK, SB, T, 4>(p.b, b, j0, k_begin, tid)
                                       : walk<BN, BK, SB, T, 1>(p.b, b, j0, k_begin, tid);
        const auto copy = [&](i64 k0, int stage) {
          copy_tile<BM, BK, SA, T>(As + stage * BK * SA, wa, how_a, p.a, b, i0, k0, p.m, k_end, kPadA, tid);
          copy_tile<BN, BK, SB, T>(Bs + stage * BK * SB, wb, how_b, p.b, b, j0, k0, p.n, k_end, kPadB, tid);
          wa.at += wa.tile_step, wb.at += wb.tile_step;
        };
#pragma unroll
        for (int t = 0; t < STAGES - 1; ++t) {
          if (t < tiles) copy(k_begin + t * BK, t);
          cp_async_commit();  // empty groups past the last tile keep the count
        }
        int read = 0, write = STAGES - 1;
        for (i64 t = 0; t < tiles; ++t) {
          cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed ...
          __syncthreads();  // ... everyone's too, and everyone is done with tile t - 1's stage
          if (t + STAGES - 1 < tiles) copy(k_begin + (t + STAGES - 1) * BK, write);
          cp_async_commit();
          multiply<Cfg>(acc, As + read * BK * SA + row0, Bs + read * BK * SB + col0, lm, ln);
          read = read + 1 == STAGES ? 0 : read + 1;
          write = write + 1 == STAGES ? 0 : write + 1;
        }
        __syncthreads();  // the next tile of the grid loop refills the stages
      }
#pragma unroll
      for (int r = 0; r < Cfg::TM; ++r) {
        const i64 i = i0 + row0 + split_index<4 * LM>(lm, r);
#pragma unroll
        for (int h = 0; h < Cfg::TN / 4; ++h) {
          const i64 j = j0 + col0 + 4 * LN * h + 4 * ln;
          const float* v = &acc[r][4 * h];
          if (sp.sink == Sink::D) {
            store4(p, vec_d, b, i, j, v);
          } else if (i < p.m && j < p.n) {
            if (sp.sink == Sink::Partial) {  // ldw % 4 == 0: the row's float4 fits even past N
              *reinterpret_cast<float4*>(sp.partial + ((s * p.batch + b) * p.m + i) * sp.ldw + j) =
                  make_float4(v[0], v[1], v[2], v[3]);
            } else {
              for (int q = 0; q < 4 && j + q < p.n; ++q)
                atomicAdd(p.d + b * p.stride_d + i * p.ldd + j + q, __fmul_rn(p.alpha, v[q]));
            }
          }
        }
      }
    }
}

/// Launches warptile<Cfg> on batch x splits (sp) K ranges; opts in to more than 48 KiB of
/// shared memory where Cfg needs it.
template <class Cfg>
cudaError_t launch_warptile(const Problem& p, bool vec_a, bool vec_b, bool vec_d, const Split& sp,
                            cudaStream_t stream) {
  if constexpr (Cfg::kSmemBytes > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(warptile<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(Cfg::kSmemBytes));
    if (e != cudaSuccess) return e;
  }
  warptile<Cfg><<<grid(ceil_div(p.n, Cfg::BN), ceil_div(p.m, Cfg::BM), p.batch * sp.splits), Cfg::kThreads,
                  Cfg::kSmemBytes, stream>>>(p, vec_a, vec_b, vec_d, sp);
  return cudaGetLastError();
}

/// Steps 7-9's shape: 128 x 128 x 16 block tiles, 8 warps of 64 x 32 (2 x 4), 8 x 8 sums per
/// lane, register double buffering. dev/sgemm_configs.cu times it beside other shapes.
using Step7Config = WarptileConfig<128, 128, 16, 64, 32, 8, 8>;

}  // namespace ulpgate::simt
