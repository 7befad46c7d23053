// One module per op (GEMM, attention): everything the one check path (check/check.hpp),
// the fuzz campaign and sweeps need to know about an op, and nothing they do themselves.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <rapidcheck.h>

#include "core/case.hpp"
#include "core/tensor.hpp"
#include "check/analyze.hpp"
#include "check/runner.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

using Inputs = std::map<std::string, Tensor>;

/// What the generators may draw.
struct GenLimits {
  std::int64_t max_reduction = 4096;  ///< largest GEMM K / attention seq_kv (small regime)
  bool gelu = true;                   ///< GEMM: GELU epilogues (their reference costs more)
  /// The large regime (docs/concepts/sizes.md): shapes where kernels switch paths, log-spread
  /// up to kLargeReduction (GEMM K, attention seq_kv) and GEMM M, N >= 2048 with ragged
  /// tails, within kLargeTermBudget; max_reduction does not apply.
  bool large = false;
  /// Which of the op's large-regime shape kinds to draw (GEMM: 0 long K, 1 wide, 2 long K,
  /// 3 skinny, 4 batched; attention draws at random), -1: any, at random. Campaigns rotate
  /// it (campaign/fuzz.cpp), so that even two large cases of a target reach different paths.
  int large_kind = -1;
  /// Small regime: draw the structure where plausible wrong index mappings read other
  /// elements than the right ones (attention: grouped heads with 1 < kv_heads < heads, BSHD,
  /// two or three batches of unequal kv_lengths, seq_q != seq_kv, LSE). Campaigns set it
  /// on some cases of every target (campaign/fuzz.cpp case_limits), so each seed has them.
  bool mapping = false;
  /// Attention backward: the forward kernel each case names (Case::forward_kernel; "": the
  /// exact forward rounded once).
  std::string forward_kernel{};
};

/// The large regime's longest reduction (GEMM K, attention seq_kv).
inline constexpr std::int64_t kLargeReduction = 65536;
/// The large regime's cost cap: GEMM batch x M x N x K exact terms (about 0.15 s of one
/// core's reference; FP64 takes 1/32 of it), attention batch x heads x seq_q x seq_kv x
/// (head_dim + head_dim_v) (attention cases also meet a cap on their reference's seconds,
/// check/ops/attention.cpp, which binds first).
inline constexpr std::int64_t kLargeTermBudget = std::int64_t{1} << 27;

/// A relation that did not hold: its name ("repeatability", "scaling", ...) and what broke.
struct RelationFailure {
  std::string relation, problem;
};

/// What relations may do besides looking at the inputs and the first run: run the kernel
/// again, and check a run of another case from scratch (reference and verdict).
struct RelationContext {
  Kernel& kernel;
  std::function<RunOutcome(const Case&, const Inputs&)> run;
  /// The verdict's first reason for a run of case c on inputs, "" if it passed.
  std::function<std::string(const Case& c, const Inputs& inputs, const RunOutcome& run)> judge;
  /// The same for a run of the first case on inputs with the same exact output and the
  /// same tolerance (a permutation, say): the first run's reference is reused.
  std::function<std::string(const RunOutcome& run)> judge_same;
  /// The first run's comparison of its main output (D, O): its reference (exact values,
  /// condition terms, bounds).
  const OutputComparison& first;
  /// The verdict's first reason for a run of case c judged against a given reference of its
  /// main output (c's tolerance; the got codes and the write audit from the run): for a
  /// related case whose exact output is a rearrangement of the first one's, computed without
  /// a new reference. Other outputs (LSE) are not judged.
  std::function<std::string(const Case& c, const RunOutcome& run, OutputComparison reference)> judge_against;
  /// Runs case c on inputs and judges the run: the verdict's first reason ("" if it passed),
  /// or the run's status and message where it did not run.
  std::string run_and_judge(const Case& c, const Inputs& inputs) const;
};

/// An effective accumulator precision (bits, the implicit one included) with its standard
/// uncertainty (NaN where not estimated) and the model family it was fitted in.
struct EffectiveBits {
  double bits = NAN;
  double uncertainty = NAN;
  std::string family;
};

/// An arithmetic the default rule of an op admits for an input type without a declaration
/// (docs: the precision rule's admitted arithmetics): what it is, and a CPU model that
/// computes it (a kernel name; empty: none here). Tests run every model as an undeclared
/// kernel over 20 seeds of the default campaign and allow no failure.
struct AdmittedArithmetic {
  std::string what;
  std::string model;
};

