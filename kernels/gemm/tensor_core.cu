// The GEMM ladder's tensor-core steps 10-12 (WMMA, mma.sync FP16/BF16, mma.sync TF32), after
// the FP32 SIMT steps of simt_fp32.cu; step 13 is in wgmma_tma.cu. All accumulate in FP32 on
// the tensor cores, each walking K in order with one accumulator per element, so a step's
// result is its unit's probe model in k order, bit for bit.
// What each step changes and why: see docs/kernels/ladder.md.
#include "kernels/gemm/tensor_core.hpp"

#include <mma.h>

#include "kernels/gemm/cp_async.cuh"
#include "kernels/gemm/tc_common.cuh"

namespace ulpgate::tc {
namespace {

// ---------------------------------------------------------------------------------------
// Repacking: an operand into a dense [batch][rows][ldp] copy along k (zeros past k), through
// 32 x 32 shared tiles so that both the read (along k or along rows) and the write coalesce.
template <class T>  // std::uint16_t or std::uint32_t: the element's bits
__global__ void repack_kernel(Panel src, i64 rows, i64 k, i64 ldp, T* dst) {
  __shared__ T tile[32][33];
  const i64 b = blockIdx.z, r0 = static_cast<i64>(blockIdx.y) * 32, k0 = static_cast<i64>(blockIdx.x) * 32;
  const T* s = static_cast<const T*>(src.p) + b * src.batch_stride;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int i = 0; i < 32; i += 8) {
    if (src.along_k) {
      const i64 r = r0 + ty + i, kk = k0 + tx;
      tile[ty + i][tx] = r < rows && kk < k ? s[r * src.ld + kk] : T(0);
    } else {
      const i64 kk = k0 + ty + i, r = r0 + tx;
      tile[tx][ty + i] = r < rows && kk < k ? s[kk * src.ld + r] : T(0);
    }
  }
  __syncthreads();
  for (int i = 0; i < 32; i += 8) {
    const i64 r = r0 + ty + i, kk = k0 + tx;
    if (r < rows && kk < ldp) dst[(b * rows + r) * ldp + kk] = tile[ty + i][tx];
  }
}

// alpha = 0: D = beta C without reading A or B (BLAS), any step.
__global__ void scale_c_kernel(Epilogue e, i64 m, i64 n) {
  const i64 b = blockIdx.z;
  for (i64 idx = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; idx < m * n;
       idx += static_cast<i64>(gridDim.x) * blockDim.x)
    store(e, b, m, n, idx / n, idx % n, 0.0f);
}

// 16 bytes of row r of an operand from element k on (valid elements only; zeros after).
__device__ int valid_bytes(i64 r, i64 rows, i64 k, i64 kdim, int eb) {
  if (r >= rows || k >= kdim) return 0;
  const i64 n = (kdim - k) * eb;
  return n >= 16 ? 16 : static_cast<int>(n);
}

// ---------------------------------------------------------------------------------------
// Step 10: WMMA.
namespace wmma_step {
constexpr int BM = 64, BN = 64, BK = 32, LDS = BK + 8;  // +8 halves: rows 80 bytes apart, no conflicts

template <class T>
__global__ void __launch_bounds__(128) gemm(Rows A, Rows B, i64 m, i64 n, i64 k, Epilogue e) {
  using namespace nvcuda;
  __shared__ __align__(32) T sa[BM][LDS];  // wmma loads need 32-byte aligned fragments
  __shared__ __align__(32) T sb[BN][LDS];
  __shared__ __align__(32) float sc[BM][BN + 4];
  const int tid = threadIdx.x, warp = tid / 32;
  const i64 b = blockIdx.z, m0 = static_cast<i64>(blockIdx.y) * BM, n0 = static_cast<i64>(blockIdx.x) * BN;
  const T* a = reinterpret_cast<const T*>(A.p) + b * A.batch_stride;
  const T* bb = reinterpret_cast<const T*>(B.p) + b * B.batch_stride;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.0f);
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  for (i64 k0 = 0; k0 < k; k0 += BK) {
    // 64 rows x 4 chunks of 8 elements per operand: two chunks of each per thread.
    for (int i = 0; i < 2; ++i) {
      const int idx = tid + i * 128, r = idx / 4, c = (idx % 4) * 8;
      const i64 kk = k0 + c;
      const int va = valid_bytes(m0 + r, m, kk, k, 2), vb = valid_bytes(n0 + r, n, kk, k, 2);
      uint4 za{0, 0, 0, 0}, zb{0, 0, 0, 0};
      if (va == 16) za = *reinterpret_cast<const uint4*>(a + (m0 + r) * A.ld + kk);
      else if (va > 0) for (int t = 0; t < va / 2; ++t) reinterpret_cast<T*>(&za)[t] = a[(m0 + r) * A.ld + kk + t];
      if (vb == 16) zb = *reinterpret_cast<const uint4*>(bb + (n0 + r) * B.ld + kk);
      else if (vb > 0) for (int t = 0; t < vb / 2; ++t) reinterpret_cast<T*>(&zb)[t] = bb[(n0 + r) * B.ld + kk + t];
      *reinterpret_cast<uint4*>(&sa[r][c]) = za;
      *reinterpret_cast<uint4*>(&sb[r][c]) = zb;
    }
    __syncthreads();
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];  // B(k, j) at sb[j][k]
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sa[wm + 16 * i][kk], LDS);
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sb[wn + 16 * j][kk], LDS);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::store_matrix_sync(&sc[wm + 16 * i][wn + 16 * j], acc[i][j], BN + 4, wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < BM * BN; idx += 128) {
    const int r = idx / BN, c = idx % BN;
    store(e, b, m, n, m0 + r, n0 + c, sc[r][c]);
  }
}
}  // namespace wmma_step

