// The run record: everything a run found, as versioned JSON. The harness writes and reads
// it; reports/ only renders it (Markdown, HTML, JUnit). A record read back equals the one
// written (to_json(record_from_json(j)) == j).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "check/analyze.hpp"
#include "check/result.hpp"
#include "core/case.hpp"
#include "check/runner.hpp"

namespace ulpgate {

inline constexpr int kRecordSchemaVersion = 2;

/// Where the run happened.
struct Environment {
  std::string ulpgate_version, git_revision, compiler, host, started_at;  ///< started_at: ISO 8601 UTC
  std::string device;        ///< "NVIDIA H200 (sm_90, 132 SMs), CUDA driver 13.0, ..." or "no CUDA device"
  std::string driver, cuda_runtime, cublas;
  std::int64_t sm_clock_mhz = 0;  ///< current SM clock at start (0 when unknown)
  bool operator==(const Environment&) const = default;
};

/// A plugin library as a campaign names it: its file name and a hash of its bytes, so that
/// a rebuilt plugin is a different campaign input even under the same name.
struct PluginIdentity {
  std::string name;  ///< file name, e.g. "example_plugin.so"
  std::string hash;  ///< "fnv1a64:" and 16 hex digits of the file's contents
  bool operator==(const PluginIdentity&) const = default;
};

/// Everything that decides which cases a campaign runs and how they are judged. Two records
/// with equal definitions ran (or were meant to run) the same cases: the gate compares
/// only such records unless told otherwise. Where it ran (device, git revision, time budget)
/// is not part of it: the budget decides only how much of the campaign ran (RunRecord::not_run).
/// How a fuzz campaign spreads each target's cases over the size regimes (README "Size
/// regimes"): small draws every case from the small regime (K <= max_k, M and N <= 96);
/// realistic, the default, draws every fifth case from the large regime (campaign/fuzz.hpp
/// large_case) and the rest from the small one; large draws every case from the large one.
enum class SizeSchedule : std::uint8_t { Small, Realistic, Large };
std::string_view name(SizeSchedule s);
/// "small", "realistic" or "large"; nullopt otherwise.
std::optional<SizeSchedule> parse_size_schedule(std::string_view s);

struct CampaignDefinition {
  std::string kind;      ///< "fuzz" ("" : a record with no campaign, e.g. replay)
  std::uint64_t seed = 0;
  std::int64_t cases = 0;  ///< per target
  std::int64_t max_k = 0;
  SizeSchedule sizes = SizeSchedule::Small;  ///< records written before the schedule existed: small
  bool metamorphic = true, gelu = true;
  std::vector<std::string> targets;       ///< "KERNEL DTYPE OP", in campaign order
  std::vector<PluginIdentity> plugins;
  std::string ulpgate_version;
  std::string tolerance;                  ///< "nominal per case" or the fixed model as JSON
  std::string baseline_rule;              ///< "" or "MODEL x FACTOR"
  std::string forward_kernel;             ///< attention backward's chained forward ("": exact)
  bool operator==(const CampaignDefinition&) const = default;
};

/// The fields in which b differs from a, each as "seed: 1 in the baseline, 2 in the run"
/// (a_name and b_name replace "the baseline" and "the run"); empty when equal.
std::vector<std::string> campaign_differences(const CampaignDefinition& a, const CampaignDefinition& b,
                                              const std::string& a_name = "the baseline",
                                              const std::string& b_name = "the run");

/// The identity of a plugin file (throws InputError when it cannot be read).
PluginIdentity plugin_identity(const std::string& path);

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
  double effective_bits = 0;  ///< estimated accumulator precision (docs/concepts/sweeps.md)
};


/// Part of a campaign that did not run: a target (or the rest of one) the time budget did
/// not reach.
struct NotRun {
  std::string target;    ///< "KERNEL DTYPE OP"
  std::int64_t planned = 0, run = 0;  ///< cases planned for the target and cases it ran
  std::string reason;    ///< e.g. "time budget (--time 300) spent"
};

struct RunRecord {
  int version = kRecordSchemaVersion;
  std::string kind;  ///< "fuzz", "sweep", "replay", "check"
  std::uint64_t seed = 0;
  std::string command;  ///< the command line that produced it
  CampaignDefinition campaign;  ///< fuzz: what was asked for (kind "" otherwise)
  std::vector<NotRun> not_run;  ///< what of it did not run; empty: all of it ran
  /// fuzz --shard INDEX/COUNT: this record holds shard INDEX (0-based) of COUNT of the
  /// campaign (campaign/fuzz.hpp); 0 of 1: the whole campaign.
  int shard_index = 0, shard_count = 1;
  Environment environment;
  ToleranceModel tolerance;
  BaselineRule baseline;
  std::vector<CaseResult> cases;
  std::vector<SweepSeries> sweeps;
};

nlohmann::json to_json(const RunRecord& r);

// The pieces of a record on their own, for the isolation worker's protocol and the journal
// (campaign/isolate.hpp, campaign/journal.hpp). `path` prefixes every InputError message.
nlohmann::json case_result_to_json(const CaseResult& c);
CaseResult case_result_from_json(const nlohmann::json& j, const std::string& path);
nlohmann::json tolerance_to_json(const ToleranceModel& t);
ToleranceModel tolerance_from_json(const nlohmann::json& j, const std::string& path);
nlohmann::json campaign_to_json(const CampaignDefinition& c);
CampaignDefinition campaign_from_json(const nlohmann::json& j, const std::string& path);
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