class OpModule {
 public:
  virtual ~OpModule() = default;
  virtual Op op() const = 0;
  /// The input types a campaign can target ("fp32", "bf16", ...), simplest first.
  virtual std::vector<std::string> dtypes() const = 0;
  /// The small packed case of a dtype that decides whether a kernel is a target.
  /// Throws InputError for a dtype this op does not have.
  virtual Case basic_case(std::string_view dtype) const = 0;
  /// The formats the generator may draw the main output (D, O) in for a dtype, the basic
  /// case's first.
  virtual std::vector<Format> output_formats(std::string_view dtype) const = 0;
  /// basic_case(dtype) with each of output_formats(dtype): a kernel that supports any of
  /// them (many take only their input format out) is a target of the dtype.
  std::vector<Case> basic_cases(std::string_view dtype) const;
  /// The output format of the first of basic_cases(dtype) that k supports; nullopt: none.
  /// Generated cases for k start from it.
  std::optional<Format> supported_output(const Kernel& k, std::string_view dtype) const;
  /// Generated cases of a dtype for kernel k, each choice kept only where k supports it
  /// (k nullptr: no filtering, every dtype when dtype is empty).
  virtual rc::Gen<Case> generate(std::string_view dtype, const Kernel* k, const GenLimits& limits) const = 0;
  /// Adds the inputs the case derives from its generated ones (Case::derived_inputs():
  /// attention backward's O and LSE); the other ops derive none.
  virtual void derive_inputs(const Case&, Inputs&) const {}
  /// What the gate compares by, e.g. "gemm bf16->fp32 fp32 normal(0,1)".
  virtual std::string family(const Case& c) const = 0;
  /// The length of the reduction errors grow with (GEMM K, attention seq_kv).
  virtual std::int64_t reduction_length(const Case& c) const = 0;
  /// The tolerance model the declared types and the kernel's traits imply.
  virtual ToleranceModel tolerance(const Case& c, const KernelTraits& traits) const = 0;
  /// What the default rule admits for a dtype of dtypes() (see AdmittedArithmetic).
  virtual std::vector<AdmittedArithmetic> admitted(std::string_view dtype) const = 0;
  /// The exact references of the case's outputs (outputs_of(c), in that order; one
  /// reference computation for all of them), each compared with the kernel's tensor of that
  /// name in `outputs`: per element the code, the reference, the condition term and the
  /// allowed error.
  virtual std::vector<OutputComparison> compare(const Case& c, const Inputs& inputs,
                                                const std::map<std::string, Tensor>& outputs,
                                                const ToleranceModel& tol) const = 0;
  /// The buffer offset of each element of output `output`, in logical order (GEMM D (b, i, j),
  /// attention O (b, h, i, d), LSE (b, h, i)).
  virtual std::vector<std::int64_t> output_offsets(const Case& c, const std::string& output) const = 0;
  /// An output's codes in logical order.
  UninitVector<Code> logical_output(const Case& c, const std::string& output, const Tensor& t) const;
  /// Runs the op's metamorphic relations that apply to a case whose first run passed
  /// (repeatability, common to every op, is checked by check/check).
  virtual std::vector<RelationFailure> relations(const RelationContext& ctx, const Case& c, const Inputs& inputs,
                                                 const RunOutcome& first) const = 0;
  /// The effective accumulator precision at one sweep point (docs/concepts/sweeps.md), NaN where
  /// the op has no calibrator; the kernel's traits choose the model family (round to
  /// nearest: a sequential accumulation; otherwise the block-FMA family, truncating).
  virtual EffectiveBits effective_bits(const Case& c, const Inputs& inputs, const OutputComparison& cmp,
                                       double kernel_mean_normalised, const KernelTraits& traits) const = 0;
};

/// The precision terms every op's tolerance starts from: the accumulator precision of the
/// compute format (fp32 -> 24 bits, fp16 -> 11, bf16 -> 8, fp64 -> 53; tf32 accumulates in
/// FP32 but rounds its inputs to 11 bits), or the kernel's declared accumulator precision,
/// and the accumulator's smallest subnormal.
ToleranceModel precision_terms(const Case& c, const KernelTraits& traits);

/// The formats in order, each once.
std::vector<Format> distinct_formats(const std::vector<Format>& formats);

/// What the default rule admits for FP8 inputs without a declaration: the tensor cores'
/// accumulator of 13 fraction bits (14 bits of precision, truncated), promoted to an FP32
/// accumulator every 128 products (DeepSeek-V3's interval, CUTLASS's and cuBLASLt's without
/// fast accumulation). A kernel that never promotes declares it (KernelTraits::promote = 0
/// with accumulator_bits = 14).
inline constexpr int kFp8AccumulatorBits = 14;
inline constexpr int kFp8PromoteInterval = 128;

/// "OP IN->OUT COMPUTE DIST", the gate family of a case: e.g. "gemm bf16->fp32 fp32 normal(0,1)".
std::string op_family(const Case& c, const char* op, const char* in, const char* out);

/// Every input of a case: its generated ones (fill_inputs, which may write derived case
/// fields: amax scales, kv_lengths) and those its op derives from them (derive_inputs).
Inputs case_inputs(Case& c);

/// The module of an op.
const OpModule& op_module(Op op);
/// Every op's module, GEMM first.
std::vector<const OpModule*> all_op_modules();

/// Up to `afford` of the indices 0..n-1 (all of them when afford >= n), sorted: the first
/// two, the last four, both sides of the last 64- and 128-index tile boundaries, then
/// indices spread evenly (offset by seed). The rows an op judges in full where it cannot
/// afford them all (attention's referenced queries, GEMM's precision rows).
std::vector<std::int64_t> edge_and_spread_sample(std::int64_t n, std::int64_t afford, std::uint64_t seed);

}  // namespace ulpgate
