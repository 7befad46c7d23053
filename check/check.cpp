#include "check/check.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/profile.hpp"
#include "distributions/fill.hpp"
#include "check/ops/attention_backward.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "references/fp_env.hpp"

namespace ulpgate {
namespace {

// The comparisons of one run's outputs (outputs_of order: the main output first) with
// their exact references, their metrics, and the one verdict.
struct Judged {
  std::vector<OutputComparison> cmp;
  std::vector<ErrorMetrics> metrics;
  Verdict verdict;
};

// Per logical element of output `name`, whether the run's write audit found it unwritten
// (empty: none).
std::vector<char> unwritten_mask(const Case& c, const std::string& name, const RunOutcome& run) {
  const auto it = run.unwritten_at.find(name);
  if (it == run.unwritten_at.end() || it->second.empty()) return {};
  const std::vector<std::int64_t> offsets = op_module(c.op).output_offsets(c, name);
  std::vector<char> mask(offsets.size(), 0);
  for (std::size_t e = 0; e < offsets.size(); ++e)
    mask[e] = std::binary_search(it->second.begin(), it->second.end(), offsets[e]);
  return mask;
}

// The metrics and verdict of a run whose comparisons (references included) are j.cmp: each
// output judged on its own (the baseline rule on the main output only), the verdict every
// output's failures, its worst element and statistics the main output's where it failed,
// else the first failing output's; each output's worst element shown is a failing one where
// any fails.
void judge_into(Judged& j, const Case& c, const RunOutcome& run, const ToleranceModel& tol,
                double baseline_max_normalised = -1, const BaselineRule& rule = {}) {
  const OpModule& op = op_module(c.op);
  const std::vector<std::string> names = outputs_of(c);
  j.metrics.clear();
  j.verdict = Verdict{};
  for (std::size_t o = 0; o < j.cmp.size(); ++o) {
    OutputComparison& cmp = j.cmp[o];
    cmp.unwritten = unwritten_mask(c, names[o], run);
    ErrorMetrics audit;
    audit.output = names[o];
    const auto at = run.unwritten_at.find(names[o]);
    // The run's count where it has one output (it stands for a failed second run's too).
    audit.unwritten = names.size() == 1 ? run.unwritten : at == run.unwritten_at.end() ? 0 : static_cast<std::int64_t>(at->second.size());
    audit.padding_written = o == 0 ? run.padding_written : 0;
    Assessment a = o == 0 ? analyze_and_judge(cmp, tol, op.reduction_length(c), audit, baseline_max_normalised, rule)
                          : analyze_and_judge(cmp, tol, op.reduction_length(c), audit);
    if (a.verdict.worst_element >= 0) a.metrics.worst = describe_element(cmp, a.verdict.worst_element);
    j.metrics.push_back(std::move(a.metrics));
    if (o == 0) {
      j.verdict = std::move(a.verdict);
    } else if (!a.verdict.passed) {
      if (j.verdict.passed) j.verdict.worst_element = a.verdict.worst_element;
      for (std::size_t r = 0; r < a.verdict.reasons.size(); ++r)
        j.verdict.fail(std::move(a.verdict.checks[r]), names[o] + ": " + std::move(a.verdict.reasons[r]));
    }
  }
  if (!run.inputs_modified.empty()) {
    j.verdict.fail("inputs_modified", fmt::format("the kernel wrote to its inputs ({})", fmt::join(run.inputs_modified, ", ")));
  }
}

Judged judge_run(const Case& c, const Inputs& inputs, const RunOutcome& run, const ToleranceModel& tol) {
  const ReferenceFpEnv env;  // the reference's derived forms and the ops' bounds, whatever the caller set
  Judged j;
  {
    const Phase phase("compare");
    j.cmp = op_module(c.op).compare(c, inputs, run.outputs, tol);
  }
  const Phase phase("judge");
  judge_into(j, c, run, tol);
  return j;
}

// A run of case c against given references (their got codes and write audit replaced).
Judged judge_against(std::vector<OutputComparison> reference, const Case& c, const RunOutcome& run, const ToleranceModel& tol) {
  const ReferenceFpEnv env;
  Judged r;
  r.cmp = std::move(reference);
  const std::vector<std::string> names = outputs_of(c);
  for (std::size_t o = 0; o < r.cmp.size(); ++o) r.cmp[o].got = op_module(c.op).logical_output(c, names[o], run.outputs.at(names[o]));
  judge_into(r, c, run, tol);
  return r;
}

// Another run of the same case against j's references (same exact outputs and tolerance).
Judged rejudge(const Judged& j, const Case& c, const RunOutcome& run, const ToleranceModel& tol) {
  return judge_against(j.cmp, c, run, tol);
}

// Outputs computed elsewhere, as a kernel: the runner's write audit then sees exactly what
// a kernel that wrote these values would leave (the padding keeps its poison).
class GivenOutputs final : public Kernel {
 public:
  GivenOutputs(std::string name, const std::map<std::string, Tensor>& outputs, KernelTraits traits)
      : name_(std::move(name)), outputs_(outputs), traits_(std::move(traits)) {
    traits_.writes_lse = true;  // whatever outputs were given (check_given_outputs wants them all)
    traits_.attention_variants = kAllAttentionVariants;  // computed for the case as it is
    traits_.memory = Memory::Host;
  }
  std::string name() const override { return name_; }
  std::string description() const override { return "outputs computed elsewhere"; }
  KernelTraits traits() const override { return traits_; }
  std::optional<std::string> unsupported(const Case&) const override { return std::nullopt; }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    for (const auto& [op, t] : outputs_) {
      const std::vector<std::int64_t> offsets = op_module(c.op).output_offsets(c, op);
      const std::size_t w = storage_bytes(t.format());
      const auto* from = static_cast<const std::byte*>(t.data());
      auto* to = static_cast<std::byte*>(io.out.at(op));
      for (const std::int64_t e : offsets) std::memcpy(to + e * w, from + e * w, w);
    }
  }