// ---------------------------------------------------------------------------------------
// Steps 11 and 12: mma.sync with a cp.async pipeline. A tile row is 64 bytes (32 halves or
// 16 floats): four 16-byte chunks, chunk c of row r stored at chunk c ^ ((r / 2) % 4), so
// that the eight rows one ldmatrix (or one fragment load) reads hit eight different bank
// groups.
namespace mma_step {
constexpr int BM = 128, BN = 128, ROW_BYTES = 64, STAGES = 4, THREADS = 128;
constexpr int STAGE_BYTES = (BM + BN) * ROW_BYTES;  // 16 KiB
constexpr int LDC = BN + 4;                          // the epilogue's FP32 tile, padded
constexpr int SMEM_BYTES = BM * LDC * 4 > STAGES * STAGE_BYTES ? BM * LDC * 4 : STAGES * STAGE_BYTES;  // 66 KiB

__device__ __forceinline__ std::uint32_t swz(int r, int c) { return r * ROW_BYTES + ((c ^ ((r >> 1) & 3)) << 4); }

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

struct Fp16 {
  static constexpr int kElem = 2;
};
struct Bf16 {
  static constexpr int kElem = 2;
};
struct Tf32 {
  static constexpr int kElem = 4;
};

__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1, Fp16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1, Bf16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma1688_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ std::uint32_t to_tf32(std::uint32_t bits) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(bits)));
  return r;
}
__device__ __forceinline__ std::uint32_t lds32(std::uint32_t addr) {
  std::uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// One warp's 64 x 64 share of a stage: 16-bit inputs, two k16 steps of 4 x 8 mma each.
template <class Type>
__device__ __forceinline__ void multiply_stage(float (&acc)[4][8][4], std::uint32_t sa, std::uint32_t sb, int wm, int wn,
                                               int lane, Type t) {
  #pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    std::uint32_t af[4][4], bf[8][2];
    #pragma unroll
    for (int mi = 0; mi < 4; ++mi) ldmatrix_x4(af[mi], sa + swz(wm + mi * 16 + (lane & 15), ks * 2 + (lane >> 4)));
    #pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      std::uint32_t r[4];
      ldmatrix_x4(r, sb + swz(wn + nj * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
      bf[2 * nj][0] = r[0], bf[2 * nj][1] = r[1], bf[2 * nj + 1][0] = r[2], bf[2 * nj + 1][1] = r[3];
    }
    #pragma unroll
    for (int mi = 0; mi < 4; ++mi)
      #pragma unroll
      for (int ni = 0; ni < 8; ++ni) mma16816(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1], t);
  }
}

