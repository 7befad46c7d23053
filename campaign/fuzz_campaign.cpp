#include "campaign/fuzz_campaign.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace ulpgate {
namespace {

constexpr int kMaxShrinkSteps = 400;
// A failure from the large regime shrinks by at most this many evaluations: each costs up
// to a second or more, and the first few shrinks (halving K, M, N) find most of the way.
constexpr int kMaxLargeShrinkSteps = 24;
// How far (in multiples of jobs) drawing runs ahead of the oldest case not yet taken.
constexpr std::int64_t kLookahead = 32;


}  // namespace

std::string shell_word(const std::string& s) {
  const bool safe = !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char ch) {
    return std::isalnum(ch) || std::strchr("._:=,/+-@%", ch);
  });
  if (safe) return s;
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

std::string plugin_flags(const std::vector<std::string>& plugins) {
  std::string out;
  for (const auto& p : plugins) out += " --plugin " + shell_word(p);
  return out;
}

// --- Set-up ------------------------------------------------------------------------------

FuzzCampaign::FuzzCampaign(Registry& registry, const FuzzOptions& options, const Progress& progress, const Log& log)
    : registry_(registry), o_(options), progress_(progress), log_(log) {
  targets_ = o_.targets.empty() ? all_targets(registry_) : o_.targets;
  check_shards();
  start_record();
  start_evaluators();
  replay_cmd_ = "ulpgate" + plugin_flags(o_.plugins) + " replay ";
  open_journal();
  list_corpus();
}

void FuzzCampaign::check_shards() const {
  if (o_.scheduler && o_.shard_count != 1) throw InputError("a shared campaign is not also sharded (drop --shard)");
  if (o_.shard_count < 1 || o_.shard_index < 0 || o_.shard_index >= o_.shard_count)
    throw InputError(fmt::format("shard {}/{}: the index must be at least 0 and below the count", o_.shard_index, o_.shard_count));
}

void FuzzCampaign::start_record() {
  record_.kind = "fuzz";
  record_.seed = o_.seed;
  record_.shard_index = o_.shard_index, record_.shard_count = o_.shard_count;
  record_.campaign = campaign_definition(o_, targets_);
  record_.environment = capture_environment();
  if (o_.evaluation.tolerance) record_.tolerance = *o_.evaluation.tolerance;
  if (o_.evaluation.baseline) record_.baseline = *o_.evaluation.baseline;
  options_ = o_.evaluation;
  options_.relations = o_.metamorphic;
  without_relations_ = options_;
  without_relations_.relations = false;
  for (std::size_t i = 0; i < targets_.size(); ++i) p_.total += owns(i) ? o_.cases : 0;
}

// Generated cases go to a pool of worker threads when jobs > 1 (a worker of their own, so
// that `isolated_` stays free for the stand-ins' supports() queries while cases are drawn,
// for the corpus and for shrinking); otherwise to `isolated_` or this process.
void FuzzCampaign::start_evaluators() {
  isolated_ = o_.evaluator;
  if (!isolated_ && o_.isolation) isolated_ = (own_ = std::make_unique<IsolatedEvaluator>(*o_.isolation)).get();
  if (isolated_ && o_.isolation && o_.jobs > 1) {
    IsolationOptions po = *o_.isolation;
    po.jobs = static_cast<unsigned>(o_.jobs);
    pool_ = std::make_unique<IsolatedEvaluator>(po);
  }
}

void FuzzCampaign::open_journal() {
  if (o_.journal_path.empty()) return;
  nlohmann::json campaign = {{"seed", o_.seed}, {"cases", o_.cases}, {"max_k", o_.max_k}, {"metamorphic", o_.metamorphic},
                             {"stream", 2}};
  for (const auto& t : targets_) campaign["targets"].push_back(t.kernel + " " + t.dtype);
  journal_ = std::make_unique<Journal>(o_.journal_path, campaign, o_.resume);
  if (o_.resume)
    for (const auto& other : o_.journals_read) journal_->absorb(other, campaign);
  if (journal_->loaded()) say(fmt::format("resuming: {} cases from {}", journal_->loaded(), o_.journal_path));
  for (const auto& n : journal_->notes()) say(n);
}

