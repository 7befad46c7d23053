// The GEMM ladder's tensor-core steps (tensor_core.cu) behind one launch function, as
// simt_fp32.hpp is for the FP32 SIMT steps: every case reaches them as the row-major problem
// D = alpha A B^T + beta C with A M x K and B read as N x K (ladder.cpp maps column-major
// cases and transposes onto it). Kept free of the project's C++20 headers: the .cu is CUDA
// C++17.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ulpgate::tc {

/// The tensor-core steps, in ladder order (docs/kernels/ladder.md says what each one changes).
enum class Step { WmmaFp16, WmmaBf16, MmaFp16, MmaBf16, MmaTf32, WgmmaFp16, WgmmaBf16 };

/// D's (and C's) storage format.
enum class Out { F32, F16, BF16 };

/// An input operand as the reduction walks it (simt::Panel with untyped elements): element
/// (mn, k) of batch b at b * batch_stride + (along_k ? mn * ld + k : k * ld + mn), in
/// elements of the step's input type (2 bytes: FP16, BF16; 4 bytes: FP32 for TF32).
struct Panel {
  const void* p = nullptr;
  std::int64_t ld = 0, batch_stride = 0;
  bool along_k = true;
};

/// D[b](i, j) = alpha sum_k A(i, k) B(j, k) + beta C[b](i, j), accumulated in FP32 on the
/// tensor cores, C and D row-major in format `out` (element (i, j) of batch b at
/// b * stride + i * ld + j). C is read only when c is set (beta != 0); alpha = 0 reads
/// neither A nor B (BLAS).
struct Problem {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  Panel a, b;
  const void* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
  void* d = nullptr;
  std::int64_t ldd = 0, stride_d = 0;
  Out out = Out::F32;
  float alpha = 1.0f, beta = 0.0f;
};

/// How a step runs a problem, decided before the launch. The main loops read both operands
/// along k, 16 bytes at a time, from rows that start 16-byte aligned; an operand stored
/// otherwise (along m or n, or a leading dimension or address off 16 bytes) is first
/// repacked into the workspace as a dense [batch][rows][ld_packed] copy along k.
struct Plan {
  bool repack_a = false, repack_b = false;
  std::int64_t ld_packed_a = 0, ld_packed_b = 0;  ///< elements, multiples of 16 bytes
  std::size_t offset_b = 0;                       ///< where B's copy starts in the workspace (after A's)
  std::size_t workspace_bytes = 0;                ///< the repacked copies (256-byte aligned each)
};

/// Bytes per input element of step s (2 or 4).
int input_bytes(Step s);

/// The plan of step s for p.
cudaError_t plan(Step s, const Problem& p, Plan* out);

/// Launches step s on stream with a workspace of at least plan.workspace_bytes (256-byte
/// aligned); returns the first launch error.
cudaError_t launch(Step s, const Problem& p, const Plan& plan, void* workspace, cudaStream_t stream);

}  // namespace ulpgate::tc
