// The fuzz campaign finds planted bugs, shrinks them and saves a replayable corpus; correct
// kernels pass; the gate compares runs with a baseline.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "harness/fuzz.hpp"
#include "harness/gate.hpp"
#include "kernels/emulated/gemm_models.hpp"

using namespace ulpgate;

namespace {

// cpu.fp32_seq with a planted bug: the last term of the dot product is dropped whenever
// K is odd and above 20 (a remainder-loop bug of the kind tiled kernels have).
class DropsOddTail final : public Kernel {
 public:
  std::string name() const override { return "planted.odd_tail"; }
  std::string description() const override { return "drops the last term when K is odd and > 20"; }
  KernelTraits traits() const override { return {Memory::Host, true}; }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_->unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    Case shorter = c;
    if (c.gemm.k > 20 && c.gemm.k % 2 == 1) shorter.gemm.k -= 1;  // same buffers, one term fewer
    inner_->run(shorter, io, notes);
  }

 private:
  std::unique_ptr<Kernel> inner_ = make_emulated_gemm(default_models()[0]);
};

FuzzOptions options(const std::string& kernel, const std::string& dtype, const std::string& corpus) {
  FuzzOptions o;
  o.targets = {{kernel, dtype}};
  o.cases = 12;
  o.seed = 7;
  o.max_k = 64;
  o.gelu = false;  // keeps the test fast; GELU references are tested in tests/references
  o.corpus_dir = corpus;
  return o;
}

}  // namespace

TEST(Fuzz, CorrectModelPassesEveryProperty) {
  Registry reg = builtin_registry();
  const std::string corpus = testing::TempDir() + "fuzz_ok_corpus";
  std::filesystem::remove_all(corpus);
  // FP16 inputs cannot overflow an FP32 accumulator: every failure here would be a false alarm.
  const RunRecord r = run_fuzz(reg, options("cpu.fp32_seq", "fp16", corpus));
  ASSERT_EQ(r.cases.size(), 12u);
  for (const auto& c : r.cases) EXPECT_TRUE(c.verdict.passed) << c.family << ": " << c.verdict.reasons.front();
  EXPECT_FALSE(std::filesystem::exists(corpus) && !std::filesystem::is_empty(corpus));
}

TEST(Fuzz, FindsShrinksSavesAndReplaysAPlantedBug) {
  Registry reg = builtin_registry();
  reg.add(std::make_unique<DropsOddTail>());
  const std::string corpus = testing::TempDir() + "fuzz_bug_corpus";
  std::filesystem::remove_all(corpus);
  std::vector<std::string> log;
  const RunRecord r = run_fuzz(reg, options("planted.odd_tail", "fp16", corpus), {},
                               [&](const std::string& s) { log.push_back(s); });
  const auto shrunk = std::find_if(r.cases.begin(), r.cases.end(),
                                   [](const CaseResult& c) { return c.family.rfind("shrunk ", 0) == 0; });
  ASSERT_NE(shrunk, r.cases.end()) << "the planted bug was not found";
  EXPECT_FALSE(shrunk->verdict.passed);
  // Shrinking keeps the bug's condition (K odd, above 20) and reduces everything else.
  // (RapidCheck's integer shrinking halves the distance to 1, so K need not end at 21.)
  EXPECT_EQ(shrunk->spec.gemm.k % 2, 1);
  EXPECT_GT(shrunk->spec.gemm.k, 20);
  EXPECT_EQ(shrunk->spec.gemm.m, 1);
  EXPECT_EQ(shrunk->spec.gemm.n, 1);
  EXPECT_NE(shrunk->notes.at("rapidcheck_reproduce").find("RC_PARAMS=\"reproduce="), std::string::npos);
  ASSERT_EQ(shrunk->reproducer.rfind("ulpgate replay ", 0), 0u);
  const std::string file = shrunk->reproducer.substr(std::string("ulpgate replay ").size());
  ASSERT_TRUE(std::filesystem::exists(file));
  // The saved case replays to the same failure, and a later campaign replays it first.
  EXPECT_FALSE(replay_case(reg, read_case_file(file), {}).verdict.passed);
  FuzzOptions again = options("planted.odd_tail", "fp16", corpus);
  again.cases = 1;
  const RunRecord r2 = run_fuzz(reg, again);
  ASSERT_FALSE(r2.cases.empty());
  EXPECT_EQ(r2.cases.front().family.rfind("corpus ", 0), 0u);
  EXPECT_FALSE(r2.cases.front().verdict.passed);
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.back().find("FAIL planted.odd_tail fp16"), std::string::npos) << log.back();
}

