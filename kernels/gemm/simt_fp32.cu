// The FP32 SIMT GEMM ladder, steps 1-9 (naive to split-K with atomics), each step one idea
// past the one before. Steps 1-7 add an element's products in k order, one FMA each: the
// same bits as each other and as cpu.fp32_seq. launch() at the end is the one dispatcher;
// step 7's kernel, a template on its tile shapes, and the loaders of steps 6-9 are in
// simt_warptile.cuh. What each step changes and why: see docs/kernels/ladder.md.
#include "kernels/gemm/simt_fp32.hpp"

#include <algorithm>
#include <cstdint>

#include "kernels/gemm/simt_warptile.cuh"

namespace ulpgate::simt {
namespace {

// D = beta C, or +0 where C is not read: the whole result when alpha = 0 (BLAS: A and B are
// not read, so their NaNs do not reach D), and step 9's starting value. Mapped as step 2.
__global__ void __launch_bounds__(256) scale_c(Problem p) {
  for (i64 b = blockIdx.z; b < p.batch; b += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, blockDim.y); y += gridDim.y) {
      const i64 j = blockIdx.x * i64{blockDim.x} + threadIdx.x, i = y * blockDim.y + threadIdx.y;
      if (i < p.m && j < p.n)
        p.d[b * p.stride_d + i * p.ldd + j] = p.c ? __fmul_rn(p.beta, p.c[b * p.stride_c + i * p.ldc + j]) : 0.0f;
    }
}

// ---- 1, 2: one thread per element -------------------------------------------------------

// sum_k A(i, k) B(j, k) in k order, one FMA per product.
__device__ __forceinline__ float dot(const Problem& p, i64 b, i64 i, i64 j) {
  float acc = 0.0f;
  for (i64 k = 0; k < p.k; ++k) acc = __fmaf_rn(p.a.p[offset(p.a, b, i, k)], p.b.p[offset(p.b, b, j, k)], acc);
  return acc;
}

// 1 naive: threadIdx.x walks down a column (i), so where A is stored along k a warp's 32
// loads of A(i, k), and its 32 stores of D, are ld apart: 32 transactions each.
// (Every kernel's y and z stride on past the grid's limit of 65535 there.)
__global__ void __launch_bounds__(256) naive(Problem p) {
  for (i64 b = blockIdx.z; b < p.batch; b += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.n, blockDim.y); y += gridDim.y) {
      const i64 i = blockIdx.x * i64{blockDim.x} + threadIdx.x, j = y * blockDim.y + threadIdx.y;
      if (i < p.m && j < p.n) store(p, b, i, j, dot(p, b, i, j));
    }
}

// 2 coalesced: the same threads with threadIdx.x along a row (j): a warp's stores of D, and
// its loads of B where j is B's contiguous index, are 128 contiguous bytes; A(i, k) is one
// address for the whole warp (a broadcast).
__global__ void __launch_bounds__(256) coalesced(Problem p) {
  for (i64 b = blockIdx.z; b < p.batch; b += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, blockDim.y); y += gridDim.y) {
      const i64 j = blockIdx.x * i64{blockDim.x} + threadIdx.x, i = y * blockDim.y + threadIdx.y;
      if (i < p.m && j < p.n) store(p, b, i, j, dot(p, b, i, j));
    }
}

// ---- 3-5: tiles in shared memory, scalar loads ------------------------------------------

// Stages the MN x KT tile of P at (mn0, k0) as s[k * S + mn], padded past mn_end and k_end.
// Consecutive threads take consecutive addresses along whichever index is contiguous in
// memory, so the loads coalesce for either storage order.
template <int MN, int KT, int S, int THREADS>
__device__ __forceinline__ void stage(float* s, const Panel& P, i64 b, i64 mn0, i64 k0, i64 mn_end, i64 k_end,
                                      float pad, int tid) {
  static_assert(MN * KT % THREADS == 0, "whole rounds of the block");
#pragma unroll
  for (int r = 0; r < MN * KT / THREADS; ++r) {
    const int e = tid + r * THREADS;
    const int mn = P.along_k ? e / KT : e % MN, k = P.along_k ? e % KT : e / MN;
    s[k * S + mn] = mn0 + mn < mn_end && k0 + k < k_end ? P.p[offset(P, b, mn0 + mn, k0 + k)] : pad;
  }
}

