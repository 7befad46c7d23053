// What the tensor-core steps share (tensor_core.cu, wgmma_tma.cu): the operand rows the main
// loops read, and the epilogue. Device code, CUDA C++17.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/gemm/tensor_core.hpp"

namespace ulpgate::tc {

using i64 = std::int64_t;

// The operand as the main loops read it: rows along k, 16-byte aligned.
struct Rows {
  const char* p;
  i64 ld, batch_stride;  // elements
};

// ---------------------------------------------------------------------------------------
// Epilogue: D(i, j) = alpha acc + beta C(i, j) (one FMA, as the SIMT steps), stored in D's format.
struct Epilogue {
  const void* c;
  i64 ldc, stride_c;
  void* d;
  i64 ldd, stride_d;
  Out out;
  float alpha, beta;
};

__device__ __forceinline__ float load_out(const void* p, i64 off, Out f) {
  if (f == Out::F32) return static_cast<const float*>(p)[off];
  if (f == Out::F16) return __half2float(static_cast<const __half*>(p)[off]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
}

__device__ __forceinline__ void store(const Epilogue& e, i64 b, i64 m, i64 n, i64 i, i64 j, float acc) {
  if (i >= m || j >= n) return;
  float v = e.alpha * acc;
  if (e.c) v = fmaf(e.beta, load_out(e.c, b * e.stride_c + i * e.ldc + j, e.out), v);
  const i64 off = b * e.stride_d + i * e.ldd + j;
  if (e.out == Out::F32) static_cast<float*>(e.d)[off] = v;
  else if (e.out == Out::F16) static_cast<__half*>(e.d)[off] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(e.d)[off] = __float2bfloat16_rn(v);
}


/// The block's (tile row, tile column) in a grouped order: blocks running at once cover a
/// band of `group` tile rows column by column, so that they share A's and B's tiles in L2
/// (row by row, every wave would stream all of B from memory again).
__device__ __forceinline__ void grouped_tile(int group, i64* tile_m, i64* tile_n) {
  const i64 tiles_n = gridDim.x, tiles_m = gridDim.y, id = blockIdx.y * tiles_n + blockIdx.x;
  const i64 band = group * tiles_n, first = id / band * group;
  const i64 rows = tiles_m - first < group ? tiles_m - first : group;
  *tile_m = first + id % band % rows, *tile_n = id % band / rows;
}

/// Launches the wgmma step (wgmma_tma.cu) on operands already along K and 16-byte aligned.
cudaError_t launch_wgmma(Step s, const Rows& a, const Rows& b, const Problem& p, const Epilogue& e, cudaStream_t stream);

}  // namespace ulpgate::tc
