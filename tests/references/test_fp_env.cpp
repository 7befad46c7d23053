// The exact value's derived forms (double-double, every format's rounding, the condition
// term's) do not depend on the floating-point environment the caller or a kernel left
// set: under each rounding mode, set through fesetround (x87 and SSE) or the SSE control
// register alone, they are bit-identical to those under round to nearest.
#include <gtest/gtest.h>

#include <xmmintrin.h>

#include <bit>
#include <cfenv>
#include <string>
#include <vector>

#include "references/exact_dot.hpp"
#include "tests/references/dot_inputs.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

constexpr Rounding kRoundings[] = {Rounding::NearestEven, Rounding::NearestAway, Rounding::TowardZero, Rounding::Up,
                                   Rounding::Down};

// Every derived form of x as bits.
std::vector<std::uint64_t> derived_forms(const RefValue& x) {
  const DoubleDouble dd = x.double_double();
  std::vector<std::uint64_t> out{std::bit_cast<std::uint64_t>(dd.hi), std::bit_cast<std::uint64_t>(dd.lo)};
  for (Format f : kAllFormats)
    for (Rounding r : kRoundings) out.push_back(x.round_to(f, r));
  for (Rounding r : kRoundings) out.push_back(std::bit_cast<std::uint64_t>(x.to_double(r)));
  return out;
}

// The exact sum and condition term of a dot product and their derived forms.
std::vector<std::uint64_t> dot_forms(ExactAccumulator& acc, const DotInput& d) {
  acc.clear();
  acc.add_products(d.x, d.y);
  std::vector<std::uint64_t> out = derived_forms(acc.value());
  const std::vector<std::uint64_t> m = derived_forms(acc.magnitude());
  out.insert(out.end(), m.begin(), m.end());
  return out;
}

// A changed environment: a rounding mode through fesetround, or the SSE control register's
// rounding field alone (the x87 control word, which fegetround reads, left at nearest).
struct Environment {
  std::string name;
  int fe = FE_TONEAREST;
  unsigned mxcsr_rounding = 0;  // bits 13-14 of MXCSR
};
const Environment kEnvironments[] = {{"FE_UPWARD", FE_UPWARD},
                                     {"FE_DOWNWARD", FE_DOWNWARD},
                                     {"FE_TOWARDZERO", FE_TOWARDZERO},
                                     {"MXCSR toward +inf only", FE_TONEAREST, 0x4000},
                                     {"MXCSR toward zero only", FE_TONEAREST, 0x6000}};

void enter(const Environment& e) {
  std::fesetround(e.fe);
  if (e.mxcsr_rounding) _mm_setcsr((_mm_getcsr() & ~0x6000u) | e.mxcsr_rounding);
}

void leave() { std::fesetround(FE_TONEAREST); }

}  // namespace

// 12,000 dot products of every input family (heavy and exact cancellation, extreme and
// subnormal products, specials): each environment set between the calls.
TEST(FpEnvironment, DerivedFormsIgnoreTheRoundingMode) {
  ExactAccumulator acc;
  std::vector<int> differ(std::size(kEnvironments), 0);
  std::string first;
  for (Family fam : kFamilies)
    for (std::uint64_t i = 0; i < 1200; ++i) {
      const DotInput d = make_dot(fam, 2024, i, 300);
      const std::vector<std::uint64_t> nearest = dot_forms(acc, d);
      for (std::size_t e = 0; e < std::size(kEnvironments); ++e) {
        enter(kEnvironments[e]);
        const std::vector<std::uint64_t> got = dot_forms(acc, d);
        leave();
        if (got != nearest && !differ[e]++)
          first += std::string(" ") + name(fam) + " input " + std::to_string(i) + " under " + kEnvironments[e].name + ";";
      }
    }
  for (std::size_t e = 0; e < std::size(kEnvironments); ++e)
    EXPECT_EQ(differ[e], 0) << "of 12000 dot products under " << kEnvironments[e].name << "; first:" << first;
}
