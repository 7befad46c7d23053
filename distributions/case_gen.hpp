// RapidCheck building blocks for case generators: dimensions that favour the values where
// kernels break, choices that shrink to the simplest option, and a distribution spec for
// every family. The whole-case generators, one per op, are in check/ops.
// Header-only: only tests and the fuzz driver link RapidCheck. See docs/concepts/cases.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <rapidcheck.h>

#include "distributions/gendot.hpp"
#include "distributions/spec.hpp"
#include "core/case.hpp"

namespace ulpgate::gen {

/// Largest number of elements per generated operand.
inline constexpr std::int64_t kElementBudget = std::int64_t{1} << 18;

/// Tile edges and their neighbours, primes, 1.
inline const std::vector<std::int64_t> kInterestingDims = {1,  2,  3,  5,   7,   13,  15,  16,  17,
                                                           31, 32, 33, 63,  64,  65,  127, 128, 129,
                                                           255, 256, 257, 1000, 4096, 65536};

/// A dimension in [1, max]: an interesting value (kInterestingDims up to max, or `extra`)
/// half of the time, otherwise uniform in a range that grows with RapidCheck's size. Shrinks towards 1 one integer at a time (not just
/// through the interesting list), so a failure ends at its exact boundary.
/// With generic = false only `extra` is the pool (e.g. attention head dimensions).
inline rc::Gen<std::int64_t> dim(std::int64_t max, std::vector<std::int64_t> extra = {},
                                 bool generic = true) {
  return rc::Gen<std::int64_t>([max, extra, generic](const rc::Random& random, int size) {
    std::vector<std::int64_t> pool = extra;
    for (std::int64_t d : kInterestingDims)
      if (generic && d <= max) pool.push_back(d);
    rc::Random r = random;
    const bool pick_interesting = !pool.empty() && rc::gen::arbitrary<bool>()(r.split(), size).value();
    std::int64_t v;
    if (pick_interesting) {
      // Uniform over the pool whatever RapidCheck's size: edge values from the first test on.
      v = pool[static_cast<std::size_t>(r.split().next() % pool.size())];
    } else {
      // Size-scaled: small shapes in early tests, up to max later.
      v = rc::gen::inRange<std::int64_t>(1, max + 1)(r.split(), size).value();
    }
    v = std::clamp<std::int64_t>(v, 1, max);
    return rc::shrinkable::shrinkRecur(
        v, [](std::int64_t x) { return rc::shrink::towards<std::int64_t>(x, 1); });
  });
}

/// A large-regime dimension in [lo, hi] (docs/concepts/sizes.md), log-uniform whatever
/// RapidCheck's size, so that each octave is drawn as often: a third of the time as drawn
/// (mostly ragged), a third a power of two (the boundary itself), a third a multiple of
/// one of `tiles` plus one of `tails` (by default 256 or 128, plus or minus 1, 3 or 17: a
/// remainder tile that is not a multiple of 16 either). Clamped to [lo, hi]; shrinks
/// towards shrink_to.
inline rc::Gen<std::int64_t> log_dim(std::int64_t lo, std::int64_t hi, std::vector<std::int64_t> tiles = {256, 128},
                                     std::vector<std::int64_t> tails = {1, -1, 3, -3, 17}, std::int64_t shrink_to = 1) {
  return rc::Gen<std::int64_t>([lo, hi, tiles, tails, shrink_to](const rc::Random& random, int) {
    rc::Random r = random;
    const double u = static_cast<double>(r.split().next() >> 11) * 0x1p-53;
    const double l = std::log2(static_cast<double>(lo)), h = std::log2(static_cast<double>(hi) + 1);
    auto v = static_cast<std::int64_t>(std::exp2(l + u * (h - l)));
    const std::uint64_t how = r.split().next() % 3;
    if (how == 1) {
      v = std::int64_t{1} << static_cast<int>(std::llround(std::log2(static_cast<double>(std::max<std::int64_t>(v, 1)))));
    } else if (how == 2) {
      // (one tile: no draw)
      const std::int64_t tile = tiles.size() == 1 ? tiles[0] : tiles[r.split().next() % tiles.size()];
      v = std::max<std::int64_t>(1, v / tile) * tile + tails[r.split().next() % tails.size()];
    }
    v = std::clamp(v, lo, hi);
    return rc::shrinkable::shrinkRecur(
        v, [shrink_to](std::int64_t x) { return rc::shrink::towards<std::int64_t>(x, shrink_to); });
  });
}

/// One of `options`, uniformly; shrinks towards options[0] (RapidCheck's own elementOf does
/// not shrink at all), so every list here starts with its simplest choice.
template <class T>
rc::Gen<T> pick(std::vector<T> options) {
  return rc::Gen<T>([options](const rc::Random& random, int) {
    const auto i = static_cast<std::size_t>(rc::Random(random).next() % options.size());
    return rc::shrinkable::map(
        rc::shrinkable::shrinkRecur(i, [](std::size_t x) { return rc::shrink::towards<std::size_t>(x, 0); }),
        [options](std::size_t k) { return options[k]; });
  });
}

/// Formats with the simplest (FP32) first.
inline const std::vector<Format> kFormatsSimpleFirst = {Format::FP32, Format::FP16, Format::BF16,
                                                        Format::E4M3, Format::E5M2, Format::TF32,
                                                        Format::FP64};

namespace detail {

inline std::string num(double v) { return fmt::format("{}", v); }

// The family names usable on `op` of case c, "normal" first.
inline std::vector<std::string> families_for(const Case& c, const std::string& op, bool joint_allowed,
                                             const std::vector<std::string>& exclude) {
  std::vector<std::string> out{"normal"};
  for (const FamilyInfo& f : all_families()) {
    if (f.name == "normal" || std::find(exclude.begin(), exclude.end(), f.name) != exclude.end()) continue;
    bool ok = false;
    switch (f.scope) {
      case Scope::Any: ok = true; break;
      case Scope::GemmAB: ok = joint_allowed && c.op == Op::Gemm && op == "A"; break;
      case Scope::GemmABC: ok = c.op == Op::Gemm && (op == "A" || op == "B" || op == "C"); break;  // attention: draw_kv_scales
      case Scope::AttnQK: ok = joint_allowed && is_attention(c.op) && op == "Q"; break;
      case Scope::CombineLse: ok = c.op == Op::AttentionCombine && op == "LSE_part"; break;
    }
    if (f.name == "gendot" && ok) {
      // One GenDot pair must fit both A and B, and the request must be reachable at this K.
      const Format a = c.types.at("A"), b = c.types.at("B");
      ok = a == b && gendot_max_cond(static_cast<std::size_t>(c.gemm.k), a) >= 1e3 &&
           c.gemm.batch * 3 * c.gemm.k <= (std::int64_t{1} << 18);
    }
    if (ok) out.emplace_back(f.name);
  }
  return out;
}

// A base spec for the wrappers: simple per-element families.
inline rc::Gen<std::string> base_spec() {
  return pick(std::vector<std::string>{"normal(0,1)", "uniform(0,1)", "uniform(-9,9)",
                                                     "activations", "student_t(3)", "relu"});
}

}  // namespace detail

/// A distribution spec for input `op` of case c (types and shape already set). With
/// joint_allowed, the families built with a partner (gendot on A, logits/sink/masked on Q)
/// may come up; the caller then leaves the partner's spec empty. Families named in exclude
/// never come up.
inline rc::Gen<std::string> dist_spec(const Case& c, const std::string& op, bool joint_allowed,
                                      std::vector<std::string> exclude = {}) {
  return rc::gen::exec([c, op, joint_allowed, exclude]() -> std::string {
    using V = std::vector<double>;
    const std::string fam = *pick(detail::families_for(c, op, joint_allowed, exclude));
    const Format f = c.types.at(op);
    if (fam == "normal") {
      const double mean = *pick(V{0, 1, -3, 100}), std = *pick(V{1, 0.01, 10, 1e3});
      return fmt::format("normal({},{})", detail::num(mean), detail::num(std));
    }
    if (fam == "uniform") {
      const auto lh = *pick(std::vector<std::pair<double, double>>{{-1, 1}, {0, 1}, {-9, 9}, {1, 2}, {-1e3, 1e3}});
      return fmt::format("uniform({},{})", detail::num(lh.first), detail::num(lh.second));
    }
    if (fam == "lognormal")
      return fmt::format("lognormal({},{})", detail::num(*pick(V{0, -2, 2})), detail::num(*pick(V{1, 0.25, 3})));
    if (fam == "student_t")
      return fmt::format("student_t({},{})", detail::num(*pick(V{3, 1, 2, 5, 30})), detail::num(*pick(V{1, 0.1})));
    if (fam == "cauchy") return fmt::format("cauchy(0,{})", detail::num(*pick(V{1, 0.01})));
    if (fam == "activations")
      return fmt::format("activations(std={},rate={},scale={})", detail::num(*pick(V{1, 0.1})),
                         detail::num(*pick(V{0.01, 0.001, 0.1})), detail::num(*pick(V{20, 100, 6})));
    if (fam == "weights") return fmt::format("weights(gain={})", detail::num(*pick(V{1, 2})));
    if (fam == "softmax") return fmt::format("softmax(std={})", detail::num(*pick(V{2, 0.5, 8})));
    if (fam == "sparse") return fmt::format("sparse(density={})", detail::num(*pick(V{0.1, 0.5, 0.01, 0.9})));
    if (fam == "relu") return fmt::format("relu(mean={})", detail::num(*pick(V{0, -1, 1})));
    if (fam == "positive") return fmt::format("positive({})", detail::num(*pick(V{1, 10})));
    if (fam == "gendot") {
      const double top = gendot_max_cond(static_cast<std::size_t>(c.gemm.k), f);
      V conds;
      for (double x : {1e3, 1e8, 1e16, 1e30, 1e40})
        if (x <= top) conds.push_back(x);
      return fmt::format("gendot(cond={},pairs={})", detail::num(*pick(conds)), *pick(std::vector<int>{1, 2, 3}));
    }
    if (fam == "near_overflow") return fmt::format("near_overflow(lo={})", detail::num(*pick(V{0.25, 0.9})));
    if (fam == "subnormal") return fmt::format("subnormal(rate={})", detail::num(*pick(V{0.5, 0.1, 0.9})));
    if (fam == "specials") {
      const double inf = info(f).has_inf ? *pick(V{1e-4, 0.01, 0}) : 0.0;
      return fmt::format("specials(nan={},inf={},negzero={},base={})", detail::num(*pick(V{1e-4, 0.01, 0})),
                         detail::num(inf), detail::num(*pick(V{0.01, 0.1})), *detail::base_spec());
    }
    if (fam == "outliers")
      return fmt::format("outliers(rate={},scale={},base={})", detail::num(*pick(V{0.001, 0.01})),
                         detail::num(*pick(V{100, 1e4})), *detail::base_spec());
    if (fam == "amax")
      return fmt::format("amax(frac={},base={})", detail::num(*pick(V{1, 0.5})), *detail::base_spec());
    if (fam == "logits") return fmt::format("logits(std={})", detail::num(*pick(V{1, 5, 0.1})));
    if (fam == "sink")
      return fmt::format("sink(logit={},key={})", detail::num(*pick(V{16, 50})),
                         *rc::gen::inRange<std::int64_t>(0, c.attention.seq_kv));
    if (fam == "masked") return fmt::format("masked(frac={})", detail::num(*pick(V{0.25, 0.5})));
    if (fam == "exact") return fmt::format("exact(frac={})", *pick(std::vector<int>{0, 2}));
    if (fam == "lse")  // equal LSEs (std 0, a step), far-negative rows, exp(LSE) past FP32's range, empty splits
      return fmt::format("lse(mean={},std={},empty={},step={})", detail::num(*pick(V{4, 0, 20, -1e4, 100, 1000, -100})),
                         detail::num(*pick(V{4, 0.5, 30, 0, 300})), detail::num(*pick(V{0.1, 0, 0.5, 1})),
                         detail::num(*pick(V{0, 0, 1, 0.5, 0.25})));
    throw std::logic_error("dist_spec: no generator for family " + fam);
  });
}

}  // namespace ulpgate::gen
