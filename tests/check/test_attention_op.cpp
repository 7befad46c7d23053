// The attention op end to end: the CPU models against exact corner cases, the fuzz
// campaign over them (no false alarm; the planted no-rescale bug found), and each relation
// against a kernel built to break it while passing the tolerance.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "distributions/fill.hpp"
#include "distributions/spec.hpp"
#include "check/check.hpp"
#include "campaign/fuzz.hpp"
#include "check/ops/attention.hpp"
#include "kernels/emulated/attention_models.hpp"
#include "kernels/builtin.hpp"

using namespace ulpgate;

namespace {

Case small_case(Format f, std::int64_t seq_kv, std::int64_t hd = 4) {
  Case c = dtype_attention_case(f == Format::FP32 ? "fp32" : f == Format::FP16 ? "fp16" : "bf16");
  c.attention.seq_kv = seq_kv, c.attention.head_dim = hd;
  c.kernel = "test";
  return c;
}

std::vector<std::unique_ptr<Kernel>> models() {
  std::vector<std::unique_ptr<Kernel>> out;
  for (const auto& m : default_attention_models()) out.push_back(make_emulated_attention(m));
  return out;
}

// A kernel built from a model with one change to its outputs or inputs (writing the LSE
// output where asked unless `lse` is false).
class Wrapped : public Kernel {
 public:
  Wrapped(std::string name, std::function<void(const Case&, const KernelIo&, Kernel&, RunNotes&)> run, bool lse = true)
      : name_(std::move(name)), run_(std::move(run)), lse_(lse) {}
  std::string name() const override { return name_; }
  std::string description() const override { return name_; }
  KernelTraits traits() const override {
    KernelTraits t;
    t.writes_lse = lse_;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_->unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override { run_(c, io, *inner_, notes); }

 private:
  std::string name_;
  std::function<void(const Case&, const KernelIo&, Kernel&, RunNotes&)> run_;
  bool lse_;
  std::unique_ptr<Kernel> inner_ = make_emulated_attention(AttentionModel{});
};

Evaluation check(Kernel& k, Case c) {
  c.kernel = k.name();
  return evaluate(k, c, EvaluationOptions{});
}

std::string relation_of(const Evaluation& ev) { return ev.relations.empty() ? "" : ev.relations.front().relation; }

}  // namespace

// One visible key: O is that key's V row exactly, so every model returns its correct
// rounding bit for bit (any format), whatever the other keys hold.
TEST(AttentionOp, OneVisibleKeyGivesItsValueRow) {
  for (Format f : {Format::FP32, Format::FP16, Format::BF16}) {
    Case c = small_case(f, 9);
    c.attention.causal = true, c.attention.seq_q = 1;  // bottom-right: query 0 sees keys 0..8
    c.attention.kv_lengths = {1};                       // ... and only key 0 is valid
    c.dist = {{"Q", "normal(0,3)"}, {"K", "normal(0,3)"}, {"V", "normal(0,1)"}};
    for (auto& k : models()) {
      const Evaluation ev = check(*k, c);
      ASSERT_EQ(ev.metrics.size(), 1u) << k->name();
      EXPECT_EQ(ev.metrics[0].exact_matches, ev.metrics[0].elements) << k->name() << " " << name(f);
      EXPECT_TRUE(ev.verdict.passed) << k->name() << ": " << ev.verdict.reasons.front();
    }
  }
}

// Fully masked rows follow the documented convention (O = 0); a kernel that writes NaN
// there fails.
TEST(AttentionOp, FullyMaskedRowsAreZero) {
  Case c = small_case(Format::FP32, 8);
  c.attention.batch = 2, c.attention.kv_lengths = {8, 0};
  c.dist = {{"Q", "normal(0,1)"}, {"V", "normal(0,1)"}, {"K", "normal(0,1)"}};
  for (auto& k : models()) EXPECT_TRUE(check(*k, c).verdict.passed) << k->name();
  Wrapped nan_rows("nan_for_masked", [](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) {
    inner.run(cc, io, n);
    const AttentionView ov = attention_view(cc, "O");
    for (std::int64_t i = 0; i < cc.attention.seq_q; ++i)
      for (std::int64_t d = 0; d < ov.dim; ++d) store_code(Format::FP32, io.out.at("O"), ov.offset(1, 0, i, d), 0x7fc00000);
  });
  const Evaluation ev = check(nan_rows, c);
  EXPECT_FALSE(ev.verdict.passed);
}

// The default models over generated attention cases of every kind: no false alarm. The
// planted no-rescale model is found.
TEST(AttentionOp, FuzzModelsPassAndPlantedBugIsFound) {
  Registry reg = builtin_registry();
  FuzzOptions o;
  o.cases = 8, o.seed = 11, o.max_k = 300;
  for (const auto& m : default_attention_models()) o.targets.push_back({m.name(), "bf16", Op::Attention});
  o.targets.push_back({"cpu.attn_naive", "fp32", Op::Attention});
  const RunRecord r = run_fuzz(reg, o);
  ASSERT_EQ(r.cases.size(), 40u);
  for (const auto& c : r.cases) EXPECT_TRUE(c.verdict.passed) << c.kernel << " " << c.family << ": " << c.verdict.reasons.front();

  ASSERT_NE(reg.resolve("cpu.attn_online:block=16,rescale=off"), nullptr);
  FuzzOptions bug = o;
  bug.targets = {{"cpu.attn_online:block=16,rescale=off", "fp32", Op::Attention}};
  bug.corpus_dir = testing::TempDir() + "attention_corpus_" + std::to_string(::getpid());
  std::filesystem::remove_all(bug.corpus_dir);
  const RunRecord b = run_fuzz(reg, bug);
  EXPECT_TRUE(std::any_of(b.cases.begin(), b.cases.end(), [](const CaseResult& c) { return !c.verdict.passed; }));
  // Every saved failure, relation failures included, fails again on replay.
  int replayed = 0, by_relation = 0;
  for (const auto& f : std::filesystem::directory_iterator(bug.corpus_dir)) {
    const CaseResult r = replay_case(reg, read_case_file(f.path().string()), EvaluationOptions{});
    EXPECT_FALSE(r.verdict.passed) << f.path();
    ++replayed, by_relation += r.notes.count("relation") > 0;
  }
  EXPECT_GE(replayed, 1);
  std::printf("[ corpus ] %d replayed, %d by a relation\n", replayed, by_relation);
  // A failure found by a relation only (the no-rescale bug hidden in the original key order,
  // exposed by the permutation; saved by a campaign): replay runs the relation and fails.
  const CaseResult rel = replay_case(
      reg, read_case_file(std::string(ULPGATE_SOURCE_DIR) + "/tests/data/attention_relation_failure.json"), EvaluationOptions{});
  EXPECT_FALSE(rel.verdict.passed);
  EXPECT_EQ(rel.notes.count("relation") ? rel.notes.at("relation") : "", "key_permutation");
}

// V scaling: an absolute offset of 2^-20 in O (values in [1, 2]: a few ulps) is inside the
// tolerance, but O(2V) is then 2 O(V) - 2^-20, not 2 O(V).
TEST(AttentionOp, VScalingCatchesAnAbsoluteOffset) {
  Case c = small_case(Format::FP32, 16);
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "uniform(1,2)"}};
  auto naive = make_emulated_attention(AttentionModel{});
  EXPECT_TRUE(check(*naive, c).verdict.passed);
  Wrapped offset("offset", [](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) {
    inner.run(cc, io, n);
    float* o = static_cast<float*>(io.out.at("O"));
    for (std::int64_t e = 0; e < attention_view(cc, "O").elements(); ++e) o[e] += 0x1p-20f;
  });
  const Evaluation ev = check(offset, c);
  EXPECT_GT(ev.metrics[0].max_ulp, 1.0);  // a few ulps off, within the tolerance
  EXPECT_EQ(relation_of(ev), "v_scaling") << (ev.verdict.reasons.empty() ? "" : ev.verdict.reasons.front());
}

