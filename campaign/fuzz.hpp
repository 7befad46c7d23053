// Fuzz campaigns: generated cases for kernels x input types, GEMM and attention alike, each
// through the one check path (check/check.hpp) in the isolated worker. A target's case
// stream depends only on (campaign seed, target name, case index), so campaigns are
// reproducible whatever else runs. Case streams, failures and shrinking, the time budget:
// see docs/concepts/relations.md; several cases at once: docs/concepts/isolation.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <rapidcheck.h>

#include "check/check.hpp"
#include "campaign/isolate.hpp"
#include "campaign/record.hpp"

namespace ulpgate {

struct FuzzTarget {
  std::string kernel;
  std::string dtype;  ///< GEMM: fp64, fp32, tf32, fp16, bf16, e4m3, e5m2; attention: fp32, fp16, bf16, e4m3
  Op op = Op::Gemm;
};

/// Whether case `index` of a target is drawn from the large regime (GenLimits::large) under
/// schedule s (campaign/record.hpp): never (small), indices 4, 9, 14, ... (realistic: every
/// fifth, 20% of the budget), always (large).
bool large_case(SizeSchedule s, std::int64_t index);

/// A shared campaign's unit of generated cases: this many consecutive cases of one target.
inline constexpr std::int64_t kSharedUnitCases = 16;
/// How many exchanges run_fuzz makes in a shared campaign (after each phase).
inline constexpr int kSharedFuzzExchanges = 2;

/// Processes sharing one campaign (the ranks of `mpirun ulpgate fuzz`) claim its work as
/// they become free: dynamic load balancing that keeps the single-process record. run_fuzz
/// cuts the campaign into units every process lists alike: each corpus file, then each
/// target's cases in runs of kSharedUnitCases (phase 0); once every process has exchanged what it found,
/// one unit per failure to shrink (phase 1: the first failure of each signature in each
/// target, in case order, as a single process shrinks them). Every process returns the
/// whole record.
class FuzzScheduler {
 public:
  virtual ~FuzzScheduler() = default;
  /// This process's place among them (0: the one that records the planning's supports()
  /// failures).
  virtual int rank() const = 0;
  /// The next unit of `phase` for this process, first come first served across the
  /// processes; `count` (the same on every process) or more when none is left.
  virtual std::int64_t claim(int phase, std::int64_t count) = 0;
  /// Collective: every process's text, in rank order, on every process. run_fuzz makes
  /// exactly kSharedFuzzExchanges.
  virtual std::vector<std::string> exchange(const std::string& text) = 0;
  /// Filled by run_fuzz: the processes whose part of the campaign threw (rank, error);
  /// the units they had not finished are in the record's not-run list.
  std::vector<std::pair<int, std::string>> failures;
};

/// What a process whose campaign threw before run_fuzz's exchanges sends in each one it
/// has not made: no work done, and its error (the others then record it as failed).
std::string failed_exchange(const std::string& error);

/// What `ulpgate fuzz` runs without flags: cases per target and the small regime's largest K.
inline constexpr std::int64_t kDefaultCampaignCases = 10, kDefaultCampaignMaxK = 1024;

struct FuzzOptions {
  std::vector<FuzzTarget> targets;  ///< empty: every kernel here x every dtype it supports
  std::int64_t cases = 30;          ///< cases per target
  double seconds = 0;               ///< wall-clock budget for the whole campaign (0: none)
  std::uint64_t seed = 1;
  std::int64_t max_k = 4096;        ///< largest K generated (small regime)
  SizeSchedule sizes = SizeSchedule::Realistic;
  std::string corpus_dir;           ///< shrunk failures, replayed first ("" : none)
  /// The corpus files to replay, listed before the campaign started (nullopt: corpus_dir's
  /// .json files as run_fuzz finds them). Processes running shards of one campaign at once
  /// over one corpus (fuzz under mpirun) list it before any of them can save a shrunk case.
  std::optional<std::vector<std::string>> corpus_files;
  std::string cases_dir;            ///< every failing case as a case file ("" : none)
  /// Plugin libraries the kernels come from: named in the campaign (with a hash of each
  /// file) and in every reproducer.
  std::vector<std::string> plugins;
  EvaluationOptions evaluation;
  bool metamorphic = true;
  /// Attention backward targets: the forward kernel whose outputs every case's backward
  /// takes (Case::forward_kernel, a chained check); "": the exact forward rounded once.
  std::string forward_kernel;
  /// Draw GELU epilogues too (their certified reference costs up to seconds per case).
  bool gelu = true;
  /// Kernel calls in a worker process with a timeout (crashes and hangs become results);
  /// nullopt: in this process.
  std::optional<IsolationOptions> isolation;
  /// Generated cases checked at once (isolated campaigns only; in process: 1), by that
  /// many threads of a second worker started from `isolation`. Cases are generated and
  /// their results taken in case order, so the record, the journal's entries and the
  /// failures found do not depend on it.
  int jobs = 1;
  /// The worker to use (the one whose stand-ins the registry holds); nullptr: run_fuzz
  /// starts its own from `isolation`. Its supports() failures join the record.
  IsolatedEvaluator* evaluator = nullptr;
  /// Append every result to this JSONL journal ("": none); with resume, reuse the results
  /// an interrupted run of the same campaign journaled.
  std::string journal_path;
  bool resume = false;
  /// Sharding (job arrays): this run takes target t (in campaign order) only when
  /// t % shard_count == shard_index, and the corpus cases of the kernels it takes first; the
  /// records of all shards merge (merge_shards) into the record of the whole campaign. A
  /// target's cases never depend on other targets, so each shard's results are the whole
  /// run's.
  int shard_index = 0, shard_count = 1;
  /// Shared with other processes that claim its units as they go (see FuzzScheduler;
  /// nullptr: this process runs its shard alone). Each process has its own journal_path;
  /// journals_read are the others' journals, whose results a resume reuses too.
  FuzzScheduler* scheduler = nullptr;
  std::vector<std::string> journals_read;
};

/// Every (kernel, dtype, op) of the registry whose kernel supports one of the op's basic
/// cases of the dtype (OpModule::basic_cases); with `kernels`, of those kernels only, in the order named (resolved through
/// the registry, so parameterised models count).
std::vector<FuzzTarget> all_targets(Registry& registry, const std::vector<std::string>& kernels = {});

struct FuzzProgress {
  std::int64_t cases = 0, failures = 0, total = 0;
  double elapsed = 0;
  /// Of elapsed, the seconds this thread waited for the pool's results: near elapsed, the
  /// pool is the bottleneck; far below, drawing and taking results here are.
  double waiting = 0;
};

/// The campaign definition these options make (RunRecord::campaign).
CampaignDefinition campaign_definition(const FuzzOptions& o, const std::vector<FuzzTarget>& targets);

/// The random-state seed of a target's case stream (from the campaign seed and the target).
std::uint64_t target_seed(std::uint64_t campaign_seed, const FuzzTarget& t);

/// Case `index` of a target's stream: `gen` (the op's generator for the target) at
/// RapidCheck size (37 index) mod 101 from a random state of (target_seed, index).
/// RapidCheck's generators share global state: call from one thread at a time.
rc::Shrinkable<Case> draw_case(const rc::Gen<Case>& gen, std::uint64_t target_seed, std::uint64_t index);

/// The generator limits of case `index` of a target: the small regime, or when the size
/// schedule says so (large_case) the large one, the n-th large case of the target drawing
/// shape kind n mod 5 (rotating), so that even two large cases reach different paths; the
/// small cases of index 1 and 3 mod 5 draw the mapping structure (GenLimits::mapping).
GenLimits case_limits(const FuzzOptions& o, std::int64_t index);

/// Case `index` of target t's stream as run_fuzz draws it (k asked what it supports).
Case campaign_case(const FuzzOptions& o, const FuzzTarget& t, const Kernel& k, std::int64_t index);

/// "KERNEL DTYPE OP": how records name a target.
std::string target_name(const FuzzTarget& t);

/// The command that regenerates case `index` of target t (its last case), with every flag
/// that shapes the case stream and its judgement.
std::string fuzz_reproducer(const FuzzOptions& o, const FuzzTarget& t, std::int64_t index);

/// Whether shard `shard_index` of `shard_count` runs the campaign's target `target_index`
/// (every shard_count-th target from shard_index on).
inline bool shard_owns(std::size_t target_index, int shard_index, int shard_count) {
  return static_cast<int>(target_index % static_cast<std::size_t>(shard_count)) == shard_index;
}

/// The case files (.json) a campaign with this corpus directory replays, as run_fuzz lists
/// them ("" or no such directory: none).
std::vector<std::string> corpus_files(const std::string& dir);

/// Runs the campaign; returns the run record (kind "fuzz"). progress is called after each
/// case; log receives one line per event worth printing (failures, corpus saves).
RunRecord run_fuzz(Registry& registry, const FuzzOptions& options,
                   const std::function<void(const FuzzProgress&)>& progress = {},
                   const std::function<void(const std::string&)>& log = {});

/// The records of the shards of one campaign (fuzz --shard i/N, every i once) as the record
/// of the whole campaign: the same cases in the same order (the corpus first, then each
/// target's), the same not-run list; the environment is shard 0's. InputError (naming the
/// record) for records of different campaigns, a shard missing or given twice, or a record
/// that is not a fuzz shard.
RunRecord merge_shards(const std::vector<std::pair<std::string, RunRecord>>& shards);

/// Evaluates one case file's case on its kernel (case.kernel) and returns the record entry.
CaseResult replay_case(Registry& registry, Case c, const EvaluationOptions& options);

}  // namespace ulpgate
