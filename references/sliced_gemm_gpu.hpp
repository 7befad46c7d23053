// The sliced exact GEMM on the GPU (references/sliced_gemm.hpp for the method): slicing
// kernels, int8 x int8 -> int32 tensor-core GEMMs through cuBLAS (exact per K chunk), and
// a fused combination kernel, with the arithmetic of sliced_digits.hpp that the CPU
// emulation runs too. Built with CUDA only.
#pragma once

#include <cstddef>

#include "references/sliced_gemm.hpp"

namespace ulpgate {

/// Whether a CUDA device is present (asked once).
bool gpu_sliced_available();

/// The sliced path on the current CUDA device. product_budget: device bytes for one block
/// of int32 digit products (value and magnitude, every K chunk); B's columns are taken in
/// blocks that fit. Throws std::runtime_error on a CUDA or cuBLAS error.
SlicedPath gpu_sliced_path(int max_digits = kMaxSliceDigits, std::size_t product_budget = std::size_t{8} << 30);

}  // namespace ulpgate