// Key shift: a kernel without the max subtraction is exact enough on small scores, but
// exp overflows FP32 once every score grows by about 100.
TEST(AttentionOp, KeyShiftCatchesAMissingMaxSubtraction) {
  class NoMax final : public Kernel {
   public:
    std::string name() const override { return "no_max"; }
    std::string description() const override { return "softmax without the max subtraction"; }
    KernelTraits traits() const override { return {}; }
    std::optional<std::string> unsupported(const Case&) const override { return std::nullopt; }
    void run(const Case& c, const KernelIo& io, RunNotes&) override {
      const AttentionShape& a = c.attention;
      const AttentionView qv = attention_view(c, "Q"), kv = attention_view(c, "K"), vv = attention_view(c, "V"),
                          ov = attention_view(c, "O");
      const auto at = [&](const char* op, const AttentionView& v, std::int64_t h, std::int64_t s, std::int64_t d) {
        return static_cast<const float*>(io.in.at(op))[v.offset(0, h, s, d)];
      };
      const float scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
      for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t i = 0; i < a.seq_q; ++i) {
          std::vector<float> p(a.seq_kv);
          float l = 0;
          for (std::int64_t j = 0; j < a.seq_kv; ++j) {
            float s = 0;
            for (std::int64_t d = 0; d < a.head_dim; ++d) s = std::fma(at("Q", qv, h, i, d), at("K", kv, h, j, d), s);
            l += (p[j] = std::exp(scale * s));
          }
          for (std::int64_t d = 0; d < a.eff_head_dim_v(); ++d) {
            float acc = 0;
            for (std::int64_t j = 0; j < a.seq_kv; ++j) acc = std::fma(p[j], at("V", vv, h, j, d), acc);
            static_cast<float*>(io.out.at("O"))[ov.offset(0, h, i, d)] = acc / l;
          }
        }
    }
  } no_max;
  Case c = small_case(Format::FP32, 12);
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  const Evaluation ev = check(no_max, c);
  ASSERT_EQ(ev.metrics.size(), 1u);
  EXPECT_EQ(relation_of(ev), "key_shift") << (ev.verdict.reasons.empty() ? "" : ev.verdict.reasons.front());
  auto naive = make_emulated_attention(AttentionModel{});
  EXPECT_TRUE(check(*naive, c).verdict.passed);  // with the max subtraction: fine
}

// Key permutation: with the largest scores first, the no-rescale bug never shows (the
// running max never grows); permuted, it does.
TEST(AttentionOp, KeyPermutationExposesAnOrderDependentBug) {
  Case c = small_case(Format::FP32, 48, 2);
  c.attention.seq_q = 1, c.attention.softmax_scale = 1.0;
  c.dist.clear();
  Inputs in;
  in.emplace("Q", Tensor(Format::FP32, 2));
  in.emplace("K", Tensor(Format::FP32, 96));
  in.emplace("V", Tensor(Format::FP32, 96));
  in.at("Q").set_value(0, 1.0), in.at("Q").set_value(1, 0.0);
  for (std::int64_t j = 0; j < 48; ++j) {
    in.at("K").set_value(2 * j, 4.0 - j / 8.0), in.at("K").set_value(2 * j + 1, 1.0);  // descending scores
    in.at("V").set_value(2 * j, 1.0 + j), in.at("V").set_value(2 * j + 1, -0.5 * j);
  }
  auto buggy = make_emulated_attention(*AttentionModel::parse("cpu.attn_online:block=16,rescale=off"));
  c.kernel = buggy->name();
  const Evaluation ev = evaluate_with_inputs(*buggy, c, in, EvaluationOptions{});
  EXPECT_EQ(relation_of(ev), "key_permutation") << (ev.verdict.reasons.empty() ? "" : ev.verdict.reasons.front());
  auto online = make_emulated_attention(*AttentionModel::parse("cpu.attn_online:block=16"));
  EXPECT_TRUE(evaluate_with_inputs(*online, c, in, EvaluationOptions{}).verdict.passed);
}

// Batch independence: a kernel that takes another path for a single batch (and gets it
// wrong there) passes the batched case; run alone, the last batch fails.
TEST(AttentionOp, BatchIndependenceCatchesASingleBatchPath) {
  Case c = small_case(Format::FP32, 10);
  c.attention.batch = 3;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  Wrapped single("single_batch_path", [](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) {
    inner.run(cc, io, n);
    if (cc.attention.batch == 1) static_cast<float*>(io.out.at("O"))[0] *= 1.001f;
  });
  const Evaluation ev = check(single, c);
  EXPECT_EQ(relation_of(ev), "batch_independence") << (ev.verdict.reasons.empty() ? "" : ev.verdict.reasons.front());
}

// NaN or Inf inputs: the rows they reach are not judged (softmax has no exact value
// there), the others are.
TEST(AttentionOp, NonFiniteInputsMarkTheirRows) {
  Case c = small_case(Format::FP16, 8);
  c.attention.seq_q = 3;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  Inputs in = fill_inputs(c);
  in.at("Q").set_value(attention_view(c, "Q").offset(0, 0, 1, 0), INFINITY);  // query 1 only
  auto naive = make_emulated_attention(AttentionModel{});
  const Evaluation ev = evaluate_with_inputs(*naive, c, in, EvaluationOptions{});
  EXPECT_TRUE(ev.verdict.passed) << ev.verdict.reasons.front();
  EXPECT_EQ(ev.metrics[0].overflowed + ev.metrics[0].expected_nonfinite + ev.metrics[0].compared, ev.metrics[0].elements);
  EXPECT_GE(ev.metrics[0].compared, 8);  // rows 0 and 2, head_dim 4 each
}