// 3 smem: a block of 32 x 32 threads computes a 32 x 32 tile of D from 32 x 32 tiles of A and
// B staged in shared memory, so each value loaded from global memory serves 32 FMAs, not 1.
constexpr int kT3 = 32;
__global__ void __launch_bounds__(kT3 * kT3) smem(Problem p) {
  // [k][i] and [k][j]; the extra column spreads a transposed tile's 32 stores over 32 banks
  __shared__ float As[kT3][kT3 + 1], Bs[kT3][kT3 + 1];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kT3 + tx;
  for (i64 b = blockIdx.z; b < p.batch; b += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, kT3); y += gridDim.y) {
      const i64 i0 = y * kT3, j0 = blockIdx.x * i64{kT3};
      float acc = 0.0f;
      for (i64 k0 = 0; k0 < p.k; k0 += kT3) {
        stage<kT3, kT3, kT3 + 1, kT3 * kT3>(&As[0][0], p.a, b, i0, k0, p.m, p.k, kPadA, tid);
        stage<kT3, kT3, kT3 + 1, kT3 * kT3>(&Bs[0][0], p.b, b, j0, k0, p.n, p.k, kPadB, tid);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kT3; ++kk) acc = __fmaf_rn(As[kk][ty], Bs[kk][tx], acc);
        __syncthreads();  // before the next tile overwrites what others still read
      }
      if (i0 + ty < p.m && j0 + tx < p.n) store(p, b, i0 + ty, j0 + tx, acc);
    }
}

// 4 reg1d: a 64 x 64 tile per block of 512 threads, each computing 8 consecutive rows of one
// column: the B value read from shared memory once per k feeds 8 FMAs from registers.
constexpr int kB4 = 64, kBK4 = 8, kTM4 = 8, kThreads4 = kB4 * kB4 / kTM4;
__global__ void __launch_bounds__(kThreads4) reg1d(Problem p) {
  __shared__ float As[kBK4][kB4], Bs[kBK4][kB4];
  const int tid = threadIdx.x, col = tid % kB4, row0 = tid / kB4 * kTM4;
  for (i64 b = blockIdx.z; b < p.batch; b += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, kB4); y += gridDim.y) {
      const i64 i0 = y * kB4, j0 = blockIdx.x * i64{kB4};
      float acc[kTM4] = {};
      for (i64 k0 = 0; k0 < p.k; k0 += kBK4) {
        stage<kB4, kBK4, kB4, kThreads4>(&As[0][0], p.a, b, i0, k0, p.m, p.k, kPadA, tid);
        stage<kB4, kBK4, kB4, kThreads4>(&Bs[0][0], p.b, b, j0, k0, p.n, p.k, kPadB, tid);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kBK4; ++kk) {
          const float bv = Bs[kk][col];
#pragma unroll
          for (int r = 0; r < kTM4; ++r) acc[r] = __fmaf_rn(As[kk][row0 + r], bv, acc[r]);
        }
        __syncthreads();
      }
#pragma unroll
      for (int r = 0; r < kTM4; ++r)
        if (i0 + row0 + r < p.m && j0 + col < p.n) store(p, b, i0 + row0 + r, j0 + col, acc[r]);
    }
}

// 5 reg2d: a 128 x 128 tile per block of 256 threads, each computing an 8 x 8 block: per k,
// 16 loads from shared memory feed 64 FMAs, and global loads are spread over 4x the work.
constexpr int kB5 = 128, kBK5 = 8, kThreads5 = 256;
__global__ void __launch_bounds__(kThreads5) reg2d(Problem p) {
  __shared__ float As[kBK5][kB5], Bs[kBK5][kB5];
  const int tid = threadIdx.x, row0 = tid / 16 * 8, col0 = tid % 16 * 8;
  for (i64 b = blockIdx.z; b < p.batch; b += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, kB5); y += gridDim.y) {
      const i64 i0 = y * kB5, j0 = blockIdx.x * i64{kB5};
      float acc[8][8] = {};
      for (i64 k0 = 0; k0 < p.k; k0 += kBK5) {
        stage<kB5, kBK5, kB5, kThreads5>(&As[0][0], p.a, b, i0, k0, p.m, p.k, kPadA, tid);
        stage<kB5, kBK5, kB5, kThreads5>(&Bs[0][0], p.b, b, j0, k0, p.n, p.k, kPadB, tid);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kBK5; ++kk) {
          float a[8], bb[8];
#pragma unroll
          for (int r = 0; r < 8; ++r) a[r] = As[kk][row0 + r], bb[r] = Bs[kk][col0 + r];
          outer(acc, a, bb);
        }
        __syncthreads();
      }
#pragma unroll
      for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c)
          if (i0 + row0 + r < p.m && j0 + col0 + c < p.n) store(p, b, i0 + row0 + r, j0 + col0 + c, acc[r][c]);
    }
}