void FuzzCampaign::list_corpus() {
  std::vector<std::string> files = o_.corpus_files ? *o_.corpus_files : corpus_files(o_.corpus_dir);
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    const Case c = read_case_file(f);
    if (owns_kernel(c.kernel) && registry_.resolve(c.kernel)) corpus_.push_back(f);
  }
}

bool FuzzCampaign::owns(std::size_t target_index) const { return shard_owns(target_index, o_.shard_index, o_.shard_count); }

// A shard replays the corpus cases of the kernels whose first target is its own.
bool FuzzCampaign::owns_kernel(const std::string& kernel) const {
  for (std::size_t i = 0; i < targets_.size(); ++i)
    if (targets_[i].kernel == kernel) return owns(i);
  return false;
}

double FuzzCampaign::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

bool FuzzCampaign::budget_spent() const { return o_.seconds > 0 && elapsed() > o_.seconds; }

void FuzzCampaign::say(const std::string& line) const {
  if (log_) log_(line);
}

// --- supports() failures -----------------------------------------------------------------

// A supports() query that crashed or hung the worker is recorded as a failed result (the
// kernel is then unsupported everywhere and the campaign goes on). These are the ones not
// taken yet.
std::vector<CaseResult> FuzzCampaign::new_support_failures() {
  std::vector<CaseResult> out;
  if (!isolated_) return out;
  for (; support_failures_seen_ < isolated_->support_failures().size(); ++support_failures_seen_) {
    CaseResult r = isolated_->support_failures()[support_failures_seen_];
    r.origin = "supports";
    say(fmt::format("FAIL {}: {}", r.kernel, r.message));
    ++p_.failures;
    out.push_back(std::move(r));
  }
  return out;
}

void FuzzCampaign::record_support_failures() {
  for (CaseResult& r : new_support_failures()) record_.cases.push_back(std::move(r));
}

// Every shard (or rank) planned the targets; only one records what planning met.
void FuzzCampaign::skip_support_failures() {
  if (isolated_) support_failures_seen_ = isolated_->support_failures().size();
}

// --- The corpus, targets and evaluation --------------------------------------------------

CaseResult FuzzCampaign::replay_corpus(const std::string& file) {
  Case c = read_case_file(file);
  CaseResult r = isolated_ ? isolated_->evaluate(c.kernel, c, options_) : replay_case(registry_, c, options_);
  r.origin = "corpus";
  r.reproducer = replay_cmd_ + shell_word(file);
  if (!r.verdict.passed) ++p_.failures;
  say(fmt::format("corpus {}: {}", std::filesystem::path(file).filename().string(), r.verdict.passed ? "passes now" : "still fails"));
  return r;
}

// One generator for each of case_limits' seven limits.
const FuzzCampaign::TargetRun& FuzzCampaign::target_run(std::size_t target_index) {
  if (auto it = runs_.find(target_index); it != runs_.end()) return it->second;
  TargetRun tr;
  tr.t = &targets_[target_index];
  tr.k = registry_.resolve(tr.t->kernel);
  if (!tr.k) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", tr.t->kernel));
  const auto gen = [&](bool large, int kind, bool mapping) {
    const GenLimits l{.max_reduction = o_.max_k, .gelu = o_.gelu, .large = large, .large_kind = kind, .mapping = mapping,
                      .forward_kernel = o_.forward_kernel};
    tr.gens.push_back(op_module(tr.t->op).generate(tr.t->dtype, tr.k, l));
  };
  for (bool mapping : {false, true}) gen(false, -1, mapping);
  for (int kind = 0; kind < 5; ++kind) gen(true, kind, false);
  tr.seed = target_seed(o_.seed, *tr.t);
  return runs_.emplace(target_index, std::move(tr)).first->second;
}

const rc::Gen<Case>& FuzzCampaign::gen_of(const TargetRun& tr, std::int64_t index) const {
  const GenLimits l = case_limits(o_, index);
  return tr.gens[l.large ? 2 + static_cast<std::size_t>(l.large_kind) : l.mapping ? 1 : 0];
}