 private:
  std::string name_;
  const std::map<std::string, Tensor>& outputs_;
  KernelTraits traits_;
};

}  // namespace

std::string status_check(Disposition status) { return "status:" + std::string(name(status)); }

std::string default_dtype(const std::string& kernel) {
  const auto dot = kernel.find('.');
  const std::string suffix = dot == std::string::npos ? "" : kernel.substr(dot + 1);
  if (suffix.rfind("fp8", 0) == 0) return "e4m3";
  for (const char* t : {"fp64", "fp32", "tf32", "fp16", "bf16"})
    if (suffix == t) return t;
  return "fp32";
}

ToleranceModel nominal_tolerance(const Case& c, const KernelTraits& traits) { return op_module(c.op).tolerance(c, traits); }

std::int64_t reduction_length(const Case& c) { return op_module(c.op).reduction_length(c); }

std::string case_family(const Case& c) { return op_module(c.op).family(c); }

Evaluation evaluate_with_inputs(Kernel& k, const Case& c, const Inputs& inputs, const EvaluationOptions& options,
                                const Registry* registry) {
  const auto start = std::chrono::steady_clock::now();
  const OpModule& op = op_module(c.op);
  Evaluation ev;
  ev.tolerance = options.tolerance.value_or(op.tolerance(c, k.traits()));
  {
    const Phase phase("kernel");
    ev.run = run_kernel(k, c, inputs);
  }
  if (ev.run.status != Disposition::Ok) {
    ev.verdict.passed = ev.run.status == Disposition::NotSupported;
    if (!ev.verdict.passed)
      ev.verdict.fail(status_check(ev.run.status), fmt::format("{}: {}", name(ev.run.status), ev.run.message));
  } else {
    // The baseline model runs on the same inputs and is compared with the same reference.
    double baseline = -1;
    std::optional<RunOutcome> base;
    std::optional<BaselineRule> rule = options.baseline;
    std::unique_ptr<Kernel> declared;  // the kernel's own model (KernelTraits::accumulation_model)
    if (!rule && c.op == Op::Gemm && !k.traits().accumulation_model.empty() &&
        c.gemm.batch * c.gemm.m * c.gemm.n * c.gemm.k <= kDeclaredModelTerms) {
      if (auto m = AccumulationModel::parse(k.traits().accumulation_model)) {
        // A model aligned by FP8 exponents takes the case's own FP8 formats (E4M3 x E5M2).
        const Format fa = c.types.at("A"), fb = c.types.at("B");
        if (m->align_inputs && is_fp8(m->align_format) && is_fp8(fa) && is_fp8(fb)) {
          m->align_format = fa;
          m->align_format_b = fb == fa ? std::nullopt : std::optional<Format>(fb);
        }
        declared = make_emulated_gemm(*m);
        rule = BaselineRule{m->name(), kDeclaredModelFactor};
      }
    }
    if (declared) {
      if (declared->supports(c)) base = run_kernel(*declared, c, inputs);
    } else if (rule && registry) {
      Kernel* model = registry->find(rule->model);
      if (!model) throw InputError(fmt::format("baseline model '{}' is not a kernel here", rule->model));
      if (model->supports(c)) base = run_kernel(*model, c, inputs);
    }
    Judged j = judge_run(c, inputs, ev.run, ev.tolerance);  // the reference, once
    if (!j.cmp.front().reference_note.empty()) ev.run.notes["reference"] = j.cmp.front().reference_note;
    if (base && base->status == Disposition::Ok) {
      baseline = rejudge(j, c, *base, ev.tolerance).metrics.front().max_normalised;
      judge_into(j, c, ev.run, ev.tolerance, baseline, *rule);
    }
    ev.baseline_max_normalised = baseline;
    ev.verdict = j.verdict;
    if (options.effective_bits) {
      const Phase phase("effective_bits");
      const EffectiveBits eb = op.effective_bits(c, inputs, j.cmp.front(), j.metrics.front().mean_normalised, k.traits());
      ev.effective_bits = eb.bits;
      if (std::isfinite(eb.uncertainty)) ev.run.notes["effective_bits_uncertainty"] = fmt::format("{:.3g}", eb.uncertainty);
      if (!eb.family.empty()) ev.run.notes["effective_bits_family"] = eb.family;
    }
    ev.metrics = std::move(j.metrics);
    if (options.relations && ev.verdict.passed) {
      const RelationContext ctx{
          k, [&](const Case& cc, const Inputs& in) { return run_kernel(k, cc, in); },
          [&](const Case& cc, const Inputs& in, const RunOutcome& run) {
            const Judged r = judge_run(cc, in, run, options.tolerance.value_or(op.tolerance(cc, k.traits())));
            return r.verdict.passed ? std::string() : r.verdict.reasons.front();
          },
          [&](const RunOutcome& run) {
            const Judged r = rejudge(j, c, run, ev.tolerance);
            return r.verdict.passed ? std::string() : r.verdict.reasons.front();
          },
          j.cmp.front(),
          [&](const Case& cc, const RunOutcome& run, OutputComparison reference) {
            std::vector<OutputComparison> main;
            main.push_back(std::move(reference));
            const Judged r = judge_against(std::move(main), cc, run, options.tolerance.value_or(op.tolerance(cc, k.traits())));
            return r.verdict.passed ? std::string() : r.verdict.reasons.front();
          }};
      // Repeatability holds for every op: a deterministic kernel gives the same bits twice.
      // Attention backward: dK and dV always, dQ unless it is accumulated with atomics.
      const bool backward = c.op == Op::AttentionBackward;
      if (k.traits().deterministic || backward) {
        const RunOutcome again = run_kernel(k, c, inputs);
        bool same = again.status == Disposition::Ok;
        std::string differs;
        for (const std::string& name : outputs_of(c)) {
          if (backward && name == "dQ" && k.traits().atomic_dq) continue;
          if (!same) break;
          const Tensor &a = again.outputs.at(name), &b = ev.run.outputs.at(name);
          same = a.size_bytes() == b.size_bytes() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
          if (!same) differs = name;
        }
        if (!same)
          ev.relations.push_back({"repeatability", differs.empty() ? "not bitwise repeatable: a second run failed"
                                                                   : fmt::format("not bitwise repeatable: a second run gave other bits in {}", differs)});
      }
      for (RelationFailure& f : op.relations(ctx, c, inputs, ev.run)) ev.relations.push_back(std::move(f));
      for (const RelationFailure& f : ev.relations) ev.verdict.fail("relation:" + f.relation, f.problem);
    }
  }
  ev.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ev;
}

