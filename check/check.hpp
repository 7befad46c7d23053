// The one check path: a case is checked here, once. In order: the inputs are filled (a
// pure function of the case), the kernel runs, the op's relations make their extra kernel
// calls, the exact reference is computed, and one verdict is given. fuzz, replay and sweep
// all come here, in the isolated worker (campaign/isolate.hpp) unless told otherwise.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "check/analyze.hpp"
#include "check/ops/attention.hpp"
#include "check/ops/gemm.hpp"
#include "check/ops/op.hpp"
#include "check/result.hpp"
#include "check/runner.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

struct EvaluationOptions {
  /// nullopt: the op's nominal tolerance for each case (OpModule::tolerance).
  std::optional<ToleranceModel> tolerance;
  /// Apply the baseline rule with this CPU model (e.g. "cpu.fp32_seq"); empty: do not.
  std::optional<BaselineRule> baseline;
  /// Run the op's metamorphic relations on a case that passed.
  bool relations = true;
  /// Sweeps: estimate the effective accumulator precision (notes["effective_bits"]).
  bool effective_bits = false;
};

struct Evaluation {
  RunOutcome run;
  std::vector<ErrorMetrics> metrics;  ///< one per output (empty unless the run was ok)
  Verdict verdict;
  ToleranceModel tolerance;            ///< the model applied
  double baseline_max_normalised = -1; ///< the baseline model's error, when applied
  std::vector<RelationFailure> relations;  ///< the relations that did not hold
  double effective_bits = NAN;         ///< with options.effective_bits
  double seconds = 0;
};

/// The check token of a run that gave no output ("status:crashed"; see Verdict).
std::string status_check(Disposition status);

/// The input type a kernel name implies ("cublaslt.fp8_fast" -> "e4m3", "cublas.tf32" ->
/// "tf32", cpu.* -> "fp32").
std::string default_dtype(const std::string& kernel);

/// The tolerance a case's declared types and the kernel's traits imply (the op's).
ToleranceModel nominal_tolerance(const Case& c, const KernelTraits& traits = {});

/// The reduction length the tolerance uses (GEMM K, attention seq_kv).
std::int64_t reduction_length(const Case& c);

/// The family a case belongs to for gating, e.g. "gemm bf16->fp32 fp32 normal(0,1)".
std::string case_family(const Case& c);

/// Checks case c on kernel k: fills the inputs (fill_inputs; may set c.scales and
/// kv_lengths), then as evaluate_with_inputs. `registry` supplies the baseline model.
Evaluation evaluate(Kernel& k, Case& c, const EvaluationOptions& options, const Registry* registry = nullptr);

/// The same on given inputs (the caller filled them).
Evaluation evaluate_with_inputs(Kernel& k, const Case& c, const Inputs& inputs, const EvaluationOptions& options,
                                const Registry* registry = nullptr);

/// Judges outputs computed elsewhere (`ulpgate check --outputs`) as a run of a kernel named
/// `kernel` (e.g. "external:D.npy"): the inputs filled as for a kernel, then
/// evaluate_with_inputs on a kernel whose run copies each output's logical elements from
/// `outputs` (buffers laid out as gemm_view()/attention_view() say; their padding is not
/// read), with default traits and no relations (nothing can be run again). InputError
/// when an output is missing or of another format or size.
/// `declared`: the arithmetic the outputs' kernel is known to have (e.g. p_bits for an
/// attention that rounds P, as FlashAttention does), for the tolerance model; default: none.
/// `forward`: attention backward, the forward's outputs (O, and LSE where known) the
/// backward was computed from, in place of the derived ones (the exact forward rounded
/// once); the check measures how far they are from the exact forward and allows for it.
CaseResult check_given_outputs(const Case& c, const std::map<std::string, Tensor>& outputs, const std::string& kernel,
                               const KernelTraits& declared = {}, const std::map<std::string, Tensor>& forward = {});

/// The run-record entry of an evaluation (reproducer left empty for the caller to set);
/// a relation that failed is named in notes["relation"]. A passing case's metrics carry no
/// error map (ErrorMetrics::map empty): maps are kept for failing cases.
CaseResult to_case_result(const Kernel& k, const Case& c, const Evaluation& ev, std::string family);

/// The record of a case that gave no outputs (it threw, crashed, hung): status, message,
/// and the verdict "STATUS: message", family case_family(c).
CaseResult failed_result(const std::string& kernel, const Case& c, Disposition status, std::string message);

/// evaluate + to_case_result, with anything a kernel throws besides KernelError (and
/// InputError, which is the case's fault) turned into a failed result.
CaseResult check_case(Kernel& k, const Case& c, const EvaluationOptions& options, const Registry* registry = nullptr);

}  // namespace ulpgate
