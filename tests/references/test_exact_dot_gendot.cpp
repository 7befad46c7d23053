// The superaccumulator on ill-conditioned dot products with prescribed condition numbers
// up to 1e40 (Ogita-Rump-Oishi GenDot, distributions/gendot.hpp), bit for bit against
// the MPFR oracle; the condition term it reports must give back the prescribed condition.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <sstream>

#include "distributions/gendot.hpp"
#include "core/format_mpfr.hpp"
#include "references/exact_dot.hpp"
#include "tests/references/dot_inputs.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

constexpr Format kFormats[] = {Format::FP32, Format::TF32, Format::BF16,
                               Format::FP16, Format::E4M3, Format::E5M2};

// A tenth of the dot-product budget (GenDot builds each input with MPFR, so it is the
// slowest family to generate): 100 RapidCheck cases of batch_size() dots.
std::uint64_t batch_size() { return std::max<std::uint64_t>(1, dots_budget() / 10 / 100); }

}  // namespace

RC_GTEST_PROP(ExactDotGenDot, IllConditionedMatchOracle, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  thread_local ExactAccumulator best(Simd::Avx512), bins_only(Simd::Scalar);
  thread_local MpfrOracle oracle;
  Bits bits(seed, 5, 0);
  Mpfr exact(2);
  const std::uint64_t batch = batch_size();
  for (std::uint64_t i = 0; i < batch; ++i) {
    const Format f = kFormats[i % 3 == 0 ? bits.in(0, 5) : 0];  // mostly FP32: cond to 1e40
    const std::size_t n = static_cast<std::size_t>(bits.in(2, 200));
    const double cond = std::min(std::pow(10.0, 0.5 + 39.5 * to_unit_closed_open(bits.next())),
                                 gendot_max_cond(n, f));
    if (cond < 2.0) continue;
    const DotPair p = gendot(n, cond, f, seed, static_cast<std::uint32_t>(i));
    const std::vector<float> x(p.x.begin(), p.x.end()), y(p.y.begin(), p.y.end());
    ExactAccumulator& acc = i % 2 ? bins_only : best;
    acc.clear();
    acc.add_products(x, y);
    oracle.dot(exact, x, y);
    const RefValue v = acc.value();
    std::ostringstream where;
    where << "seed " << seed << " dot " << i << " n " << n << " cond " << cond << " " << name(f);
    if (!(v == RefValue::from_exact(exact))) RC_FAIL(where.str() + ": window " + to_string(v));
    Mpfr fast(2);
    acc.exact_value(fast);
    RC_ASSERT(mpfr_equal_p(fast, exact) != 0);
    for (Format g : kAllFormats)
      if (v.round_to(g) != encode_exact(g, exact)) RC_FAIL(where.str() + ": rounding to " + std::string(name(g)));
    // The reported condition term gives back GenDot's condition number (within its 10x).
    const double achieved = 2.0 * acc.magnitude().to_double() / std::fabs(v.to_double());
    if (!(achieved >= cond / 10 && achieved <= cond * 10))
      RC_FAIL(where.str() + ": achieved condition " + std::to_string(achieved));
  }
}
