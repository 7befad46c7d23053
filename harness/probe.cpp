#include "harness/probe.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "harness/runner.hpp"
#include "kernels/emulated/gemm_models.hpp"

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
  const std::string r = rounding ? std::string(name(*rounding)) : "rounding not observable (no step sum it can build needs rounding)";
  return fmt::format("block {}, {}, {}{}{}", block, f, r,
                     promote ? fmt::format(", promoted to FP32 every {} products", promote) : "",
                     validated ? fmt::format("; the model agrees on {} random dot products", validated)
                               : "; not validated (a parameter is not known)");
}

ProbeDot kernel_unit(Kernel& kernel) {
  return [&kernel](std::span<const double> p) {
    Case c;
    c.op = Op::Gemm;
    c.kernel = kernel.name();
    c.gemm.k = static_cast<std::int64_t>(p.size());
    c.types = {{"A", Format::FP32}, {"B", Format::FP32}, {"D", Format::FP32}, {"compute", Format::FP32}};
    validate(c);
    if (const auto why = kernel.unsupported(c))
      throw InputError(fmt::format("kernel '{}' does not take the probe's 1 x 1 x {} FP32 GEMM: {}", kernel.name(),
                                   p.size(), *why));
    std::map<std::string, Tensor> in{{"A", Tensor(Format::FP32, p.size())}, {"B", Tensor(Format::FP32, p.size())}};
    for (std::size_t i = 0; i < p.size(); ++i) in.at("A").set_value(i, p[i]), in.at("B").set_value(i, 1.0);
    const RunOutcome out = run_kernel(kernel, c, in);
    if (out.status != Disposition::Ok)
      throw std::runtime_error(fmt::format("kernel '{}' failed on a probe case: {}", kernel.name(), out.message));
    return static_cast<float>(decode(Format::FP32, out.outputs.at("D").code(0)));
  };
}