// A false alarm once found by the fuzz (seed 4): V of both signs in a column, a partial sum
// cancelling into FP32's subnormals, so that doubling V did not double one O element
// exactly in a correct online-softmax kernel. The relation now skips such columns.
// Grouped-query and multi-query cases (heads 4, kv_heads 2 and 1): every CPU model gives
// the bits it gives for the multi-head case whose K/V head h is the GQA case's kv_head(h),
// and passes the check with every relation (the key shift moves each K head by its group's
// queries, the batch slice takes kv_heads heads of K and V).
TEST(AttentionOp, GroupedQueryModelsEqualRepeatedHeadsAndPass) {
  for (const auto& m : models())
    for (const std::int64_t kv_heads : {2, 1})
      for (const AttentionLayout layout : {AttentionLayout::BHSD, AttentionLayout::BSHD}) {
        Case c = small_case(Format::FP16, 70, 8);
        AttentionShape& a = c.attention;
        a.batch = 2, a.heads = 4, a.kv_heads = kv_heads, a.seq_q = 5, a.head_dim_v = 6, a.layout = layout;
        a.kv_lengths = {70, 33};
        c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
        c.seed = static_cast<std::uint64_t>(kv_heads);
        c.kernel = m->name();
        const std::string what = m->name() + " kv_heads " + std::to_string(kv_heads) + " " + std::string(name(layout));
        const Evaluation ev = check(*m, c);
        EXPECT_TRUE(ev.verdict.passed) << what << ": " << ev.verdict.reasons.front();
        EXPECT_EQ(relation_of(ev), "") << what;
        const Inputs in = fill_inputs(c);
        Case mha = c;
        mha.attention.kv_heads = 0;
        Inputs repeated = in;
        for (const char* op : {"K", "V"}) {
          const AttentionView gv = attention_view(c, op), mv = attention_view(mha, op);
          repeated.at(op) = Tensor(in.at(op).format(), static_cast<std::size_t>(mv.elements()));
          for (std::int64_t b = 0; b < a.batch; ++b)
            for (std::int64_t h = 0; h < a.heads; ++h)
              for (std::int64_t s = 0; s < a.seq_kv; ++s)
                for (std::int64_t d = 0; d < gv.dim; ++d)
                  repeated.at(op).set_code(mv.offset(b, h, s, d), in.at(op).code(gv.offset(b, h / (4 / kv_heads), s, d)));
        }
        const RunOutcome g = run_kernel(*m, c, in), r = run_kernel(*m, mha, repeated);
        ASSERT_EQ(g.status, Disposition::Ok) << g.message;
        ASSERT_EQ(g.outputs.at("O").size_bytes(), r.outputs.at("O").size_bytes());
        EXPECT_EQ(std::memcmp(g.outputs.at("O").data(), r.outputs.at("O").data(), g.outputs.at("O").size_bytes()), 0)
            << what;
      }
}

TEST(AttentionOp, VScalingNoFalseAlarmOnCancellingColumns) {
  Case c = read_case_file(std::string(ULPGATE_SOURCE_DIR) + "/tests/data/attention_v_scaling_cancellation.json");
  auto online = make_emulated_attention(*AttentionModel::parse(c.kernel));
  const Evaluation ev = evaluate(*online, c, EvaluationOptions{});
  EXPECT_TRUE(ev.verdict.passed) << ev.verdict.reasons.front();
}

// Drawn cases where one key outscores the others by billions (lognormal(0,3) BF16 Q and K):
// the other keys' weights are below MPFR's exponent range, and the reference must still decide
// O and the LSE next to the dominant key's values.
TEST(AttentionOp, DominantKeyBeyondMpfrRangeIsReferenced) {
  for (const char* file : {"attention_dominant_key_beyond_mpfr_range.json", "attention_dominant_key_beyond_mpfr_range_gqa.json"}) {
    Case c = read_case_file(std::string(ULPGATE_SOURCE_DIR) + "/tests/data/" + file);
    auto naive = make_emulated_attention(*AttentionModel::parse(c.kernel));
    const Evaluation ev = evaluate(*naive, c, EvaluationOptions{});
    EXPECT_TRUE(ev.verdict.passed) << file << ": " << (ev.verdict.reasons.empty() ? "" : ev.verdict.reasons.front());
  }
}

namespace {

// A correct attention kernel that is not bitwise repeatable and says so (a split-KV kernel
// whose split depends on the run): each run takes the online-softmax model with a block
// size drawn at random.
class RandomSplit final : public Kernel {
 public:
  RandomSplit() {
    for (int block : {4, 8, 16, 32, 64})
      models_.push_back(make_emulated_attention(*AttentionModel::parse("cpu.attn_online:block=" + std::to_string(block))));
  }
  std::string name() const override { return "test.random_split"; }
  std::string description() const override { return "online softmax, block size drawn per run"; }
  KernelTraits traits() const override {
    KernelTraits t;
    t.deterministic = false;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override { return models_[0]->unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& n) override {
    models_[rng_() % models_.size()]->run(c, io, n);
  }

 private:
  std::vector<std::unique_ptr<Kernel>> models_;
  std::mt19937 rng_{7};
};

}  // namespace

// V scaling compares O(2V) with 2 O(V) bit for bit, which a kernel that is not bitwise
// repeatable cannot promise: there O(2V) is judged against its own exact reference. The
// random-split kernel passes every relation (and two of its runs do give other bits, or the
// test would show nothing).
TEST(AttentionOp, NonDeterministicKernelPassesTheRelations) {
  RandomSplit k;
  int differ = 0;
  for (Format f : {Format::FP32, Format::FP16, Format::BF16})
    for (std::int64_t kv : {40, 100, 200}) {
      Case c = small_case(f, kv, 8);
      c.attention.seq_q = 3;
      c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "uniform(1,2)"}};
      c.seed = static_cast<std::uint64_t>(kv);
      const Evaluation ev = check(k, c);
      EXPECT_TRUE(ev.verdict.passed) << name(f) << " seq_kv " << kv << ": " << ev.verdict.reasons.front();
      c.kernel = k.name();
      const Inputs in = fill_inputs(c);
      const RunOutcome r1 = run_kernel(k, c, in), r2 = run_kernel(k, c, in);
      differ += std::memcmp(r1.outputs.at("O").data(), r2.outputs.at("O").data(), r1.outputs.at("O").size_bytes()) != 0;
    }
  EXPECT_GT(differ, 0) << "the kernel never gave other bits: the test shows nothing";
}

