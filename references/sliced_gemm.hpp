// Exact GEMM dot products from integer digit products (Ozaki-style error-free slicing), the
// method of the GPU exact reference (issue 17), with the integer products emulated on the
// CPU so that the slicing, the combination and the certification are tested here.
//
// Slicing: each row of op(A) (and each column of op(B), held as a row of length K) gets a
// power-of-two scale 2^e with every |v| < 2^e, and every element v becomes the integer
// N = v 2^(7D - e), written in D signed base-128 digits d_0 .. d_(D-1) (all of one element's
// digits carry its sign, |d_t| <= 127, N = sum_t d_t 128^(D-1-t)). N is an integer exactly
// when v's lowest set bit is at or above 2^(e - 7D): then the row is *captured*. D is the
// largest number of digits a row of the operand needs, ceil((e - lowest bit exponent) / 7),
// up to a cap; a row needing more, or holding Inf or NaN, is not captured.
//
// Products: for every digit pair (s, t) an int8 x int8 -> integer GEMM
//   P_st[i][j] = sum_k dA_s[i][k] dB_t[j][k]
// exact in int32 while K 127^2 < 2^31 (K chunks of at most kInt32Chunk), summed in int64.
//
// Combination: S_ij = sum_(s,t) P_st[i][j] 128^((DA-1-s) + (DB-1-t)), a 256-bit integer, and
// the dot product is S_ij 2^(e_i + f_j - 7 DA - 7 DB) exactly; the condition term sum|a b|
// the same from the digits' magnitudes (|N| = sum_t |d_t| 128^(D-1-t)). Both become the
// RefValue the superaccumulator gives (ExactAccumulator::value / magnitude), bit for bit.
//
// Certification: element (i, j) comes from the digits only when row i and column j are
// captured and its sum is not zero (a zero's sign follows IEEE rules over the terms' signs,
// which the digits do not keep); every other element is recomputed by the superaccumulator
// and counted. Never an uncertified value.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "references/ref_value.hpp"

namespace ulpgate {

/// Digits per element at most: 9 x 7 = 63 bits, so N fits an int64 (FP32 spans 24 bits in
/// one binade; 9 digits capture a row whose values spread over up to 39 binades).
inline constexpr int kMaxSliceDigits = 9;
/// K per exact int32 accumulation of digit products: K 127^2 < 2^31.
inline constexpr std::int64_t kInt32Chunk = (std::int64_t{1} << 31) / (127 * 127);

/// Rows of length k sliced into digits (see the header).
struct SlicedRows {
  std::int64_t rows = 0, k = 0;
  int digits = 0;                       ///< D, the same for every row (0: every row zero)
  std::vector<std::int32_t> exponent;   ///< per row: e, every |v| < 2^e (0 for a zero row)
  std::vector<char> captured;           ///< per row: N exact for every element
  std::vector<std::int8_t> digit;       ///< digit t of row r, element q: (t * rows + r) * k + q
  const std::int8_t* plane(int t) const { return digit.data() + static_cast<std::size_t>(t) * rows * k; }
  std::int64_t captured_rows() const;
};

/// Slices `rows` rows of length k (row r at values[r * k ...]) with at most max_digits digits.
SlicedRows slice_rows(std::span<const float> values, std::int64_t rows, std::int64_t k,
                      int max_digits = kMaxSliceDigits);

/// out[i * n + j] = sum_q a[i * k + q] * b[j * k + q], exactly: the integer products of one
/// digit pair (a GPU's int8 GEMM, or cpu_digit_gemm).
using DigitGemm = std::function<void(const std::int8_t* a, const std::int8_t* b, std::int64_t m, std::int64_t n,
                                     std::int64_t k, std::int64_t* out)>;
/// The CPU emulation: int32 sums over chunks of kInt32Chunk, added in int64, as the GPU does.
void cpu_digit_gemm(const std::int8_t* a, const std::int8_t* b, std::int64_t m, std::int64_t n, std::int64_t k,
                    std::int64_t* out);

struct SlicedDots {
  std::int64_t m = 0, n = 0;
  /// sum_q a_iq b_jq at i * n + j, as ExactAccumulator::value() (an element not certified:
  /// the superaccumulator's when sliced_dots recomputes, else left zero for the caller).
  std::vector<RefValue> value;
  std::vector<RefValue> magnitude;  ///< sum_q |a_iq b_jq|, as ExactAccumulator::magnitude(), likewise
  /// Per element certified by the digits, the exact sum as at most 5 doubles (52-bit pieces
  /// of S 2^scale, zeros after the last), for an accumulator to continue from (epilogue
  /// terms); all zeros for an element not certified.
  std::vector<std::array<double, 5>> pieces;
  std::vector<char> certified;
  std::int64_t recomputed = 0;      ///< elements not certified by the digits, for the superaccumulator
  std::int64_t digit_gemms = 0;     ///< digit-pair products run (value and magnitude)
};

/// The m x n dot products of the rows of a (m x k, row-major) with the rows of b (n x k:
/// op(B)'s columns), through the digits, certified; what the digits do not certify is
/// recomputed from the values, or with recompute = false left to the caller (who runs the
/// superaccumulator on those elements anyway, as gemm_reference does).
SlicedDots sliced_dots(std::span<const float> a, std::int64_t m, std::span<const float> b, std::int64_t n,
                       std::int64_t k, const DigitGemm& gemm = cpu_digit_gemm, int max_digits = kMaxSliceDigits,
                       bool recompute = true);

}  // namespace ulpgate
