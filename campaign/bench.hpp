// `ulpgate bench`: how fast a kernel is on a case, next to how accurate that output is.
// Speed without accuracy is not a result, so every timed kernel's output is also checked
// against the exact reference. Timing method, FLOP counts and what is reported: see
// docs/dev/benchmarks.md.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/case.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

struct BenchOptions {
  int reps = 20;        ///< timed runs (at least 20 for a reported median)
  int warmup = 3;       ///< untimed runs first
  bool flush_l2 = true; ///< evict L2 before each timed run (device kernels)
  bool check = true;    ///< judge the output against the exact reference
  /// Attention backward: O and LSE from this forward kernel run on the case's Q, K, V (not
  /// judged), instead of the exact forward rounded once, which costs minutes at training
  /// sizes. Empty: the exact forward.
  std::string forward_kernel;
};

/// Order statistics of the timed runs, in milliseconds.
struct BenchTiming {
  double median_ms = 0, min_ms = 0, max_ms = 0, p10_ms = 0, p90_ms = 0;
  int reps = 0;
};
/// The statistics of a set of times (at least one): median (mean of the middle two for an
/// even count), min, max, and the 10th/90th percentiles by nearest rank.
BenchTiming timing_of(std::vector<double> ms);

/// Floating-point operations of a case as defined above.
double case_flops(const Case& c);

struct BenchRow {
  std::string kernel;
  Case c;
  std::string status = "ok";  ///< "ok", or why not run ("not supported: ...", "failed: ...")
  BenchTiming t;
  std::string timer;          ///< "cuda events" or "steady clock"
  double flops = 0, tflops = 0;
  double percent_of_baseline = -1;  ///< -1: no baseline, or this is it
  bool checked = false, passed = false, same_bits = false;
  double max_normalised = -1;
  /// GEMM: the effective accumulator precision of the checked output (bits; the fit of the
  /// kernel's model family, README "Effective bits"); NaN where not estimated.
  double effective_bits = NAN;
  std::string verdict;        ///< the first failure reason, or "pass"
  RunNotes notes;             ///< the kernel's own (algorithm, tile, ...)
};

struct BenchReport {
  std::string device;
  std::int64_t clock_before_mhz = 0, clock_after_mhz = 0;
  BenchOptions options;
  std::string baseline;
  std::vector<BenchRow> rows;
};

/// Times kernel k on case c (filled from its distributions and seed). Throws InputError
/// for a case that fails validation; a kernel that does not take the case or fails gives a
/// row with that status. forward: the kernel named by options.forward_kernel (backward cases
/// take their O and LSE from it; nullptr: from the exact forward).
BenchRow bench_kernel(Kernel& k, Case c, const BenchOptions& options, Kernel* forward = nullptr);

/// The shapes of a preset: "square" (M = N = K = 1024, 2048, 4096, 8192) or "llm"
/// (4096 x 4096 x 11008, 4096 x 11008 x 4096, 8192 x 8192 x 8192, 16 x 4096 x 4096).
/// Throws InputError for another name.
std::vector<std::array<std::int64_t, 3>> gemm_shape_preset(const std::string& name);

/// A case as the bench's tables name it: "4096x4096x4096 fp16" (GEMM, "3 x " in front for
/// a batch), "B4 H16 Sq4096 Skv4096 D128 causal fp16" (attention).
std::string bench_case_text(const Case& c);

/// Markdown: a header with the device, clocks and method, then one table row per result.
std::string bench_markdown(const BenchReport& r);
nlohmann::json bench_json(const BenchReport& r);
/// The report bench_json wrote (`ulpgate report BENCH.json` renders it again: Markdown,
/// HTML with the speed-vs-size plots). InputError naming the field for anything else.
BenchReport bench_from_json(const nlohmann::json& j);

}  // namespace ulpgate