// The same for FP32 inputs as TF32: two k8 steps per 16-float row. Fragment element (row,
// k) at swz(row, k / 4) + 4 (k % 4); a thread holds rows g, g + 8 and k = t, t + 4.
__device__ __forceinline__ void multiply_stage(float (&acc)[4][8][4], std::uint32_t sa, std::uint32_t sb, int wm, int wn,
                                               int lane, Tf32) {
  const int g = lane >> 2, t = lane & 3;
  #pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    std::uint32_t af[4][4], bf[8][2];
    #pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const int r = wm + mi * 16 + g;
      af[mi][0] = to_tf32(lds32(sa + swz(r, ks * 2) + 4 * t));
      af[mi][1] = to_tf32(lds32(sa + swz(r + 8, ks * 2) + 4 * t));
      af[mi][2] = to_tf32(lds32(sa + swz(r, ks * 2 + 1) + 4 * t));
      af[mi][3] = to_tf32(lds32(sa + swz(r + 8, ks * 2 + 1) + 4 * t));
    }
    #pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
      const int r = wn + ni * 8 + g;
      bf[ni][0] = to_tf32(lds32(sb + swz(r, ks * 2) + 4 * t));
      bf[ni][1] = to_tf32(lds32(sb + swz(r, ks * 2 + 1) + 4 * t));
    }
    #pragma unroll
    for (int mi = 0; mi < 4; ++mi)
      #pragma unroll
      for (int ni = 0; ni < 8; ++ni) mma1688_tf32(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
  }
}

template <class Type>
__global__ void __launch_bounds__(THREADS) gemm(Rows A, Rows B, i64 m, i64 n, i64 k, Epilogue e) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int EB = Type::kElem, BKE = ROW_BYTES / EB;  // elements of k per tile
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = (warp >> 1) * 64, wn = (warp & 1) * 64;
  i64 tile_m, tile_n;
  grouped_tile(16, &tile_m, &tile_n);
  const i64 b = blockIdx.z, m0 = tile_m * BM, n0 = tile_n * BN;
  const char* a = A.p + b * A.batch_stride * EB;
  const char* bb = B.p + b * B.batch_stride * EB;
  const std::uint32_t base = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  const i64 tiles = (k + BKE - 1) / BKE;

  // Stage s of k-tile t: 128 + 128 rows of four chunks, eight chunks per thread.
  const auto load = [&](int s, i64 t) {
    const std::uint32_t sa = base + s * STAGE_BYTES, sb = sa + BM * ROW_BYTES;
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = tid + i * THREADS, r = idx >> 2, c = idx & 3;
      const i64 kk = t * BKE + c * (16 / EB);
      const int va = valid_bytes(m0 + r, m, kk, k, EB), vb = valid_bytes(n0 + r, n, kk, k, EB);
      cp_async16(sa + swz(r, c), va ? a + ((m0 + r) * A.ld + kk) * EB : a, va);
      cp_async16(sb + swz(r, c), vb ? bb + ((n0 + r) * B.ld + kk) * EB : bb, vb);
    }
  };

  float acc[4][8][4];
  #pragma unroll
  for (auto& x : acc)
    #pragma unroll
    for (auto& y : x)
      #pragma unroll
      for (float& z : y) z = 0.0f;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < tiles) load(s, s);
    cp_async_commit();  // an empty group past the last tile keeps the count
  }
  for (i64 t = 0; t < tiles; ++t) {
    cp_async_wait<STAGES - 2>();  // tile t has landed (this thread's copies) ...
    __syncthreads();              // ... everyone's, and stage (t - 1) % STAGES is free again
    if (t + STAGES - 1 < tiles) load(static_cast<int>((t + STAGES - 1) % STAGES), t + STAGES - 1);
    cp_async_commit();
    const std::uint32_t sa = base + static_cast<int>(t % STAGES) * STAGE_BYTES;
    multiply_stage(acc, sa, sa + BM * ROW_BYTES, wm, wn, lane, Type{});
  }
  cp_async_wait<0>();

  // The accumulators through shared memory (the pipeline's, free now), so that the stores
  // to D run along its rows.
  __syncthreads();
  float* sc = reinterpret_cast<float*>(smem);
  const int g = lane >> 2, q = lane & 3;
  #pragma unroll
  for (int mi = 0; mi < 4; ++mi)
    #pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
      const int r = wm + mi * 16 + g, c = wn + ni * 8 + 2 * q;
      sc[r * LDC + c] = acc[mi][ni][0], sc[r * LDC + c + 1] = acc[mi][ni][1];
      sc[(r + 8) * LDC + c] = acc[mi][ni][2], sc[(r + 8) * LDC + c + 1] = acc[mi][ni][3];
    }
  __syncthreads();
  for (int idx = tid; idx < BM * BN; idx += THREADS) store(e, b, m, n, m0 + idx / BN, n0 + idx % BN, sc[(idx / BN) * LDC + idx % BN]);
}
}  // namespace mma_step

bool aligned16(const Panel& p, int eb) {
  return p.along_k && (p.ld * eb) % 16 == 0 && (p.batch_stride * eb) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(p.p) % 16 == 0;
}