TEST(Fuzz, SameSeedSameCampaign) {
  Registry reg = builtin_registry();
  FuzzOptions o = options("cpu.fp32_pairwise", "fp16", "");
  o.cases = 8;
  const RunRecord a = run_fuzz(reg, o), b = run_fuzz(reg, o);
  ASSERT_EQ(a.cases.size(), b.cases.size());
  for (std::size_t i = 0; i < a.cases.size(); ++i) {
    EXPECT_EQ(a.cases[i].spec, b.cases[i].spec);
    EXPECT_EQ(a.cases[i].metrics.front().max_normalised, b.cases[i].metrics.front().max_normalised);
  }
}

TEST(Gate, PassRegressionAndNewFailure) {
  RunRecord base;
  auto add = [](RunRecord& r, const char* fam, double err, bool passed) {
    CaseResult c;
    c.kernel = "k";
    c.family = fam;
    ErrorMetrics m;
    m.max_normalised = err;
    m.max_ulp = err * 1e6;
    c.metrics.push_back(m);
    c.verdict.passed = passed;
    if (!passed) c.verdict.reasons = {"planted"};
    r.cases.push_back(c);
  };
  add(base, "f1", 1e-7, true);
  add(base, "f1", 2e-7, true);
  add(base, "f2", 1e-3, true);
  const Baseline b = baseline_from_record(base, 0.25);
  ASSERT_EQ(b.entries.size(), 2u);
  EXPECT_EQ(b.entries[0].max_normalised, 2e-7);
  EXPECT_EQ(b.entries[0].cases, 2);
  EXPECT_EQ(baseline_from_json(to_json(b)), b);

  EXPECT_FALSE(gate(b, base).regression);
  RunRecord worse = base;
  worse.cases[1].metrics[0].max_normalised = 2.6e-7;  // > 2e-7 * 1.25
  const GateResult g = gate(b, worse);
  EXPECT_TRUE(g.regression);
  EXPECT_NE(render_gate_table(g).find("regressed"), std::string::npos);
  RunRecord within = base;
  within.cases[1].metrics[0].max_normalised = 2.4e-7;
  EXPECT_FALSE(gate(b, within).regression);
  RunRecord failing = base;
  failing.cases[2].verdict.passed = false;
  EXPECT_TRUE(gate(b, failing).regression);
  RunRecord partial = base;
  partial.cases.pop_back();  // f2 missing: reported, not a regression
  const GateResult p = gate(b, partial);
  EXPECT_FALSE(p.regression);
  EXPECT_NE(render_gate_table(p).find("missing"), std::string::npos);
  EXPECT_NE(render_gate_junit(g).find("<failure"), std::string::npos);
}

TEST(Gate, BadBaselineFilesAreInputErrors) {
  auto msg = [](const nlohmann::json& j) {
    try {
      baseline_from_json(j);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(msg(nlohmann::json::array()), "baseline: must be a JSON object");
  EXPECT_EQ(msg({{"ulpgate_baseline", 9}}), "baseline.ulpgate_baseline: unsupported version 9 (this build reads 1)");
  nlohmann::json j = to_json(Baseline{});
  j["entries"] = {{{"kernel", "k"}, {"family", "f"}, {"cases", 1}, {"failed", 0}, {"max_normalised", "x"}, {"max_ulp", 0}}};
  EXPECT_EQ(msg(j), "baseline.entries[0].max_normalised: must be a number");
  EXPECT_THROW(read_baseline_file("/nonexistent/baseline.json"), InputError);
}

// A target's cases depend only on (seed, kernel, dtype, op), not on which other targets
// the campaign runs (issue 13: adding a kernel used to change every later target's cases).
TEST(Fuzz, TargetCaseStreamDependsOnlyOnItsOwnName) {
  Registry reg = builtin_registry();
  FuzzOptions alone = options("cpu.fp32_seq", "fp16", "");
  alone.cases = 4;
  FuzzOptions with_other = alone;
  with_other.targets.insert(with_other.targets.begin(), {"cpu.fp32_pairwise", "fp32"});
  const RunRecord a = run_fuzz(reg, alone), b = run_fuzz(reg, with_other);
  std::vector<nlohmann::json> ca, cb;
  for (const auto& c : a.cases) ca.push_back(to_json(c.spec));
  for (const auto& c : b.cases)
    if (c.kernel == "cpu.fp32_seq") cb.push_back(to_json(c.spec));
  ASSERT_EQ(ca.size(), 4u);
  EXPECT_EQ(ca, cb);
}
