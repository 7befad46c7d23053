// Sweeps: one error metric against one parameter (GEMM K) for one kernel and format, the
// fitted growth exponent, and the kernel's effective accumulator precision.
//
// Effective precision. For an accumulator that rounds to t bits with errors that behave
// like independent rounding errors, the mean error normalised by the condition term
// scales as 2^-t. A calibrator (sequential RNE accumulation rounding every partial sum to
// kCalibrationBits bits, run on the same inputs, its result not rounded further) measures
// the data's own constant, so
//     effective_bits = kCalibrationBits + log2(calibrator mean_normalised /
//                                               kernel mean_normalised)
// per sweep point; the series reports the median over the points. Data with few bits
// (FP8 inputs) can make the calibrator exact: then it steps down 4 bits at a time (to 12)
// until it is not, keeping n 2^-bits <= 1/16 so that its errors stay independent. FP32 with RNE comes out
// near 24; an accumulator whose errors grow faster than independent rounding (biased
// truncation on all-positive data) comes out lower, and lower as K grows: that is a
// finding, visible per point.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/evaluate.hpp"
#include "harness/record.hpp"

namespace ulpgate {

inline constexpr int kCalibrationBits = 32;  // n 2^-32 << 1 for every K we sweep

/// Least squares fit of log y = intercept + exponent log x over the points with x, y > 0,
/// with the exponent's standard error (0 with fewer than 3 points).
PowerFit fit_power(const std::vector<double>& x, const std::vector<double>& y);

/// sum_k a[k] b[k] accumulated sequentially, each partial sum rounded to nearest (ties to
/// even) at `bits` bits of precision (2..52): the calibrator above.
double calibration_dot(const double* a, const double* b, std::int64_t k, int bits);

/// The metric named by `metric` ("max_normalised", "mean_normalised", "max_ulp",
/// "mean_ulp", "max_rel", "mean_rel", "normwise"); throws InputError for another name.
double metric_value(const ErrorMetrics& m, const std::string& metric);

struct SweepOptions {
  Case base;                         ///< GEMM case; K is replaced by each value
  std::vector<std::int64_t> values;  ///< K values
  std::string metric = "mean_normalised";
  EvaluationOptions evaluation;
};

struct SweepOutcome {
  SweepSeries series;
  std::vector<double> effective_bits_per_point;
  std::vector<CaseResult> cases;  ///< one per point, for the run record
};

/// Runs the sweep; progress(i, n) is called after each point.
SweepOutcome run_sweep(Kernel& k, const SweepOptions& options, const Registry* registry = nullptr,
                       const std::function<void(std::size_t, std::size_t)>& progress = {});

/// Parses "K=256:65536" (doubling) or "K=256:65536:4" (factor 4) into K values; throws
/// InputError naming the problem.
std::vector<std::int64_t> parse_vary(const std::string& text);

}  // namespace ulpgate