namespace {

// A plain FP32 attention kernel with one planted bug of a class real kernels have.
// The window bugs: the left bound counted with the diagonal key in it (one key too few, as
// xformers against Hugging Face), a window declared but not applied, a window measured from the
// top-left diagonal. The served variants' bugs: the soft cap applied after masking (masked
// keys get logit -cap), accepted but not applied, written as x tanh(x / cap); ALiBi in the
// other form, with slopes 2^(-8(h+1)/heads) of its own (wrong where heads is not a power of
// two), or not applied; the sink left out of the running max, or not applied.
enum class Bug {
  None, TopLeftCausal, IgnoresKvLengths, ScaleOverD, MaskedRowNaN, LastBlockDropped, LseWithoutMax, LseInLog2,
  WindowLeftInclusive, WindowIgnored, WindowTopLeft,
  SoftcapAfterMask, SoftcapIgnored, SoftcapXTanh, AlibiOtherForm, AlibiOwnSlopes, AlibiIgnored, SinkNotInMax, SinkIgnored,
  MaxFromSentinel,  // the running max starts at -5e4 instead of -inf
  SinkNoneAsZero,   // a sink of -inf taken as 0
  // Paged K/V: the table ignored (entry e read as page e), one page read past keys that end
  // on a page boundary, slots taken modulo 128 (pages above 128 keys), whole pages read (the
  // last page's slots past seq_kv as keys), keys summed in another order when paged.
  PagedIgnoresTable, PagedOnePagePast, PagedSlotMod128, PagedWholeLastPage, PagedOtherOrder,
  // An FP8 K/V cache: scales ignored (left at 1), divided instead of multiplied, V's ignored,
  // K and V dequantized to BF16 whatever Q's format; KvDequantToQ dequantizes to Q's own
  // format, as vLLM does (admitted: no bug).
  KvScalesIgnored, KvScaleInverted, VScaleIgnored, KvDequantBf16, KvDequantToQ,
  // Per-head K/V scales: head 0's applied to every head, all of them ignored (left at 1).
  KvHeadScaleFirst, KvHeadScalesIgnored
};

class BuggyAttention final : public Kernel {
 public:
  explicit BuggyAttention(Bug bug) : bug_(bug) {}
  std::string name() const override { return "planted.attention." + std::to_string(static_cast<int>(bug_)); }
  std::string description() const override { return name(); }
  KernelTraits traits() const override {
    KernelTraits t;
    t.writes_lse = true;
    if (bug_ == Bug::MaxFromSentinel) return t;  // a plain kernel: its far-negative cases keep every score
    if (bug_ == Bug::None || bug_ >= Bug::SoftcapAfterMask) t.attention_variants = kAllAttentionVariants;
    else if (bug_ >= Bug::WindowLeftInclusive) t.attention_variants = kAttnWindow;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Attention) return "attention only";
    for (const char* op : {"Q", "O"})
      if (c.types.at(op) == Format::FP64 || is_fp8(c.types.at(op))) return "Q and O in FP32, FP16 or BF16";
    for (const char* op : {"K", "V"})
      if (c.types.at(op) == Format::FP64) return "K and V in FP32, FP16, BF16 or FP8";
    if (c.types.at("compute") != Format::FP32) return "FP32 compute only";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const AttentionShape& a = c.attention;
    const AttentionView qv = attention_view(c, "Q"), kv = attention_view(c, "K"), vv = attention_view(c, "V"),
                        ov = attention_view(c, "O");
    // Every operand dequantized to FP32 values (K and V with their scales, and the bugs).
    const Format fq = c.types.at("Q"), fo = c.types.at("O");
    const auto dequantized = [&](const char* op, const AttentionView& view) {
      const Format f = c.types.at(op);
      const auto scale_of = [&](std::int64_t hk) {
        double s = input_scale(c, op, bug_ == Bug::KvHeadScaleFirst ? 0 : hk);
        if (bug_ == Bug::KvScalesIgnored || (bug_ == Bug::VScaleIgnored && op[0] == 'V') ||
            (bug_ == Bug::KvHeadScalesIgnored && c.head_scales.count(op)))
          s = 1.0;
        if (bug_ == Bug::KvScaleInverted) s = 1.0 / s;
        return s;
      };
      const auto value = [&](std::int64_t e, double s) {
        const Format to = bug_ == Bug::KvDequantBf16 && s != 1.0 ? Format::BF16
                          : bug_ == Bug::KvDequantToQ && s != 1.0 ? fq : Format::FP32;
        return static_cast<float>(round_to(to, s * decode(f, load_code(f, io.in.at(op), e))));
      };
      // Every element with head 0's scale (pool slots no key owns included), then each key's
      // with its own head's.
      std::vector<float> out(static_cast<std::size_t>(view.elements()));
      for (std::size_t e = 0; e < out.size(); ++e) out[e] = value(static_cast<std::int64_t>(e), scale_of(0));
      if (c.head_scales.count(op))
        for (std::int64_t b = 0; b < a.batch; ++b)
          for (std::int64_t hk = 0; hk < a.eff_kv_heads(); ++hk)
            for (std::int64_t j = 0; j < a.seq_kv; ++j)
              for (std::int64_t d = 0; d < view.dim; ++d) {
                const std::int64_t e = view.offset(b, hk, j, d);
                out[static_cast<std::size_t>(e)] = value(e, scale_of(hk));
              }
      return out;
    };
    std::vector<float> q_values(static_cast<std::size_t>(qv.elements()));
    for (std::size_t e = 0; e < q_values.size(); ++e)
      q_values[e] = static_cast<float>(decode(fq, load_code(fq, io.in.at("Q"), static_cast<std::int64_t>(e))));
    const std::vector<float> k_values = dequantized("K", kv), v_values = dequantized("V", vv);
    const float* qp = q_values.data();
    const float* kp = k_values.data();
    const float* vp = v_values.data();
    std::vector<float> o_values(static_cast<std::size_t>(ov.elements()));
    // Where key j of batch b is for K (view kv) or V (view vv), with the paged bugs.
    const auto at = [&](const AttentionView& view, std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t e) {
      if (!a.paged() || bug_ < Bug::PagedIgnoresTable || bug_ == Bug::PagedOtherOrder) return view.offset(b, hk, j, e);
      const std::int64_t p = a.page_size, per = a.pages_per_seq();
      const std::int64_t entry = std::min<std::int64_t>(b * per + j / p, static_cast<std::int64_t>(a.page_table.size()) - 1);
      const std::int64_t page = bug_ == Bug::PagedIgnoresTable ? entry % a.num_pages : a.page_table[static_cast<std::size_t>(entry)];
      const std::int64_t slot = bug_ == Bug::PagedSlotMod128 ? j % std::min<std::int64_t>(p, 128) : j % p;
      return view.pool_offset(page, hk, slot, e);
    };
    float* op = o_values.data();
    float* lsep = io.out.count("LSE") ? static_cast<float*>(io.out.at("LSE")) : nullptr;
    AttentionShape form = a;
    if (bug_ == Bug::AlibiOtherForm) form.alibi_form = a.alibi_form == AlibiForm::Flash ? AlibiForm::FlashInfer : AlibiForm::Flash;
    const double d = static_cast<double>(a.head_dim);
    const float scale = static_cast<float>(a.softmax_scale.value_or(bug_ == Bug::ScaleOverD ? 1.0 / d : 1.0 / std::sqrt(d)));
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t i = 0; i < a.seq_q; ++i) {
          std::vector<std::int64_t> keys;
          const std::int64_t len = a.kv_lengths.empty() || bug_ == Bug::IgnoresKvLengths ? a.seq_kv : a.kv_lengths[b];
          std::int64_t end = bug_ == Bug::LastBlockDropped && len > 64 ? len / 64 * 64 : len;
          if (a.paged() && bug_ == Bug::PagedOnePagePast && len > 0 && len % a.page_size == 0) end = len + 1;
          if (a.paged() && bug_ == Bug::PagedWholeLastPage) end = (len + a.page_size - 1) / a.page_size * a.page_size;
          std::vector<char> masked;  // SoftcapAfterMask: keys the mask hides take part with logit -cap
          for (std::int64_t j = 0; j < end; ++j) {
            const bool causal_ok = !a.causal || (bug_ == Bug::TopLeftCausal ? j <= i : j - (a.seq_kv - a.seq_q) <= i);
            const std::int64_t diag = bug_ == Bug::WindowTopLeft ? i : i + a.seq_kv - a.seq_q;
            const std::int64_t low = diag - a.window_left + (bug_ == Bug::WindowLeftInclusive ? 1 : 0);
            const bool window_ok = bug_ == Bug::WindowIgnored ||
                                   ((a.window_left < 0 || j >= low) && (a.window_right < 0 || j <= diag + a.window_right));
            if ((causal_ok && window_ok) || (bug_ == Bug::SoftcapAfterMask && a.softcap != 0))
              keys.push_back(j), masked.push_back(!(causal_ok && window_ok));
          }
          std::vector<float> s(keys.size());
          float m = bug_ == Bug::MaxFromSentinel ? -5e4f : -INFINITY, l = 0;
          const float cap = static_cast<float>(a.softcap);
          float slope = a.alibi_slopes.empty() || bug_ == Bug::AlibiIgnored ? 0.0f : static_cast<float>(a.alibi_slopes[h]);
          if (bug_ == Bug::AlibiOwnSlopes && slope != 0.0f)
            slope = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(a.heads));
          for (std::size_t t = 0; t < keys.size(); ++t) {
            float dot = 0;
            for (std::int64_t e = 0; e < a.head_dim; ++e) dot = std::fma(qp[qv.offset(b, h, i, e)], kp[at(kv, b, a.kv_head(h), keys[t], e)], dot);
            float x = scale * dot;
            if (cap != 0 && bug_ != Bug::SoftcapIgnored)
              x = masked[t] ? -cap : bug_ == Bug::SoftcapXTanh ? x * std::tanh(x / cap) : cap * std::tanh(x / cap);
            if (slope != 0.0f) x += slope * static_cast<float>(alibi_distance(form, i, keys[t]));
            m = std::max(m, s[t] = x);
          }
          float sink = a.sinks.empty() || bug_ == Bug::SinkIgnored ? -INFINITY : static_cast<float>(a.sinks[h]);
          if (bug_ == Bug::SinkNoneAsZero && !a.sinks.empty() && sink == -INFINITY) sink = 0.0f;
          const float m_keys = m;
          if (bug_ != Bug::SinkNotInMax) m = std::max(m, sink);
          for (float& x : s) l += (x = std::exp(x - m));
          if (sink != -INFINITY) l += std::exp(sink - (bug_ == Bug::SinkNotInMax ? m_keys : m));
          for (std::int64_t e = 0; e < a.eff_head_dim_v(); ++e) {
            float acc = 0;
            for (std::size_t t = 0; t < keys.size(); ++t) {
              const std::size_t u = a.paged() && bug_ == Bug::PagedOtherOrder ? keys.size() - 1 - t : t;
              acc = std::fma(s[u], vp[at(vv, b, a.kv_head(h), keys[u], e)], acc);
            }
            float o = l > 0 ? acc / l : (bug_ == Bug::MaskedRowNaN ? NAN : 0.0f);
            op[ov.offset(b, h, i, e)] = o;
          }
          if (lsep) {  // the log-sum-exp, m + ln l (-inf without a key)
            const float lse = bug_ == Bug::LseWithoutMax ? std::log(l) : bug_ == Bug::LseInLog2 ? m + std::log2(l) : m + std::log(l);
            lsep[(b * a.heads + h) * a.seq_q + i] = l > 0 ? lse : -INFINITY;
          }
        }
    for (std::size_t e = 0; e < o_values.size(); ++e)
      store_code(fo, io.out.at("O"), static_cast<std::int64_t>(e), encode(fo, o_values[e]));
  }

 private:
  Bug bug_;
};

