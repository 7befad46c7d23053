// GEMM bugs that live only at sizes where kernels switch paths, found by the default
// campaign (the CLI's `ulpgate fuzz --kernel NAME`: every dtype the kernel supports, 10
// cases each, max_k 1024, relations on, the realistic size schedule), on seeds 1, 2 and 3;
// the same kernels without their bug pass the same campaigns (no false alarm). Also: the
// large regime's draws.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "core/tensor.hpp"
#include "check/check.hpp"
#include "campaign/fuzz.hpp"
#include "check/ops/gemm.hpp"
#include "tests/campaign/campaign_test_util.hpp"
#include "kernels/builtin.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

// A plain FP32 GEMM (D = alpha op(A) op(B), no C, no epilogue; any D format), written as a
// split-K kernel would be: below K = 2048 one sequential FMA chain per element; from 2048
// on (its split-K path) chunks of 256 products, each summed with FMA in FP32, the chunk
// sums added in FP32. With narrow_partials the split-K path stores each chunk sum with 11
// bits of precision (a TF32/FP16-precision workspace: no overflow, but 2^13 times coarser
// than FP32): a bug invisible to a K-linear worst-case bound.
class SplitKGemm final : public Kernel {
 public:
  SplitKGemm(bool narrow_partials, bool declares_nearest) : narrow_(narrow_partials), nearest_(declares_nearest) {}
  std::string name() const override { return narrow_ ? "planted.splitk_narrow" : "planted.splitk_ok"; }
  std::string description() const override { return "FP32 split-K GEMM from K = 2048 on"; }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Host, true};
    t.rounds_to_nearest = nearest_;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Gemm) return "GEMM only";
    if (c.beta != 0 || c.epilogue != Epilogue::None) return "no C, no epilogue";
    if (c.types.at("compute") != Format::FP32 || !c.scales.empty()) return "FP32 compute, no scales";
    for (const char* op : {"A", "B"})
      if (c.types.at(op) != Format::FP32 && c.types.at(op) != Format::FP16 && c.types.at(op) != Format::BF16)
        return "FP32, FP16 or BF16 inputs";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const GemmShape& g = c.gemm;
    const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
    const Format fa = c.types.at("A"), fb = c.types.at("B"), fd = c.types.at("D");
    std::vector<float> as(static_cast<std::size_t>(g.m * g.k)), bs(static_cast<std::size_t>(g.n * g.k));
    for (std::int64_t bi = 0; bi < g.batch; ++bi)
      for (std::int64_t i = 0; i < g.m; ++i) {
        if (i == 0) {  // op(A) rows and op(B) columns of this batch, decoded once
          for (std::int64_t r = 0; r < g.m; ++r)
            for (std::int64_t k = 0; k < g.k; ++k)
              as[r * g.k + k] = static_cast<float>(decode(fa, load_code(fa, io.in.at("A"), op_a_offset(c, av, bi, r, k))));
          for (std::int64_t j = 0; j < g.n; ++j)
            for (std::int64_t k = 0; k < g.k; ++k)
              bs[j * g.k + k] = static_cast<float>(decode(fb, load_code(fb, io.in.at("B"), op_b_offset(c, bv, bi, k, j))));
        }
        const float* a = &as[i * g.k];
        for (std::int64_t j = 0; j < g.n; ++j) {
          const float* b = &bs[j * g.k];
          float acc = 0;
          if (g.k < 2048) {
            for (std::int64_t k = 0; k < g.k; ++k) acc = std::fmaf(a[k], b[k], acc);
          } else {
            for (std::int64_t k0 = 0; k0 < g.k; k0 += 256) {
              float part = 0;
              for (std::int64_t k = k0; k < std::min(g.k, k0 + 256); ++k) part = std::fmaf(a[k], b[k], part);
              if (narrow_) part = static_cast<float>(decode(Format::TF32, encode(Format::TF32, part)));
              acc += part;
            }
          }
          const double d = static_cast<double>(static_cast<float>(c.alpha * static_cast<double>(acc)));
          store_code(fd, io.out.at("D"), dv.offset(bi, i, j), encode(fd, d, Rounding::NearestEven, Overflow::NoSaturate));
        }
      }
  }

 private:
  bool narrow_, nearest_;
};

// A correct FP32 GEMM whose path for M >= 1024 works in row tiles of 128; with the bug, the
// rows of a ragged last tile (M not a multiple of 128) are computed from the row 128 above
// (a tail-tile index bug that small shapes never reach).
class LargeTileGemm final : public Kernel {
 public:
  explicit LargeTileGemm(bool bug) : bug_(bug) {}
  std::string name() const override { return bug_ ? "planted.tile_tail" : "planted.tile_ok"; }
  std::string description() const override { return "FP32 GEMM, 128-row tiles from M = 1024 on"; }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Host, true};
    t.rounds_to_nearest = true;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_.unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    inner_.run(c, io, notes);
    const GemmShape& g = c.gemm;
    if (!bug_ || g.m < 1024 || g.m % 128 == 0) return;
    const MatrixView dv = gemm_view(c, "D");
    const Format fd = c.types.at("D");
    for (std::int64_t bi = 0; bi < g.batch; ++bi)
      for (std::int64_t i = g.m / 128 * 128; i < g.m; ++i)
        for (std::int64_t j = 0; j < g.n; ++j)
          store_code(fd, io.out.at("D"), dv.offset(bi, i, j), load_code(fd, io.out.at("D"), dv.offset(bi, i - 128, j)));
  }

 private:
  bool bug_;
  SplitKGemm inner_{false, true};
};

