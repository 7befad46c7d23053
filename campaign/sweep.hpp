// Sweeps: one error metric against one parameter (GEMM K, attention seq_kv) for one kernel
// and format, the fitted growth exponent, and (GEMM) the kernel's effective accumulator
// precision, measured against a calibrator run on the same inputs. Every point goes
// through the one check path (check/check.hpp). See docs/concepts/sweeps.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "check/check.hpp"
#include "check/ops/gemm.hpp"
#include "campaign/record.hpp"

namespace ulpgate {

/// Least squares fit of log y = intercept + exponent log x over the points with x, y > 0,
/// with the exponent's standard error (0 with fewer than 3 points).
PowerFit fit_power(const std::vector<double>& x, const std::vector<double>& y);

/// The metric named by `metric` ("max_normalised", "mean_normalised", "max_ulp",
/// "mean_ulp", "max_rel", "mean_rel", "normwise"); throws InputError for another name.
double metric_value(const ErrorMetrics& m, const std::string& metric);

/// What a sweep varies: GEMM "K" or attention "seq_kv", and the values.
struct SweepVary {
  std::string parameter = "K";
  std::vector<std::int64_t> values;
};

struct SweepOptions {
  Case base;                         ///< the case each point starts from (kernel set)
  std::string parameter = "K";       ///< "K" (GEMM) or "seq_kv" (attention)
  std::vector<std::int64_t> values;
  std::string metric = "mean_normalised";
  /// The output whose metric is swept (attention backward: "dQ", "dK" or "dV"); empty: the
  /// main one (D, O, dQ).
  std::string output;
  EvaluationOptions evaluation;      ///< effective_bits is set, relations cleared, per point
};

struct SweepOutcome {
  SweepSeries series;
  std::vector<double> effective_bits_per_point;
  std::vector<CaseResult> cases;  ///< one per point, for the run record
};

/// Precision cliffs (GEMM sweeps). A correct kernel's effective precision moves smoothly with
/// K: below the best estimate at smaller K by at most 1.44 bits over K = 2^8..2^16 for the
/// FP32, TF32, FP16 and BF16 cuBLASLt kernels on the H200, 3.3 bits for FP8 with fast
/// accumulation (single points), 0 for the CPU models (sweep logs of 2026-12-02); a kernel that switches to a less precise path
/// above some size (split-K partials kept in a narrow format, say) drops by several bits
/// there and stays down. The cliff starts at the first point whose estimate is more than
/// kPrecisionCliffBits below the highest estimate at any smaller value, when the next point
/// (if there is one) is also that far below it; every point that far below it fails its
/// check ("sweep:precision_cliff"). Points without an estimate are skipped.
inline constexpr double kPrecisionCliffBits = 4.0;

struct PrecisionCliff {
  std::size_t start = 0;       ///< index of the first point of the cliff
  std::size_t best = 0;        ///< index of the highest estimate before it
  std::vector<std::size_t> below;  ///< every point (index) more than the drop below the best
};
/// The cliff of a series of per-point estimates (NaN: none at that point), if there is one.
std::optional<PrecisionCliff> precision_cliff(const std::vector<double>& bits, double drop = kPrecisionCliffBits);

/// How one sweep point is checked: the isolated worker's evaluate, or check_case here.
using PointChecker = std::function<CaseResult(const Case&, const EvaluationOptions&)>;

/// Point p of the sweep (values[p]) as run_sweep checks it, and the options it checks
/// with (effective bits on, relations off): what a process checking points for another
/// (a rank of `mpirun ulpgate sweep`) needs.
Case sweep_point(const SweepOptions& options, std::size_t p);
/// What a sweep of an op's cases varies: GEMM "K", attention (forward and backward)
/// "seq_kv", attention_combine "splits".
std::string sweep_parameter(Op op);
EvaluationOptions sweep_evaluation(const SweepOptions& options);

/// Runs the sweep, each point through `check`; progress(i, n) is called after each point.
SweepOutcome run_sweep(const SweepOptions& options, const PointChecker& check,
                       const std::function<void(std::size_t, std::size_t)>& progress = {});
/// The same in this process on kernel k (tests).
SweepOutcome run_sweep(Kernel& k, const SweepOptions& options, const Registry* registry = nullptr);

/// The most points a sweep has (with FACTOR >= 2 and TO a case size, at most 32 arise).
inline constexpr std::size_t kMaxSweepPoints = 64;

/// Parses "K=256:65536" (doubling), "K=256:65536:4" (factor 4), "seq_kv=128:65536" or
/// "splits=1:256";
/// values are case sizes (at most kMaxCaseSize), points at most kMaxSweepPoints; throws
/// InputError naming the problem.
SweepVary parse_vary(const std::string& text);

}  // namespace ulpgate
