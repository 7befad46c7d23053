#include "harness/probe.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace ulpgate {
namespace {

// Steps of `block` products from index 0: each step's values, zero padded.
std::vector<double> in_steps(std::initializer_list<std::initializer_list<double>> steps, int block) {
  std::vector<double> p;
  for (const auto& step : steps) {
    if (step.size() > static_cast<std::size_t>(block)) throw std::logic_error("probe: a step longer than the block");
    p.insert(p.end(), step.begin(), step.end());
    p.resize(p.size() + static_cast<std::size_t>(block) - step.size(), 0.0);
  }
  return p;
}

// The first j in [from, to] whose 2^-j the experiment loses; 0 when it keeps every one.
int first_lost(int from, int to, const std::function<bool(double)>& kept) {
  for (int j = from; j <= to; ++j)
    if (!kept(std::ldexp(1.0, -j))) return j;
  return 0;
}

}  // namespace

std::string ProbedAccumulation::describe() const {
  const std::string f = frac ? fmt::format("{} fraction bits", *frac) : fmt::format(">= {} fraction bits", frac_at_least);
  const std::string r = rounding ? std::string(name(*rounding)) : "rounding not observable (every step's sum fits FP32)";
  return fmt::format("block {}, {}, {}{}", block, f, r, promote ? fmt::format(", promoted to FP32 every {} products", promote) : "");
}

ProbedAccumulation probe_accumulation(const ProbeDot& dot, int max_block, int max_promote) {
  const auto run = [&](const std::vector<double>& p) { return static_cast<double>(dot(p)); };
  ProbedAccumulation r;

  // Block: 2^-100 after (1, -1) is lost while it shares their step.
  for (int t = 2; t <= max_block && r.block == 0; ++t) {
    std::vector<double> p(static_cast<std::size_t>(t) + 1, 0.0);
    p[0] = 1.0, p[1] = -1.0, p[static_cast<std::size_t>(t)] = 0x1p-100;
    if (run(p) == 0x1p-100) r.block = t;
  }
  if (r.block == 0)
    throw std::runtime_error(fmt::format("probe: 2^-100 lost behind (1, -1) at every distance up to {} products", max_block));

  // Fraction bits with (1), (-1, 2^-j): kept up to frac when the two share a step. Where
  // nothing is lost and the first experiment could not tell 1 from 2, the unit adds one
  // product at a time (the -1 cancels the accumulator before 2^-j arrives).
  const int pad = std::max(r.block, 2);
  const int lost = first_lost(1, 60, [&](double e) { return run(in_steps({{1.0}, {-1.0, e}}, pad)) == e; });
  if (lost > 0) {
    r.block = pad, r.frac = lost - 1;
  } else if (r.block >= 3) {
    r.frac_at_least = 60;
  } else {
    r.block = 1;  // one product per step: a lone 1 + 2^-j is aligned to itself, up to 23
    const int lost1 = first_lost(1, 23, [&](double e) { return run(std::vector<double>{1.0 + e}) == 1.0 + e; });
    if (lost1 > 0) r.frac = lost1 - 1;
    else r.frac_at_least = 23;
  }

  // Promotion, where the width is below FP32's: 2^-(frac+1) kept once it starts a new chunk.
  // Kept exactly from the promotion length on (t a multiple of the block): doubling, then
  // bisection.
  if (r.frac && *r.frac < 23) {
    const double e = std::ldexp(1.0, -(*r.frac + 1));
    const auto kept_at = [&](int t) {
      std::vector<double> p(static_cast<std::size_t>(t) + 1, 0.0);
      p[0] = 1.0, p[static_cast<std::size_t>(t)] = e;
      return run(p) == 1.0 + e;
    };
    int lo = 0, hi = r.block;  // blocks: lost at lo (0: none tried), kept at hi
    while (hi <= max_promote && !kept_at(hi)) lo = hi, hi *= 2;
    if (hi <= max_promote) {
      while (hi - lo > r.block) {
        const int mid = lo + (hi - lo) / (2 * r.block) * r.block;
        (kept_at(mid) ? hi : lo) = mid;
      }
      r.promote = hi;
    }
  }

  // Rounding, where a step's sum can need it: 2 + 3 2^-23 and 2 + 2^-23 are ties in FP32.
  if (!r.frac || *r.frac >= 23) {
    const double x = 1.0 + 3 * 0x1p-23, y = 1.0 + 0x1p-23;
    const double a = run(in_steps({{x}, {1.0}}, r.block)), b = run(in_steps({{-x}, {-1.0}}, r.block)),
                 c = run(in_steps({{y}, {1.0}}, r.block));
    const double up = 2.0 + 0x1p-21, down = 2.0 + 0x1p-22;
    const bool a_up = a == up, b_away = b == -up, c_up = c == down;  // c: 2 + 2^-22 is its "up"
    if ((a != up && a != down) || (b != -up && b != -down) || (c != 2.0 && c != down))
      throw std::runtime_error(fmt::format("probe: the rounding experiments gave {}, {}, {}: not a rounding of the ties "
                                           "2 + 3 2^-23 and 2 + 2^-23",
                                           a, b, c));
    if (a_up && b_away) r.rounding = c_up ? Rounding::NearestAway : Rounding::NearestEven;
    else if (!a_up && !b_away) r.rounding = Rounding::TowardZero;
    else r.rounding = a_up ? Rounding::Up : Rounding::Down;
    if (c_up != (r.rounding == Rounding::NearestAway || r.rounding == Rounding::Up))
      throw std::runtime_error(fmt::format("probe: the rounding experiments disagree ({}, {}, {})", a, b, c));
  }
  return r;
}

}  // namespace ulpgate
