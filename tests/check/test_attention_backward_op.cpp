// The attention backward op end to end: the case model and its derived inputs, the CPU
// models against the exact gradients (no false alarm, also where the gradients are
// negligible), and kernels with planted bugs of each class the op must catch: a missing D
// term, a stale LSE, a lost scale, a wrong K/V head, a dropped group sum, a masked row that
// is not zero, run-to-run differences in dK, dV and undeclared dQ.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "campaign/fuzz.hpp"
#include "check/check.hpp"
#include "check/ops/attention_backward.hpp"
#include "check/runner.hpp"
#include "kernels/builtin.hpp"
#include "kernels/emulated/attention_backward_models.hpp"

using namespace ulpgate;

namespace {

Case backward_case(const std::string& dtype, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t hd = 16) {
  Case c = dtype_attention_backward_case(dtype);
  c.attention.seq_q = seq_q, c.attention.seq_kv = seq_kv, c.attention.head_dim = hd;
  c.kernel = "test";
  c.seed = 7;
  return c;
}

// A kernel built from the naive model with one change: to its inputs (a copy) before the run,
// or to its outputs after it.
class Planted : public Kernel {
 public:
  using Edit = std::function<void(const Case&, std::map<std::string, Tensor>&)>;
  Planted(std::string name, Edit inputs, Edit outputs, KernelTraits traits = {})
      : name_(std::move(name)), inputs_(std::move(inputs)), outputs_(std::move(outputs)), traits_(traits) {}
  std::string name() const override { return name_; }
  std::string description() const override { return name_; }
  KernelTraits traits() const override { return traits_; }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_->unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    std::map<std::string, Tensor> in, out;
    for (const auto& [op, p] : io.in) {
      const Format f = c.types.at(op);
      Tensor t(f, static_cast<std::size_t>(operand_elements(c, op)));
      std::memcpy(t.data(), p, t.size_bytes());
      in.emplace(op, std::move(t));
    }
    if (inputs_) inputs_(c, in);
    KernelIo mine;
    for (auto& [op, t] : in) mine.in[op] = t.data();
    for (const auto& [op, p] : io.out) {
      out.emplace(op, Tensor(c.types.at(op), static_cast<std::size_t>(operand_elements(c, op))));
      mine.out[op] = out.at(op).data();
    }
    inner_->run(c, mine, notes);
    if (outputs_) outputs_(c, out);
    if (with_inputs_) with_inputs_(c, in, out);
    for (const auto& [op, p] : io.out) std::memcpy(p, out.at(op).data(), out.at(op).size_bytes());
  }

  /// An edit of the outputs that reads the inputs too.
  std::function<void(const Case&, const std::map<std::string, Tensor>&, std::map<std::string, Tensor>&)> with_inputs_;

 private:
  std::string name_;
  Edit inputs_, outputs_;
  KernelTraits traits_;
  std::unique_ptr<Kernel> inner_ = make_emulated_attention_backward(AttentionBackwardModel{});
};

CaseResult check(Kernel& k, Case c) {
  c.kernel = k.name();
  return check_case(k, c, EvaluationOptions{});
}

std::string reasons(const CaseResult& r) {
  std::string s;
  for (const auto& x : r.verdict.reasons) s += x + "; ";
  return s;
}