// The planted kernel's first failure on case c ("" when it passes); c.kernel names it.
std::string planted_signature(Bug bug, Case& c) {
  BuggyAttention k(bug);
  c.kernel = k.name();
  const Evaluation ev = check(k, c);
  return ev.verdict.passed ? std::string() : failure_signature(ev.verdict);
}

}  // namespace

// Runs a 'cases'-case campaign of each planted bug: every bug is found, None passes every case.
static void expect_fuzz_finds(std::initializer_list<Bug> bugs, std::int64_t cases, std::int64_t max_k) {
  for (Bug bug : bugs) {
    Registry reg;
    reg.add(std::make_unique<BuggyAttention>(bug));
    FuzzOptions o;
    o.cases = cases, o.seed = 3, o.max_k = max_k;
    o.targets = {{"planted.attention." + std::to_string(static_cast<int>(bug)), "fp32", Op::Attention}};
    const RunRecord r = run_fuzz(reg, o);
    const bool found = std::any_of(r.cases.begin(), r.cases.end(), [](const CaseResult& c) { return !c.verdict.passed; });
    if (bug == Bug::None) {
      for (const auto& c : r.cases) EXPECT_TRUE(c.verdict.passed) << c.family << ": " << c.verdict.reasons.front();
    } else {
      std::string drawn;  // the variants each case drew, for the message
      for (const auto& c : r.cases) drawn += "[" + attention_variant_names(attention_variants(c.spec)) + "]";
      EXPECT_TRUE(found) << "bug " << static_cast<int>(bug) << " not found in " << r.cases.size() << " cases " << drawn;
    }
  }
}

// Bug classes of real attention kernels, each planted in an otherwise correct FP32 kernel:
// the campaign finds every one, and passes the same kernel without a bug.
TEST(AttentionOp, FuzzFindsPlantedBugClasses) {
  expect_fuzz_finds({Bug::None, Bug::TopLeftCausal, Bug::IgnoresKvLengths, Bug::ScaleOverD, Bug::MaskedRowNaN,
                     Bug::LastBlockDropped, Bug::LseWithoutMax, Bug::LseInLog2, Bug::WindowLeftInclusive,
                     Bug::WindowIgnored, Bug::WindowTopLeft},
                    25, 300);
}

// The served variants' bug classes (soft cap after the mask or as x tanh(x / cap), ALiBi in
// the other form or with other slopes, a sink left out of the running max, each ignored, and
// a running max started from a sentinel of -5e4 that far-negative logits stay below),
// found by the default generator in a few cases each, and no alarm on the correct model
// with every variant declared.
TEST(AttentionOp, FuzzFindsServedVariantBugs) {
  expect_fuzz_finds({Bug::None, Bug::SoftcapAfterMask, Bug::SoftcapIgnored, Bug::SoftcapXTanh, Bug::AlibiOtherForm,
                     Bug::AlibiOwnSlopes, Bug::AlibiIgnored, Bug::SinkNotInMax, Bug::SinkIgnored},
                    20, 130);
  expect_fuzz_finds({Bug::MaxFromSentinel}, 60, 130);  // far-negative rows: one case in six
}

// Paged K/V's bug classes (docs/concepts/paged-kv.md): the page table ignored, one page read
// past keys ending on a page boundary, slots modulo 128, the last page read whole; each found
// by the default generator, and the correct kernel passes every paged case.
TEST(AttentionOp, FuzzFindsPagedKvBugs) {
  expect_fuzz_finds({Bug::None, Bug::PagedOnePagePast, Bug::PagedSlotMod128}, 60, 130);
  expect_fuzz_finds({Bug::PagedIgnoresTable, Bug::PagedWholeLastPage, Bug::PagedOtherOrder}, 20, 130);
}

// An FP8 K/V cache's bug classes (docs/concepts/fp8-kv.md): scales ignored, inverted, V's
// ignored, K and V dequantized to BF16 under FP32 queries; each found by the default
// generator, and the kernel dequantizing to FP32 passes every case.
TEST(AttentionOp, FuzzFindsKvScaleBugs) {
  expect_fuzz_finds({Bug::None, Bug::KvScalesIgnored, Bug::KvScaleInverted, Bug::VScaleIgnored, Bug::KvDequantBf16,
                     Bug::KvHeadScalesIgnored},
                    24, 130);
  expect_fuzz_finds({Bug::KvHeadScaleFirst}, 40, 130);  // needs a per-head case with two K/V heads or more
}

// The naive CPU model and the flash one (P rounded to p_format before P V) pass case c.
static void expect_cpu_models_pass(Case c, Format p_format) {
  for (auto model : {AttentionModel{}, AttentionModel{AttentionModel::Variant::Flash, 64, p_format}}) {
    auto k = make_emulated_attention(model);
    c.kernel = k->name();
    const Evaluation ev = check(*k, c);
    EXPECT_TRUE(ev.verdict.passed) << k->name() << ": " << failure_signature(ev.verdict);
  }
}

