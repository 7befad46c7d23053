// The fuzz campaign finds planted bugs, shrinks them and saves a replayable corpus; correct
// kernels pass; the gate compares runs with a baseline.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "campaign/fuzz.hpp"
#include "campaign/gate.hpp"
#include "kernels/emulated/attention_models.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "kernels/builtin.hpp"

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
  o.sizes = SizeSchedule::Small;  // the large regime's campaigns: tests/campaign/test_*size_regimes.cpp
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
  const auto shrunk = std::find_if(r.cases.begin(), r.cases.end(), [](const CaseResult& c) { return c.origin == "shrunk"; });
  ASSERT_NE(shrunk, r.cases.end()) << "the planted bug was not found";
  EXPECT_FALSE(shrunk->verdict.passed);
  // Shrinking keeps the bug's condition (K odd, above 20) and reduces everything else.
  // (RapidCheck's integer shrinking halves the distance to 1, so K need not end at 21.)
  EXPECT_EQ(shrunk->spec.gemm.k % 2, 1);
  EXPECT_GT(shrunk->spec.gemm.k, 20);
  EXPECT_EQ(shrunk->spec.gemm.m, 1);
  EXPECT_EQ(shrunk->spec.gemm.n, 1);
  ASSERT_EQ(shrunk->reproducer.rfind("ulpgate replay ", 0), 0u);
  const std::string file = shrunk->reproducer.substr(std::string("ulpgate replay ").size());
  ASSERT_TRUE(std::filesystem::exists(file));
  // The saved case replays to the same failure, and a later campaign replays it first.
  EXPECT_FALSE(replay_case(reg, read_case_file(file), {}).verdict.passed);
  FuzzOptions again = options("planted.odd_tail", "fp16", corpus);
  again.cases = 1;
  const RunRecord r2 = run_fuzz(reg, again);
  ASSERT_FALSE(r2.cases.empty());
  EXPECT_EQ(r2.cases.front().origin, "corpus");
  EXPECT_FALSE(r2.cases.front().verdict.passed);
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.front().find("FAIL planted.odd_tail fp16"), std::string::npos) << log.front();
}

namespace {

// Two bugs in one kernel: the odd-tail bug above, and NaN in C[0][0] whenever K is a
// multiple of 4 above 8 (a distinct failure: another check, another region).
class TwoBugs final : public Kernel {
 public:
  std::string name() const override { return "planted.two_bugs"; }
  std::string description() const override { return "drops the odd tail; NaN at [0][0] for K % 4 == 0"; }
  KernelTraits traits() const override { return {Memory::Host, true}; }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_.unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    inner_.run(c, io, notes);
    if (c.gemm.k > 8 && c.gemm.k % 4 == 0) static_cast<float*>(io.out.at("D"))[0] = NAN;
  }

 private:
  DropsOddTail inner_;
};

}  // namespace

// A target goes on after a failure; distinct failures are each shrunk, keeping their
// signature (a target must not stop at its first failure, nor shrinking drift to another).
TEST(Fuzz, KeepsLookingAfterAFailureAndShrinksEachSignature) {
  Registry reg = builtin_registry();
  reg.add(std::make_unique<TwoBugs>());
  FuzzOptions o = options("planted.two_bugs", "fp32", "");
  o.cases = 40;
  o.max_k = 128;
  const RunRecord r = run_fuzz(reg, o);
  std::int64_t generated = 0;
  std::set<std::string> checks;
  for (const auto& c : r.cases) {
    generated += c.origin == "generated";
    if (c.origin == "generated" && !c.verdict.passed) checks.insert(c.signature.substr(0, c.signature.find('@')));
  }
  EXPECT_EQ(generated, 40) << "the target stopped early";
  EXPECT_TRUE(checks.count("D:tolerance")) << ::testing::PrintToString(checks);
  EXPECT_TRUE(checks.count("D:unexpected_nan")) << ::testing::PrintToString(checks);
  int shrunk = 0;
  for (const auto& m : r.cases) {
    if (m.origin != "shrunk") continue;
    ++shrunk;
    const auto from = std::find_if(r.cases.begin(), r.cases.end(),
                                   [&](const CaseResult& c) { return c.id == m.notes.at("shrunk_from"); });
    ASSERT_NE(from, r.cases.end());
    EXPECT_TRUE(same_failure(m.signature, from->signature)) << m.signature << " from " << from->signature;
    EXPECT_LE(m.spec.gemm.k, from->spec.gemm.k);
  }
  EXPECT_GE(shrunk, 2);
}