// What a GEMM campaign drew from the large regime, for a message.
std::string large_shape(const CaseResult& c) {
  const GemmShape& g = c.spec.gemm;
  if (g.k < 2048 && g.m < 1024 && g.n < 1024) return "";
  return fmt::format("{} M={} N={} K={} precision_ratio={}", c.family, g.m, g.n, g.k,
                     c.notes.count("precision_ratio") ? c.notes.at("precision_ratio") : "-");
}

}  // namespace

// Narrow split-K partials from K = 2048 on: found by the default campaign on every seed,
// only in cases with K >= 2048, by the precision rule (FP32 D) or the rounding test (a
// BF16/FP16 D, whose rounding hides the loss from the mean of errors); the worst-case
// bound lets them through.
TEST(GemmLargeRegime, DefaultCampaignFindsNarrowSplitKPartials) {
  for (std::uint64_t seed : {1, 2, 3}) {
    Registry reg;
    reg.add(std::make_unique<SplitKGemm>(true, true));
    const RunRecord r = default_campaign(reg, "planted.splitk_narrow", seed);
    expect_found_only_where(r, [](const Case& c) { return c.gemm.k >= 2048; }, "seed " + std::to_string(seed), large_shape);
    bool statistical = false;
    for (const CaseResult& c : r.cases)
      statistical |= c.signature.find("D:precision") != std::string::npos || c.signature.find("D:misrounded") != std::string::npos;
    EXPECT_TRUE(statistical) << "seed " << seed;
  }
}

TEST(GemmLargeRegime, DefaultCampaignPassesTheCorrectSplitKKernel) {
  for (std::uint64_t seed : {1, 2, 3})
    for (bool nearest : {true, false}) {
      Registry reg;
      reg.add(std::make_unique<SplitKGemm>(false, nearest));
      expect_all_pass(default_campaign(reg, "planted.splitk_ok", seed), "seed " + std::to_string(seed));
    }
}

// A ragged last row tile computed from the wrong rows on the M >= 1024 path.
TEST(GemmLargeRegime, DefaultCampaignFindsALargeTileTailBug) {
  for (std::uint64_t seed : {1, 2, 3}) {
    Registry reg;
    reg.add(std::make_unique<LargeTileGemm>(true));
    const RunRecord r = default_campaign(reg, "planted.tile_tail", seed);
    // (the transposition relation runs the problem with M and N swapped: N's tail then counts)
    expect_found_only_where(
        r, [](const Case& c) { return (c.gemm.m >= 1024 && c.gemm.m % 128 != 0) || (c.gemm.n >= 1024 && c.gemm.n % 128 != 0); },
        "seed " + std::to_string(seed), large_shape);
  }
}

// The large regime reaches what it promises: K from 2048 to 65536, M and N >= 2048 with
// ragged tails, batches up to 16, within the caps.
TEST(GemmLargeRegime, DrawsWhereKernelsSwitchPaths) {
  const rc::Gen<Case> gen = op_module(Op::Gemm).generate("fp32", nullptr, GenLimits{1024, true, true});
  std::int64_t max_k = 0, max_mn = 0, max_batch = 0, ragged_big = 0, long_k = 0;
  for (std::uint64_t i = 0; i < 400; ++i) {
    const Case c = draw_case(gen, 99, i).value();
    const GemmShape& g = c.gemm;
    EXPECT_LE(g.batch * g.m * g.n * g.k, kLargeTermBudget);
    max_k = std::max(max_k, g.k), max_mn = std::max({max_mn, g.m, g.n}), max_batch = std::max(max_batch, g.batch);
    ragged_big += (std::max(g.m, g.n) >= 2048 && std::max(g.m, g.n) % 16 != 0);
    long_k += g.k >= 2048;
  }
  EXPECT_GE(max_k, 32768);
  EXPECT_GE(max_mn, 4096);
  EXPECT_GE(max_batch, 12);
  EXPECT_GE(ragged_big, 20);
  EXPECT_GE(long_k, 80);
}

// A correct sequential round-to-nearest FP32 kernel on heavy-tailed positive data at K =
// 65536: small products are absorbed one-sidedly into the large running sum, an error the
// random rounding model (independent zero-mean roundings) underestimates about 16-fold.
// Before the precision scale took a sequential accumulation's actual error into account,
// these cases failed the precision rule (3.2x) and the rounding test (63 of 64): false
// alarms on a correct kernel.
TEST(PrecisionScale, CorrectSequentialKernelPassesOnHeavyTailedPositiveData) {
  Registry reg = builtin_registry();
  for (const char* dist : {"lognormal(0,3)", "lognormal(2,3)"})
    for (const int seed : {35784, 1, 2}) {
      nlohmann::json j = nlohmann::json::parse(R"({"alpha": 1.0, "beta": 0.0, "epilogue": "none",
        "gemm": {"batch": 1, "k": 65536, "layout": "row", "lda": 0, "ldb": 0, "ldc": 0, "ldd": 0, "m": 8, "n": 8,
                 "trans_a": false, "trans_b": false},
        "kernel": "cpu.fp32_seq", "op": "gemm", "scales": {},
        "types": {"A": "fp32", "B": "fp32", "D": "fp32", "compute": "fp32"}, "ulpgate_case": 1})");
      j["dist"] = {{"A", dist}, {"B", dist}};
      j["seed"] = seed;
      Case c = case_from_json(j);
      Kernel& k = *reg.find("cpu.fp32_seq");
      const Evaluation ev = evaluate(k, c, {});
      EXPECT_TRUE(ev.verdict.passed) << dist << " seed " << seed << ": " << failure_signature(ev.verdict);
      EXPECT_LT(ev.verdict.precision_ratio, 0.5) << dist << " seed " << seed;
      EXPECT_EQ(ev.verdict.misrounded, 0) << dist << " seed " << seed;
    }
}