i64 round_up(i64 x, i64 to) { return (x + to - 1) / to * to; }

}  // namespace

int input_bytes(Step s) { return s == Step::MmaTf32 ? 4 : 2; }

cudaError_t plan(Step s, const Problem& p, Plan* out) {
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 1 || p.batch > 65535 || (p.m + 127) / 128 > 65535)
    return cudaErrorInvalidValue;
  const int eb = input_bytes(s);
  Plan pl;
  pl.repack_a = p.alpha != 0.0f && p.k > 0 && !aligned16(p.a, eb);
  pl.repack_b = p.alpha != 0.0f && p.k > 0 && !aligned16(p.b, eb);
  pl.ld_packed_a = pl.repack_a ? round_up(p.k, 16 / eb) : 0;
  pl.ld_packed_b = pl.repack_b ? round_up(p.k, 16 / eb) : 0;
  pl.offset_b = static_cast<std::size_t>(round_up(p.batch * p.m * pl.ld_packed_a * eb, 256));
  pl.workspace_bytes = pl.offset_b + static_cast<std::size_t>(round_up(p.batch * p.n * pl.ld_packed_b * eb, 256));
  *out = pl;
  return cudaSuccess;
}

cudaError_t launch(Step s, const Problem& p, const Plan& pl, void* workspace, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  const Epilogue e{p.beta != 0.0f ? p.c : nullptr, p.ldc, p.stride_c, p.d, p.ldd, p.stride_d, p.out, p.alpha, p.beta};
  const dim3 batches(1, 1, static_cast<unsigned>(p.batch));
  if (p.alpha == 0.0f || p.k == 0) {  // D = beta C (K = 0: the empty sum is 0)
    const i64 blocks = (p.m * p.n + 255) / 256;
    scale_c_kernel<<<dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 1, batches.z), 256, 0, stream>>>(e, p.m, p.n);
    return cudaGetLastError();
  }
  const int eb = input_bytes(s);
  char* ws = static_cast<char*>(workspace);
  const auto rows_of = [&](const Panel& panel, bool repack, i64 rows, i64 ldp, char* dst) -> Rows {
    if (!repack) return {static_cast<const char*>(panel.p), panel.ld, panel.batch_stride};
    const dim3 grid(static_cast<unsigned>((ldp + 31) / 32), static_cast<unsigned>((rows + 31) / 32), batches.z);
    if (eb == 2) repack_kernel<<<grid, dim3(32, 8), 0, stream>>>(panel, rows, p.k, ldp, reinterpret_cast<std::uint16_t*>(dst));
    else repack_kernel<<<grid, dim3(32, 8), 0, stream>>>(panel, rows, p.k, ldp, reinterpret_cast<std::uint32_t*>(dst));
    return {dst, ldp, rows * ldp};
  };
  const Rows A = rows_of(p.a, pl.repack_a, p.m, pl.ld_packed_a, ws);
  const Rows B = rows_of(p.b, pl.repack_b, p.n, pl.ld_packed_b, ws + pl.offset_b);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (s == Step::WgmmaFp16 || s == Step::WgmmaBf16) return launch_wgmma(s, A, B, p, e, stream);
  if (s == Step::WmmaFp16 || s == Step::WmmaBf16) {
    using namespace wmma_step;
    const dim3 grid(static_cast<unsigned>((p.n + BN - 1) / BN), static_cast<unsigned>((p.m + BM - 1) / BM), batches.z);
    if (s == Step::WmmaFp16) gemm<__half><<<grid, 128, 0, stream>>>(A, B, p.m, p.n, p.k, e);
    else gemm<__nv_bfloat16><<<grid, 128, 0, stream>>>(A, B, p.m, p.n, p.k, e);
    return cudaGetLastError();
  }
  using namespace mma_step;
  const dim3 grid(static_cast<unsigned>((p.n + BN - 1) / BN), static_cast<unsigned>((p.m + BM - 1) / BM), batches.z);
  const auto run = [&](auto kernel) {
    if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES); err != cudaSuccess)
      return err;
    kernel<<<grid, THREADS, SMEM_BYTES, stream>>>(A, B, p.m, p.n, p.k, e);
    return cudaGetLastError();
  };
  if (s == Step::MmaFp16) return run(gemm<Fp16>);
  if (s == Step::MmaBf16) return run(gemm<Bf16>);
  return run(gemm<Tf32>);
}

}  // namespace ulpgate::tc