// Checks one case: in the worker when isolated (the parent never runs kernel code), else
// in this process. Every problem is in the verdict; a case the harness itself cannot
// handle is a failed result, seen and shrunk like any other.
CaseResult FuzzCampaign::check_generated(Kernel& k, const Case& c, const EvaluationOptions& options) {
  try {
    return isolated_ ? isolated_->evaluate(k.name(), c, options) : check_case(k, c, options, &registry_);
  } catch (const std::exception& e) {
    return failed_result(k.name(), c, Disposition::Failed, std::string("harness error: ") + e.what());
  }
}

// A shrink candidate that passes is rejected, and one that fails only a metamorphic
// relation has another signature: unless the failure being shrunk is a relation's,
// candidates run without the relations (a passing one would otherwise run the kernel four
// or five more times, seconds for a large case), which changes no decision. Those bypass
// the journal, whose results are complete evaluations.
CaseResult FuzzCampaign::evaluate(const TargetRun& tr, const Case& c, bool relations) {
  const EvaluationOptions& eo = relations ? options_ : without_relations_;
  Kernel& k = *tr.k;
  CaseResult r = journal_ && relations ? journal_->resume_or_run(k.name(), c, [&] { return check_generated(k, c, eo); })
                                       : check_generated(k, c, eo);
  r.target = target_name(*tr.t);
  return r;
}

// --- A target's cases --------------------------------------------------------------------

// Cases [begin, end) of a target, appended to `out` in case order. With shrinking, the
// first failure of each signature (not in `shrunk_signatures` yet) is shrunk and its shrunk
// case follows it; without, the failures that could be shrunk (their case drawn again here
// is the one checked) are listed in `failures` for shrinking later. Returns how many cases
// were taken (< end - begin: the time budget ended the drawing).
//
// Cases are drawn (and looked up in the journal) in order here, checked as they come
// (concurrently: at most 2 x jobs in the pool's threads at once, up to kLookahead x jobs
// cases ahead of the oldest unfinished one), and taken in order.
std::int64_t FuzzCampaign::run_cases(const TargetRun& tr, std::int64_t begin, std::int64_t end, bool shrinking,
                                     std::vector<std::string>& shrunk_signatures, std::vector<CaseResult>& out,
                                     std::vector<Unshrunk>* failures) {
  // The pool's worker draws the cases itself (its kernel answers the generator's supports()
  // questions without a round trip each), unless a journal is resumed: its results are
  // found by the case, so this thread draws them first.
  CaseRun run{tr, begin, end, shrinking, shrunk_signatures, out, failures, pool_ && !(journal_ && journal_->loaded()), {}, begin};
  std::int64_t i = begin;
  while (i < end) {
    draw_ahead(run, i);
    const auto it = run.slots.find(i);
    if (it == run.slots.end()) break;  // the time budget ended the drawing before case i
    if (!it->second.done) {
      collect(run);
      continue;
    }
    Slot s = std::move(it->second);
    run.slots.erase(it);
    take_case(run, std::move(s), i++);
  }
  return i - begin;
}

// Draws (or has the pool's worker draw) the next cases, as far as the lookahead, the
// pool's capacity and the time budget allow; without a pool each is checked at once.
void FuzzCampaign::draw_ahead(CaseRun& run, std::int64_t next_taken) {
  const FuzzTarget& t = *run.tr.t;
  Kernel* k = run.tr.k;
  const std::int64_t lookahead = pool_ ? kLookahead * static_cast<std::int64_t>(o_.jobs) : 1;
  while (run.next_draw < run.end && run.next_draw - next_taken < lookahead &&
         (!pool_ || pool_->in_flight() < 2 * std::size_t(o_.jobs)) && !budget_spent()) {
    const std::int64_t index = run.next_draw++;
    const auto id = static_cast<std::uint64_t>(index);
    if (run.worker_draws) {
      pool_->submit(id, k->name(), DrawSpec{t.op, t.dtype, run.tr.seed, id, case_limits(o_, index)}, options_);
      run.slots.emplace(index, Slot{});
      continue;
    }
    Slot s = draw(run.tr, index);
    if (!s.done && pool_) {
      pool_->submit(id, k->name(), s.value, options_);
    } else if (!s.done) {
      s.result = check_generated(*k, s.value, options_);
      s.done = s.checked = true;
    }
    run.slots.emplace(index, std::move(s));
  }
}