namespace {

// A chained check's forward (Case::forward_kernel): the named kernel runs on the backward
// case's Q, K and V and is judged by the forward's own rule (no relations); where it ran, its
// O and LSE replace the exact forward's in `inputs`.
Evaluation chained_forward(const Case& c, Inputs& inputs, const Registry* registry) {
  if (c.op != Op::AttentionBackward)
    throw InputError(fmt::format("case.forward_kernel: only attention_backward cases take a forward kernel, this one is {}", name(c.op)));
  Kernel* f = registry ? registry->find(c.forward_kernel) : nullptr;
  if (!f) throw InputError(fmt::format("forward kernel '{}' is not a kernel here (see `ulpgate list`)", c.forward_kernel));
  const Case fc = forward_case(c);
  Inputs qkv;
  for (const std::string& op : fc.inputs()) qkv.insert_or_assign(op, inputs.at(op));
  EvaluationOptions options;
  options.relations = false;
  Evaluation fwd = evaluate_with_inputs(*f, fc, qkv, options, registry);
  if (fwd.run.status == Disposition::Ok)
    for (const std::string& op : c.derived_inputs()) inputs.insert_or_assign(op, fwd.run.outputs.at(op));
  return fwd;
}

}  // namespace

Evaluation evaluate(Kernel& k, Case& c, const EvaluationOptions& options, const Registry* registry) {
  Inputs inputs = [&] {
    const Phase phase("inputs");
    return case_inputs(c);
  }();
  if (c.forward_kernel.empty()) return evaluate_with_inputs(k, c, inputs, options, registry);
  const Evaluation fwd = chained_forward(c, inputs, registry);
  if (fwd.run.status != Disposition::Ok) {
    // The backward cannot run without the forward's outputs: declined or failed as the forward.
    Evaluation ev;
    ev.run.status = fwd.run.status;
    ev.run.message = fmt::format("forward kernel {}: {}", c.forward_kernel, fwd.run.message);
    ev.verdict.passed = fwd.run.status == Disposition::NotSupported;
    if (!ev.verdict.passed) ev.verdict.fail("forward", ev.run.message);
    ev.seconds = fwd.seconds;
    return ev;
  }
  Evaluation ev = evaluate_with_inputs(k, c, inputs, options, registry);
  std::vector<std::string> summary;
  for (const ErrorMetrics& m : fwd.metrics)
    summary.push_back(fmt::format("{} max {:.3g} of its bound, {} ULP", m.output, m.max_normalised, m.max_ulp_distance));
  ev.run.notes["forward"] = fmt::format("{} ({}): {}", c.forward_kernel, fwd.verdict.passed ? "passed" : "failed",
                                        fmt::join(summary, "; "));
  for (const std::string& why : fwd.verdict.reasons) ev.verdict.fail("forward", fmt::format("forward kernel {}: {}", c.forward_kernel, why));
  ev.seconds += fwd.seconds;
  return ev;
}