bool failed_check(const CaseResult& r, const std::string& token) {
  for (const auto& t : r.verdict.checks)
    if (t.find(token) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(AttentionBackwardOp, CaseModel) {
  Case c = backward_case("bf16", 3, 5);
  EXPECT_EQ(c.inputs(), (std::vector<std::string>{"Q", "K", "V", "dO"}));
  EXPECT_EQ(c.derived_inputs(), (std::vector<std::string>{"O", "LSE"}));
  EXPECT_EQ(outputs_of(c), (std::vector<std::string>{"dQ", "dK", "dV"}));
  EXPECT_EQ(case_from_json(to_json(c)), c);
  c.attention.kv_heads = 1, c.attention.heads = 4, c.attention.head_dim_v = 8, c.attention.layout = AttentionLayout::BSHD;
  EXPECT_EQ(attention_view(c, "dK").heads, 1);
  EXPECT_EQ(attention_view(c, "dV").dim, 8);
  EXPECT_EQ(attention_view(c, "dO").offset(0, 2, 1, 3), attention_view(c, "O").offset(0, 2, 1, 3));
  Case no_lse = c;
  no_lse.types.erase("LSE");
  EXPECT_THROW(validate(no_lse), InputError);
  Case forward = forward_case(c);
  EXPECT_EQ(forward.op, Op::Attention);
  EXPECT_THROW(attention_view(forward, "dQ"), InputError);
  EXPECT_EQ(parse_op("attention_backward"), Op::AttentionBackward);
}

// O and LSE are the exact forward rounded once; a row without keys gets O = 0, LSE = +inf.
TEST(AttentionBackwardOp, DerivedForwardOutputs) {
  Case c = backward_case("fp16", 4, 6);
  c.attention.batch = 2, c.attention.kv_lengths = {6, 0};
  const Inputs in = case_inputs(c);
  ASSERT_TRUE(in.count("O") && in.count("LSE"));
  for (std::int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(in.at("LSE").value(static_cast<std::size_t>(4 + i)), INFINITY);
    EXPECT_TRUE(std::isfinite(in.at("LSE").value(static_cast<std::size_t>(i))));
    for (std::int64_t d = 0; d < 16; ++d) EXPECT_EQ(in.at("O").value(attention_view(c, "O").offset(1, 0, i, d)), 0.0);
  }
  // Row 0 of batch 0: O is the softmax average of V, to FP16's rounding.
  const double o = in.at("O").value(0);
  double l = 0, num = 0, m = -INFINITY;
  std::vector<double> s(6);
  for (std::int64_t j = 0; j < 6; ++j) {
    for (std::int64_t d = 0; d < 16; ++d) s[j] += in.at("Q").value(d) * in.at("K").value(j * 16 + d);
    s[j] /= 4.0, m = std::max(m, s[j]);
  }
  for (std::int64_t j = 0; j < 6; ++j) l += std::exp(s[j] - m), num += std::exp(s[j] - m) * in.at("V").value(j * 16);
  EXPECT_NEAR(o, num / l, std::ldexp(std::fabs(num / l), -10));
  EXPECT_NEAR(in.at("LSE").value(0), m + std::log(l), 1e-5);
}

TEST(AttentionBackwardOp, ModelsPassTheirOwnCases) {
  for (const auto& m : default_attention_backward_models()) {
    auto k = make_emulated_attention_backward(m);
    for (const char* dtype : {"fp32", "fp16", "bf16"}) {
      for (const bool causal : {false, true}) {
        Case c = backward_case(dtype, 9, 70, 32);
        c.attention.batch = 2, c.attention.heads = 4, c.attention.kv_heads = 2, c.attention.causal = causal;
        c.attention.kv_lengths = {70, 0};
        if (k->unsupported(c)) continue;
        const CaseResult r = check(*k, c);
        EXPECT_TRUE(r.verdict.passed) << m.name() << " " << dtype << ": " << reasons(r);
      }
    }
  }
}

// Scores of a million: the weights of all but one key are e^-(10^6), so several gradients
// cancel to values no 2^18-bit computation resolves. They round to zero in every format, and
// the check decides them (shrunk from fuzz cases whose reference used to give up).
TEST(AttentionBackwardOp, NegligibleGradientsAreDecided) {
  Case c = backward_case("bf16", 7, 7, 64);
  c.attention.batch = 2;
  c.dist = {{"Q", "normal(100,1000)"}, {"K", "uniform(-1000,1000)"}, {"V", "normal(0,1)"}, {"dO", "normal(0,1)"}};
  auto k = make_emulated_attention_backward(AttentionBackwardModel{});
  c.seed = 0;
  const CaseResult r = check(*k, c);
  EXPECT_EQ(r.status, Disposition::Ok) << r.message;
  EXPECT_TRUE(r.verdict.passed) << reasons(r);
}

// FP16 dS overflows where |dS| passes 65504 (V and dO of a thousand): FlashAttention-2's
// arithmetic then gives Inf or NaN in dQ and dK, which the default rule admits there, and
// only there; the FP32 model stays finite and is judged by its values.
TEST(AttentionBackwardOp, Fp16DsOverflowIsAdmittedWhereItCanHappen) {
  Case c = backward_case("fp16", 8, 64, 64);
  c.dist = {{"V", "normal(0,1000)"}, {"dO", "normal(0,1000)"}};
  AttentionBackwardModel flash;
  flash.block = 64, flash.p_format = Format::FP16;
  auto k = make_emulated_attention_backward(flash);
  const CaseResult r = check(*k, c);
  EXPECT_TRUE(r.verdict.passed) << reasons(r);
  Case filled = c;
  filled.kernel = k->name();
  const RunOutcome run = run_kernel(*k, filled, case_inputs(filled));
  std::int64_t nonfinite = 0;
  for (const char* g : {"dQ", "dK"})
    for (std::size_t e = 0; e < run.outputs.at(g).size(); ++e) nonfinite += !std::isfinite(run.outputs.at(g).value(e));
  EXPECT_GT(nonfinite, 0) << "the case should overflow dS in FP16";
  auto naive = make_emulated_attention_backward(AttentionBackwardModel{});
  EXPECT_TRUE(check(*naive, c).verdict.passed);
  // The same Inf where dS stays small is a failure: dQ of a case of unit inputs.
  Case small = backward_case("fp16", 8, 64, 64);
  Planted inf("inf_dq", nullptr, [](const Case&, std::map<std::string, Tensor>& out) {
    out.at("dQ").set_value(0, INFINITY);
  });
  EXPECT_TRUE(failed_check(check(inf, small), "dQ:unexpected_inf")) << reasons(check(inf, small));
}

TEST(AttentionBackwardOp, PlantedBugsFail) {
  const auto scale_output = [](const char* op, double by) {
    return [op, by](const Case&, std::map<std::string, Tensor>& out) {
      Tensor& t = out.at(op);
      for (std::size_t e = 0; e < t.size(); ++e) t.set_value(e, t.value(e) * by);
    };
  };
  std::vector<std::pair<std::unique_ptr<Kernel>, std::string>> bugs;
  bugs.emplace_back(make_emulated_attention_backward(AttentionBackwardModel{0, Format::FP32, false, false, false, true}), "dQ:tolerance");
  // A stale LSE: P off by a factor e^-0.1 everywhere.
  bugs.emplace_back(std::make_unique<Planted>("stale_lse", [](const Case&, std::map<std::string, Tensor>& in) {
    Tensor& l = in.at("LSE");
    for (std::size_t e = 0; e < l.size(); ++e) l.set_value(e, l.value(e) + 0.1);
  }, nullptr), "tolerance");
  // dQ without the softmax scale (1/4 here).
  bugs.emplace_back(std::make_unique<Planted>("dq_unscaled", nullptr, scale_output("dQ", 4.0)), "dQ:tolerance");
  // D from O read as zeros.
  bugs.emplace_back(std::make_unique<Planted>("d_from_zero_o", [](const Case&, std::map<std::string, Tensor>& in) {
    in.at("O").fill_code(0);
  }, nullptr), "tolerance");
  // Query head h reads K/V head h % kv_heads instead of h / group.
  bugs.emplace_back(std::make_unique<Planted>("gqa_modulo", [](const Case& c, std::map<std::string, Tensor>& in) {
    const AttentionShape& a = c.attention;
    for (const char* op : {"K", "V"}) {
      const Tensor orig = in.at(op);
      const AttentionView v = attention_view(c, op);
      for (std::int64_t hk = 0; hk < v.heads; ++hk)
        for (std::int64_t s = 0; s < v.seq; ++s)
          for (std::int64_t d = 0; d < v.dim; ++d)
            in.at(op).set_code(v.offset(0, hk, s, d), orig.code(v.offset(0, (hk + 1) % v.heads, s, d)));
      (void)a;
    }
  }, nullptr), "tolerance");
  // A masked row's dQ not zero: 2^-20 written there.
  bugs.emplace_back(std::make_unique<Planted>("masked_row_nonzero", nullptr, [](const Case& c, std::map<std::string, Tensor>& out) {
    out.at("dQ").set_value(attention_view(c, "dQ").offset(1, 0, 0, 0), 0x1p-20);
  }), "dQ:tolerance");
  for (auto& [k, token] : bugs) {
    Case c = backward_case("bf16", 9, 70, 32);
    c.attention.batch = 2, c.attention.heads = 4, c.attention.kv_heads = 2, c.attention.kv_lengths = {70, 0};
    const CaseResult r = check(*k, c);
    EXPECT_FALSE(r.verdict.passed) << k->name();
    EXPECT_TRUE(failed_check(r, token)) << k->name() << ": " << reasons(r);
  }
}

// A sliding window: the model passes; the same model reading the window with one key more on
// the left (the diagonal key counted out of the bound, as xformers against Hugging Face)
// fails, and so does one that leaves the window out. A kernel that does not declare windows is
// not handed the case.
TEST(AttentionBackwardOp, WindowsAreAppliedAndTheirOffByOneFails) {
  class Rewindowed final : public Kernel {
   public:
    Rewindowed(std::string name, std::int64_t extra_left, bool declared) : name_(std::move(name)), extra_(extra_left), declared_(declared) {}
    std::string name() const override { return name_; }
    std::string description() const override { return name_; }
    KernelTraits traits() const override {
      KernelTraits t = inner_->traits();
      if (!declared_) t.attention_variants = 0;
      return t;
    }
    std::optional<std::string> unsupported(const Case& c) const override { return inner_->unsupported(c); }
    void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
      Case wide = c;
      wide.attention.window_left = extra_ < 0 ? -1 : c.attention.window_left + extra_;
      inner_->run(wide, io, notes);
    }

   private:
    std::string name_;
    std::int64_t extra_;
    bool declared_;
    std::unique_ptr<Kernel> inner_ = make_emulated_attention_backward(AttentionBackwardModel{});
  };
  Case c = backward_case("bf16", 24, 70, 32);
  c.attention.causal = true, c.attention.window_left = 16, c.attention.window_right = 0;
  Rewindowed right("window_as_given", 0, true), one_more("window_one_key_more", 1, true), none("window_left_out", -1, true),
      undeclared("window_undeclared", 0, false);
  const CaseResult ok = check(right, c);
  EXPECT_TRUE(ok.verdict.passed) << reasons(ok);
  for (Kernel* k : std::vector<Kernel*>{&one_more, &none}) {
    const CaseResult r = check(*k, c);
    EXPECT_FALSE(r.verdict.passed) << k->name();
  }
  const CaseResult skipped = check(undeclared, c);
  EXPECT_EQ(skipped.status, Disposition::NotSupported);
  EXPECT_NE(skipped.message.find("window"), std::string::npos) << skipped.message;
}

// cuDNN's padded-tile bug class: a kernel that computes exp(s) exp(-LSE) gets Inf, then NaN,
// where a row's LSE is below -88.7 (exp(88.7) passes FP32's range). Ordinary inputs never
// reach it; the low_lse relation does.
TEST(AttentionBackwardOp, LowLseRelationFindsOverflowingExponentials) {
  Planted overflow("exp_of_minus_lse", nullptr, nullptr);
  overflow.with_inputs_ = [](const Case& c, const std::map<std::string, Tensor>& in, std::map<std::string, Tensor>& out) {
    const AttentionShape& a = c.attention;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t i = 0; i < a.seq_q; ++i) {
          const double lse = in.at("LSE").value(static_cast<std::size_t>((b * a.heads + h) * a.seq_q + i));
          if (std::isfinite(lse) && !std::isfinite(static_cast<float>(std::exp(-lse))))
            for (std::int64_t d = 0; d < a.head_dim; ++d) out.at("dQ").set_value(attention_view(c, "dQ").offset(b, h, i, d), NAN);
        }
  };
  const CaseResult r = check(overflow, backward_case("bf16", 8, 48, 32));
  EXPECT_TRUE(failed_check(r, "relation:low_lse")) << reasons(r);
  EXPECT_EQ(r.verdict.reasons.size(), 1u) << reasons(r);  // the first run, on ordinary inputs, passed
}

