// The release gate: compare a run record with a checked-in baseline, case by case.
//
// A baseline is made from a complete, passing fuzz campaign (`ulpgate baseline update`
// refuses anything else). It holds the campaign definition (record.hpp) and, per case id
// (record.hpp case_id: kernel + complete case JSON), the max normalised and max ULP error
// of each output. The gate
//   - refuses (InputError, exit 2) a run of another campaign definition, naming the
//     difference, unless allow_different_campaign; a plugin rebuilt under the same file
//     name (another hash, the same kernels) is the same campaign, and is named;
//   - matches cases by id and classifies every one: matched (compared with its baseline
//     numbers: ok, regressed or improved), new (not in the baseline), missing (in the
//     baseline, not in the run) or not run (in the baseline, in a target the run lists as
//     not run: the time budget ended first);
//   - fails on any failing case of the run (baseline or not), on any regression beyond
//     slack, and on missing or not-run cases unless allow_missing.
// Slack, per output of a matched case with baseline errors b (max ULP) and n (max
// normalised) in a format with F fraction bits:
//   regressed when max_ulp > b + max(relative_slack * b, absolute_slack_ulp)
//           or max_normalised > n + max(relative_slack * n, absolute_slack_ulp * 2^-F)
// (2^-F is one ULP relative to the value, and |x| <= the condition term c), so a case
// whose baseline error is 0 may still move by a rounding. Improved: the same margins the
// other way. Overflowed elements take no part in either metric (analyze.hpp).
// Exit codes: 0 pass, 1 fail, 2 bad input or a different campaign.
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