namespace {

// DropsOddTail, recording every case it runs (as JSON) in order.
class RecordsRuns final : public Kernel {
 public:
  explicit RecordsRuns(std::vector<std::string>& runs) : runs_(runs) {}
  std::string name() const override { return "planted.records_runs"; }
  std::string description() const override { return "planted.odd_tail, recording its runs"; }
  KernelTraits traits() const override { return {Memory::Host, true}; }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_.unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    runs_.push_back(to_json(c).dump());
    inner_.run(c, io, notes);
  }

 private:
  std::vector<std::string>& runs_;
  DropsOddTail inner_;
};

}  // namespace

// Shrinking a failure that is not a relation's runs each candidate without the
// metamorphic relations (a passing candidate is rejected either way): with relations on,
// every case that is not a generated one runs exactly as often as with relations off (a
// passing candidate would otherwise run again for repeatability and scaling), and the
// shrunk case is the same.
TEST(Fuzz, ShrinkCandidatesRunWithoutRelationsUnlessTheFailureIsOne) {
  std::vector<std::string> runs;
  Registry reg = builtin_registry();
  reg.add(std::make_unique<RecordsRuns>(runs));
  FuzzOptions o = options("planted.records_runs", "fp16", "");
  const auto campaign = [&](bool relations, std::map<std::string, int>& count) {
    runs.clear();
    o.metamorphic = relations;
    RunRecord r = run_fuzz(reg, o);
    for (const auto& j : runs) ++count[j];
    return r;
  };
  std::map<std::string, int> without, with;
  const RunRecord a = campaign(false, without), b = campaign(true, with);
  const auto shrunk_of = [](const RunRecord& r) {
    const auto it = std::find_if(r.cases.begin(), r.cases.end(), [](const CaseResult& c) { return c.origin == "shrunk"; });
    return it == r.cases.end() ? std::string() : it->id;
  };
  ASSERT_NE(shrunk_of(a), "") << "the planted bug was not found";
  EXPECT_EQ(shrunk_of(b), shrunk_of(a)) << "the same minimal case";
  std::set<std::string> generated;
  for (const auto& c : b.cases)
    if (c.origin == "generated") generated.insert(to_json(c.spec).dump());
  int candidates = 0;
  for (const auto& [j, n] : with) {
    if (generated.count(j)) continue;
    if (without.count(j)) ++candidates;  // (a transposed case of a relation runs only with relations on)
    if (without.count(j)) { EXPECT_EQ(n, without.at(j)) << "a shrink candidate ran more often with relations on: " << j; }
  }
  EXPECT_GT(candidates, 5);
}

