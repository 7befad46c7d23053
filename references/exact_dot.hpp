// Exact dot products: a fast superaccumulator and the MPFR oracle it is tested against.
//
// Products of FP32-or-narrower numbers are exact in FP64, so an exact dot product is an
// exact sum of doubles; ExactAccumulator sums them through slices, integers or bins into a
// carry-save fixed-point number, never dropping a bit, so its result is bit-identical to the
// oracle for every input. The paths and when each applies: see docs/concepts/references.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <mpfr.h>

#include "references/ref_value.hpp"

namespace ulpgate {

/// The instruction sets the exact paths can use, in increasing order. Asking for more
/// than the CPU has gives the best it has (usable_simd), so any value is safe anywhere.
enum class Simd : std::uint8_t {
  Scalar,  ///< no vector code: the accumulator sums through the bins only
  Avx2,    ///< slices in 4 lanes where the range allows, else the bins
  Avx512   ///< slices in 8 lanes where the range allows, else the bins
};
/// The best instruction set of this CPU.
Simd best_simd();
/// Whether this CPU has AVX-512 IFMA (52-bit integer multiply-add), which the integer path
/// of prepared operands needs on top of Simd::Avx512.
bool has_ifma();
/// min(requested, best_simd()).
Simd usable_simd(Simd requested);

/// floor(log2 |v|) over the nonzero finite values of an FP32 array; empty when none.
struct ExponentRange {
  int lo = 0, hi = -1;    ///< empty when lo > hi
  bool special = false;   ///< the array holds an Inf or NaN
  bool empty() const { return lo > hi; }
};
/// The range of v, computed with usable_simd(simd) (every choice gives the same answer).
ExponentRange exponent_range(std::span<const float> v, Simd simd = Simd::Avx512);

/// An FP32 operand with the exponent range of its own values. The accumulator's fast path
/// needs the range, and one narrower than the data would corrupt the sum silently, so the
/// range is only ever computed here, from the values. GEMM builds one per row of op(A) and
/// column of op(B) and reuses it; the values must not change while it is in use.
class Operand {
 public:
  /// What the constructor prepares: the exponent range only, or also the integer form.
  enum class Prepare : std::uint8_t { Range, Integers };

  Operand() = default;
  /// With Prepare::Integers, usable_simd(simd) == Avx512 and has_ifma(), and values that
  /// are finite, not all zero and within 52 bits of one another (see integers()), the
  /// operand also holds its integer form (8 bytes per value: twice the floats' memory).
  explicit Operand(std::span<const float> v, Simd simd = Simd::Avx512, Prepare prepare = Prepare::Integers);
  std::span<const float> values() const { return values_; }
  const ExponentRange& range() const { return range_; }
  /// |v_i| = integers()[i] * 2^unit() exactly, each below 2^52, zero-padded to a multiple of
  /// 8; bit i % 8 of signs()[i / 8] is v_i's sign bit. Empty when not prepared.
  std::span<const std::uint64_t> integers() const { return integers_; }
  std::span<const std::uint8_t> signs() const { return signs_; }
  int unit() const { return unit_; }

 private:
  std::span<const float> values_;
  ExponentRange range_;
  std::vector<std::uint64_t> integers_;
  std::vector<std::uint8_t> signs_;
  int unit_ = 0;
};

/// Exact sum of products of FP32-representable numbers and of arbitrary doubles.
/// Zeros follow IEEE 754: an exact zero sum is -0 when every term is -0, +0 when every term
/// is +0, and otherwise (cancellation, or zeros of both signs) +0, or -0 when rounding down
/// (RefValue::negative_down). NaN products, or +Inf and -Inf together, give NaN.
/// The result does not depend on the caller's floating-point environment (FTZ/DAZ,
/// rounding mode): add_products sets its own and restores the caller's; add() uses no
/// floating-point arithmetic. Not thread-safe; use one per thread (it holds 128 KiB of bins).
///
/// Paths (see path_terms): a call of add_products with K >= 8 (AVX-512) or 4 (AVX2)
/// products, no Inf or NaN, and (x's exponent spread) + (y's exponent spread) <= 156
/// binades is summed as slices; any other call through the bins, except that the last
/// K mod 8 (or 4) products of a sliced call are added one by one, like add().
class ExactAccumulator {
 public:
  /// simd: the most the accumulator may use (usable_simd applies); Scalar pins the bins.
  explicit ExactAccumulator(Simd simd = Simd::Avx512);

