// Ill-conditioned dot products with a prescribed condition number: Ogita, Rump and Oishi,
// "Accurate sum and dot product", SIAM J. Sci. Comput. 26(6), 2005, Algorithm 6.1 (GenDot),
// adapted so that every value is exactly representable in a target format.
//
// Condition number of a dot product (the paper's definition):
//     cond(x, y) = 2 * sum |x_i y_i| / |sum x_i y_i|      (>= 2 always).
//
// Construction (n >= 2, cond > 20):
//   1. The first n2 pairs get random signs, significands in [1, 2) and product exponents
//      spread uniformly over B = ceil(log2 cond) binades (the first pair at the top), so
//      that sum |x_i y_i| is about 2^B times the final dot product.
//   2. Each remaining pair cancels the exact running dot product d_{i-1} (kept in MPFR, never
//      in plain double) down to a target t_i: x_i ~ sqrt|d_{i-1}|, y_i = round((t_i -
//      d_{i-1}) / x_i). The targets descend geometrically, at most s = max(1, p - 3) binades
//      per step (p = the format's precision), so the rounding error of y_i (<= |d_{i-1}|
//      2^-p) stays well below t_i. The last target is t_n = +-2 S / cond with S the exact
//      sum |x_i y_i|, so the achieved condition number is within a factor of about
//      1 +- 2^(s+1-p) of the request (tested: within 10x, in practice within 2x).
//   3. The pairs are randomly permuted (the same permutation for x and y).
// Exponents are centred in the format's normal range so nothing overflows or goes
// subnormal; gendot_max_cond() says how far that (and the number of cancellation steps
// n - n2) reaches for a given n and format. cond <= 20 gives all-positive data (cond = 2).
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