// dK and dV must repeat bit for bit always; dQ unless the kernel declares atomic dQ.
TEST(AttentionBackwardOp, Determinism) {
  int runs = 0;
  const auto jitter = [&runs](const char* op) {
    return [op, &runs](const Case&, std::map<std::string, Tensor>& out) {
      if (++runs % 2 == 0) out.at(op).set_code(0, out.at(op).code(0) ^ 1);  // the last bit, every other run
    };
  };
  KernelTraits atomic;
  atomic.atomic_dq = true;
  KernelTraits nondeterministic;
  nondeterministic.deterministic = false;
  Case c = backward_case("fp32", 5, 9);
  Planted dq_atomic("dq_atomic", nullptr, jitter("dQ"), atomic);
  EXPECT_TRUE(check(dq_atomic, c).verdict.passed);
  Planted dq_undeclared("dq_undeclared", nullptr, jitter("dQ"));
  EXPECT_TRUE(failed_check(check(dq_undeclared, c), "repeatability"));
  Planted dk_atomic("dk_atomic", nullptr, jitter("dK"), atomic);
  EXPECT_TRUE(failed_check(check(dk_atomic, c), "repeatability"));
  Planted dv_any("dv_nondeterministic", nullptr, jitter("dV"), nondeterministic);
  EXPECT_TRUE(failed_check(check(dv_any, c), "repeatability"));
}

