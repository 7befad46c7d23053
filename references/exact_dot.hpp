// Exact dot products: a fast superaccumulator and the MPFR oracle it is tested against.
//
// Every product of two FP32 numbers (and so of TF32, FP16, BF16, E4M3, E5M2 numbers) is
// exact in FP64: 24 x 24 bits fit in 53, and the exponents, 2^-298 to 2^256, are far
// inside FP64's normal range. So an exact dot product is an exact sum of doubles whose
// significands have at most 48 bits.
//
// ExactAccumulator has two exact paths, both ending in a carry-save fixed-point number of
// 32-bit digits that spans every FP64 magnitude, 2^-1080 to 2^1224:
//  - Levels (AVX-512 or AVX2, the common case): when the operands' exponent ranges put every product
//    within 157 binades, each product is split exactly into at most four 51-bit slices
//    at fixed positions (Rump's ExtractScalar: t = p + 1.5*2^(52+L) holds round(p/2^L) in
//    its low bits, and p - (t - 1.5*2^(52+L)) is the exact remainder). The slices are
//    summed as 64-bit integers in SIMD lanes: a handful of vector operations per four
//    terms, no data-dependent memory access.
//  - Bins (any data, Neal's "large superaccumulator"): each product is added, as a 48-bit
//    integer, to a 64-bit bin chosen by its sign and FP64 exponent, one integer add with
//    no carry propagation; four interleaved tables keep consecutive adds to one bin from
//    waiting on each other. Every 2^15 terms the touched bins are folded into the digits.
// No bits are ever dropped, so the result is bit-identical to the oracle for every input.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <mpfr.h>

#include "references/ref_value.hpp"

namespace ulpgate {

/// floor(log2 |v|) over the nonzero finite values of an FP32 array; empty when none.
/// Lets callers that reuse an operand (GEMM rows and columns) compute it once.
struct ExponentRange {
  int lo = 0, hi = -1;    ///< empty when lo > hi
  bool special = false;   ///< the array holds an Inf or NaN
  bool empty() const { return lo > hi; }
};
ExponentRange exponent_range(std::span<const float> v);
/// The same with a chosen instruction set (0 scalar, 1 AVX2, 2 AVX-512; the CPU must
/// have it): lets tests cover every path on one machine.
ExponentRange exponent_range(std::span<const float> v, int simd_level);

/// Exact sum of products of FP32-representable numbers and of arbitrary doubles.
/// Zeros follow IEEE 754 (RNE): a sum of -0 terms only is -0, any other zero sum is +0;
/// NaN products, or +Inf and -Inf together, give NaN. Not thread-safe; use one per thread
/// (it holds 128 KiB of bins).
class ExactAccumulator {
 public:
  /// Which exact path add_products may take; tests pin each one.
  enum class Simd : std::uint8_t {
    Best,    ///< AVX-512 or AVX2 slices where the CPU has them and the range allows
    Avx2,    ///< AVX2 slices at most (if the CPU has AVX2)
    BinsOnly ///< always the bins
  };
  explicit ExactAccumulator(Simd simd = Simd::Best);

  /// Back to an empty sum (+0, no terms).
  void clear();
  /// Adds sum_i x[i] * y[i]; x and y have the same length.
  void add_products(std::span<const float> x, std::span<const float> y);
  /// The same, with the operands' exponent ranges already known (exponent_range()).
  void add_products(std::span<const float> x, std::span<const float> y, ExponentRange xr,
                    ExponentRange yr);
  /// Adds one double exactly (any value: subnormal, Inf, NaN, signed zero).
  void add(double v);

  /// The exact sum.
  RefValue value() const;
  /// The exact sum of the terms' magnitudes, sum |x_i y_i| (+ |v| for add(v)): the
  /// condition term. NaN if a term is NaN, +Inf if one is infinite.
  RefValue magnitude() const;
  /// Sets out to the exact sum (its precision is changed to hold it exactly).
  void exact_value(mpfr_ptr out) const;
  /// Number of terms added since clear().
  std::uint64_t terms() const { return terms_; }

  /// Positions: digit d holds bits of weight 2^(32 d - kBias) ... 2^(32 d + 31 - kBias).
  static constexpr int kBias = 1080;
  static constexpr int kDigits = 72;

 private:
  static constexpr int kTables = 4;
  static constexpr int kBins = 4096;  // sign bit + 11 exponent bits of the FP64 product
  static constexpr std::size_t kChunk = std::size_t{1} << 15;  // bins cannot overflow

  void add_chunk(const float* x, const float* y, std::size_t n, int e_lo, int e_hi,
                 bool special);
  void add_levels(const float* x, const float* y, std::size_t n, int levels, int top);
  void fold_bins(int e_lo, int e_hi);
  void note_specials(const float* x, const float* y, std::size_t n);
  void add_integer(std::int64_t v, std::int64_t mag, int position);
  /// The magnitude of the carry-save digits as 32-bit words, valid in [digit_lo_, result];
  /// returns the highest nonzero word (< digit_lo_ when the sum is zero).
  int magnitude_digits(const std::array<std::int64_t, kDigits>& in,
                       std::array<std::uint32_t, kDigits>& out, bool& negative) const;
  RefValue summarise(const std::array<std::int64_t, kDigits>& digits, bool magnitude) const;

  std::vector<std::uint64_t> bins_;  // kTables x kBins, all zero between calls
  std::array<std::int64_t, kDigits> value_{};
  std::array<std::int64_t, kDigits> magnitude_{};
  int digit_lo_ = kDigits, digit_hi_ = -1;
  int simd_level_;  // 0 bins only, 1 AVX2, 2 AVX-512
  // Terms with the sign bit set, counted where it matters: if the exact sum is zero and
  // every term had its sign bit set, every term was -0 and so is the sum.
  std::uint64_t terms_ = 0, negative_zero_terms_ = 0;
  bool nan_ = false, pos_inf_ = false, neg_inf_ = false;
};

/// The MPFR oracle: exact dot products by mpfr_sum over exact products, then one
/// rounding by the caller (encode_exact). Slow and simple on purpose; it keeps its MPFR
/// numbers between calls so that timing it measures MPFR, not allocation.
class MpfrOracle {
 public:
  MpfrOracle() = default;
  ~MpfrOracle();
  MpfrOracle(const MpfrOracle&) = delete;
  MpfrOracle& operator=(const MpfrOracle&) = delete;

  /// out = sum x_i y_i exactly (out's precision is changed to hold it). FP32 inputs: each
  /// product is an exact double.
  void dot(mpfr_ptr out, std::span<const float> x, std::span<const float> y);
  /// The same for FP64 inputs: each product is formed exactly in 106 bits.
  void dot(mpfr_ptr out, std::span<const double> x, std::span<const double> y);

 private:
  void reserve(std::size_t n, mpfr_prec_t prec);
  void sum(mpfr_ptr out, std::size_t n);
  std::vector<__mpfr_struct> terms_;
  std::vector<mpfr_ptr> pointers_;
};

}  // namespace ulpgate
