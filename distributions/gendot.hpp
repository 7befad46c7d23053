// Ill-conditioned dot products with a prescribed condition number: Ogita, Rump and Oishi's
// GenDot (SIAM J. Sci. Comput. 26(6), 2005, Algorithm 6.1), adapted so that every value is
// exactly representable in a target format; the running dot product is kept exact (MPFR)
// so the achieved condition is the one asked for. Definition and construction:
// see docs/concepts/cases.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/format.hpp"

namespace ulpgate {

struct DotPair {
  std::vector<double> x, y;
};

/// x, y of length n whose exact dot product has condition number 2*sum|x_i y_i| / |x.y|
/// within 10x of cond; values representable in format. Deterministic from (seed, stream):
/// pair element i draws random_block(seed, stream, 2i) and (.., 2i+1) (rng.hpp).
/// Throws InputError if cond < 2, cond is not finite, n == 0, or cond > gendot_max_cond.
DotPair gendot(std::size_t n, double cond, Format format, std::uint64_t seed, std::uint32_t stream);

/// The largest condition number gendot() accepts for length n and this format: limited by
/// the format's exponent range (entries stay normal) and precision (each cancellation step
/// removes at most max(1, p - 3) binades). 2 for n = 1 (a single product has cond 2).
double gendot_max_cond(std::size_t n, Format format);

/// The exact condition number 2*sum|x_i y_i| / |x.y| computed with MPFR (products and sums
/// exact), rounded to double; +Inf when the exact dot product is 0.
double exact_dot_condition(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace ulpgate
