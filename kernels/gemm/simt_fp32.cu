// The FP32 SIMT GEMM ladder, each step one idea past the one before (README "The GEMM ladder"):
//   1 naive          one thread per element of D, threadIdx.x down a column
//   2 coalesced      threadIdx.x along a row: loads of B and stores of D coalesce
//   3 smem           32 x 32 tiles of A and B staged in shared memory, each value used 32 times
//   4 reg1d          64 x 64 tiles, 8 elements of a column per thread: one shared load, 8 FMAs
//   5 reg2d          128 x 128 tiles, 8 x 8 per thread: 16 shared loads, 64 FMAs
//   6 vec_db         float4 loads, two shared buffers: tile t+1 loads while tile t computes
//   7 warptile       BK 16, a 64 x 32 sub-tile per warp, 2 x 2 blocks of 4 x 4 per lane
//   8 splitk         K split to fill the GPU; partials summed in split order by a 2nd kernel
//   9 splitk_atomic  the splits atomicAdd into D: no 2nd pass, a run-dependent order
// Steps 1-7 add an element's products in k order, one FMA each: the same bits as each other
// and as cpu.fp32_seq. launch() at the end is the one dispatcher.
#include "kernels/gemm/simt_fp32.hpp"

#include <algorithm>
#include <cstdint>

namespace ulpgate::simt {
namespace {

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

// acc[r][c] += a[r] b[c]: the register tile's outer product for one k.
__device__ __forceinline__ void outer8(float (&acc)[8][8], const float (&a)[8], const float (&b)[8]) {
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[r][c] = __fmaf_rn(a[r], b[c], acc[r][c]);
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
          outer8(acc, a, bb);
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

// A thread's share of an MN x KT tile of a panel, as float4 groups along the contiguous index:
// fetched into registers, later put in shared memory as s[k * S + mn], so that the loads of
// the next tile are in flight while the current one computes.
template <int MN, int KT, int S, int THREADS>
struct TileLoader {
  static constexpr int kGroups = MN * KT / 4 / THREADS;
  static_assert(MN * KT % (4 * THREADS) == 0 && S % 4 == 0, "whole float4 groups, aligned rows");
  float4 r[kGroups];

  // Group e: along k, 4 consecutive k of row mn; otherwise 4 consecutive mn of row k.
  __device__ static void where(bool along_k, int e, int& mn, int& k) {
    if (along_k) {
      mn = e / (KT / 4), k = e % (KT / 4) * 4;
    } else {
      mn = e % (MN / 4) * 4, k = e / (MN / 4);
    }
  }
  __device__ void fetch(const Panel& P, bool vec, i64 b, i64 mn0, i64 k0, i64 mn_end, i64 k_end, float pad,
                        int tid) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      int mn, k;
      where(P.along_k, tid + g * THREADS, mn, k);
      r[g] = fetch4(P, vec, b, mn0 + mn, k0 + k, mn_end, k_end, pad);
    }
  }
  __device__ void put(float* s, bool along_k, int tid) const {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      int mn, k;
      where(along_k, tid + g * THREADS, mn, k);
      if (along_k) {  // four k: a column of s
        s[(k + 0) * S + mn] = r[g].x, s[(k + 1) * S + mn] = r[g].y;
        s[(k + 2) * S + mn] = r[g].z, s[(k + 3) * S + mn] = r[g].w;
      } else {
        *reinterpret_cast<float4*>(&s[k * S + mn]) = r[g];
      }
    }
  }
};

// Index of a thread's r-th row (or column) when its 8 are two runs of 4, at 4 q and HALF + 4 q.
template <int HALF>
__device__ __forceinline__ int split_index(int q, int r) { return r / 4 * HALF + 4 * q + r % 4; }

