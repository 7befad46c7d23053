// The run record: everything a run found, as versioned JSON. The harness writes and reads
// it; reports/ only renders it (Markdown, HTML, JUnit). A record read back equals the one
// written (to_json(record_from_json(j)) == j).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/analyze.hpp"
#include "core/case.hpp"
#include "harness/runner.hpp"

namespace ulpgate {

inline constexpr int kRecordSchemaVersion = 1;

/// Where the run happened.
struct Environment {
  std::string ulpgate_version, git_revision, compiler, host, started_at;  ///< started_at: ISO 8601 UTC
  std::string device;        ///< "NVIDIA H200 (sm_90, 132 SMs), CUDA driver 13.0, ..." or "no CUDA device"
  std::string driver, cuda_runtime, cublas;
  std::int64_t sm_clock_mhz = 0;  ///< current SM clock at start (0 when unknown)
  bool operator==(const Environment&) const = default;
};

/// One kernel run on one case.
struct CaseResult {
  std::string kernel;
  Case spec;                 ///< the complete case, seed included
  std::string family;        ///< what the gate compares by, e.g. "gemm bf16->fp32 normal(0,1)"
  Disposition status = Disposition::Ok;
  std::string message;       ///< why, when status is not ok
  RunNotes notes;            ///< algorithm, workspace, library version, ...
  std::vector<ErrorMetrics> metrics;  ///< one per output
  Verdict verdict;
  std::string reproducer;    ///< one command that reruns this case, e.g. "ulpgate replay cases/x.json"
  double seconds = 0;        ///< wall time of kernel + reference + analysis
};

/// A least-squares fit log(y) = intercept + exponent log(x), with the exponent's standard
/// error, over the points with y > 0.
struct PowerFit {
  double exponent = 0, exponent_stderr = 0, intercept = 0;
  std::int64_t points = 0;
};

/// One metric against one parameter for one kernel and format.
struct SweepSeries {
  std::string kernel, format, dist;
  std::string parameter;  ///< "K", "seq_kv" or "magnitude"
  std::string metric;     ///< "max_normalised", "mean_normalised", "max_ulp", ...
  std::vector<double> x, y;
  PowerFit fit;
  double effective_bits = 0;  ///< estimated accumulator precision (see sweep.hpp)
};

struct RunRecord {
  int version = kRecordSchemaVersion;
  std::string kind;  ///< "fuzz", "sweep", "replay", "check"
  std::uint64_t seed = 0;
  std::string command;  ///< the command line that produced it
  Environment environment;
  ToleranceModel tolerance;
  BaselineRule baseline;
  std::vector<CaseResult> cases;
  std::vector<SweepSeries> sweeps;
};

nlohmann::json to_json(const RunRecord& r);

// The pieces of a record on their own, for the isolation worker's protocol and the journal
// (harness/isolate.hpp, harness/journal.hpp). `path` prefixes every InputError message.
nlohmann::json case_result_to_json(const CaseResult& c);
CaseResult case_result_from_json(const nlohmann::json& j, const std::string& path);
nlohmann::json tolerance_to_json(const ToleranceModel& t);
ToleranceModel tolerance_from_json(const nlohmann::json& j, const std::string& path);
nlohmann::json baseline_to_json(const BaselineRule& b);
BaselineRule baseline_from_json(const nlohmann::json& j, const std::string& path);

/// Parses and validates; InputError names the offending field ("record.cases[3].status:
/// unknown status 'meh'"), and an unknown version is refused with the version found.
RunRecord record_from_json(const nlohmann::json& j);
RunRecord read_record_file(const std::string& path);
/// Writes atomically (temporary file + rename): a reader never sees half a record.
void write_record_file(const std::string& path, const RunRecord& r);

/// The environment of this process (device fields from kernels/device.hpp).
Environment capture_environment();

/// The source revision this build was made from: 12 hex digits, "-dirty" when tracked files
/// differed from that commit, or "unknown" (generated at build time by
/// cmake/git_revision.cmake; $ULPGATE_GIT_REVISION at build time overrides it).
const char* git_revision();

}  // namespace ulpgate