// BF16 queries over an E4M3 cache with scales far from 1: the CPU models (dequantizing to
// FP32) and a kernel dequantizing the cache to BF16 as vLLM does both pass; ignoring the
// scales, or V's alone, fails. The fill wrote scales on either side of 1.
TEST(AttentionOp, Fp8KvCacheWithScales) {
  Case c = small_case(Format::BF16, 96, 64);
  c.attention.heads = 2, c.attention.seq_q = 8;
  c.types["K"] = c.types["V"] = Format::E4M3;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "amax(frac=0.5,base=normal(0,3))"}, {"V", "amax(frac=0.001953125,base=normal(2,1))"}};
  c.seed = 9;
  validate(c);
  expect_cpu_models_pass(c, Format::BF16);
  Case filled = c;
  fill_inputs(filled);
  EXPECT_EQ(attention_variants(filled), kAttnKvScales);
  EXPECT_GT(filled.scales.at("V"), 1.0);  // normal(2,1) stored up to 448/512
  EXPECT_LT(filled.scales.at("K"), 0.1);
  const auto signature = [&](Bug bug) { return planted_signature(bug, c); };
  EXPECT_EQ(signature(Bug::None), "");
  EXPECT_EQ(signature(Bug::KvDequantToQ), "");
  EXPECT_NE(signature(Bug::KvScalesIgnored), "");
  EXPECT_NE(signature(Bug::VScaleIgnored), "");
}

// Per-head scales by hand (grouped heads, FP16 queries over an E5M2 cache): the CPU models
// pass; head 0's scale applied to every head fails, and so does leaving them at 1.
TEST(AttentionOp, Fp8KvCacheWithPerHeadScales) {
  Case c = small_case(Format::FP16, 96, 64);
  c.attention.heads = 4, c.attention.kv_heads = 2, c.attention.seq_q = 8;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,2)"}, {"V", "normal(1,3)"}};
  apply_kv_cache(c, "e5m2:0.5:head");
  c.seed = 4;
  validate(c);
  expect_cpu_models_pass(c, Format::FP16);
  Case filled = c;
  fill_inputs(filled);
  EXPECT_EQ(attention_variants(filled), kAttnKvHeadScales);
  ASSERT_EQ(filled.head_scales.at("V").size(), 2u);
  EXPECT_NE(filled.head_scales.at("V")[0], filled.head_scales.at("V")[1]);
  EXPECT_EQ(planted_signature(Bug::None, c), "");
  EXPECT_NE(planted_signature(Bug::KvHeadScaleFirst, c), "");
  EXPECT_NE(planted_signature(Bug::KvHeadScalesIgnored, c), "");
}

// A paged case by hand: page size 3 (dividing neither 64 nor 128), pages out of order, batch 1
// sharing batch 0's first page, a partial last page, an extra table entry pointing at an
// unused (poisoned) page. The CPU models pass it and its relations (the contiguous twin bit for
// bit among them); a kernel summing a paged case's keys in another order passes the
// reference's bound but fails paged_contiguous, and the table's misreadings fail outright.
TEST(AttentionOp, PagedCaseEqualsItsContiguousTwin) {
  Case c = small_case(Format::FP32, 8, 16);
  AttentionShape& a = c.attention;
  a.batch = 2, a.heads = 2, a.kv_heads = 1, a.seq_q = 4;
  a.page_size = 3, a.num_pages = 7;
  a.page_table = {4, 0, 6, 2,   // batch 0: pages 4, 0, 6 (keys 6, 7 in page 6), an extra entry
                  4, 5, 1, 2};  // batch 1: shares page 4 (keys 0-2), then 5 and 1
  a.kv_lengths = {8, 6};        // batch 1 ends on a page boundary
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  c.seed = 5;
  validate(c);
  for (auto model : {AttentionModel{}, AttentionModel{AttentionModel::Variant::Online, 4}}) {
    auto k = make_emulated_attention(model);
    c.kernel = k->name();
    const Evaluation ev = check(*k, c);
    EXPECT_TRUE(ev.verdict.passed) << k->name() << ": " << failure_signature(ev.verdict);
  }
  const auto signature = [&](Bug bug) { return planted_signature(bug, c); };
  EXPECT_EQ(signature(Bug::None), "");
  EXPECT_NE(signature(Bug::PagedOtherOrder).find("paged_contiguous"), std::string::npos) << signature(Bug::PagedOtherOrder);
  EXPECT_NE(signature(Bug::PagedIgnoresTable), "");
  EXPECT_NE(signature(Bug::PagedOnePagePast), "");  // batch 1 takes key 6, past its length
  EXPECT_NE(signature(Bug::PagedWholeLastPage), "");  // batch 0 reads slot 2 of page 6 (stale)
}

// The variants' identities as relations: a case without sinks run again with a sink of -inf
// on every head, and a causal case run again with the window (-1, 0), must pass against the
// same reference. A kernel that takes a -inf sink as 0, or that ignores windows, fails them
// on cases that have no sink or window at all; the correct kernel passes.
TEST(AttentionOp, VariantIdentitiesAreRelations) {
  Case c = small_case(Format::FP32, 40, 16);
  c.attention.seq_q = 40, c.attention.causal = true, c.attention.heads = 2;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  c.seed = 11;
  validate(c);
  const auto relations_failed = [&](Bug bug) { return planted_signature(bug, c); };
  EXPECT_EQ(relations_failed(Bug::None), "");
  EXPECT_NE(relations_failed(Bug::SinkNoneAsZero).find("sink_none"), std::string::npos) << relations_failed(Bug::SinkNoneAsZero);
  EXPECT_NE(relations_failed(Bug::WindowIgnored).find("window_causal"), std::string::npos) << relations_failed(Bug::WindowIgnored);
}

// A long prefill: the kernel computes 1,100 queries, the reference a sample of them
// (referenced_queries: the first two, the last four, the last tile boundaries, spread
// evenly), about 0.3 s of it. A correct model passes; a kernel whose last, partial 64-query
// tile is off by 1% is caught through the sampled tail; a NaN in a query outside the sample
// is caught too (only values are left unjudged there, OutputComparison::unreferenced).
TEST(AttentionOp, LongPrefillReferencesASampleOfItsQueries) {
  Case c = small_case(Format::FP32, 1100, 64);
  c.attention.seq_q = 1100;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  c.seed = 7;
  const std::vector<std::int64_t> q = referenced_queries(c);
  ASSERT_LT(q.size(), 1100u);
  ASSERT_GE(q.size(), 16u);
  for (std::int64_t i : {0, 1, 1023, 1024, 1087, 1088, 1096, 1097, 1098, 1099})
    EXPECT_TRUE(std::binary_search(q.begin(), q.end(), i)) << i;
  std::int64_t outside = -1;  // a query the reference skips
  for (std::int64_t i = 500; outside < 0; ++i)
    if (!std::binary_search(q.begin(), q.end(), i)) outside = i;

  auto online = make_emulated_attention(AttentionModel{AttentionModel::Variant::Online, 64});
  const Evaluation ok = check(*online, c);
  EXPECT_TRUE(ok.verdict.passed) << ok.verdict.reasons.front();
  ASSERT_EQ(ok.metrics.size(), 1u);
  EXPECT_EQ(ok.metrics[0].compared, static_cast<std::int64_t>(q.size()) * 64);

  Wrapped tail("tail_tile_off", [](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) {
    inner.run(cc, io, n);
    auto* o = static_cast<float*>(io.out.at("O"));
    const std::int64_t dv = cc.attention.eff_head_dim_v(), from = cc.attention.seq_q / 64 * 64;
    for (std::int64_t i = from; i < cc.attention.seq_q; ++i)
      for (std::int64_t d = 0; d < dv; ++d) o[i * dv + d] *= 1.01f;  // bhsd, batch and heads 1
  });
  const Evaluation bad = check(tail, c);
  EXPECT_FALSE(bad.verdict.passed);
  EXPECT_NE(failure_signature(bad.verdict).find("O:tolerance"), std::string::npos) << failure_signature(bad.verdict);

  Wrapped nan_row("nan_outside_the_sample", [outside](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) {
    inner.run(cc, io, n);
    static_cast<float*>(io.out.at("O"))[outside * cc.attention.eff_head_dim_v()] = NAN;
  });
  const Evaluation nan_ev = check(nan_row, c);
  EXPECT_FALSE(nan_ev.verdict.passed);
  EXPECT_NE(failure_signature(nan_ev.verdict).find("O:unexpected_nan"), std::string::npos) << failure_signature(nan_ev.verdict);
}