// ---- 6-9: float4 loads, double buffering -----------------------------------------------

// 6 vec_db: step 5's tiles with 16-byte loads: one float4 of A and one of B per thread per
// tile from global memory, and float4 reads of shared memory (a thread's 8 x 8 is four 4 x 4
// blocks 64 apart, so a warp reads contiguous rows). Two shared buffers: tile t+1's global
// loads are issued before tile t's FMAs and stored after them, one barrier per tile.
constexpr int kB6 = 128, kBK6 = 8, kS6 = kB6 + 4, kThreads6 = 256;  // +4: transposed puts hit 32 banks
__global__ void __launch_bounds__(kThreads6) vec_db(Problem p, bool vec_a, bool vec_b, bool vec_d) {
  __shared__ __align__(16) float As[2][kBK6][kS6], Bs[2][kBK6][kS6];
  using Loader = TileLoader<kB6, kBK6, kS6, kThreads6>;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (i64 b = blockIdx.z; b < p.batch; b += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, kB6); y += gridDim.y) {
      const i64 i0 = y * kB6, j0 = blockIdx.x * i64{kB6}, tiles = ceil_div(p.k, kBK6);
      Loader la, lb;
      float acc[8][8] = {};
      la.fetch(p.a, vec_a, b, i0, 0, p.m, p.k, kPadA, tid);
      lb.fetch(p.b, vec_b, b, j0, 0, p.n, p.k, kPadB, tid);
      la.put(&As[0][0][0], p.a.along_k, tid);
      lb.put(&Bs[0][0][0], p.b.along_k, tid);
      __syncthreads();
      for (i64 t = 0; t < tiles; ++t) {
        const int cur = t & 1;
        const bool more = t + 1 < tiles;
        if (more) {
          la.fetch(p.a, vec_a, b, i0, (t + 1) * kBK6, p.m, p.k, kPadA, tid);
          lb.fetch(p.b, vec_b, b, j0, (t + 1) * kBK6, p.n, p.k, kPadB, tid);
        }
#pragma unroll
        for (int kk = 0; kk < kBK6; ++kk) {
          float a[8], bb[8];
          load_runs<64>(a, As[cur][kk], ty);
          load_runs<64>(bb, Bs[cur][kk], tx);
          outer(acc, a, bb);
        }
        if (more) {  // the other buffer: everyone finished reading it before the last barrier
          la.put(&As[cur ^ 1][0][0], p.a.along_k, tid);
          lb.put(&Bs[cur ^ 1][0][0], p.b.along_k, tid);
        }
        __syncthreads();
      }
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const i64 i = i0 + split_index<64>(ty, r);
        store4(p, vec_d, b, i, j0 + 4 * tx, &acc[r][0]);
        store4(p, vec_d, b, i, j0 + 64 + 4 * tx, &acc[r][4]);
      }
    }
}

// 7 warptile: simt_warptile.cuh's kernel in Step7Config's shape: BK 16 (half the barriers per
// k), and each warp owns a 64 x 32 sub-tile of the 128 x 128 block tile (8 warps as 2 x 4),
// its 32 lanes as 8 x 4, each computing 2 x 2 blocks of 4 x 4 spaced 32 rows and 16 columns
// apart. Per k a warp reads 8 float4 of A and 4 of B from shared memory, each shared by 4 or
// 8 lanes, and its sums cover a compact region of D. Global loads walk by pointer, unchecked
// on tiles inside the matrix. Steps 8 and 9 run it on K ranges.

// 8, second kernel: D = alpha (the splits' partial sums added in split order) + beta C, one
// thread per element mapped as step 2: the same order, so the same bits, on every run.
__global__ void __launch_bounds__(256) sum_splits(Problem p, Split sp) {
  const i64 split_stride = p.batch * p.m * sp.ldw;
  for (i64 b = blockIdx.z; b < p.batch; b += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, blockDim.y); y += gridDim.y) {
      const i64 j = blockIdx.x * i64{blockDim.x} + threadIdx.x, i = y * blockDim.y + threadIdx.y;
      if (i >= p.m || j >= p.n) continue;
      const float* w = sp.partial + (b * p.m + i) * sp.ldw + j;
      float acc = w[0];
      for (int s = 1; s < sp.splits; ++s) acc = __fadd_rn(acc, w[s * split_stride]);
      store(p, b, i, j, acc);
    }
}

// ---- the dispatcher ----------------------------------------------------------------------

constexpr i64 kMaxSplits = 16;

