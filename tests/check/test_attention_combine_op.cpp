// The attention combine op end to end: the case model, the FP32 model against the exact
// merge (no false alarm: equal LSEs, far-negative and huge LSEs, empty splits, both bases and
// layouts), and each planted bug class caught, by a designed case and by a short campaign.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "campaign/fuzz.hpp"
#include "check/check.hpp"
#include "check/ops/attention_combine.hpp"
#include "kernels/builtin.hpp"
#include "kernels/emulated/attention_combine_models.hpp"

using namespace ulpgate;

namespace {

Case combine_case(const std::string& dtype, std::int64_t splits, const std::string& lse_dist, bool base2 = false,
                  AttentionLayout layout = AttentionLayout::BHSD) {
  Case c = dtype_attention_combine_case(dtype);
  AttentionShape& a = c.attention;
  a.batch = 2, a.heads = 3, a.seq_q = 2, a.head_dim = 16, a.splits = splits, a.layout = layout, a.lse_base2 = base2;
  c.types["LSE"] = Format::FP32;
  c.dist["LSE_part"] = lse_dist;
  c.seed = 5;
  validate(c);
  return c;
}

CaseResult check_with(const AttentionCombineModel& m, Case c) {
  auto k = make_emulated_attention_combine(m);
  c.kernel = k->name();
  return check_case(*k, c, EvaluationOptions{});
}

std::string reasons(const CaseResult& r) {
  std::string s;
  for (const auto& x : r.verdict.reasons) s += x + "; ";
  return s;
}

void expect_case_error(const Case& c, const std::string& needle) {
  try {
    validate(c);
    ADD_FAILURE() << "no error, expected one naming " << needle;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(AttentionCombineOp, CaseModel) {
  Case c = combine_case("fp32", 4, "lse(mean=4,std=4)", true, AttentionLayout::BSHD);
  EXPECT_EQ(case_from_json(to_json(c)), c);
  EXPECT_EQ(to_json(c)["attention"]["lse_base"], "2");
  EXPECT_EQ(c.inputs(), (std::vector<std::string>{"O_part", "LSE_part"}));
  EXPECT_EQ(operand_elements(c, "O_part"), 4 * 2 * 3 * 2 * 16);
  EXPECT_EQ(operand_elements(c, "LSE_part"), 4 * 2 * 3 * 2);
  // Split s of batch b: batch s * batch + b of the view, the split outermost.
  const AttentionView v = attention_view(c, "O_part");
  EXPECT_EQ(v.offset(1 * 2 + 0, 0, 0, 0), 2 * 3 * 2 * 16);
  Case bad = c;
  bad.attention.seq_kv = 8;
  expect_case_error(bad, "case.attention.seq_kv");
  bad = c, bad.attention.causal = true;
  expect_case_error(bad, "case.attention.causal");
  bad = c, bad.attention.splits = 0;
  expect_case_error(bad, "case.attention.splits");
  bad = c, bad.types["LSE_part"] = Format::FP16;
  expect_case_error(bad, "case.types.LSE_part");
  bad = c, bad.types["O_part"] = Format::E4M3;
  expect_case_error(bad, "case.types.O_part");
  bad = c, bad.types.erase("O_part");
  expect_case_error(bad, "case.types.O_part");
  Case forward;
  forward.op = Op::Attention;
  forward.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP32}, {"compute", Format::FP32}};
  forward.attention.splits = 2;
  expect_case_error(forward, "case.attention.splits");
  auto j = to_json(c);
  j["attention"]["lse_base"] = "10";
  EXPECT_THROW(case_from_json(j), InputError);
  EXPECT_THROW(attention_view(forward, "O_part"), InputError);
  EXPECT_THROW(attention_view(c, "Q"), InputError);
  EXPECT_THROW(dtype_attention_combine_case("e4m3"), InputError);
}

// The FP32 model passes, whatever the LSEs: equal ones (rational outputs), far-negative rows,
// LSEs past exp's FP32 range, empty splits up to whole rows, both bases and layouts, every
// partial format.
TEST(AttentionCombineOp, ModelPassesItsCases) {
  const AttentionCombineModel good;
  for (const char* dtype : {"fp32", "fp16", "bf16"})
    for (bool base2 : {false, true})
      for (AttentionLayout layout : {AttentionLayout::BHSD, AttentionLayout::BSHD})
        for (const char* lse : {"lse(mean=4,std=4,empty=0.2)", "lse(mean=0,std=0,empty=0)", "lse(mean=3,std=2,step=1)",
                                "lse(mean=-10000,std=3)", "lse(mean=1000,std=300,empty=0.5)", "lse(empty=1)"})
          for (std::int64_t splits : {1, 3, 33}) {
            const Case c = combine_case(dtype, splits, lse, base2, layout);
            const CaseResult r = check_with(good, c);
            EXPECT_TRUE(r.verdict.passed) << dtype << " base2 " << base2 << " " << name(layout) << " " << lse << " splits "
                                          << splits << ": " << reasons(r);
          }
}

// A row of empty splits: LSE -inf, or +inf as FlashAttention's combine writes it; a NaN or a
// finite LSE there fails, and so does a NaN O.
TEST(AttentionCombineOp, EmptyRowsTakeEitherInfinityAsTheirLse) {
  const Case c = combine_case("fp32", 3, "lse(empty=1)");
  auto model = make_emulated_attention_combine(AttentionCombineModel{});
  const auto with_lse = [&](double lse, double o) {
    class Fixed : public Kernel {
     public:
      Fixed(Kernel& inner, double lse, double o) : inner_(inner), lse_(lse), o_(o) {}
      std::string name() const override { return "fixed"; }
      std::string description() const override { return "fixed"; }
      KernelTraits traits() const override { return inner_.traits(); }
      std::optional<std::string> unsupported(const Case& c) const override { return inner_.unsupported(c); }
      void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
        inner_.run(c, io, notes);
        Tensor l(Format::FP32, static_cast<std::size_t>(operand_elements(c, "LSE")));
        l.fill_code(encode(Format::FP32, lse_));
        std::memcpy(io.out.at("LSE"), l.data(), l.size_bytes());
        if (o_ != 0) {
          Tensor o(c.types.at("O"), static_cast<std::size_t>(operand_elements(c, "O")));
          o.fill_code(encode(c.types.at("O"), o_));
          std::memcpy(io.out.at("O"), o.data(), o.size_bytes());
        }
      }
     private:
      Kernel& inner_;
      double lse_, o_;
    } k(*model, lse, o);
    Case cc = c;
    cc.kernel = k.name();
    return check_case(k, cc, EvaluationOptions{}).verdict.passed;
  };
  EXPECT_TRUE(with_lse(-INFINITY, 0));
  EXPECT_TRUE(with_lse(INFINITY, 0));
  EXPECT_FALSE(with_lse(NAN, 0));
  EXPECT_FALSE(with_lse(-1e30, 0));
  EXPECT_FALSE(with_lse(-INFINITY, NAN));
}

