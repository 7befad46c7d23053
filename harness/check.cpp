#include "harness/check.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/profile.hpp"
#include "distributions/fill.hpp"
#include "kernels/emulated/gemm_models.hpp"

namespace ulpgate {
namespace {

// The comparison of one run's output with its exact reference, its metrics and verdict.
struct Judged {
  OutputComparison cmp;
  ErrorMetrics metrics;
  Verdict verdict;
};

// Per logical output element, whether the run's write audit found it unwritten (empty: none).
std::vector<char> unwritten_mask(const Case& c, const RunOutcome& run) {
  const auto it = run.unwritten_at.find(outputs_of(c).front());
  if (it == run.unwritten_at.end() || it->second.empty()) return {};
  const std::vector<std::int64_t> offsets = op_module(c.op).output_offsets(c);
  std::vector<char> mask(offsets.size(), 0);
  for (std::size_t e = 0; e < offsets.size(); ++e)
    mask[e] = std::binary_search(it->second.begin(), it->second.end(), offsets[e]);
  return mask;
}

// The metrics and verdict of a run whose comparison (reference included) is cmp; the
// worst element shown is a failing one where any fails.
void judge_into(Judged& j, const Case& c, const RunOutcome& run, const ToleranceModel& tol,
                double baseline_max_normalised = -1, const BaselineRule& rule = {}) {
  const OpModule& op = op_module(c.op);
  j.cmp.unwritten = unwritten_mask(c, run);
  ErrorMetrics audit;
  audit.output = outputs_of(c).front();
  audit.unwritten = run.unwritten;
  audit.padding_written = run.padding_written;
  Assessment a = analyze_and_judge(j.cmp, tol, op.reduction_length(c), audit, baseline_max_normalised, rule);
  j.metrics = std::move(a.metrics);
  j.verdict = std::move(a.verdict);
  if (j.verdict.worst_element >= 0) j.metrics.worst = describe_element(j.cmp, j.verdict.worst_element);
  if (!run.inputs_modified.empty()) {
    j.verdict.fail("inputs_modified", fmt::format("the kernel wrote to its inputs ({})", fmt::join(run.inputs_modified, ", ")));
  }
}

Judged judge_run(const Case& c, const Inputs& inputs, const RunOutcome& run, const ToleranceModel& tol) {
  Judged j;
  {
    const Phase phase("compare");
    j.cmp = op_module(c.op).compare(c, inputs, run.outputs.at(outputs_of(c).front()), tol);
  }
  const Phase phase("judge");
  judge_into(j, c, run, tol);
  return j;
}

// A run of case c against a given reference (its got codes and write audit replaced).
Judged judge_against(OutputComparison reference, const Case& c, const RunOutcome& run, const ToleranceModel& tol) {
  Judged r;
  r.cmp = std::move(reference);
  r.cmp.got = op_module(c.op).logical_output(c, run.outputs.at(outputs_of(c).front()));
  judge_into(r, c, run, tol);
  return r;
}

// Another run of the same case against j's reference (same exact output and tolerance).
Judged rejudge(const Judged& j, const Case& c, const RunOutcome& run, const ToleranceModel& tol) {
  return judge_against(j.cmp, c, run, tol);
}

// Outputs computed elsewhere, as a kernel: the runner's write audit then sees exactly what
// a kernel that wrote these values would leave (the padding keeps its poison).
class GivenOutputs final : public Kernel {
 public:
  GivenOutputs(std::string name, const std::map<std::string, Tensor>& outputs) : name_(std::move(name)), outputs_(outputs) {}
  std::string name() const override { return name_; }
  std::string description() const override { return "outputs computed elsewhere"; }
  KernelTraits traits() const override { return {}; }
  std::optional<std::string> unsupported(const Case&) const override { return std::nullopt; }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const std::vector<std::int64_t> offsets = op_module(c.op).output_offsets(c);
    for (const auto& [op, t] : outputs_) {
      const std::size_t w = storage_bytes(t.format());
      const auto* from = static_cast<const std::byte*>(t.data());
      auto* to = static_cast<std::byte*>(io.out.at(op));
      for (const std::int64_t e : offsets) std::memcpy(to + e * w, from + e * w, w);
    }
  }

 private:
  std::string name_;
  const std::map<std::string, Tensor>& outputs_;
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
    if (!j.cmp.reference_note.empty()) ev.run.notes["reference"] = j.cmp.reference_note;
    if (base && base->status == Disposition::Ok) {
      baseline = rejudge(j, c, *base, ev.tolerance).metrics.max_normalised;
      judge_into(j, c, ev.run, ev.tolerance, baseline, *rule);
    }
    ev.baseline_max_normalised = baseline;
    ev.verdict = j.verdict;
    if (options.effective_bits) {
      const Phase phase("effective_bits");
      const EffectiveBits eb = op.effective_bits(c, inputs, j.cmp, j.metrics.mean_normalised, k.traits());
      ev.effective_bits = eb.bits;
      if (std::isfinite(eb.uncertainty)) ev.run.notes["effective_bits_uncertainty"] = fmt::format("{:.3g}", eb.uncertainty);
      if (!eb.family.empty()) ev.run.notes["effective_bits_family"] = eb.family;
    }
    ev.metrics.push_back(std::move(j.metrics));
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
          j.cmp,
          [&](const Case& cc, const RunOutcome& run, OutputComparison reference) {
            const Judged r = judge_against(std::move(reference), cc, run, options.tolerance.value_or(op.tolerance(cc, k.traits())));
            return r.verdict.passed ? std::string() : r.verdict.reasons.front();
          }};
      // Repeatability holds for every op: a deterministic kernel gives the same bits twice.
      if (k.traits().deterministic) {
        const RunOutcome again = run_kernel(k, c, inputs);
        const Tensor &a = again.outputs.at(outputs_of(c).front()), &b = ev.run.outputs.at(outputs_of(c).front());
        if (again.status != Disposition::Ok || a.size_bytes() != b.size_bytes() ||
            std::memcmp(a.data(), b.data(), a.size_bytes()) != 0)
          ev.relations.push_back({"repeatability", "not bitwise repeatable: a second run gave other bits"});
      }
      for (RelationFailure& f : op.relations(ctx, c, inputs, ev.run)) ev.relations.push_back(std::move(f));
      for (const RelationFailure& f : ev.relations) ev.verdict.fail("relation:" + f.relation, f.problem);
    }
  }
  ev.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ev;
}

Evaluation evaluate(Kernel& k, Case& c, const EvaluationOptions& options, const Registry* registry) {
  const auto inputs = [&] {
    const Phase phase("inputs");
    return fill_inputs(c);
  }();
  return evaluate_with_inputs(k, c, inputs, options, registry);
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

CaseResult check_given_outputs(const Case& c, const std::map<std::string, Tensor>& outputs, const std::string& kernel) {
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
  GivenOutputs k(kernel, outputs);
  Case filled = c;  // as check_case: filling may add derived fields (amax scales, kv_lengths)
  const Inputs inputs = fill_inputs(filled);
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
