// The sliced path's integer products on the GPU (references/sliced_gemm.hpp): an int8 x
// int8 -> integer GEMM per digit pair, exact (int32 sums of at most kInt32Chunk products,
// added in int64). Built with CUDA only.
#pragma once

#include "references/sliced_gemm.hpp"

namespace ulpgate {

/// A DigitGemm that runs on the current CUDA device (dp4a: four int8 products per
/// instruction; no tensor cores yet). Throws std::runtime_error on a CUDA error.
DigitGemm gpu_digit_gemm();

}  // namespace ulpgate
