// The release gate: compare a run record with a checked-in baseline, case by case (matched
// by case id), and fail on failing cases, on regressions beyond slack, and on missing or
// not-run cases; a run of another campaign definition is refused. Baselines come only from
// complete, passing campaigns. Classification, the slack rule and exit codes: see
// docs/concepts/gate.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "campaign/record.hpp"

namespace ulpgate {

inline constexpr int kBaselineSchemaVersion = 2;

struct BaselineOutput {
  std::string output;  ///< "D", "O"
  Format format = Format::FP32;
  double max_normalised = 0, max_ulp = 0;
  bool operator==(const BaselineOutput&) const = default;
};

struct BaselineCase {
  std::string id, kernel, target, family;
  std::vector<BaselineOutput> outputs;
  bool operator==(const BaselineCase&) const = default;
};

struct Baseline {
  double relative_slack = 0.25;
  double absolute_slack_ulp = 1.0;
  std::string source;  ///< the command that made the run it was made from
  CampaignDefinition campaign;
  std::vector<BaselineCase> cases;
  bool operator==(const Baseline&) const = default;
};

/// A baseline from a fuzz record. InputError when the record is not a campaign, has a
/// failing case, or did not run completely (a baseline must be a complete pass).
Baseline baseline_from_record(const RunRecord& r, double relative_slack = 0.25, double absolute_slack_ulp = 1.0);
nlohmann::json to_json(const Baseline& b);
/// Validates; InputError names the field ("baseline.cases[2].outputs[0].max_ulp: must be a number").
Baseline baseline_from_json(const nlohmann::json& j);
Baseline read_baseline_file(const std::string& path);
void write_baseline_file(const std::string& path, const Baseline& b);  ///< atomic

struct GateOptions {
  bool allow_missing = false;             ///< missing and not-run cases do not fail the gate
  bool allow_different_campaign = false;  ///< compare runs of different campaigns anyway
};

struct GateRow {
  std::string what;  ///< failing, regressed, improved, new, missing, not run
  std::string id, kernel, family;
  std::string detail;  ///< the numbers that moved, or why
  bool fails = false;  ///< this row fails the gate
};

struct GateResult {
  bool failed = false;
  std::int64_t matched = 0, regressed = 0, improved = 0, new_cases = 0, missing = 0, not_run = 0, failing = 0;
  std::vector<std::string> campaign_differences;  ///< when allowed to differ
  /// Plugins whose file has other bytes than the baseline's (a rebuilt kernel), each as
  /// "NAME (HASH in the baseline, HASH in the run)": judged, not another campaign.
  std::vector<std::string> rebuilt_plugins;
  std::vector<GateRow> rows;                      ///< every case that is not plainly ok
};

/// Throws InputError when the run is not a fuzz campaign record, or (unless allowed) its
/// campaign differs from the baseline's.
GateResult gate(const Baseline& baseline, const RunRecord& run, const GateOptions& options = {});
/// The rows that are not plain "ok" (the first 40 of each kind) and a summary line.
std::string render_gate_table(const GateResult& g);
/// JUnit XML: one testcase per baseline case and per new case.
std::string render_gate_junit(const GateResult& g);

}  // namespace ulpgate