  /// Terms added since clear(), by the path that added them.
  struct PathTerms {
    std::uint64_t slices = 0;  ///< split into integer slices in vector lanes
    std::uint64_t bins = 0;    ///< added to the exponent bins
    std::uint64_t integers = 0;  ///< prepared operands' integer products (AVX-512 IFMA)
    std::uint64_t single = 0;  ///< added one at a time: add(), and tails of sliced calls
    bool operator==(const PathTerms&) const = default;
  };

  /// Back to an empty sum (+0, no terms).
  void clear();
  /// Adds sum_i x[i] * y[i]; x and y have the same length.
  void add_products(std::span<const float> x, std::span<const float> y);
  /// The same for prepared operands: the integer path when both have their integer form
  /// and this accumulator may use AVX-512, else as add_products(span, span) with the
  /// operands' known ranges.
  void add_products(const Operand& x, const Operand& y);
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
  /// The instruction set in use (the constructor's request, as far as the CPU has it).
  Simd simd() const { return simd_; }
  const PathTerms& path_terms() const { return paths_; }

  /// Positions: digit d holds bits of weight 2^(32 d - kBias) ... 2^(32 d + 31 - kBias).
  static constexpr int kBias = 1080;
  static constexpr int kDigits = 72;

 private:
  static constexpr int kTables = 4;
  static constexpr int kBins = 4096;  // sign bit + 11 exponent bits of the FP64 product
  static constexpr std::size_t kChunk = std::size_t{1} << 15;  // bins cannot overflow

  // Each add_integer call changes a digit by less than 2^32: after 2^30 calls the digits
  // are carried (normalize), so no digit can overflow however long the sum.
  static constexpr std::uint32_t kNormalizeEvery = std::uint32_t{1} << 30;

  void add_products_checked(std::span<const float> x, std::span<const float> y,
                            const ExponentRange& xr, const ExponentRange& yr);
  void add_chunk(const float* x, const float* y, std::size_t n, int e_lo, int e_hi,
                 bool special);
  void add_levels(const float* x, const float* y, std::size_t n, int levels, int top);
  void fold_bins(int e_lo, int e_hi);
  void note_specials(const float* x, const float* y, std::size_t n);
  void add_integers(const Operand& x, const Operand& y);
  void add_integer(std::int64_t v, std::int64_t mag, int position);
  void add_wide(__int128 v, unsigned __int128 mag, int position);
  void normalize();
  /// The magnitude of the carry-save digits as 32-bit words, valid in [digit_lo_, result];
  /// returns the highest nonzero word (< digit_lo_ when the sum is zero).
  int magnitude_digits(const std::array<std::int64_t, kDigits>& in,
                       std::array<std::uint32_t, kDigits>& out, bool& negative) const;
  RefValue summarise(const std::array<std::int64_t, kDigits>& digits, bool magnitude) const;
  RefValue zero_sum(bool magnitude_zero) const;
  void flush_single();

  // A lone integer-path block added to an empty accumulator is kept here, not in the digits
  // (a GEMM element at K <= 32768): value() and magnitude() read it directly. Any other
  // addition moves it into the digits first (flush_single).
  bool single_ = false;
  __int128 single_value_ = 0;
  unsigned __int128 single_magnitude_ = 0;
  int single_position_ = 0;

  std::vector<std::uint64_t> bins_;  // kTables x kBins, all zero between calls
  std::array<std::int64_t, kDigits> value_{};
  std::array<std::int64_t, kDigits> magnitude_{};
  int digit_lo_ = kDigits, digit_hi_ = -1;
  std::uint32_t unnormalized_adds_ = 0;  // add_integer calls since the last normalize
  Simd simd_;
  PathTerms paths_;
  // Terms with the sign bit set, counted where it matters: if every term is zero, they
  // decide the sign of the sum (all -0: -0; some: -0 rounding down only).
  std::uint64_t terms_ = 0, negative_zero_terms_ = 0;
  bool any_sign_bit_ = false;  // some term had its sign bit set
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
  /// product is an exact double. An exact zero takes the sign IEEE 754 gives it when
  /// rounding with `zero_sign` (mpfr_sum's rule).
  void dot(mpfr_ptr out, std::span<const float> x, std::span<const float> y,
           mpfr_rnd_t zero_sign = MPFR_RNDN);
  /// The same for FP64 inputs: each product is formed exactly in 106 bits.
  void dot(mpfr_ptr out, std::span<const double> x, std::span<const double> y,
           mpfr_rnd_t zero_sign = MPFR_RNDN);

 private:
  void reserve(std::size_t n, mpfr_prec_t prec);
  void sum(mpfr_ptr out, std::size_t n);
  std::vector<__mpfr_struct> terms_;
  std::vector<mpfr_ptr> pointers_;
};

}  // namespace ulpgate
