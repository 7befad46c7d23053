#include "references/sliced_gemm_gpu.hpp"

namespace ulpgate {
namespace detail {
// references/sliced_gemm_gpu.cu
void digit_gemm_gpu(const std::int8_t* a, const std::int8_t* b, std::int64_t m, std::int64_t n, std::int64_t k,
                    std::int64_t* out);
}  // namespace detail

DigitGemm gpu_digit_gemm() {
  static_assert(kInt32Chunk == 133144, "sliced_gemm_gpu.cu's chunk");
  return detail::digit_gemm_gpu;
}

}  // namespace ulpgate
