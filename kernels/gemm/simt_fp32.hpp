// The FP32 SIMT GEMM ladder's kernels (simt_fp32.cu) behind one launch function. Every case
// reaches them as the row-major problem below (ladder.cpp: a column-major D is the row-major
// D^T = op(B)^T op(A)^T). Kept free of the project's C++20 headers: the .cu is CUDA C++17.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/host_device.hpp"

namespace ulpgate::simt {

/// The ladder's steps, in order (docs/kernels/ladder.md says what each one changes).
enum class Step { Naive, Coalesced, Smem, Reg1d, Reg2d, VecDb, Warptile, SplitK, SplitKAtomic };

/// An input operand as the reduction walks it: element (mn, k) of batch b, where mn is i
/// for A (M x K) and j for B (read as N x K, i.e. op(B)^T). along_k: k is the contiguous
/// index (element at mn * ld + k), otherwise mn is (k * ld + mn).
struct Panel {
  const float* p = nullptr;
  std::int64_t ld = 0, batch_stride = 0;
  bool along_k = true;
};

ULPGATE_HD std::int64_t offset(const Panel& P, std::int64_t b, std::int64_t mn, std::int64_t k) {
  return b * P.batch_stride + (P.along_k ? mn * P.ld + k : k * P.ld + mn);
}

/// D[b](i, j) = alpha sum_k A(i, k) B(j, k) + beta C[b](i, j), all FP32, D and C row-major
/// (element (i, j) of batch b at b * stride + i * ld + j). C is read only when c is set
/// (the case's beta != 0); alpha = 0 reads neither A nor B (BLAS).
struct Problem {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  Panel a, b;
  const float* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
  float* d = nullptr;
  std::int64_t ldd = 0, stride_d = 0;
  float alpha = 1.0f, beta = 0.0f;
};

/// How a step runs a problem: decided before the launch, for the workspace and the notes.
struct Plan {
  int splits = 1;                  ///< K ranges (steps 8, 9), each a multiple of k_chunk but the last
  std::int64_t k_chunk = 0;
  std::size_t workspace_bytes = 0; ///< device memory launch() needs (step 8's partial sums)
  bool vec_a = false, vec_b = false, vec_d = false;  ///< 16-byte loads/stores taken (steps 6-9)
};

/// The plan of step s for p on the current device.
cudaError_t plan(Step s, const Problem& p, Plan* out);

/// Launches step s on stream with a workspace of at least plan.workspace_bytes (16-byte
/// aligned); returns the first launch error.
cudaError_t launch(Step s, const Problem& p, const Plan& plan, void* workspace, cudaStream_t stream);

}  // namespace ulpgate::simt
