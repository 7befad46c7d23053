#include "references/sliced_gemm_gpu.hpp"

#include <algorithm>
#include <stdexcept>

namespace ulpgate {
namespace detail {
// references/sliced_gemm_gpu.cu
bool gpu_sliced_available();
void gpu_sliced_elements(const float* a, long long m, const float* b, long long n, long long k, int max_digits,
                         std::size_t product_budget, slicing::SlicedElements& out);
}  // namespace detail

bool gpu_sliced_available() { return detail::gpu_sliced_available(); }

SlicedPath gpu_sliced_path(int max_digits, std::size_t product_budget) {
  if (max_digits < 1 || max_digits > kMaxSliceDigits) throw std::invalid_argument("gpu_sliced_path: max_digits out of 1..8");
  return [max_digits, product_budget](std::span<const float> a, std::int64_t m, std::span<const float> b, std::int64_t n,
                                      std::int64_t k) {
    if (static_cast<std::int64_t>(a.size()) < m * k || static_cast<std::int64_t>(b.size()) < n * k)
      throw std::invalid_argument("gpu_sliced_path: too few values");
    SlicedDots s;
    detail::gpu_sliced_elements(a.data(), m, b.data(), n, k, max_digits, product_budget, s);
    s.recomputed = static_cast<std::int64_t>(s.certified.size()) - std::count(s.certified.begin(), s.certified.end(), 1);
    return s;
  };
}

}  // namespace ulpgate