bool aligned16(const void* q, i64 ld, i64 batch_stride) {
  return reinterpret_cast<std::uintptr_t>(q) % 16 == 0 && ld % 4 == 0 && batch_stride % 4 == 0;
}

template <class... Params, class... Args>
cudaError_t start(void (*kernel)(Params...), dim3 blocks, dim3 threads, cudaStream_t stream, Args... args) {
  kernel<<<blocks, threads, 0, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace

cudaError_t plan(Step s, const Problem& p, Plan* out) {
  Plan pl;
  pl.k_chunk = p.k;
  if (s >= Step::VecDb && p.alpha != 0.0f) {
    pl.vec_a = aligned16(p.a.p, p.a.ld, p.a.batch_stride);
    pl.vec_b = aligned16(p.b.p, p.b.ld, p.b.batch_stride);
    // Steps 8 and 9 write D element by element (the ordered sum, atomics).
    pl.vec_d = s <= Step::Warptile && aligned16(p.d, p.ldd, p.stride_d) &&
               (!p.c || aligned16(p.c, p.ldc, p.stride_c));
  }
  if ((s == Step::SplitK || s == Step::SplitKAtomic) && p.alpha != 0.0f) {
    int device = 0, sms = 0;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
      return e;
    // Enough splits for two waves of blocks, at least 2 (a split-K kernel splits wherever K
    // has two tiles) and at most 16; whole BK tiles each, none empty.
    const i64 blocks = ceil_div(p.m, Step7Config::BM) * ceil_div(p.n, Step7Config::BN) * p.batch;
    const i64 k_tiles = ceil_div(p.k, Step7Config::BK);
    const i64 want = std::clamp<i64>(ceil_div(2 * i64{sms}, blocks), 2, kMaxSplits);
    pl.k_chunk = ceil_div(k_tiles, std::min(want, k_tiles)) * Step7Config::BK;
    pl.splits = static_cast<int>(ceil_div(p.k, pl.k_chunk));
    if (s == Step::SplitK)
      pl.workspace_bytes = static_cast<std::size_t>(pl.splits * p.batch * p.m * ceil_div(p.n, 4) * 4) * sizeof(float);
  }
  *out = pl;
  return cudaSuccess;
}

cudaError_t launch(Step s, const Problem& p, const Plan& pl, void* workspace, cudaStream_t stream) {
  const dim3 rows(32, 8);  // steps 1, 2 and the one-element-per-thread helpers
  const dim3 by_row = grid(ceil_div(p.n, 32), ceil_div(p.m, 8), p.batch);
  if (p.alpha == 0.0f) return start(scale_c, by_row, rows, stream, p);
  const auto tiles = [&](int tile, i64 z) { return grid(ceil_div(p.n, tile), ceil_div(p.m, tile), z); };
  switch (s) {
    case Step::Naive: return start(naive, grid(ceil_div(p.m, 32), ceil_div(p.n, 8), p.batch), rows, stream, p);
    case Step::Coalesced: return start(coalesced, by_row, rows, stream, p);
    case Step::Smem: return start(smem, tiles(kT3, p.batch), dim3(kT3, kT3), stream, p);
    case Step::Reg1d: return start(reg1d, tiles(kB4, p.batch), dim3(kThreads4), stream, p);
    case Step::Reg2d: return start(reg2d, tiles(kB5, p.batch), dim3(kThreads5), stream, p);
    case Step::VecDb:
      return start(vec_db, tiles(kB6, p.batch), dim3(kThreads6), stream, p, pl.vec_a, pl.vec_b, pl.vec_d);
    case Step::Warptile:
      return launch_warptile<Step7Config>(p, pl.vec_a, pl.vec_b, pl.vec_d, Split{1, p.k, Sink::D, nullptr, 0}, stream);
    case Step::SplitK: {
      Split sp{pl.splits, pl.k_chunk, Sink::Partial, static_cast<float*>(workspace), ceil_div(p.n, 4) * 4};
      if (const cudaError_t e = launch_warptile<Step7Config>(p, pl.vec_a, pl.vec_b, pl.vec_d, sp, stream); e != cudaSuccess)
        return e;
      return start(sum_splits, by_row, rows, stream, p, sp);
    }
    case Step::SplitKAtomic: {
      if (const cudaError_t e = start(scale_c, by_row, rows, stream, p); e != cudaSuccess) return e;
      return launch_warptile<Step7Config>(p, pl.vec_a, pl.vec_b, pl.vec_d, Split{pl.splits, pl.k_chunk, Sink::Atomic, nullptr, 0},
                                    stream);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace ulpgate::simt
