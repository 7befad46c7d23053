// GEMM ladder step 13: Hopper wgmma fed by TMA (sm_90a), FP16 or BF16 inputs, FP32
// accumulation, warp-specialised (one producer warpgroup, two consumers, a 4-stage mbarrier
// ring). Each output element is one accumulator walked along K in order (k16 steps).
// What changes from step 11 and why: see docs/kernels/ladder.md.
#include <cuda.h>  // CUtensorMap and its enums (the encoder is fetched from the runtime)

#include "kernels/gemm/tc_common.cuh"

namespace ulpgate::tc {
namespace {

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 384;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;  // 16 + 32 KiB
constexpr int LDC = BN + 4;                                                                     // the epilogue's tile
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024 /* alignment */ + 2 * STAGES * 8 /* barriers */;
static_assert(BM * LDC * 4 <= STAGES * STAGE_BYTES, "the epilogue's tile fits in the ring");

struct Fp16 {};
struct Bf16 {};

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], std::uint64_t da, std::uint64_t db, Fp16) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
#else
  (void)d, (void)da, (void)db;
#endif
}

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], std::uint64_t da, std::uint64_t db, Bf16) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
#else
  (void)d, (void)da, (void)db;
#endif
}

// A shared-memory matrix descriptor for a K-major tile in the 128-byte swizzle (PTX ISA,
// "Matrix Descriptor Format"): start address / 16 (bits 0-13), leading byte offset / 16
// (bits 16-29; unused for this layout, 1), stride byte offset / 16 (bits 32-45: 1024, the
// 8 rows x 128 bytes of one swizzle atom), layout 1 = 128B swizzle (bits 62-63). The k16
// slices of a 64-wide tile start 32 bytes apart inside the atom.
__device__ __forceinline__ std::uint64_t descriptor(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (std::uint64_t{1} << 16) | (std::uint64_t{1024 >> 4} << 32) |
         (std::uint64_t{1} << 62);
}

__device__ __forceinline__ void mbar_init(std::uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(std::uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load(std::uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

template <class Type>
__global__ void __launch_bounds__(THREADS, 1)
    gemm(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b, i64 m, i64 n, i64 k, Epilogue e) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  // 128-byte swizzled tiles must start 1024-byte aligned
  const std::uint32_t raw = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw));
  const std::uint32_t base = (raw + 1023) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const std::uint32_t full = base + STAGES * STAGE_BYTES, empty = full + STAGES * 8;
  const int tid = threadIdx.x, wg = tid / 128;
  i64 tile_m, tile_n;
  grouped_tile(16, &tile_m, &tile_n);
  const i64 b = blockIdx.z, m0 = tile_m * BM, n0 = tile_n * BN;
  const int tiles = static_cast<int>((k + BK - 1) / BK);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 2);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      for (int t = 0; t < tiles; ++t) {
        const int s = t % STAGES;
        if (t >= STAGES) mbar_wait(empty + 8 * s, ((t / STAGES) + 1) & 1);
        mbar_expect_tx(full + 8 * s, STAGE_BYTES);
        const std::uint32_t sa = base + s * STAGE_BYTES;
        tma_load(sa, &map_a, t * BK, static_cast<int>(m0), static_cast<int>(b), full + 8 * s);
        tma_load(sa + A_BYTES, &map_b, t * BK, static_cast<int>(n0), static_cast<int>(b), full + 8 * s);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int c = wg - 1, t128 = tid % 128;
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    const int s = t % STAGES;
    mbar_wait(full + 8 * s, (t / STAGES) & 1);
    const std::uint32_t sa = base + s * STAGE_BYTES + c * 64 * 128, sb = base + s * STAGE_BYTES + A_BYTES;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) wgmma_m64n256k16(d, descriptor(sa + 32 * kk), descriptor(sb + 32 * kk), Type{});
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (t128 == 0) mbar_arrive(empty + 8 * s);
  }

  // The accumulators through shared memory (the ring is idle once both consumers are past
  // their last wgmma: named barrier 1 over the 256 consumer threads), then stores along D's rows.
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  float* tile = reinterpret_cast<float*>(smem);
  const int w = t128 / 32, g = (t128 % 32) / 4, q = t128 % 4;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int r = c * 64 + 16 * w + g, col = 8 * i + 2 * q;
    tile[r * LDC + col] = d[4 * i], tile[r * LDC + col + 1] = d[4 * i + 1];
    tile[(r + 8) * LDC + col] = d[4 * i + 2], tile[(r + 8) * LDC + col + 1] = d[4 * i + 3];
  }
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  for (int idx = tid - 128; idx < BM * BN; idx += 256)
    store(e, b, m, n, m0 + idx / BN, n0 + idx % BN, tile[(idx / BN) * LDC + idx % BN]);
#else
  (void)map_a, (void)map_b, (void)m, (void)n, (void)k, (void)e;
  __trap();  // not sm_90a code (launch_wgmma runs it on compute capability 9.0 only)
#endif
}

using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                            const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// A [batch][rows][k] operand (rows along k, ld and batch stride in elements) as a 3D tensor
// map of boxes of 64 k x box_rows rows, 128-byte swizzled, zeros outside.
cudaError_t tensor_map(CUtensorMap* map, Encode encode, bool bf16, const Rows& r, i64 rows, i64 k, i64 batch, int box_rows) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(batch)};
  const i64 batch_stride = batch > 1 ? r.batch_stride : rows * r.ld;  // never 0 (a stride must be a positive multiple of 16)
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(r.ld * 2), static_cast<cuuint64_t>((batch_stride > 0 ? batch_stride : r.ld) * 2)};
  const cuuint32_t box[3] = {BK, static_cast<cuuint32_t>(box_rows), 1}, unit[3] = {1, 1, 1};
  const CUresult res = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                              const_cast<char*>(r.p), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_wgmma(Step s, const Rows& a, const Rows& b, const Problem& p, const Epilogue& e, cudaStream_t stream) {
  static Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<Encode>(fn);
  }();
  if (!encode) return cudaErrorNotSupported;
  if (p.k > 0x7FFFFFFF || p.m > 0x7FFFFFFF || p.n > 0x7FFFFFFF) return cudaErrorInvalidValue;  // TMA coordinates are int32
  const bool bf16 = s == Step::WgmmaBf16;
  CUtensorMap ma, mb;
  if (cudaError_t err = tensor_map(&ma, encode, bf16, a, p.m, p.k, p.batch, BM); err != cudaSuccess) return err;
  if (cudaError_t err = tensor_map(&mb, encode, bf16, b, p.n, p.k, p.batch, BN); err != cudaSuccess) return err;
  const auto kernel = bf16 ? gemm<Bf16> : gemm<Fp16>;
  if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES); err != cudaSuccess)
    return err;
  const dim3 grid(static_cast<unsigned>((p.n + BN - 1) / BN), static_cast<unsigned>((p.m + BM - 1) / BM), static_cast<unsigned>(p.batch));
  kernel<<<grid, THREADS, SMEM_BYTES, stream>>>(ma, mb, p.m, p.n, p.k, e);
  return cudaGetLastError();
}

}  // namespace ulpgate::tc
