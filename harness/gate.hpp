// The release gate: compare a run record with a checked-in baseline, per (kernel, case
// family), and say what moved.
//
// A baseline entry holds, for one kernel and family: the number of cases, how many failed
// their verdict, and the largest max_normalised and max_ulp errors. A run regresses when,
// for some entry,
//   - a family that had no failing case now has one ("new failure"), or
//   - its max_normalised or max_ulp exceeds baseline * (1 + relative_slack) +
//     absolute_slack (the slack is stored in the baseline file).
// Families the run lacks are reported as "missing" and families the baseline lacks as
// "new"; neither fails the gate (a changed campaign is not a numerical regression), but
// both are printed. Exit codes: 0 pass, 1 regression, 2 bad input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/record.hpp"

namespace ulpgate {

inline constexpr int kBaselineSchemaVersion = 1;

struct BaselineEntry {
  std::string kernel, family;
  std::int64_t cases = 0, failed = 0;
  double max_normalised = 0, max_ulp = 0;
  bool operator==(const BaselineEntry&) const = default;
};

struct Baseline {
  double relative_slack = 0.25;
  double absolute_slack = 0.0;
  std::string source;  ///< what it was made from (the run's command and seed)
  std::vector<BaselineEntry> entries;
  bool operator==(const Baseline&) const = default;
};

/// Aggregates a run record into baseline entries (cases not run - not supported - are left out).
Baseline baseline_from_record(const RunRecord& r, double relative_slack = 0.25, double absolute_slack = 0.0);
nlohmann::json to_json(const Baseline& b);
/// Validates; InputError names the field ("baseline.entries[2].max_ulp: must be a number").
Baseline baseline_from_json(const nlohmann::json& j);
Baseline read_baseline_file(const std::string& path);
void write_baseline_file(const std::string& path, const Baseline& b);  ///< atomic

struct GateRow {
  std::string kernel, family, what;  ///< what: ok, improved, regressed, new failure, missing, new
  std::string detail;                ///< the numbers that moved
  bool regression = false;
};

struct GateResult {
  bool regression = false;
  std::vector<GateRow> rows;
};

GateResult gate(const Baseline& baseline, const RunRecord& run);
/// A fixed-width table of the rows that are not plain "ok", and a summary line.
std::string render_gate_table(const GateResult& g);
/// JUnit XML: one testcase per baseline family.
std::string render_gate_junit(const GateResult& g);

}  // namespace ulpgate
