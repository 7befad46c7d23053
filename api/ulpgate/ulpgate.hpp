// ulpgate's C++ API, for GoogleTest and RapidCheck suites: build a case, run a kernel on it
// through the one check path (check/check.hpp), get the verdict and its metrics. Link
// ulpgate::ulpgate (docs/guide/cpp.md); the types it uses are the library's own.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/format.hpp"
#include "check/analyze.hpp"
#include "check/check.hpp"
#include "check/ops/op.hpp"
#include "campaign/record.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

/// Operand name -> the values of its elements in logical order, as fill_inputs
/// indexes them: GEMM op(A) [b][i][k], op(B) [b][k][j], C and D [b][i][j], bias [j];
/// attention Q, K, V, O [b][h][s][d] (K and V with their own heads), LSE [b][h][i]. Layout,
/// transposes and leading dimensions are undone. Every format's value is exact in a double; FP8 values
/// are the stored ones (Case::scales say the scale).
using Values = std::map<std::string, std::vector<double>>;

/// A GEMM case D = alpha op(A) op(B) + beta C (core/case.hpp), as gemm_case builds it.
struct GemmOptions {
  std::int64_t m = 1, n = 1, k = 1, batch = 1;
  std::string dtype = "fp32";    ///< A and B's format
  std::string out = "";          ///< D's format; "": fp32 (fp64 for fp64 inputs)
  std::string compute = "";      ///< the accumulation's format; "": fp32 (fp64 for fp64 inputs)
  std::string layout = "row";    ///< "row" or "col"
  bool trans_a = false, trans_b = false;
  double alpha = 1, beta = 0;    ///< beta != 0 adds C, of D's format
  std::string epilogue = "none"; ///< "bias", "relu", "gelu", ...: a bias adds a bias of D's format
  std::string dist = "normal(0,1)";  ///< every input's distribution (docs/concepts/cases.md)
  std::uint64_t seed = 1;
};

/// An attention case O = softmax(scale Q K^T + mask) V (core/case.hpp), as attention_case builds it.
struct AttentionOptions {
  std::int64_t seq_q = 1, seq_kv = 1, head_dim = 64, batch = 1, heads = 1;
  std::int64_t kv_heads = 0, head_dim_v = 0;  ///< 0: heads, head_dim
  std::string dtype = "fp16";    ///< Q, K and V's format
  std::string out = "";          ///< O's format; "": dtype
  bool lse = false;              ///< the log-sum-exp output LSE too (FP32, core/case.hpp)
  std::string compute = "fp32";
  std::string layout = "bhsd";   ///< "bhsd" or "bshd"
  bool causal = false;
  std::optional<double> softmax_scale = std::nullopt;  ///< nullopt: 1/sqrt(head_dim)
  std::vector<std::int64_t> kv_lengths = {};           ///< one per batch; empty: all seq_kv
  std::string dist = "normal(0,1)";
  std::uint64_t seed = 1;
};

/// The case the options describe, validated (InputError names a bad field), e.g.
/// gemm_case({.m = 64, .n = 32, .k = 1000, .dtype = "bf16", .out = "bf16"}).
Case gemm_case(const GemmOptions& o);
/// The same for attention, e.g. attention_case({.seq_q = 128, .seq_kv = 128, .causal = true}).
Case attention_case(const AttentionOptions& o);

/// A case's inputs as its seed and distributions fill them. `filled`, if given, receives
/// the case as filled (FP8 amax scales and masked kv_lengths are drawn while filling).
Values inputs(const Case& c, Case* filled = nullptr);

/// The case's exact outputs rounded to double, in logical order: {"D": ...} or {"O": ...}
/// (and "LSE" where the case asks for it).
/// Every element, even of long attention prefills (whose checks sample rows).
Values reference(const Case& c);

/// A host kernel: computes `outputs` (already sized, in logical order) from `inputs` of the
/// filled case c (the relations call it again on other inputs). Each output value is rounded to nearest even into the output's format
/// (exact when it is already a value of that format); an element left as given (a marker
/// NaN) is reported unwritten. Throw KernelError to fail the run with a message.
using HostFunction = std::function<void(const Case& c, const Values& inputs, Values& outputs)>;

/// Which cases a kernel computes: nullopt if it computes c, else why not. Empty: every case.
using Supports = std::function<std::optional<std::string>(const Case& c)>;

/// The cases a plain kernel computes, as Python's ulpgate.plain: GEMM D = op(A) op(B) (alpha
/// 1, beta 0, no epilogue) and attention without causal mask, kv_lengths, grouped K/V heads or
/// a softmax scale of its own.
std::optional<std::string> plain(const Case& c);

/// A host function as a kernel named `name`, for run() and gen_case(); `supports` decides
/// which generated cases it gets, `traits` what the tolerance assumes (KernelTraits).
std::unique_ptr<Kernel> host_kernel(HostFunction f, std::string name = "host", Supports supports = plain,
                                    KernelTraits traits = {});

/// Cases drawn by the op's own generator (the fuzz campaign's: shapes on tile edges, layouts,
/// distributions; shrinking towards the simplest failing case), for RC_GTEST_PROP. With a
/// kernel, only what it supports; dtype as `ulpgate list` names them ("fp32", "bf16", ...).
rc::Gen<Case> gen_case(Op op, const std::string& dtype, const Kernel* kernel = nullptr, const GenLimits& limits = {});

/// A verdict with its numbers.
struct Result {
  /// The kernel ran on the case and met every check (a case it does not support is no pass).
  bool passed = false;
  /// Why not, one line each, e.g. "436 elements exceed the tolerance (worst 170x the bound; ...)".
  std::vector<std::string> reasons;
  /// One per output: max_ulp, max_normalised, max_abs, unexpected_nan, unwritten, worst, ...
  std::vector<ErrorMetrics> metrics;
  /// The run record's entry: the case as run, status, checks, notes, seconds.
  CaseResult record;
  /// PASS or FAIL, the kernel, the metrics and the reasons on one line, then the case's
  /// JSON (case_from_json reads it; `ulpgate replay` too, with "kernel" set).
  std::string summary() const;
};

/// Checks kernel k on case c: inputs filled, k run, the op's relations (repeatability,
/// scaling, transposition, ...) run, the exact reference computed, one verdict.
Result run(Kernel& k, const Case& c, const EvaluationOptions& options = {});
/// The same with a host function as the kernel (whatever the case: no Supports asked, LSE
/// computed where the case asks for it).
Result run(const HostFunction& f, const Case& c, const EvaluationOptions& options = {});
/// The same with a kernel of `ulpgate list` by name ("cpu.fp32_seq", "cublaslt.bf16", ...);
/// InputError if there is none by that name here. Each call builds the registry (and a
/// library kernel its handle): for many runs, resolve the name once in builtin_registry().
Result run(const std::string& kernel, const Case& c, const EvaluationOptions& options = {});

/// Judges outputs computed elsewhere (logical order, one vector per output, rounded as a
/// HostFunction's are) as `ulpgate check --outputs` does: no relations, nothing is rerun.
/// `declared`: the arithmetic their kernel is known to have (e.g. p_bits for an attention
/// that rounds P, as FlashAttention does), for the tolerance.
Result check(const Case& c, const Values& outputs, const std::string& kernel = "external:c++",
             const KernelTraits& declared = {});

/// Writes r.summary(): `EXPECT_TRUE(r.passed) << r;`.
std::ostream& operator<<(std::ostream& os, const Result& r);

}  // namespace ulpgate