// A short campaign over every default model: no false alarm; the planted no-D model found.
TEST(AttentionBackwardOp, CampaignsFindTheMissingDTermOnly) {
  Registry reg = builtin_registry();
  for (const auto& m : default_attention_backward_models())
    for (const char* dtype : {"fp32", "bf16"}) {
      FuzzOptions o;
      o.targets = {{m.name(), dtype, Op::AttentionBackward}};
      o.cases = 12, o.seed = 11, o.max_k = 256, o.sizes = SizeSchedule::Small;
      const RunRecord r = run_fuzz(reg, o);
      for (const CaseResult& cr : r.cases)
        EXPECT_TRUE(cr.verdict.passed || cr.status == Disposition::NotSupported) << m.name() << " " << dtype << ": " << reasons(cr);
    }
  AttentionBackwardModel bad;
  bad.no_d = true;
  reg.add(make_emulated_attention_backward(bad));
  FuzzOptions o;
  o.targets = {{bad.name(), "bf16", Op::AttentionBackward}};
  o.cases = 12, o.seed = 11, o.max_k = 256, o.sizes = SizeSchedule::Small;
  const RunRecord r = run_fuzz(reg, o);
  int failed = 0;
  for (const CaseResult& cr : r.cases) failed += !cr.verdict.passed;
  EXPECT_GE(failed, 1);
}

