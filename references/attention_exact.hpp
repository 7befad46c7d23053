// Exact pieces shared by the attention references (forward and backward): input checks,
// the softmax scale, exact sums and quotients of MPFR numbers, and the window of a value that
// lies within a tiny distance of an exact rational. See docs/concepts/references.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "core/case.hpp"
#include "core/format_mpfr.hpp"
#include "core/tensor.hpp"
#include "references/ref_value.hpp"

namespace ulpgate::attention_exact {

/// inputs[operand], checked to be in format f and to hold at least `elements` values;
/// InputError (its message starting with `who`) otherwise.
const Tensor& checked_input(const std::map<std::string, Tensor>& inputs, const std::string& operand, Format f,
                            std::int64_t elements, std::string_view who);

// The softmax scale: a given double, or exactly 1/sqrt(head_dim).
struct Scale {
  bool given = false;
  double value = 0.0;    // when given
  long head_dim = 1;     // otherwise
  long root = 0;         // sqrt(head_dim) when head_dim is a perfect square, else 0
  int sign() const { return given ? (value > 0) - (value < 0) : 1; }
  /// sigma at precision p: exact when given, else correctly rounded (relative error 2^-p).
  void set(mpfr_ptr out) const {
    if (given) mpfr_set_d(out, value, MPFR_RNDN);
    else {
      mpfr_set_ui(out, static_cast<unsigned long>(head_dim), MPFR_RNDN);
      mpfr_rec_sqrt(out, out, MPFR_RNDN);
    }
  }
};

/// The case's scale: softmax_scale when given, else 1/sqrt(head_dim).
Scale scale_of(const AttentionShape& a);

/// The window of x / n, exactly (a rational, rounded toward zero with the ternary value); an
/// exact zero is +0.
RefValue exact_quotient(mpfr_srcptr x, unsigned long n);

/// The 128-bit window of |x| = |num| / n + Delta (num exact and nonzero, n >= 1), Delta
/// known only to lie in [lo, hi] (exact bounds) and, where `sign` is not 0, to be nonzero of
/// that sign, when that keeps |x| strictly between two neighbouring 128-bit numbers; nullopt
/// otherwise. The result carries the sign `negative`.
std::optional<RefValue> window_near(mpfr_srcptr num, unsigned long n, mpfr_srcptr lo, mpfr_srcptr hi, bool negative,
                                    int sign);

/// out = x + y exactly (x, y exact; out's precision is changed to hold it).
void exact_sum_of(mpfr_ptr out, mpfr_srcptr x, mpfr_srcptr y);
/// out = x - y exactly.
void exact_difference(mpfr_ptr out, mpfr_srcptr x, mpfr_srcptr y);

/// log2 of an upper bound of |x| (x finite), for error bounds.
long log2_bound(mpfr_srcptr x);

}  // namespace ulpgate::attention_exact