// The 8 values of a shared row at split_index<HALF>(q, 0..7): two float4 reads.
template <int HALF>
__device__ __forceinline__ void load8(float (&v)[8], const float* row, int q) {
  const float4 lo = *reinterpret_cast<const float4*>(row + 4 * q);
  const float4 hi = *reinterpret_cast<const float4*>(row + HALF + 4 * q);
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
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
          load8<64>(a, As[cur][kk], ty);
          load8<64>(bb, Bs[cur][kk], tx);
          outer8(acc, a, bb);
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

// 7 warptile: BK 16 (half the barriers per k), and each warp owns a 64 x 32 sub-tile of the
// 128 x 128 block tile (8 warps as 2 x 4), its 32 lanes as 8 x 4, each computing 2 x 2 blocks
// of 4 x 4 spaced 32 rows and 16 columns apart. Per k a warp reads 8 float4 of A and 4 of B
// from shared memory, each shared by 4 or 8 lanes, and its sums cover a compact region of D.
// Steps 8 and 9 run it on K ranges (gridDim.z covers batch x split).
constexpr int kB7 = 128, kBK7 = 16, kS7 = kB7 + 4, kThreads7 = 256;
__global__ void __launch_bounds__(kThreads7) warptile(Problem p, bool vec_a, bool vec_b, bool vec_d, Split sp) {
  __shared__ __align__(16) float As[2][kBK7][kS7], Bs[2][kBK7][kS7];
  using Loader = TileLoader<kB7, kBK7, kS7, kThreads7>;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = warp % 2 * 64, col0 = warp / 2 * 32, lm = lane % 8, ln = lane / 8;
  for (i64 z = blockIdx.z; z < p.batch * sp.splits; z += gridDim.z)
    for (i64 y = blockIdx.y; y < ceil_div(p.m, kB7); y += gridDim.y) {
      const i64 b = z / sp.splits, s = z % sp.splits;
      const i64 i0 = y * kB7, j0 = blockIdx.x * i64{kB7};
      const i64 k_begin = s * sp.k_chunk, k_end = k_begin + sp.k_chunk < p.k ? k_begin + sp.k_chunk : p.k;
      const i64 tiles = ceil_div(k_end - k_begin, kBK7);
      Loader la, lb;
      float acc[8][8] = {};
      la.fetch(p.a, vec_a, b, i0, k_begin, p.m, k_end, kPadA, tid);
      lb.fetch(p.b, vec_b, b, j0, k_begin, p.n, k_end, kPadB, tid);
      la.put(&As[0][0][0], p.a.along_k, tid);
      lb.put(&Bs[0][0][0], p.b.along_k, tid);
      __syncthreads();
      for (i64 t = 0; t < tiles; ++t) {
        const int cur = t & 1;
        const bool more = t + 1 < tiles;
        if (more) {
          la.fetch(p.a, vec_a, b, i0, k_begin + (t + 1) * kBK7, p.m, k_end, kPadA, tid);
          lb.fetch(p.b, vec_b, b, j0, k_begin + (t + 1) * kBK7, p.n, k_end, kPadB, tid);
        }
#pragma unroll
        for (int kk = 0; kk < kBK7; ++kk) {
          float a[8], bb[8];
          load8<32>(a, &As[cur][kk][row0], lm);
          load8<16>(bb, &Bs[cur][kk][col0], ln);
          outer8(acc, a, bb);
        }
        if (more) {
          la.put(&As[cur ^ 1][0][0], p.a.along_k, tid);
          lb.put(&Bs[cur ^ 1][0][0], p.b.along_k, tid);
        }
        __syncthreads();
      }
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const i64 i = i0 + row0 + split_index<32>(lm, r);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const i64 j = j0 + col0 + 16 * h + 4 * ln;
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

constexpr i64 kMaxGridYZ = 65535;
constexpr i64 kMaxSplits = 16;

// x: tiles along a row of the grid (up to 2^31 - 1); y and z capped, the kernels stride on.
dim3 grid(i64 x, i64 y, i64 z) {
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(std::min(y, kMaxGridYZ)),
              static_cast<unsigned>(std::min(z, kMaxGridYZ)));
}

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
    const i64 blocks = ceil_div(p.m, kB7) * ceil_div(p.n, kB7) * p.batch, k_tiles = ceil_div(p.k, kBK7);
    const i64 want = std::clamp<i64>(ceil_div(2 * i64{sms}, blocks), 2, kMaxSplits);
    pl.k_chunk = ceil_div(k_tiles, std::min(want, k_tiles)) * kBK7;
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
      return start(warptile, tiles(kB7, p.batch), dim3(kThreads7), stream, p, pl.vec_a, pl.vec_b, pl.vec_d,
                   Split{1, p.k, Sink::D, nullptr, 0});
    case Step::SplitK: {
      Split sp{pl.splits, pl.k_chunk, Sink::Partial, static_cast<float*>(workspace), ceil_div(p.n, 4) * 4};
      if (const cudaError_t e = start(warptile, tiles(kB7, p.batch * pl.splits), dim3(kThreads7), stream, p, pl.vec_a,
                                      pl.vec_b, pl.vec_d, sp);
          e != cudaSuccess)
        return e;
      return start(sum_splits, by_row, rows, stream, p, sp);
    }
    case Step::SplitKAtomic: {
      if (const cudaError_t e = start(scale_c, by_row, rows, stream, p); e != cudaSuccess) return e;
      const Split sp{pl.splits, pl.k_chunk, Sink::Atomic, nullptr, 0};
      return start(warptile, tiles(kB7, p.batch * pl.splits), dim3(kThreads7), stream, p, pl.vec_a, pl.vec_b,
                   pl.vec_d, sp);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace ulpgate::simt
