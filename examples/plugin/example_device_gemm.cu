// The example plugin's device kernel: one thread per output element, sequential FMA in FP32.
#include <cuda_runtime.h>

#include <cstdio>

#include "ulpgate/plugin.h"

namespace {

__device__ inline int64_t at(int32_t layout, int64_t ld, int64_t r, int64_t c) {
  return layout == ULPGATE_ROW_MAJOR ? r * ld + c : c * ld + r;
}

__global__ void sgemm(ulpgate_gemm_problem g) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t i = blockIdx.y * int64_t{blockDim.y} + threadIdx.y;
  const int64_t b = blockIdx.z;
  if (i >= g.m || j >= g.n) return;
  const float* A = static_cast<const float*>(g.a) + b * g.batch_stride_a;
  const float* B = static_cast<const float*>(g.b) + b * g.batch_stride_b;
  float acc = 0.0f;
  for (int64_t k = 0; k < g.k; ++k) {
    const float a = A[g.trans_a ? at(g.layout, g.lda, k, i) : at(g.layout, g.lda, i, k)];
    const float x = B[g.trans_b ? at(g.layout, g.ldb, j, k) : at(g.layout, g.ldb, k, j)];
    acc = __fmaf_rn(a, x, acc);
  }
  float v = __fmul_rn(static_cast<float>(g.alpha), acc);
  if (g.beta != 0)
    v = __fmaf_rn(static_cast<float>(g.beta), static_cast<const float*>(g.c)[b * g.batch_stride_c + at(g.layout, g.ldc, i, j)], v);
  static_cast<float*>(g.d)[b * g.batch_stride_d + at(g.layout, g.ldd, i, j)] = v;
}

}  // namespace

int example_device_sgemm(const ulpgate_gemm_problem* g, void* stream, char* err, size_t err_size) {
  const dim3 block(16, 16);
  const dim3 grid(static_cast<unsigned>((g->n + 15) / 16), static_cast<unsigned>((g->m + 15) / 16),
                  static_cast<unsigned>(g->batch));
  sgemm<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(*g);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_size, "sgemm launch: %s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