// Case i of a target is the same case whatever --cases is (so a longer campaign runs the
// shorter one's cases and more), and a time budget that ends the campaign records what
// did not run.
TEST(Fuzz, CaseStreamIndependentOfCaseCountAndBudgetRecorded) {
  Registry reg = builtin_registry();
  FuzzOptions three = options("cpu.fp32_seq", "fp16", "");
  three.cases = 3;
  FuzzOptions five = three;
  five.cases = 5;
  const RunRecord a = run_fuzz(reg, three), b = run_fuzz(reg, five);
  ASSERT_EQ(a.cases.size(), 3u);
  ASSERT_EQ(b.cases.size(), 5u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.cases[i].id, b.cases[i].id);
  EXPECT_TRUE(a.not_run.empty());
  EXPECT_NE(a.campaign, b.campaign);

  FuzzOptions cut = five;
  cut.targets.push_back({"cpu.fp32_pairwise", "fp16"});
  cut.seconds = 1e-9;
  const RunRecord c = run_fuzz(reg, cut);
  ASSERT_EQ(c.not_run.size(), 2u);
  EXPECT_EQ(c.not_run[0].target, "cpu.fp32_seq fp16 gemm");
  EXPECT_EQ(c.not_run[0].planned, 5);
  EXPECT_EQ(c.not_run[1].run, 0);
  EXPECT_NE(c.not_run[1].reason.find("time budget"), std::string::npos);
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

namespace {

CaseResult gate_case(const std::string& id, const std::string& target, double max_ulp, bool passed = true) {
  CaseResult c;
  c.kernel = "k";
  c.id = id;
  c.target = target;
  c.family = "gemm fp32";
  ErrorMetrics m;
  m.output = "D";
  m.format = Format::FP32;
  m.max_ulp = max_ulp;
  m.max_normalised = max_ulp * 0x1p-23;
  c.metrics.push_back(m);
  if (!passed) c.verdict.fail("D:tolerance@interior", "planted");
  c.signature = failure_signature(c.verdict);
  return c;
}

RunRecord gate_run() {
  RunRecord r;
  r.kind = "fuzz";
  r.campaign.kind = "fuzz";
  r.campaign.seed = 1;
  r.campaign.cases = 2;
  r.campaign.targets = {"k fp32 gemm", "k fp16 gemm"};
  r.cases = {gate_case("a1", "k fp32 gemm", 0.0), gate_case("a2", "k fp32 gemm", 4.0), gate_case("b1", "k fp16 gemm", 2.0),
             gate_case("b2", "k fp16 gemm", 2.0)};
  return r;
}

}  // namespace

TEST(Gate, MatchesByIdWithRelativeSlackAndAnAbsoluteUlpFloor) {
  const RunRecord base = gate_run();
  const Baseline b = baseline_from_record(base, 0.25, 1.0);
  ASSERT_EQ(b.cases.size(), 4u);
  EXPECT_EQ(baseline_from_json(to_json(b)), b);
  GateResult same = gate(b, base);
  EXPECT_FALSE(same.failed);
  EXPECT_EQ(same.matched, 4);

  RunRecord moved = base;
  moved.cases[0].metrics[0].max_ulp = 0.9;  // from 0: within the 1-ULP floor
  moved.cases[1].metrics[0].max_ulp = 5.0;  // from 4: within 25 %
  EXPECT_FALSE(gate(b, moved).failed) << render_gate_table(gate(b, moved));
  moved.cases[0].metrics[0].max_ulp = 1.5;  // beyond the floor
  GateResult g = gate(b, moved);
  EXPECT_TRUE(g.failed);
  EXPECT_EQ(g.regressed, 1);
  moved.cases[0].metrics[0].max_ulp = 0;
  moved.cases[1].metrics[0].max_normalised = 5.1 * 0x1p-23;  // normalised: 4 + max(1, 1) ULP relative
  EXPECT_TRUE(gate(b, moved).failed);
  RunRecord better = base;
  better.cases[1].metrics[0].max_ulp = 1.0, better.cases[1].metrics[0].max_normalised = 0x1p-23;
  g = gate(b, better);
  EXPECT_FALSE(g.failed);
  EXPECT_EQ(g.improved, 1);
  EXPECT_NE(render_gate_junit(gate(b, moved)).find("<failure"), std::string::npos);
}

TEST(Gate, FailsOnFailingMissingAndNotRunCases) {
  const RunRecord base = gate_run();
  const Baseline b = baseline_from_record(base);
  // A failing case fails the gate even when the baseline has never seen it.
  RunRecord failing = base;
  failing.cases.push_back(gate_case("c1", "k fp32 gemm", 0.0, false));
  GateResult g = gate(b, failing);
  EXPECT_TRUE(g.failed);
  EXPECT_EQ(g.failing, 1);
  EXPECT_EQ(g.new_cases, 1);
  // A run with no cases compares nothing: every baseline case is missing, and that fails.
  RunRecord empty = base;
  empty.cases.clear();
  g = gate(b, empty);
  EXPECT_TRUE(g.failed);
  EXPECT_EQ(g.missing, 4);
  EXPECT_FALSE(gate(b, empty, {.allow_missing = true}).failed);
  // Cut short by the budget: the fp16 target's cases are "not run", with the reason.
  RunRecord cut = base;
  cut.cases.resize(2);
  cut.not_run = {{"k fp16 gemm", 2, 0, "time budget (--time 1) spent"}};
  g = gate(b, cut);
  EXPECT_TRUE(g.failed);
  EXPECT_EQ(g.not_run, 2);
  EXPECT_EQ(g.missing, 0);
  EXPECT_NE(render_gate_table(g).find("time budget"), std::string::npos);
  // A baseline is made only from a complete, passing run.
  EXPECT_THROW(baseline_from_record(failing), InputError);
  EXPECT_THROW(baseline_from_record(cut), InputError);
}

TEST(Gate, RefusesAnotherCampaignNamingTheDifference) {
  const RunRecord base = gate_run();
  const Baseline b = baseline_from_record(base);
  RunRecord other = base;
  other.campaign.seed = 2;
  other.campaign.targets.pop_back();
  try {
    gate(b, other);
    FAIL() << "accepted another campaign";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("seed: 1 in the baseline, 2 in the run"), std::string::npos) << what;
    EXPECT_NE(what.find("k fp16 gemm only in the baseline"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
  const GateResult g = gate(b, other, {.allow_different_campaign = true});
  EXPECT_EQ(g.campaign_differences.size(), 2u);
  RunRecord replay = base;
  replay.campaign = {};
  EXPECT_THROW(gate(b, replay), InputError);
}

// A rebuilt plugin (another hash under the same file name) is what the gate exists for: its
// run is judged against the baseline of the previous build, case by case. Other kernel
// names or another plugin file are still another campaign.
TEST(Gate, JudgesARebuiltPluginOfTheSameKernels) {
  RunRecord base = gate_run();
  base.campaign.plugins = {{"libk.so", "fnv1a64:0000000000000001"}};
  const Baseline b = baseline_from_record(base);
  RunRecord rebuilt = base;
  rebuilt.campaign.plugins[0].hash = "fnv1a64:0000000000000002";
  const GateResult same = gate(b, rebuilt);
  EXPECT_FALSE(same.failed) << render_gate_table(same);
  EXPECT_EQ(same.matched, 4);
  EXPECT_TRUE(same.campaign_differences.empty());
  EXPECT_NE(render_gate_table(same).find("plugin rebuilt: libk.so (fnv1a64:0000000000000001 in the baseline, "
                                         "fnv1a64:0000000000000002 in the run)"),
            std::string::npos)
      << render_gate_table(same);
  rebuilt.cases[0].metrics[0].max_ulp = 1.5;  // beyond the 1-ULP floor
  const GateResult worse = gate(b, rebuilt);
  EXPECT_TRUE(worse.failed);
  EXPECT_EQ(worse.regressed, 1);
  RunRecord renamed = rebuilt;
  renamed.campaign.targets[1] = "k2 fp16 gemm";
  EXPECT_THROW(gate(b, renamed), InputError);
  RunRecord other_file = base;
  other_file.campaign.plugins[0].name = "libother.so";
  EXPECT_THROW(gate(b, other_file), InputError);
  RunRecord other_seed = rebuilt;
  other_seed.campaign.seed = 2;
  EXPECT_THROW(gate(b, other_seed), InputError);
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
  EXPECT_EQ(msg({{"ulpgate_baseline", 9}}),
            "baseline.ulpgate_baseline: unsupported version 9 (this build reads 2; regenerate it with 'ulpgate baseline update')");
  nlohmann::json j = to_json(baseline_from_record(gate_run()));
  j["cases"][0]["outputs"][0]["max_ulp"] = "x";
  EXPECT_EQ(msg(j), "baseline.cases[0].outputs[0].max_ulp: must be a number");
  j = to_json(baseline_from_record(gate_run()));
  j["campaign"].erase("seed");
  EXPECT_EQ(msg(j), "baseline.campaign.seed: missing");
  EXPECT_THROW(read_baseline_file("/nonexistent/baseline.json"), InputError);
}

// A target's cases depend only on (seed, kernel, dtype, op), not on which other targets
// the campaign runs (adding a kernel must not change every later target's cases).
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

// A kernel that takes only the head sizes flash kernels take (64 and 128) is a target of
// the default campaign, and its generated cases keep to those sizes. (With the attention
// op's basic case at head_dim 16, cuda.attn_flash and cudnn.sdpa were left out unsaid.)
TEST(Fuzz, AttentionKernelOfHeadDim64And128IsADefaultTarget) {
  class Head64Or128 final : public Kernel {
   public:
    std::string name() const override { return "test.attn_hd64_128"; }
    std::string description() const override { return "online-softmax model, head_dim 64 or 128 only"; }
    KernelTraits traits() const override { return inner_->traits(); }
    std::optional<std::string> unsupported(const Case& c) const override {
      if (c.op == Op::Attention && c.attention.head_dim != 64 && c.attention.head_dim != 128)
        return std::string("head_dim 64 or 128 only");
      if (c.op == Op::Attention && c.attention.eff_head_dim_v() != c.attention.head_dim) return std::string("head_dim_v");
      return inner_->unsupported(c);
    }
    void run(const Case& c, const KernelIo& io, RunNotes& notes) override { inner_->run(c, io, notes); }

   private:
    std::unique_ptr<Kernel> inner_ = make_emulated_attention(*AttentionModel::parse("cpu.attn_online:block=64"));
  };
  Registry reg;
  reg.add(std::make_unique<Head64Or128>());
  const std::vector<FuzzTarget> targets = all_targets(reg, {});
  ASSERT_FALSE(targets.empty());
  for (const FuzzTarget& t : targets) EXPECT_EQ(t.op, Op::Attention) << target_name(t);
  FuzzOptions o = options("test.attn_hd64_128", "fp16", "");
  o.targets = targets;
  o.cases = 10;
  o.sizes = SizeSchedule::Realistic;  // cases 4 and 9 from the large regime
  const RunRecord r = run_fuzz(reg, o);
  ASSERT_FALSE(r.cases.empty());
  for (const auto& c : r.cases) {
    EXPECT_TRUE(c.spec.attention.head_dim == 64 || c.spec.attention.head_dim == 128) << c.spec.attention.head_dim;
    EXPECT_EQ(c.status, Disposition::Ok) << c.message;
    EXPECT_TRUE(c.verdict.passed) << c.spec.attention.seq_kv;
  }
}

// --shard i/N runs every N-th target; merge_shards joins the shards' records into the
// whole campaign's: the same cases (failures, shrunk reproducers and corpus replays
// included) in the same order, and merge refuses shards of another campaign, a shard
// missing or given twice.
TEST(Fuzz, ShardsMergeIntoTheWholeCampaign) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "ulpgate_test_shards";
  fs::remove_all(dir);
  Registry reg = builtin_registry();
  reg.add(std::make_unique<DropsOddTail>());
  FuzzOptions o = options("planted.odd_tail", "fp32", (dir / "corpus").string());
  o.targets = {{"cpu.fp32_seq", "fp32"}, {"planted.odd_tail", "fp16"}, {"cpu.fp32_pairwise", "fp16"},
               {"planted.odd_tail", "bf16"}, {"cpu.attn_naive", "fp16", Op::Attention}};
  const RunRecord whole = run_fuzz(reg, o);  // fills the corpus: the shards replay it too
  const RunRecord whole_again = run_fuzz(reg, o);
  ASSERT_GT(std::count_if(whole_again.cases.begin(), whole_again.cases.end(), [](const CaseResult& c) { return c.origin == "corpus"; }), 0);
  ASSERT_GT(std::count_if(whole_again.cases.begin(), whole_again.cases.end(), [](const CaseResult& c) { return !c.verdict.passed; }), 0);
  std::vector<std::pair<std::string, RunRecord>> shards;
  for (int i = 2; i >= 0; --i) {  // any order
    FuzzOptions s = o;
    s.shard_index = i, s.shard_count = 3;
    shards.emplace_back(fmt::format("shard{}.json", i), run_fuzz(reg, s));
    EXPECT_EQ(shards.back().second.shard_index, i);
  }
  const RunRecord merged = merge_shards(shards);
  const auto comparable = [](const RunRecord& r) {
    nlohmann::json cases = nlohmann::json::array();
    for (const auto& c : r.cases) {
      nlohmann::json j = case_result_to_json(c);
      j.erase("seconds");
      cases.push_back(j);
    }
    return cases;
  };
  EXPECT_EQ(merged.campaign, whole_again.campaign);
  EXPECT_EQ(merged.shard_count, 1);
  EXPECT_EQ(comparable(merged), comparable(whole_again));
  // refusals
  auto missing = shards;
  missing.pop_back();
  EXPECT_THROW(merge_shards(missing), InputError);
  auto twice = shards;
  twice.back() = twice.front();
  EXPECT_THROW(merge_shards(twice), InputError);
  auto other = shards;
  FuzzOptions s = o;
  s.seed = 8, s.shard_index = 0, s.shard_count = 3;
  other.back().second = run_fuzz(reg, s);
  try {
    merge_shards(other);
    ADD_FAILURE() << "merged shards of two campaigns";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("another campaign"), std::string::npos) << e.what();
  }
  FuzzOptions bad = o;
  bad.shard_index = 3, bad.shard_count = 3;
  EXPECT_THROW(run_fuzz(reg, bad), InputError);
  fs::remove_all(dir);
}