ProbedAccumulation probe_accumulation(const ProbeDot& dot, int max_block, int max_promote, int validate) {
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

  // Rounding, where a step's sum can need it. On the width's grid g = 2^-w (w = frac, at
  // most 23) a sum of terms below 2 reaching 2^E, E = 24 - w, has more bits than FP32 holds:
  // 2^E + 3g lies halfway between 2^E + 2g and 2^E + 4g, 2^E + g between 2^E and 2^E + 2g.
  // The terms (2 - g as often as it fits, then the rest) go into one step, or the first
  // into the step before when one more than the block is needed (not where every block is
  // promoted); more terms than that, and the unit never rounds a sum we can build.
  {
    const int w = std::min(r.frac.value_or(23), 23), e_top = 24 - w;
    const double g = std::ldexp(1.0, -w), top = 2.0 - g, base = std::ldexp(1.0, e_top);
    const auto experiment = [&](double sum) -> std::optional<std::vector<double>> {
      std::vector<double> terms;
      double rest = sum;  // exact: multiples of g below 2^(e_top + 1)
      while (rest >= top && terms.size() <= static_cast<std::size_t>(r.block)) terms.push_back(top), rest -= top;
      if (rest > 0) terms.push_back(rest);
      const auto n = static_cast<std::int64_t>(terms.size());
      if (n <= r.block) {
        terms.resize(static_cast<std::size_t>(r.block), 0.0);
        return terms;
      }
      if (n == r.block + 1 && (r.promote == 0 || r.promote > r.block)) {
        std::vector<double> p(static_cast<std::size_t>(2 * r.block), 0.0);
        p[0] = terms[0];
        std::copy(terms.begin() + 1, terms.end(), p.begin() + r.block);
        return p;
      }
      return std::nullopt;
    };
    const auto pa = experiment(base + 3 * g), pc = experiment(base + g);
    if (pa && pc) {
      std::vector<double> pb = *pa;
      for (double& v : pb) v = -v;
      const double a = run(*pa), b = run(pb), c = run(*pc);
      const double up = base + 4 * g, down = base + 2 * g;
      const bool a_up = a == up, b_away = b == -up, c_up = c == base + 2 * g;
      if ((a != up && a != down) || (b != -up && b != -down) || (c != base && c != base + 2 * g))
        throw std::runtime_error(fmt::format("probe: the rounding experiments gave {}, {}, {}: not a rounding of the ties "
                                             "2^{} + 3 2^-{} and 2^{} + 2^-{}",
                                             a, b, c, e_top, w, e_top, w));
      if (a_up && b_away) r.rounding = c_up ? Rounding::NearestAway : Rounding::NearestEven;
      else if (!a_up && !b_away) r.rounding = Rounding::TowardZero;
      else r.rounding = a_up ? Rounding::Up : Rounding::Down;
      if (c_up != (r.rounding == Rounding::NearestAway || r.rounding == Rounding::Up))
        throw std::runtime_error(fmt::format("probe: the rounding experiments disagree ({}, {}, {})", a, b, c));
    }
  }

  // One product per step with at least 23 fraction bits: the width shows in how a bit below
  // the accumulator's last place decides the rounding after a 1 (nearest even: 2^-24 + 2^-j,
  // a tie broken upward by 2^-j when kept; toward zero or down: -2^-j, 1 - 2^-24 when kept;
  // up: 2^-j, 1 + 2^-23 when kept), observable up to 47 (the products are FP32 numbers).
  // Nearest-away is left at "at least 23".
  if (r.block == 1 && !r.frac && r.rounding && *r.rounding != Rounding::NearestAway) {
    const Rounding mode = *r.rounding;
    const auto kept = [&](double e) {
      if (mode == Rounding::NearestEven) return run({1.0, 0x1p-24 + e}) == 1.0 + 0x1p-23;
      if (mode == Rounding::Up) return run({1.0, e}) == 1.0 + 0x1p-23;
      return run({1.0, -e}) == 1.0 - 0x1p-24;
    };
    // nearest even: 24 bits or 23 from 1 + 3 2^-24 (a tie to 1 + 2^-22 only when kept)
    const bool even = mode == Rounding::NearestEven;
    if (even && run({1.0, 3 * 0x1p-24}) != 1.0 + 0x1p-22) {
      r.frac = 23;
    } else {
      const int lost_wide = first_lost(even ? 25 : 24, 47, kept);
      if (lost_wide > 0) r.frac = lost_wide - 1;
      else r.frac_at_least = 48;
    }
  }

  // Validation: the inferred model against the unit on random FP32 products (not where a
  // width below 48 bits or the rounding is left unknown: no single model stands for the
  // unit then).
  AccumulationModel m;
  m.order = AccumulationModel::Order::BlockFma, m.block = r.block, m.frac_bits = r.frac.value_or(52);
  m.rounding = r.rounding.value_or(Rounding::TowardZero), m.promote = r.promote;
  const std::int64_t span = std::max<std::int64_t>(8 * r.block, 3 * r.promote) + 7;
  if ((!r.frac && r.frac_at_least < 48) || !r.rounding) validate = 0;
  for (int i = 0; i < validate; ++i) {
    const std::uint32_t w = random_block(0x9e3779b9, 18, static_cast<std::uint64_t>(i)).w[0];
    const std::int64_t k = 1 + static_cast<std::int64_t>(w % static_cast<std::uint64_t>(span));
    std::vector<double> p(static_cast<std::size_t>(k)), ones(p.size(), 1.0);
    for (std::int64_t q = 0; q < k; ++q) {
      const RandomBlock b = random_block(0x9e3779b9, 19, (static_cast<std::uint64_t>(i) << 24) + static_cast<std::uint64_t>(q));
      // a sign, an exponent in [-8, 8], 23 random fraction bits: an FP32 number
      const double v = std::ldexp(1.0 + static_cast<double>(b.w[0] >> 9) * 0x1p-23, static_cast<int>(b.w[1] % 17) - 8);
      p[static_cast<std::size_t>(q)] = (b.w[2] & 1) ? -v : v;
    }
    const float want = model_dot(m, p.data(), ones.data(), k), got = dot(p);
    if (std::bit_cast<std::uint32_t>(want) != std::bit_cast<std::uint32_t>(got))
      throw std::runtime_error(fmt::format("the inferred {} gives {} where the unit gives {} (random dot product {} of "
                                           "{} products)",
                                           m.name(), want, got, i, k));
    ++r.validated;
  }
  return r;
}

}  // namespace ulpgate