// Found by the 20-seed CPU-model campaign (seed 5): V lognormal(2,3) in BF16 with an FP16 O
// has weighted means beyond FP16's range, which a correct kernel returns as Inf; outside the
// referenced queries that Inf must not count as unexpected where some |v| could carry O past
// the output's overflow threshold.
TEST(AttentionOp, OutputOverflowOutsideTheSampleIsNoFalseAlarm) {
  Case c = dtype_attention_case("bf16");
  AttentionShape& a = c.attention;
  a.batch = 1, a.heads = 2, a.kv_heads = 1, a.seq_q = 689, a.seq_kv = 1024, a.head_dim = 48, a.head_dim_v = 24;
  a.causal = true, a.kv_lengths = {1023}, a.layout = AttentionLayout::BSHD, a.softmax_scale = 1.0;
  c.types["O"] = Format::FP16;
  c.dist = {{"K", "exact(frac=0)"}, {"Q", "exact(frac=2)"}, {"V", "lognormal(2,3)"}};
  c.seed = 276195;
  ASSERT_LT(referenced_queries(c).size(), 689u);
  auto online = make_emulated_attention(AttentionModel{AttentionModel::Variant::Online, 64});
  const Evaluation ev = check(*online, c);
  EXPECT_TRUE(ev.verdict.passed) << ev.verdict.reasons.front();
}

// A non-finite V at a key some row does not see (causal, past its batch's kv_length) still
// meets that row in a kernel that multiplies P by V as a matrix (p = 0 times Inf is NaN):
// PyTorch's math SDPA, FlashAttention on a partially masked tile, cuda.attn_flash.fp16 on
// the H200 (generated cases with specials in V).
// Such rows may be NaN in that column; a kernel that skips the masked key and stays finite
// is judged as usual, and a NaN where V has no non-finite value in the column fails.
TEST(AttentionOp, NonFiniteVAtAMaskedKeyMayReachTheRowsOfItsColumn) {
  Case c = small_case(Format::FP32, 8);
  AttentionShape& a = c.attention;
  a.batch = 2, a.seq_q = 3, a.causal = true, a.kv_lengths = {8, 5};  // batch 1: keys 5..7 hidden
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  Inputs in = fill_inputs(c);
  const AttentionView vv = attention_view(c, "V");
  in.at("V").set_value(vv.offset(0, 0, 7, 1), INFINITY);   // batch 0, key 7: seen by row 2 only
  in.at("V").set_value(vv.offset(1, 0, 6, 2), -INFINITY);  // batch 1, key 6: past kv_length 5
  // P V as a matrix product: O[b, h, i, d] += 0 x V[j, d] for the keys row i does not see
  // (of the case it is given: the relations run slices of it).
  const auto matmul_nan = [](bool plant_elsewhere) {
    return Wrapped("matmul_pv", [plant_elsewhere](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) {
      inner.run(cc, io, n);
      const AttentionShape& s = cc.attention;
      const AttentionView cv = attention_view(cc, "V"), co = attention_view(cc, "O");
      const auto* v = static_cast<const float*>(io.in.at("V"));
      auto* o = static_cast<float*>(io.out.at("O"));
      for (std::int64_t b = 0; b < s.batch; ++b)
        for (std::int64_t i = 0; i < s.seq_q; ++i)
          for (std::int64_t j = 0; j < s.seq_kv; ++j)
            for (std::int64_t d = 0; d < s.head_dim; ++d)
              if (!attention_visible(cc, b, i, j) && !std::isfinite(v[cv.offset(b, 0, j, d)])) o[co.offset(b, 0, i, d)] = NAN;
      if (plant_elsewhere && s.batch == 2) o[co.offset(0, 0, 0, 3)] = NAN;  // column 3 has no non-finite V
    });
  };
  Wrapped ok = matmul_nan(false), bad = matmul_nan(true);
  c.kernel = "matmul_pv";
  const Evaluation good = evaluate_with_inputs(ok, c, in, EvaluationOptions{});
  EXPECT_TRUE(good.verdict.passed) << good.verdict.reasons.front();
  const Evaluation planted = evaluate_with_inputs(bad, c, in, EvaluationOptions{});
  EXPECT_FALSE(planted.verdict.passed);
  auto naive = make_emulated_attention(AttentionModel{});
  c.kernel = naive->name();
  const Evaluation skipping = evaluate_with_inputs(*naive, c, in, EvaluationOptions{});
  EXPECT_TRUE(skipping.verdict.passed) << skipping.verdict.reasons.front();
  EXPECT_GT(skipping.metrics[0].compared, 0);
}

