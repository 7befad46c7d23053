// The shapes of the ladder's step-7 kernel (simt_warptile.cuh) that bench_sgemm_configs times
// beside cuBLAS SGEMM (sgemm_configs.cu: one instantiation each), and its device helpers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gemm/simt_fp32.hpp"

namespace ulpgate::bench {

struct SgemmConfig {
  std::string name;   ///< "step7": the ladder's shape (Step7Config); the others are variants
  std::string shape;  ///< "128x128x16 warp 64x32 lane 8x8, 256 threads, min 1 block, registers"
  int bm, bn, bk, wm, wn, tm, tn, threads, min_blocks, stages;
  bool cp_async;
  std::size_t smem_bytes;
  const void* kernel;  ///< for cudaFuncGetAttributes and the occupancy calculator
  /// Step 7's launch on the whole of K (Sink::D), as simt::launch makes it.
  cudaError_t (*launch)(const simt::Problem&, bool vec_a, bool vec_b, bool vec_d, cudaStream_t);
};

/// The configurations, Step7Config first.
std::vector<SgemmConfig> sgemm_configs();

/// p[0..n) = uniform [-1, 1) from (seed, index), and abs_p = |p|.
void fill_uniform(float* p, float* abs_p, std::int64_t n, std::uint64_t seed, cudaStream_t stream);

/// The largest |d - ref| / abs_ref over n elements (abs_ref = |A| |B|, so this is the error
/// normalised by sum_k |a_ik b_kj|), as (float bits << 32 | index) in *worst, which must start
/// at 0 (cudaMemsetAsync). A NaN d, or d != ref where abs_ref = 0, counts as +inf.
void max_normalised_diff(const float* d, const float* ref, const float* abs_ref, std::int64_t n,
                         unsigned long long* worst, cudaStream_t stream);

}  // namespace ulpgate::bench
