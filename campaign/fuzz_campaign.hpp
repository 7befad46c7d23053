// The fuzz campaign behind run_fuzz (fuzz.hpp): its state as members, its steps as methods
// in the order a campaign takes them. Alone (or one shard) it is fuzz_campaign.cpp; shared
// with other processes through a FuzzScheduler, fuzz_shared.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include "campaign/fuzz.hpp"
#include "campaign/isolate.hpp"
#include "campaign/journal.hpp"

namespace ulpgate {

/// A word as a shell would need it typed: bare when it holds only safe characters.
std::string shell_word(const std::string& s);
/// " --plugin LIB" for each plugin: how reproducers load them.
std::string plugin_flags(const std::vector<std::string>& plugins);

class FuzzCampaign {
 public:
  using Progress = std::function<void(const FuzzProgress&)>;
  using Log = std::function<void(const std::string&)>;
  /// Sets the campaign up: targets, the record's header, evaluators, journal, corpus list.
  FuzzCampaign(Registry& registry, const FuzzOptions& options, const Progress& progress, const Log& log);
  /// Runs it, alone or shared as the options say, and returns the record.
  RunRecord run();

 private:
  // A target's generators: [0] small; [1] small, mapping; [2 + kind] large (case_limits).
  struct TargetRun {
    const FuzzTarget* t = nullptr;
    Kernel* k = nullptr;
    std::vector<rc::Gen<Case>> gens;
    std::uint64_t seed = 0;
  };
  // A failing generated case left for later shrinking (shared campaigns).
  struct Unshrunk {
    std::int64_t index = 0;
    std::size_t position = 0;  // in the unit's results
    Case requested;
  };
  // A drawn case waiting to be taken in order.
  struct Slot {
    std::optional<rc::Shrinkable<Case>> drawn;
    Case value;  // drawn->value(), taken here: RapidCheck recomputes it on each call, in this thread only
    CaseResult result;
    std::string result_json, value_json;  // as the worker sent them (Finished), for the journal
    bool done = false;     // generation failed, or the journal had it, or it was checked
    bool checked = false;  // checked now: to be journaled
  };
  // One call of run_cases: cases [begin, end) of a target and where they go.
  struct CaseRun {
    const TargetRun& tr;
    std::int64_t begin = 0, end = 0;
    bool shrinking = false;
    std::vector<std::string>& shrunk_signatures;
    std::vector<CaseResult>& out;
    std::vector<Unshrunk>* failures = nullptr;
    bool worker_draws = false;
    // Drawn and not taken yet, by case index (also the case's id in the pool: a run's
    // cases are all taken before the next run's are drawn, so ids never meet).
    std::map<std::int64_t, Slot> slots;
    std::int64_t next_draw = 0;
  };
  // A shared campaign's unit: a corpus file, or cases [begin, end) of a target.
  struct Unit {
    std::int64_t corpus = -1;  // a corpus file's index, or -1
    std::size_t target = 0;
    std::int64_t begin = 0, end = 0;
  };
  // A failure a shared campaign shrinks, in the single process's order.
  struct ShrinkJob {
    std::size_t unit = 0, target = 0, position = 0;
    std::int64_t index = 0;
    Case requested;
  };
  // What a shared campaign knows: every process's units and shrinks, as exchanged.
  struct Shared {
    std::vector<Unit> units;
    std::vector<nlohmann::json> unit_out;  // by unit; null: lost with a process that failed
    std::vector<ShrinkJob> jobs;
    std::vector<nlohmann::json> job_out;   // by job
    std::vector<CaseResult> planning;      // rank 0's supports() failures from planning
    std::string error;                     // this process's, which stops its part of the work
    std::string lost_why;                  // why units are missing: the processes that failed
  };

  // Set-up.
  void check_shards() const;
  void start_record();
  void start_evaluators();
  void open_journal();
  void list_corpus();
  bool owns(std::size_t target_index) const;
  bool owns_kernel(const std::string& kernel) const;

  // Small things every step uses.
  double elapsed() const;
  bool budget_spent() const;
  void say(const std::string& line) const;

  // supports() queries that crashed or hung the worker, as failed results.
  std::vector<CaseResult> new_support_failures();
  void record_support_failures();
  void skip_support_failures();

  // The corpus, targets and evaluation.
  CaseResult replay_corpus(const std::string& file);
  const TargetRun& target_run(std::size_t target_index);
  const rc::Gen<Case>& gen_of(const TargetRun& tr, std::int64_t index) const;
  CaseResult check_generated(Kernel& k, const Case& c, const EvaluationOptions& options);
  CaseResult evaluate(const TargetRun& tr, const Case& c, bool relations);

  // Drawing, submitting and taking a target's cases.
  std::int64_t run_cases(const TargetRun& tr, std::int64_t begin, std::int64_t end, bool shrinking,
                         std::vector<std::string>& shrunk_signatures, std::vector<CaseResult>& out,
                         std::vector<Unshrunk>* failures);
  void draw_ahead(CaseRun& run, std::int64_t next_taken);
  Slot draw(const TargetRun& tr, std::int64_t index);
  void collect(CaseRun& run);
  void take_case(CaseRun& run, Slot s, std::int64_t index);
  CaseResult generated_result(const FuzzTarget& t, Slot& s, std::int64_t index);
  void redraw_for_shrinking(const TargetRun& tr, Slot& s, std::int64_t index);

  // Shrinking and the files it writes.
  CaseResult shrink(const TargetRun& tr, rc::Shrinkable<Case> failing, const CaseResult& first, int max_steps);
  std::optional<CaseResult> shrink_failure(const TargetRun& tr, const rc::Shrinkable<Case>& drawn, const CaseResult& first,
                                           std::int64_t index);
  std::string save_case(const std::string& dir, const CaseResult& r) const;

  // The two schedules.
  RunRecord run_alone();
  RunRecord run_shared();

  // The shared schedule's steps (fuzz_shared.cpp).
  void list_units(Shared& s) const;
  nlohmann::json run_claimed_units(Shared& s);
  nlohmann::json run_unit(std::int64_t u, const Unit& unit);
  void take_exchange(Shared& s, const std::vector<std::string>& texts, const char* key, const char* id,
                     std::vector<nlohmann::json>& into);
  void list_shrink_jobs(Shared& s) const;
  nlohmann::json run_claimed_shrinks(Shared& s);
  void assemble_shared_record(Shared& s);
  void record_target_units(Shared& s, std::size_t target,
                           std::map<std::pair<std::size_t, std::size_t>, CaseResult>& shrunk_at);

  Registry& registry_;
  const FuzzOptions& o_;
  const Progress& progress_;
  const Log& log_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::vector<FuzzTarget> targets_;
  RunRecord record_;
  EvaluationOptions options_;            // the campaign's
  EvaluationOptions without_relations_;  // for shrink candidates (see evaluate)
  FuzzProgress p_;
  std::unique_ptr<IsolatedEvaluator> own_;
  IsolatedEvaluator* isolated_ = nullptr;  // null: in this process
  std::unique_ptr<IsolatedEvaluator> pool_;  // jobs > 1: generated cases go here
  std::string replay_cmd_;
  std::size_t support_failures_seen_ = 0;
  std::unique_ptr<Journal> journal_;
  std::vector<std::string> corpus_;  // the files this run replays, in order
  std::map<std::size_t, TargetRun> runs_;  // by target index, made on first use
};

}  // namespace ulpgate