// The log-sum-exp output against known answers: Q and K all ones with scale 1/2 give every
// visible key the score head_dim / 2 = 2, so LSE = 2 + ln n (batch 0: n = 9), one visible key
// LSE = 2 exactly (batch 1), no visible key -inf (batch 2). The models pass with LSE judged
// beside O; a kernel writing +inf for the empty rows (FlashAttention's convention) passes, a
// finite value or a NaN there fails, and so do ln l without the max and log2 l, under LSE's
// own check tokens.
TEST(AttentionOp, LogSumExpKnownAnswers) {
  Case c = small_case(Format::FP32, 9);
  AttentionShape& a = c.attention;
  a.batch = 3, a.seq_q = 2, a.kv_lengths = {9, 1, 0}, a.softmax_scale = 0.5;
  c.types["LSE"] = Format::FP32;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  validate(c);
  Inputs in = fill_inputs(c);
  for (const char* op : {"Q", "K"})
    for (std::size_t e = 0; e < in.at(op).size(); ++e) in.at(op).set_value(e, 1.0);
  EvaluationOptions plain;
  plain.relations = false;
  for (auto& k : models()) {
    c.kernel = k->name();
    const Evaluation ev = evaluate_with_inputs(*k, c, in, EvaluationOptions{});
    ASSERT_EQ(ev.metrics.size(), 2u) << k->name();
    EXPECT_EQ(ev.metrics[1].output, "LSE");
    EXPECT_EQ(ev.metrics[1].elements, 6);
    EXPECT_EQ(ev.metrics[1].expected_nonfinite, 2) << k->name();  // batch 2's rows: -inf
    EXPECT_LE(ev.metrics[1].max_ulp, 1.0) << k->name();
    EXPECT_TRUE(ev.verdict.passed) << k->name() << ": " << ev.verdict.reasons.front();
    const std::vector<OutputComparison> cmp = attention_module().compare(c, in, ev.run.outputs, ev.tolerance);
    ASSERT_EQ(cmp.size(), 2u);
    EXPECT_DOUBLE_EQ(cmp[1].exact[0].to_double(), 2 + std::log(9.0));
    EXPECT_EQ(cmp[1].exact[2].to_double(), 2.0);  // one key: its score, exactly
    EXPECT_EQ(cmp[1].exact[4], RefValue::infinity(true));
    EXPECT_EQ(ev.run.outputs.at("LSE").value(2), 2.0) << k->name();
  }
  // What a kernel writes for the rows without a key: +inf passes, a finite value or NaN fails.
  for (const float empty : {INFINITY, 0.0f, NAN}) {
    Wrapped k("empty_rows", [empty](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) {
      inner.run(cc, io, n);
      auto* lse = static_cast<float*>(io.out.at("LSE"));
      lse[4] = lse[5] = empty;
    });
    c.kernel = k.name();
    const Evaluation ev = evaluate_with_inputs(k, c, in, plain);
    ASSERT_EQ(ev.run.status, Disposition::Ok) << ev.run.message;
    EXPECT_EQ(ev.verdict.passed, std::isinf(empty)) << empty;
    if (!std::isinf(empty)) {
      ASSERT_FALSE(ev.verdict.checks.empty());
      EXPECT_EQ(ev.verdict.checks.front().rfind("LSE:", 0), 0u) << ev.verdict.checks.front();
    }
  }
  // Wrong formulas on generated inputs (Q, K normal: scores and their max far from 0).
  Inputs normal = fill_inputs(c);
  for (const int bug : {0, 1}) {
    Wrapped k("wrong_lse", [bug](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) {
      inner.run(cc, io, n);
      auto* lse = static_cast<float*>(io.out.at("LSE"));
      for (std::int64_t r = 0; r < cc.attention.batch * cc.attention.heads * cc.attention.seq_q; ++r)
        if (std::isfinite(lse[r])) lse[r] = bug == 0 ? lse[r] - 0.25f : lse[r] * 1.0001f;  // an offset; 1e-4 relative
    });
    c.kernel = k.name();
    const Evaluation ev = evaluate_with_inputs(k, c, normal, plain);
    ASSERT_EQ(ev.run.status, Disposition::Ok) << ev.run.message;
    EXPECT_FALSE(ev.verdict.passed) << bug;
    EXPECT_EQ(ev.metrics.at(0).max_normalised, evaluate_with_inputs(*models().front(), c, normal, plain).metrics.at(0).max_normalised);
    ASSERT_FALSE(ev.verdict.checks.empty());
    EXPECT_EQ(ev.verdict.checks.front(), "LSE:tolerance@any") << bug;
  }
}

// Kernels that do not declare the LSE output (KernelTraits::writes_lse) are not handed cases
// that ask for it: the runner says "not supported" and the generators do not draw it for them.
TEST(AttentionOp, KernelsWithoutTheLogSumExpAreNotHandedIt) {
  Wrapped k("no_lse", [](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) { inner.run(cc, io, n); }, false);
  Case c = small_case(Format::FP32, 9);
  c.types["LSE"] = Format::FP32;
  c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
  const RunOutcome r = run_kernel(k, c, fill_inputs(c));
  EXPECT_EQ(r.status, Disposition::NotSupported);
  EXPECT_EQ(r.message, "the kernel does not write the log-sum-exp output (LSE)");
  int with_lse = 0, model_lse = 0;
  auto model = make_emulated_attention(AttentionModel{});
  const auto draw = [](const Kernel* kernel, int i) {
    return attention_module().generate("fp32", kernel, GenLimits{300, false})(rc::Random(static_cast<std::uint64_t>(i)), 50).value();
  };
  for (int i = 0; i < 60; ++i) with_lse += draw(&k, i).types.count("LSE"), model_lse += draw(model.get(), i).types.count("LSE");
  EXPECT_EQ(with_lse, 0);
  EXPECT_GT(model_lse, 5);  // about one case in three
}

// A kernel that refuses kv_lengths is never handed a generated case that gets them anyway:
// the masked() distribution sets kv_lengths when the inputs are filled, after the generator
// asked the kernel about the case (ulpgate.plain refused every such case as not supported).
TEST(AttentionOp, GeneratorsAskAboutTheLengthsThatFillingSets) {
  class NoLengths final : public Wrapped {
   public:
    NoLengths() : Wrapped("no_lengths", [](const Case& cc, const KernelIo& io, Kernel& inner, RunNotes& n) { inner.run(cc, io, n); }) {}
    std::optional<std::string> unsupported(const Case& c) const override {
      if (!c.attention.kv_lengths.empty()) return "no kv_lengths";
      return Wrapped::unsupported(c);
    }
  } k;
  auto model = make_emulated_attention(AttentionModel{});
  int refused = 0, model_masked = 0;
  for (int i = 0; i < 300; ++i) {
    const auto draw = [i](const Kernel* kernel) {
      return attention_module().generate("fp16", kernel, GenLimits{300, false})(rc::Random(static_cast<std::uint64_t>(i)), 50).value();
    };
    Case c = draw(&k);
    fill_inputs(c);
    refused += k.unsupported(c).has_value();
    model_masked += parse_dist(draw(model.get()).dist.at("Q")).family == "masked";
  }
  EXPECT_EQ(refused, 0);
  EXPECT_GT(model_masked, 0) << "masked() never drawn: the test shows nothing";
}

// Outputs computed elsewhere by a kernel that rounds P to BF16 before P V (FlashAttention's
// arithmetic; PyTorch's flash and cuDNN backends) pass undeclared: the default rule admits P
// in the inputs' 16-bit format. Declared FP32 P (`ulpgate check --p-bits 24`) is the tighter
// rule, which such outputs exceed on short sequences on some seeds (P's 2^-8 relative
// rounding is above FP32's bound there); declared BF16 P passes as undeclared does.
TEST(AttentionOp, GivenOutputsTakeTheDeclaredPRounding) {
  AttentionModel m;
  m.variant = AttentionModel::Variant::Flash, m.block = 64, m.p_format = Format::BF16;
  auto flash = make_emulated_attention(m);
  int fp32_p_failures = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    Case c = dtype_attention_case("bf16");
    c.attention.heads = 2, c.attention.seq_q = 8, c.attention.seq_kv = 128;
    c.types["O"] = Format::FP32;
    c.dist = {{"Q", "normal(0,1)"}, {"K", "normal(0,1)"}, {"V", "normal(0,1)"}};
    c.seed = seed;
    const Inputs in = fill_inputs(c);
    c.kernel = flash->name();
    const RunOutcome r = run_kernel(*flash, c, in);
    ASSERT_EQ(r.status, Disposition::Ok) << r.message;
    KernelTraits declared, fp32_p;
    declared.p_bits = 8;
    fp32_p.p_bits = 24;
    EXPECT_TRUE(check_given_outputs(c, r.outputs, "external:flash", declared).verdict.passed) << seed;
    const CaseResult undeclared = check_given_outputs(c, r.outputs, "external:flash");
    EXPECT_TRUE(undeclared.verdict.passed) << seed << ": " << undeclared.verdict.reasons.front();
    fp32_p_failures += !check_given_outputs(c, r.outputs, "external:flash", fp32_p).verdict.passed;
  }
  EXPECT_GT(fp32_p_failures, 0) << "BF16 P never exceeded the FP32-P tolerance: the test shows nothing";
}