// Case `index` drawn here; done already when the journal has its result or the generator
// failed (a failed result on the op's basic case).
FuzzCampaign::Slot FuzzCampaign::draw(const TargetRun& tr, std::int64_t index) {
  Slot s;
  try {
    s.drawn = draw_case(gen_of(tr, index), tr.seed, static_cast<std::uint64_t>(index));
    s.value = s.drawn->value();
    if (journal_)
      if (auto earlier = journal_->take(tr.k->name(), s.value)) s.result = std::move(*earlier), s.done = true;
  } catch (const std::exception& e) {
    s.drawn.reset();
    s.result = failed_result(tr.k->name(), op_module(tr.t->op).basic_case(tr.t->dtype), Disposition::Failed,
                             std::string("harness error: case generation failed: ") + e.what());
    s.done = true;
  }
  return s;
}

// One finished case from the pool, into its slot.
void FuzzCampaign::collect(CaseRun& run) {
  const auto wait_start = std::chrono::steady_clock::now();
  IsolatedEvaluator::Finished f = pool_->next_result();
  p_.waiting += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  Slot& s = run.slots.at(static_cast<std::int64_t>(f.id));
  s.result = std::move(f.result);
  s.result_json = std::move(f.result_json);
  if (run.worker_draws) s.value = std::move(f.requested), s.value_json = std::move(f.requested_json);
  s.done = s.checked = true;
}

// Takes case `index`, the oldest not taken: journal, record, progress, and for a failure
// its case file and (the first of its signature) its shrinking.
void FuzzCampaign::take_case(CaseRun& run, Slot s, std::int64_t index) {
  if (s.checked && journal_) journal_->append(run.tr.k->name(), s.value, s.result, s.value_json, s.result_json);
  CaseResult r = generated_result(*run.tr.t, s, index);
  if (progress_) progress_(p_);
  if (!r.verdict.passed && run.worker_draws) redraw_for_shrinking(run.tr, s, index);
  if (!r.verdict.passed && s.drawn && !run.shrinking) run.failures->push_back({index, run.out.size(), s.value});
  const bool shrink_it = run.shrinking && !r.verdict.passed && s.drawn &&
                         std::none_of(run.shrunk_signatures.begin(), run.shrunk_signatures.end(),
                                      [&](const std::string& sig) { return same_failure(sig, r.signature); });
  std::optional<CaseResult> kept;
  if (shrink_it) kept = r;
  run.out.push_back(std::move(r));
  if (!kept) return;
  // Shrinking checks one case at a time with the planning worker; the pool's cases in
  // flight finish first, so no case waits on it past its timeout.
  while (pool_ && pool_->in_flight()) collect(run);
  run.shrunk_signatures.push_back(kept->signature);
  if (auto m = shrink_failure(run.tr, *s.drawn, *kept, index)) run.out.push_back(std::move(*m));
}

// The record's entry for generated case `index`, counted; a failure is told and saved as
// a case file, which becomes its reproducer.
CaseResult FuzzCampaign::generated_result(const FuzzTarget& t, Slot& s, std::int64_t index) {
  CaseResult r = std::move(s.result);
  r.target = target_name(t);
  r.origin = "generated";
  r.reproducer = fuzz_reproducer(o_, t, index);
  ++p_.cases;
  p_.elapsed = elapsed();
  if (!r.verdict.passed) {
    ++p_.failures;
    if (!o_.cases_dir.empty()) r.reproducer = replay_cmd_ + shell_word(save_case(o_.cases_dir, r));
    say(fmt::format("FAIL {} {} case {}, {} [{}]: {} ({})", t.kernel, t.dtype, index, shape_text(r.spec), r.signature,
                    r.verdict.reasons.front(), r.reproducer));
  }
  return r;
}