CaseResult to_case_result(const Kernel& k, const Case& c, const Evaluation& ev, std::string family) {
  CaseResult r;
  r.kernel = k.name();
  r.spec = c;
  r.family = std::move(family);
  r.status = ev.run.status;
  r.message = ev.run.message;
  r.notes = ev.run.notes;
  // A measured (not designed) arithmetic is said with every result of the kernel.
  if (const KernelTraits t = k.traits(); !t.arithmetic_source.empty())
    r.notes["arithmetic"] = fmt::format("accumulates with {} fraction bits{} ({})", t.accumulator_bits - 1,
                                        t.promote ? fmt::format(", promoted to FP32 every {} products", t.promote) : "",
                                        t.arithmetic_source);
  if (!ev.relations.empty()) r.notes["relation"] = ev.relations.front().relation;
  if (!std::isnan(ev.effective_bits)) r.notes["effective_bits"] = fmt::format("{:.17g}", ev.effective_bits);
  if (!std::isnan(ev.verdict.precision_ratio)) r.notes["precision_ratio"] = fmt::format("{:.4g}", ev.verdict.precision_ratio);
  if (ev.verdict.misrounded >= 0)
    r.notes["misrounded"] = fmt::format("{}/{}", ev.verdict.misrounded, ev.verdict.misrounded_allowed);
  if (!std::isnan(ev.verdict.bias)) r.notes["bias"] = fmt::format("{:.3g}/{:.3g}", ev.verdict.bias, ev.verdict.bias_allowed);
  if (!ev.tolerance.rule.empty()) r.notes["rule"] = ev.tolerance.rule;
  r.metrics = ev.metrics;
  r.verdict = ev.verdict;
  // The error map localises a failure (a tile or boundary pattern); a passing case keeps its
  // statistics and histogram only: the map was most of its record and journal bytes.
  if (r.verdict.passed)
    for (ErrorMetrics& m : r.metrics) m.map = ErrorMap{};
  r.seconds = ev.seconds;
  stamp(r);
  return r;
}