// Each planted bug fails on a case that exposes it.
TEST(AttentionCombineOp, PlantedBugsFail) {
  struct Planted {
    AttentionCombineModel m;
    Case c;
  };
  const auto with = [](auto set) {
    AttentionCombineModel m;
    set(m);
    return m;
  };
  const std::vector<Planted> planted{
      {with([](auto& m) { m.no_empty_guard = true; }), combine_case("fp32", 3, "lse(empty=1)")},
      {with([](auto& m) { m.no_empty_guard = true; }), combine_case("fp32", 3, "lse(empty=0)")},  // the empty_split relation
      {with([](auto& m) { m.wrong_base = true; }), combine_case("fp32", 4, "lse(mean=4,std=4,empty=0)")},
      {with([](auto& m) { m.wrong_base = true; }), combine_case("bf16", 4, "lse(mean=4,std=4,empty=0)", true)},
      {with([](auto& m) { m.no_max_shift = true; }), combine_case("fp32", 4, "lse(mean=100,std=4,empty=0)")},
      {with([](auto& m) { m.no_max_shift = true; }), combine_case("fp16", 4, "lse(mean=-200,std=4,empty=0)")},
      {with([](auto& m) { m.no_normalize = true; }), combine_case("fp16", 2, "lse(mean=4,std=1,empty=0)")},
      {with([](auto& m) { m.bhsd_store = true; }), combine_case("fp32", 2, "lse(empty=0)", false, AttentionLayout::BSHD)},
      {with([](auto& m) { m.drop_last = true; }), combine_case("bf16", 5, "lse(std=1,empty=0)")},
  };
  for (const Planted& p : planted) {
    const CaseResult r = check_with(p.m, p.c);
    EXPECT_FALSE(r.verdict.passed) << p.m.name() << " on " << to_json(p.c).dump();
  }
}

// Campaigns: the FP32 model over 5 seeds of every partial format finds nothing; each planted
// bug is found in the first seed's cases.
TEST(AttentionCombineOp, CampaignsFindEachPlantedBugAndNothingElse) {
  Registry reg = builtin_registry();
  for (std::uint64_t seed = 1; seed <= 5; ++seed)
    for (const char* dtype : {"fp32", "fp16", "bf16"}) {
      FuzzOptions o;
      o.targets = {{"cpu.attn_combine", dtype, Op::AttentionCombine}};
      o.seed = seed, o.sizes = SizeSchedule::Small;
      const RunRecord r = run_fuzz(reg, o);
      EXPECT_GE(r.cases.size(), static_cast<std::size_t>(o.cases));
      for (const CaseResult& cr : r.cases) EXPECT_TRUE(cr.verdict.passed) << dtype << " seed " << seed << ": " << reasons(cr);
    }
  for (const char* bug : {"no_empty_guard", "wrong_base", "no_max_shift", "no_normalize", "bhsd_store", "drop_last"}) {
    const std::string model = std::string("cpu.attn_combine:") + bug;
    ASSERT_NE(reg.resolve(model), nullptr) << model;
    FuzzOptions o;
    o.targets = {{model, "fp32", Op::AttentionCombine}};
    o.seed = 1, o.sizes = SizeSchedule::Small;
    const RunRecord r = run_fuzz(reg, o);
    int failed = 0;
    for (const CaseResult& cr : r.cases) failed += !cr.verdict.passed;
    EXPECT_GE(failed, 1) << model;
  }
}
