// Fuzz campaigns: RapidCheck properties over generated cases for kernels x input types,
// GEMM and attention alike (harness/ops). Each generated case goes through the one check
// path (harness/check.hpp) in the isolated worker: the verdict (tolerance, NaN/Inf, write
// audit) and the op's metamorphic relations. A failure shrinks (RapidCheck) to a minimal
// case, saved as case JSON in the corpus folder with the RapidCheck reproduce string;
// later campaigns replay the corpus first. Seeds: the campaign seed makes every target's
// RapidCheck seed, so a campaign is reproducible from the printed seed and budget.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/isolate.hpp"
#include "harness/record.hpp"

namespace ulpgate {

struct FuzzTarget {
  std::string kernel;
  std::string dtype;  ///< GEMM: fp64, fp32, tf32, fp16, bf16, e4m3, e5m2; attention: fp32, fp16, bf16, e4m3
  Op op = Op::Gemm;
};

struct FuzzOptions {
  std::vector<FuzzTarget> targets;  ///< empty: every kernel here x every dtype it supports
  std::int64_t cases = 30;          ///< cases per target
  double seconds = 0;               ///< wall-clock budget for the whole campaign (0: none)
  std::uint64_t seed = 1;
  std::int64_t max_k = 4096;        ///< largest K generated
  std::string corpus_dir;           ///< saved failures, replayed first ("" : none)
  EvaluationOptions evaluation;
  bool metamorphic = true;
  /// Draw GELU epilogues too (their certified reference costs up to seconds per case).
  bool gelu = true;
  /// Kernel calls in a worker process with a timeout (crashes and hangs become results);
  /// nullopt: in this process.
  std::optional<IsolationOptions> isolation;
  /// The worker to use (the one whose stand-ins the registry holds); nullptr: run_fuzz
  /// starts its own from `isolation`. Its supports() failures join the record.
  IsolatedEvaluator* evaluator = nullptr;
  /// Append every result to this JSONL journal ("": none); with resume, reuse the results
  /// an interrupted run of the same campaign journaled.
  std::string journal_path;
  bool resume = false;
};

/// Every (kernel, dtype, op) of the registry whose kernel supports the op's basic case of
/// the dtype.
std::vector<FuzzTarget> all_targets(const Registry& registry);

struct FuzzProgress {
  std::int64_t cases = 0, failures = 0, total = 0;
  double elapsed = 0;
};

/// Runs the campaign; returns the run record (kind "fuzz"). progress is called after each
/// case; log receives one line per event worth printing (failures, corpus saves).
RunRecord run_fuzz(Registry& registry, const FuzzOptions& options,
                   const std::function<void(const FuzzProgress&)>& progress = {},
                   const std::function<void(const std::string&)>& log = {});

/// Evaluates one case file's case on its kernel (case.kernel) and returns the record entry.
CaseResult replay_case(Registry& registry, Case c, const EvaluationOptions& options);

}  // namespace ulpgate