CaseResult check_case(Kernel& k, const Case& c, const EvaluationOptions& options, const Registry* registry) {
  const std::string family = case_family(c);
  try {
    Case filled = c;  // filling may add derived fields (amax scales, kv_lengths): recorded
    const Evaluation ev = [&] {
      const Phase phase("evaluate");
      return evaluate(k, filled, options, registry);
    }();
    const Phase phase("result");
    return to_case_result(k, filled, ev, family);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    // A kernel that throws something other than KernelError: this case failed; the
    // campaign goes on.
    return failed_result(k.name(), c, Disposition::Failed, fmt::format("evaluation threw: {}", e.what()));
  }
}

CaseResult check_given_outputs(const Case& c, const std::map<std::string, Tensor>& outputs, const std::string& kernel,
                               const KernelTraits& declared, const std::map<std::string, Tensor>& forward) {
  const std::vector<std::string> derived = c.derived_inputs();
  for (const auto& [op, t] : forward) {
    if (std::find(derived.begin(), derived.end(), op) == derived.end())
      throw InputError(fmt::format("forward output {} given, but {} cases derive {}", op, name(c.op),
                                   derived.empty() ? std::string("none") : fmt::format("{}", fmt::join(derived, ", "))));
    if (t.format() != c.types.at(op) || static_cast<std::int64_t>(t.size()) != operand_elements(c, op))
      throw InputError(fmt::format("forward output {}: {} {} elements given, the case needs {} {}", op, t.size(),
                                   name(t.format()), operand_elements(c, op), name(c.types.at(op))));
  }
  const std::vector<std::string> names = outputs_of(c);
  for (const std::string& op : names) {
    const auto it = outputs.find(op);
    const std::int64_t n = operand_elements(c, op);
    if (it == outputs.end()) throw InputError(fmt::format("no values given for output {}", op));
    if (it->second.format() != c.types.at(op) || static_cast<std::int64_t>(it->second.size()) != n)
      throw InputError(fmt::format("output {}: {} {} elements given, the case needs {} {}", op, it->second.size(),
                                   name(it->second.format()), n, name(c.types.at(op))));
  }
  if (outputs.size() != names.size()) throw InputError(fmt::format("values given for outputs other than {}", fmt::join(names, ", ")));
  GivenOutputs k(kernel, outputs, declared);
  Case filled = c;  // as check_case: filling may add derived fields (amax scales, kv_lengths)
  Inputs inputs = case_inputs(filled);
  for (const auto& [op, t] : forward) inputs.insert_or_assign(op, t);
  EvaluationOptions options;
  options.relations = false;
  return to_case_result(k, filled, evaluate_with_inputs(k, filled, inputs, options), case_family(c));
}

CaseResult failed_result(const std::string& kernel, const Case& c, Disposition status, std::string message) {
  CaseResult r;
  r.kernel = kernel;
  r.spec = c;
  r.family = case_family(c);
  r.status = status;
  r.message = std::move(message);
  r.verdict.fail(status_check(status), fmt::format("{}: {}", name(status), r.message));
  stamp(r);
  return r;
}

}  // namespace ulpgate
