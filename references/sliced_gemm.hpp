// Exact GEMM dot products from int8 digit products (Ozaki-style error-free slicing): the
// method of the GPU exact reference, which runs the digit products on tensor cores
// (sliced_gemm_gpu.hpp). The arithmetic (slicing, combination, certification) is in
// sliced_digits.hpp, shared with the GPU kernels; here it runs on the CPU with the int8
// products emulated (int32 sums over the same K chunks), so every step is tested without a
// GPU. Certified elements equal the superaccumulator bit for bit; the others (a row or
// column with Inf or NaN, or spanning more than 62 bits, or an exact zero sum) are left to
// the caller, who computes them with the superaccumulator and counts them.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "references/ref_value.hpp"
#include "references/sliced_digits.hpp"

namespace ulpgate {

inline constexpr int kMaxSliceDigits = slicing::kMaxDigits;
inline constexpr std::int64_t kInt32Chunk = slicing::kChunk;

/// Rows of length k sliced into stacked digit rows (sliced_digits.hpp).
struct SlicedRows {
  std::int64_t rows = 0, k = 0, pitch = 0;  ///< pitch: k padded to slicing::kPitch
  std::vector<slicing::RowPlan> plan;
  std::vector<std::int64_t> offset;  ///< row r's digit t is stacked row offset[r] + t
  std::int64_t stacked = 0;          ///< digit rows in all
  std::vector<std::int8_t> value, magnitude;  ///< stacked x pitch digits of N and of |N|
  std::int64_t captured_rows() const;
};

/// Slices `rows` rows of length k (row r at values[r * k ...]) into at most max_digits digits each.
SlicedRows slice_rows(std::span<const float> values, std::int64_t rows, std::int64_t k,
                      int max_digits = kMaxSliceDigits);

/// The sliced dot products of an m x n block, with their RefValue form.
struct SlicedDots : slicing::SlicedElements {
  std::int64_t recomputed = 0;  ///< elements not certified (left to the superaccumulator)
  std::size_t index(std::int64_t i, std::int64_t j) const { return static_cast<std::size_t>(j * m + i); }
  /// The exact dot product of a certified element, as ExactAccumulator::value() gives it.
  RefValue value(std::int64_t i, std::int64_t j) const;
  /// The same as exact doubles (52-bit pieces, zeros after the last), for an accumulator
  /// to continue from (the epilogue's C and bias terms).
  std::array<double, 4> pieces(std::int64_t i, std::int64_t j) const;
};

/// The m x n dot products of the rows of a (m x k, row-major) with the rows of b (n x k:
/// op(B)'s columns) through the digits, int8 products emulated on the CPU.
SlicedDots cpu_sliced_dots(std::span<const float> a, std::int64_t m, std::span<const float> b, std::int64_t n,
                           std::int64_t k, int max_digits = kMaxSliceDigits);

/// A sliced path: the CPU emulation or the GPU (sliced_gemm_gpu.hpp).
using SlicedPath = std::function<SlicedDots(std::span<const float> a, std::int64_t m, std::span<const float> b,
                                            std::int64_t n, std::int64_t k)>;

/// The int32 products of stacked digit rows, as the GPU's int8 GEMM gives them: for chunk c
/// of K, out[c * (rows_a * rows_b) + rb * rows_a + ra] = sum over the chunk of a_ra . b_rb.
void cpu_digit_products(const std::int8_t* a, std::int64_t rows_a, const std::int8_t* b, std::int64_t rows_b,
                        std::int64_t k, std::int64_t pitch, std::vector<std::int32_t>& out);

}  // namespace ulpgate