// A chained check (Case::forward_kernel): the named forward kernel runs on the case's Q, K, V,
// is judged by the forward's own rule, and its O and LSE are what the backward takes and is
// judged with. A correct pair passes; a forward that loses its rescale fails the case as the
// forward; a forward that declines the case declines it; an unknown one is an input error.
TEST(AttentionBackwardOp, ChainedForwardKernel) {
  Registry reg = builtin_registry();
  Kernel& bwd = *reg.resolve("cpu.attn_bwd_flash:block=16,p=fp16");
  Kernel& fwd = *reg.resolve("cpu.attn_flash:block=16,p=fp16");
  Kernel& broken = *reg.resolve("cpu.attn_online:block=16,rescale=off");
  Case c = backward_case("fp16", 40, 70, 32);
  c.attention.batch = 2, c.attention.kv_lengths = {70, 0};
  c.dist["Q"] = "normal(0,3)";  // scores spread wide: a forward that skips its rescale is far off
  c.kernel = bwd.name();
  c.forward_kernel = fwd.name();
  EXPECT_EQ(case_from_json(to_json(c)), c);
  const CaseResult r = check_case(bwd, c, EvaluationOptions{}, &reg);
  EXPECT_TRUE(r.verdict.passed) << reasons(r);
  ASSERT_TRUE(r.notes.count("forward"));
  EXPECT_NE(r.notes.at("forward").find(fwd.name() + " (passed)"), std::string::npos) << r.notes.at("forward");

  // The backward was judged with the forward kernel's outputs: the same metrics as a check
  // given those outputs by hand.
  Case filled = c;
  Inputs in = case_inputs(filled);
  const Case fc = forward_case(filled);
  const RunOutcome f = run_kernel(fwd, fc, {{"Q", in.at("Q")}, {"K", in.at("K")}, {"V", in.at("V")}});
  ASSERT_EQ(f.status, Disposition::Ok);
  EXPECT_NE(std::memcmp(f.outputs.at("O").data(), in.at("O").data(), in.at("O").size_bytes()), 0)
      << "the forward kernel's O should differ from the exact forward's somewhere";
  in.insert_or_assign("O", f.outputs.at("O"));
  in.insert_or_assign("LSE", f.outputs.at("LSE"));
  EvaluationOptions plain;
  const Evaluation by_hand = evaluate_with_inputs(bwd, filled, in, plain, &reg);
  ASSERT_EQ(by_hand.metrics.size(), r.metrics.size());
  for (std::size_t i = 0; i < r.metrics.size(); ++i) {
    EXPECT_EQ(r.metrics[i].max_normalised, by_hand.metrics[i].max_normalised) << r.metrics[i].output;
    EXPECT_EQ(r.metrics[i].exact_matches, by_hand.metrics[i].exact_matches) << r.metrics[i].output;
  }

  Case bad = c;
  bad.forward_kernel = broken.name();
  const CaseResult rb = check_case(bwd, bad, EvaluationOptions{}, &reg);
  EXPECT_FALSE(rb.verdict.passed);
  EXPECT_TRUE(failed_check(rb, "forward")) << reasons(rb);
  EXPECT_NE(reasons(rb).find("forward kernel " + broken.name()), std::string::npos) << reasons(rb);

  Case declined = c;
  declined.forward_kernel = "cpu.fp32_seq";  // a GEMM kernel
  const CaseResult rd = check_case(bwd, declined, EvaluationOptions{}, &reg);
  EXPECT_EQ(rd.status, Disposition::NotSupported);
  EXPECT_NE(rd.message.find("forward kernel cpu.fp32_seq"), std::string::npos) << rd.message;

  Case unknown = c;
  unknown.forward_kernel = "no.such_kernel";
  EXPECT_THROW(check_case(bwd, unknown, EvaluationOptions{}, &reg), InputError);
  Case gemm;
  gemm.forward_kernel = fwd.name();
  EXPECT_THROW(validate(gemm), InputError);
}