// To shrink a case the worker drew this thread needs its shrinks: drawn again here, the
// same case (the same generator and supports() answers), or not shrunk if it is not.
void FuzzCampaign::redraw_for_shrinking(const TargetRun& tr, Slot& s, std::int64_t index) {
  try {
    s.drawn = draw_case(gen_of(tr, index), tr.seed, static_cast<std::uint64_t>(index));
    if (to_json(s.drawn->value()) != to_json(s.value)) s.drawn.reset();
  } catch (const std::exception&) {
    s.drawn.reset();
  }
}

// --- Shrinking ---------------------------------------------------------------------------

// Shrinks a failing case towards a minimal one with the same signature: the first shrink
// that still fails that way is taken, until none does (or the step or time budget ends it:
// the smallest so far is the result).
CaseResult FuzzCampaign::shrink(const TargetRun& tr, rc::Shrinkable<Case> failing, const CaseResult& first, int max_steps) {
  CaseResult best = first;
  const bool relation_failure = first.signature.find("relation:") != std::string::npos;
  int steps = 0;
  for (bool progressed = true; progressed;) {
    progressed = false;
    auto children = failing.shrinks();
    while (auto child = children.next()) {
      if (++steps > max_steps || budget_spent()) return best;
      Case cc;
      try {
        cc = child->value();
      } catch (const std::exception&) {
        continue;  // a shrink the generator cannot build
      }
      CaseResult cr = evaluate(tr, cc, relation_failure);
      if (!cr.verdict.passed && same_failure(cr.signature, first.signature)) {
        failing = *child;
        best = std::move(cr);
        progressed = true;
        break;
      }
    }
  }
  return best;
}

// The shrunk case of a failing generated case (case `index`), saved to the corpus; its
// result when it is smaller than the failing case.
std::optional<CaseResult> FuzzCampaign::shrink_failure(const TargetRun& tr, const rc::Shrinkable<Case>& drawn,
                                                       const CaseResult& first, std::int64_t index) {
  CaseResult m = shrink(tr, drawn, first, large_case(o_.sizes, index) ? kMaxLargeShrinkSteps : kMaxShrinkSteps);
  if (!o_.corpus_dir.empty()) {
    const std::string path = save_case(o_.corpus_dir, m);
    say(fmt::format("  shrunk to {}, {}{}", shape_text(m.spec), path,
                    m.id == first.id ? " (no smaller case fails the same way)" : ""));
    m.reproducer = replay_cmd_ + shell_word(path);
  }
  if (m.id == first.id) return std::nullopt;
  m.origin = "shrunk";
  m.notes["shrunk_from"] = first.id;
  return m;
}

std::string FuzzCampaign::save_case(const std::string& dir, const CaseResult& r) const {
  std::filesystem::create_directories(dir);
  const auto path = std::filesystem::path(dir) / (safe_file_name(r.kernel + "-" + r.id) + ".json");  // model names hold ':' and ','.
  write_case_file(path.string(), r.spec);
  return path.string();
}

// --- The schedules -----------------------------------------------------------------------

RunRecord FuzzCampaign::run() { return o_.scheduler ? run_shared() : run_alone(); }

// This process alone (or one shard): the corpus, then each target's cases in order.
RunRecord FuzzCampaign::run_alone() {
  for (const auto& f : corpus_) record_.cases.push_back(replay_corpus(f));
  if (o_.shard_index == 0) record_support_failures();
  else skip_support_failures();
  for (std::size_t target_index = 0; target_index < targets_.size(); ++target_index) {
    if (!owns(target_index)) continue;
    const TargetRun& tr = target_run(target_index);
    std::vector<std::string> shrunk_signatures;
    const std::int64_t taken = run_cases(tr, 0, o_.cases, true, shrunk_signatures, record_.cases, nullptr);
    if (taken < o_.cases) {
      record_.not_run.push_back({target_name(*tr.t), o_.cases, taken, fmt::format("time budget (--time {}) spent", o_.seconds)});
      say(fmt::format("time budget spent: {} of {} cases of {} not run", o_.cases - taken, o_.cases, target_name(*tr.t)));
    }
    record_support_failures();
  }
  record_support_failures();
  return std::move(record_);
}

}  // namespace ulpgate
