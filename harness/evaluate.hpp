// One case end to end: generate inputs, run the kernel, compute the exact reference,
// analyze and judge. The building block of replay, sweep and fuzz.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/analyze.hpp"
#include "harness/record.hpp"
#include "harness/runner.hpp"
#include "kernels/kernel.hpp"
#include "references/gemm_reference.hpp"

namespace ulpgate {

struct EvaluationOptions {
  /// nullopt: nominal_tolerance(case) for each case.
  std::optional<ToleranceModel> tolerance;
  /// Apply the baseline rule with this CPU model (e.g. "cpu.fp32_seq"); empty: do not.
  std::optional<BaselineRule> baseline;
};

struct Evaluation {
  RunOutcome run;
  std::vector<ErrorMetrics> metrics;  ///< one per output (empty unless the run was ok)
  Verdict verdict;
  ToleranceModel tolerance;            ///< the model applied
  double baseline_max_normalised = -1; ///< the baseline model's error, when applied
  double seconds = 0;
  std::shared_ptr<const GemmReference> reference;  ///< kept for callers that need more (sweeps)
};

/// A GEMM case for a named input type: fp64, fp32 and fp16/bf16 (D fp32, compute fp32),
/// tf32 (FP32 data, compute tf32), e4m3 / e5m2 (B e4m3 for e5m2: cuBLASLt has no
/// E5M2 x E5M2); row-major with B stored N x K (the FP8 "TN" form), D fp32 unless
/// out is given. Throws InputError for an unknown name.
Case dtype_gemm_case(std::string_view dtype, std::int64_t m, std::int64_t n, std::int64_t k,
                     std::optional<Format> out = std::nullopt);
/// The input type a kernel name implies ("cublaslt.fp8_fast" -> "e4m3", "cublas.tf32" ->
/// "tf32", cpu.* -> "fp32").
std::string default_dtype(const std::string& kernel);

/// The tolerance a case's declared types imply: accumulator precision of the compute
/// format (fp32 -> 24 bits, fp16 -> 11, fp64 -> 53; tf32 compute accumulates in FP32 but
/// rounds its inputs to 11 bits), or the kernel's own declared accumulator precision
/// (KernelTraits::accumulator_bits) when it gives one.
ToleranceModel nominal_tolerance(const Case& c, const KernelTraits& traits = {});

/// The reduction length the tolerance uses (GEMM K).
std::int64_t reduction_length(const Case& c);

/// Builds the comparison of a GEMM output D against its reference.
OutputComparison compare_gemm(const Case& c, const GemmReference& ref, const Tensor& d);

/// Generates the inputs (fill_inputs; may set c.scales), runs k, and analyzes. `registry`
/// supplies the baseline model when options.baseline is set.
Evaluation evaluate(Kernel& k, Case& c, const EvaluationOptions& options, const Registry* registry = nullptr);

/// The same on given inputs (the caller filled them).
Evaluation evaluate_with_inputs(Kernel& k, const Case& c, const std::map<std::string, Tensor>& inputs,
                                const EvaluationOptions& options, const Registry* registry = nullptr);

/// The run-record entry of an evaluation (reproducer left empty for the caller to set).
CaseResult to_case_result(const Kernel& k, const Case& c, const Evaluation& ev, std::string family);

/// The family a case belongs to for gating: "gemm A->D compute dist", e.g.
/// "gemm bf16->fp32 fp32 normal(0,1)".
std::string case_family(const Case& c);

}  // namespace ulpgate
