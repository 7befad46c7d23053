#include "campaign/fuzz.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include "distributions/case_gen.hpp"
#include "distributions/fill.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "campaign/isolate.hpp"
#include "campaign/journal.hpp"
#include "core/hash.hpp"

namespace ulpgate {
namespace {

constexpr int kMaxShrinkSteps = 400;
// A failure from the large regime shrinks by at most this many evaluations: each costs up
// to a second or more, and the first few shrinks (halving K, M, N) find most of the way.
constexpr int kMaxLargeShrinkSteps = 24;
// How far (in multiples of jobs) drawing runs ahead of the oldest case not yet taken.
constexpr std::int64_t kLookahead = 32;

// A word as a shell would need it typed: bare when it holds only safe characters.
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

// A file name from a kernel name and an id (parameterised model names hold ':' and ',').
std::string file_stem(const std::string& kernel, const std::string& id) {
  std::string file;
  for (char ch : kernel + "-" + id) file += std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.' ? ch : '_';
  return file;
}

// Checks one case: in the worker when isolated (the parent never runs kernel code), else
// in this process. Every problem is in the verdict; a case the harness itself cannot
// handle is a failed result, seen and shrunk like any other.
CaseResult check_generated(Registry& registry, Kernel& k, const Case& c, const EvaluationOptions& options,
                           IsolatedEvaluator* isolated) {
  try {
    return isolated ? isolated->evaluate(k.name(), c, options) : check_case(k, c, options, &registry);
  } catch (const std::exception& e) {
    return failed_result(k.name(), c, Disposition::Failed, std::string("harness error: ") + e.what());
  }
}

}  // namespace

std::uint64_t target_seed(std::uint64_t campaign_seed, const FuzzTarget& t) {
  return low64(random_block(campaign_seed, 0xF022u, fnv1a64(target_name(t))));
}

rc::Shrinkable<Case> draw_case(const rc::Gen<Case>& gen, std::uint64_t target_seed, std::uint64_t index) {
  return gen(rc::Random(low64(random_block(target_seed, 0xF023u, index))), static_cast<int>((37 * index) % 101));
}

GenLimits case_limits(const FuzzOptions& o, std::int64_t index) {
  if (!large_case(o.sizes, index)) return GenLimits{o.max_k, o.gelu, false, -1, index % 5 == 1 || index % 5 == 3};
  const std::int64_t nth = o.sizes == SizeSchedule::Large ? index : index / 5;
  return GenLimits{o.max_k, o.gelu, true, static_cast<int>(nth % 5)};
}

Case campaign_case(const FuzzOptions& o, const FuzzTarget& t, const Kernel& k, std::int64_t index) {
  const rc::Gen<Case> gen = op_module(t.op).generate(t.dtype, &k, case_limits(o, index));
  return draw_case(gen, target_seed(o.seed, t), static_cast<std::uint64_t>(index)).value();
}

std::string failed_exchange(const std::string& error) {
  return nlohmann::json{{"units", nlohmann::json::array()}, {"jobs", nlohmann::json::array()}, {"error", error}}.dump();
}

std::string target_name(const FuzzTarget& t) {
  return fmt::format("{} {} {}", t.kernel, t.dtype, t.op == Op::Gemm ? "gemm" : "attention");
}

std::vector<FuzzTarget> all_targets(Registry& registry, const std::vector<std::string>& kernels) {
  std::vector<Kernel*> chosen;
  if (kernels.empty())
    for (const auto& k : registry.all()) chosen.push_back(k.get());
  for (const auto& name : kernels)
    if (Kernel* k = registry.resolve(name); k && std::find(chosen.begin(), chosen.end(), k) == chosen.end()) chosen.push_back(k);
  std::vector<FuzzTarget> out;
  for (Kernel* k : chosen)
    for (const OpModule* op : all_op_modules())
      for (const std::string& dt : op->dtypes())
        if (op->supported_output(*k, dt)) out.push_back({k->name(), dt, op->op()});
  return out;
}

bool large_case(SizeSchedule s, std::int64_t index) {
  return s == SizeSchedule::Large || (s == SizeSchedule::Realistic && index % 5 == 4);
}

CampaignDefinition campaign_definition(const FuzzOptions& o, const std::vector<FuzzTarget>& targets) {
  CampaignDefinition c;
  c.kind = "fuzz";
  c.seed = o.seed;
  c.cases = o.cases;
  c.max_k = o.max_k;
  c.sizes = o.sizes;
  c.metamorphic = o.metamorphic;
  c.gelu = o.gelu;
  for (const auto& t : targets) c.targets.push_back(target_name(t));
  for (const auto& p : o.plugins) c.plugins.push_back(plugin_identity(p));
  c.ulpgate_version = capture_environment().ulpgate_version;
  c.tolerance = o.evaluation.tolerance ? tolerance_to_json(*o.evaluation.tolerance).dump() : "nominal per case";
  if (o.evaluation.baseline)
    c.baseline_rule = fmt::format("{} x {}", o.evaluation.baseline->model, o.evaluation.baseline->factor);
  return c;
}

std::string fuzz_reproducer(const FuzzOptions& o, const FuzzTarget& t, std::int64_t index) {
  std::string cmd = "ulpgate" + plugin_flags(o.plugins);
  cmd += fmt::format(" fuzz --kernel {} --dtype {} --seed {} --cases {} --max-k {} --sizes {} --time 0",
                     shell_word(t.kernel), t.dtype, o.seed, index + 1, o.max_k, name(o.sizes));
  if (!o.metamorphic) cmd += " --no-metamorphic";
  if (o.isolation) cmd += fmt::format(" --timeout {}", o.isolation->timeout_seconds);
  else cmd += " --in-process";
  return cmd;
}

std::vector<std::string> corpus_files(const std::string& dir) {
  std::vector<std::string> files;
  if (dir.empty() || !std::filesystem::is_directory(dir)) return files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  return files;
}

RunRecord merge_shards(const std::vector<std::pair<std::string, RunRecord>>& shards) {
  if (shards.empty()) throw InputError("merge: give the records of every shard");
  const auto& [first_path, first] = shards.front();
  std::vector<const RunRecord*> by_index(static_cast<std::size_t>(std::max(first.shard_count, 1)), nullptr);
  for (const auto& [path, r] : shards) {
    if (r.kind != "fuzz") throw InputError(fmt::format("{}: a {} record, not a fuzz campaign's", path, r.kind.empty() ? "\"\"" : r.kind));
    if (r.shard_count != first.shard_count)
      throw InputError(fmt::format("{}: shard {}/{}, but {} is one of {} shards", path, r.shard_index, r.shard_count, first_path,
                                   first.shard_count));
    if (const auto diff = campaign_differences(first.campaign, r.campaign, first_path, path); !diff.empty())
      throw InputError(fmt::format("{}: another campaign than {}: {}", path, first_path, diff.front()));
    if (r.seed != first.seed) throw InputError(fmt::format("{}: seed {}, {} has {}", path, r.seed, first_path, first.seed));
    const RunRecord*& slot = by_index[static_cast<std::size_t>(r.shard_index)];
    if (slot) throw InputError(fmt::format("{}: shard {}/{} given twice", path, r.shard_index, r.shard_count));
    slot = &r;
  }
  for (std::size_t i = 0; i < by_index.size(); ++i)
    if (!by_index[i]) throw InputError(fmt::format("merge: shard {}/{} missing", i, by_index.size()));
  // Each shard's cases: the prefix (corpus replays; shard 0: the planning's supports()
  // failures), then each target's cases with the supports() failures met while drawing it.
  std::vector<CaseResult> corpus, planning;
  std::map<std::string, std::vector<CaseResult>> of_target;
  for (const RunRecord* r : by_index) {
    std::string current;
    for (const CaseResult& c : r->cases) {
      if (!c.target.empty()) current = c.target;
      if (!current.empty()) of_target[current].push_back(c);
      else (c.origin == "corpus" ? corpus : planning).push_back(c);
    }
  }
  // The whole run replays the corpus files in name order (their reproducers name them).
  std::stable_sort(corpus.begin(), corpus.end(), [](const CaseResult& a, const CaseResult& b) { return a.reproducer < b.reproducer; });
  RunRecord out = first;
  out.shard_index = 0, out.shard_count = 1;
  out.environment = by_index.front()->environment;
  out.cases = std::move(corpus);
  out.cases.insert(out.cases.end(), planning.begin(), planning.end());
  out.not_run.clear();
  std::map<std::string, NotRun> not_run;
  for (const RunRecord* r : by_index)
    for (const NotRun& n : r->not_run) not_run[n.target] = n;
  for (const std::string& t : first.campaign.targets) {
    if (auto it = of_target.find(t); it != of_target.end()) out.cases.insert(out.cases.end(), it->second.begin(), it->second.end());
    if (auto it = not_run.find(t); it != not_run.end()) out.not_run.push_back(it->second);
  }
  return out;
}

CaseResult replay_case(Registry& registry, Case c, const EvaluationOptions& options) {
  Kernel* k = registry.resolve(c.kernel);
  if (!k) throw InputError(fmt::format("case.kernel: '{}' is not a kernel here (see ulpgate list)", c.kernel));
  return check_case(*k, c, options, &registry);
}

RunRecord run_fuzz(Registry& registry, const FuzzOptions& o, const std::function<void(const FuzzProgress&)>& progress,
                   const std::function<void(const std::string&)>& log) {
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const auto budget_spent = [&] { return o.seconds > 0 && elapsed() > o.seconds; };
  const auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  const std::vector<FuzzTarget> targets = o.targets.empty() ? all_targets(registry) : o.targets;
  FuzzScheduler* const shared = o.scheduler;
  if (shared && o.shard_count != 1) throw InputError("a shared campaign is not also sharded (drop --shard)");
  if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count)
    throw InputError(fmt::format("shard {}/{}: the index must be at least 0 and below the count", o.shard_index, o.shard_count));
  // The targets this shard takes (all without sharding), and the kernels of the corpus
  // cases it replays: those whose first target is its own.
  const auto owns = [&](std::size_t index) { return shard_owns(index, o.shard_index, o.shard_count); };
  const auto owns_kernel = [&](const std::string& kernel) {
    for (std::size_t i = 0; i < targets.size(); ++i)
      if (targets[i].kernel == kernel) return owns(i);
    return false;
  };
  RunRecord record;
  record.kind = "fuzz";
  record.seed = o.seed;
  record.shard_index = o.shard_index, record.shard_count = o.shard_count;
  record.campaign = campaign_definition(o, targets);
  record.environment = capture_environment();
  if (o.evaluation.tolerance) record.tolerance = *o.evaluation.tolerance;
  if (o.evaluation.baseline) record.baseline = *o.evaluation.baseline;
  EvaluationOptions options = o.evaluation;
  options.relations = o.metamorphic;
  FuzzProgress p;
  for (std::size_t i = 0; i < targets.size(); ++i) p.total += owns(i) ? o.cases : 0;
  std::unique_ptr<IsolatedEvaluator> own;
  IsolatedEvaluator* isolated = o.evaluator;
  if (!isolated && o.isolation) isolated = (own = std::make_unique<IsolatedEvaluator>(*o.isolation)).get();
  // Generated cases go to a pool of worker threads when jobs > 1 (a worker of their own,
  // so that `isolated` stays free for the stand-ins' supports() queries while cases are
  // drawn, for the corpus and for shrinking); otherwise to `isolated` or this process.
  std::unique_ptr<IsolatedEvaluator> pool;
  if (isolated && o.isolation && o.jobs > 1) {
    IsolationOptions po = *o.isolation;
    po.jobs = static_cast<unsigned>(o.jobs);
    pool = std::make_unique<IsolatedEvaluator>(po);
  }
  const std::string replay_cmd = "ulpgate" + plugin_flags(o.plugins) + " replay ";
  std::size_t support_failures_seen = 0;
  // A supports() query that crashed or hung the worker: recorded as a failed result (the
  // kernel is then unsupported everywhere and the campaign goes on).
  const auto support_failures = [&] {  // those not taken yet
    std::vector<CaseResult> out;
    if (!isolated) return out;
    for (; support_failures_seen < isolated->support_failures().size(); ++support_failures_seen) {
      CaseResult r = isolated->support_failures()[support_failures_seen];
      r.origin = "supports";
      say(fmt::format("FAIL {}: {}", r.kernel, r.message));
      ++p.failures;
      out.push_back(std::move(r));
    }
    return out;
  };
  const auto take_support_failures = [&] {
    for (CaseResult& r : support_failures()) record.cases.push_back(std::move(r));
  };
  std::unique_ptr<Journal> journal;
  if (!o.journal_path.empty()) {
    nlohmann::json campaign = {{"seed", o.seed}, {"cases", o.cases}, {"max_k", o.max_k}, {"metamorphic", o.metamorphic},
                               {"stream", 2}};
    for (const auto& t : targets) campaign["targets"].push_back(t.kernel + " " + t.dtype);
    journal = std::make_unique<Journal>(o.journal_path, campaign, o.resume);
    if (o.resume)
      for (const auto& other : o.journals_read) journal->absorb(other, campaign);
    if (journal->loaded()) say(fmt::format("resuming: {} cases from {}", journal->loaded(), o.journal_path));
    for (const auto& n : journal->notes()) say(n);
  }
  const auto save_case = [&](const std::string& dir, const CaseResult& r) {
    std::filesystem::create_directories(dir);
    const auto path = std::filesystem::path(dir) / (file_stem(r.kernel, r.id) + ".json");
    write_case_file(path.string(), r.spec);
    return path.string();
  };

  // A corpus file's replay.
  const auto replay_corpus = [&](const std::string& f) {
    Case c = read_case_file(f);
    CaseResult r = isolated ? isolated->evaluate(c.kernel, c, options) : replay_case(registry, c, options);
    r.origin = "corpus";
    r.reproducer = replay_cmd + shell_word(f);
    if (!r.verdict.passed) ++p.failures;
    say(fmt::format("corpus {}: {}", std::filesystem::path(f).filename().string(), r.verdict.passed ? "passes now" : "still fails"));
    return r;
  };
  std::vector<std::string> corpus;  // the files this run replays, in order
  {
    std::vector<std::string> files = o.corpus_files ? *o.corpus_files : corpus_files(o.corpus_dir);
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const Case c = read_case_file(f);
      if (owns_kernel(c.kernel) && registry.resolve(c.kernel)) corpus.push_back(f);
    }
  }

  // A target's generators and the evaluations of its cases.
  struct TargetRun {
    const FuzzTarget* t = nullptr;
    Kernel* k = nullptr;
    std::vector<rc::Gen<Case>> gens;  // [0]: small; [1]: small, mapping; [2 + kind]: large
    std::uint64_t seed = 0;
  };
  // One generator for each of case_limits' seven limits.
  const auto target_run = [&](std::size_t target_index) {
    TargetRun tr;
    tr.t = &targets[target_index];
    tr.k = registry.resolve(tr.t->kernel);
    if (!tr.k) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", tr.t->kernel));
    for (bool mapping : {false, true})
      tr.gens.push_back(op_module(tr.t->op).generate(tr.t->dtype, tr.k, GenLimits{o.max_k, o.gelu, false, -1, mapping}));
    for (int kind = 0; kind < 5; ++kind)
      tr.gens.push_back(op_module(tr.t->op).generate(tr.t->dtype, tr.k, GenLimits{o.max_k, o.gelu, true, kind}));
    tr.seed = target_seed(o.seed, *tr.t);
    return tr;
  };
  const auto gen_of = [&](const TargetRun& tr, std::int64_t index) -> const rc::Gen<Case>& {
    const GenLimits l = case_limits(o, index);
    return tr.gens[l.large ? 2 + static_cast<std::size_t>(l.large_kind) : l.mapping ? 1 : 0];
  };
  // A shrink candidate that passes is rejected, and one that fails only a metamorphic
  // relation has another signature: unless the failure being shrunk is a relation's,
  // candidates run without the relations (a passing one would otherwise run the kernel
  // four or five more times, seconds for a large case), which changes no decision. Those
  // bypass the journal, whose results are complete evaluations.
  EvaluationOptions without_relations = options;
  without_relations.relations = false;
  const auto evaluate = [&](const TargetRun& tr, const Case& c, bool relations) {
    const EvaluationOptions& eo = relations ? options : without_relations;
    Kernel& k = *tr.k;
    CaseResult r = journal && relations
                       ? journal->resume_or_run(k.name(), c, [&] { return check_generated(registry, k, c, eo, isolated); })
                       : check_generated(registry, k, c, eo, isolated);
    r.target = target_name(*tr.t);
    return r;
  };
  // Shrinks a failing case towards a minimal one with the same signature: the first
  // shrink that still fails that way is taken, until none does (or the step or time
  // budget ends it: the smallest so far is the result).
  const auto shrink = [&](const TargetRun& tr, rc::Shrinkable<Case> failing, const CaseResult& first, int max_steps) {
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
  };
  // The shrunk case of a failing generated case (case `index`), saved to the corpus; its
  // result when it is smaller than the failing case.
  const auto shrink_failure = [&](const TargetRun& tr, const rc::Shrinkable<Case>& drawn, const CaseResult& first,
                                  std::int64_t index) -> std::optional<CaseResult> {
    CaseResult m = shrink(tr, drawn, first, large_case(o.sizes, index) ? kMaxLargeShrinkSteps : kMaxShrinkSteps);
    if (!o.corpus_dir.empty()) {
      const std::string path = save_case(o.corpus_dir, m);
      say(fmt::format("  shrunk to {}, {}{}", shape_text(m.spec), path,
                      m.id == first.id ? " (no smaller case fails the same way)" : ""));
      m.reproducer = replay_cmd + shell_word(path);
    }
    if (m.id == first.id) return std::nullopt;
    m.origin = "shrunk";
    m.notes["shrunk_from"] = first.id;
    return m;
  };

  // Cases [begin, end) of a target, appended to `out` in case order. With shrinking, the
  // first failure of each signature (not in `shrunk_signatures` yet) is shrunk and its
  // shrunk case follows it; without, the failures that could be shrunk (their case drawn
  // again here is the one checked) are listed in `failures` (case index, position in out,
  // the case) for shrinking later. Returns how many cases were taken (< end - begin: the
  // time budget ended the drawing).
  struct Unshrunk {
    std::int64_t index = 0;
    std::size_t position = 0;
    Case requested;
  };
  const auto run_cases = [&](const TargetRun& tr, std::int64_t begin, std::int64_t end, bool shrinking,
                             std::vector<std::string>& shrunk_signatures, std::vector<CaseResult>& out,
                             std::vector<Unshrunk>* failures) {
    const FuzzTarget& t = *tr.t;
    Kernel* k = tr.k;
    // Cases are drawn (and looked up in the journal) in order here, checked as they come
    // (concurrently: at most 2 x jobs in the pool's threads at once, up to kLookahead x
    // jobs cases ahead of the oldest unfinished one), and taken in order.
    struct Slot {
      std::optional<rc::Shrinkable<Case>> drawn;
      Case value;  // drawn->value(), taken here: RapidCheck recomputes it on each call, in this thread only
      CaseResult result;
      std::string result_json, value_json;  // as the worker sent them (Finished), for the journal
      bool done = false;     // generation failed, or the journal had it, or it was checked
      bool checked = false;  // checked now: to be journaled
    };
    // Drawn and not taken yet, by case index (also the case's id in the pool: a run's
    // cases are all taken before the next run's are drawn, so ids never meet).
    std::map<std::int64_t, Slot> slots;
    const auto draw = [&](std::int64_t index) {
      Slot s;
      try {
        s.drawn = draw_case(gen_of(tr, index), tr.seed, static_cast<std::uint64_t>(index));
        s.value = s.drawn->value();
        if (journal)
          if (auto earlier = journal->take(k->name(), s.value)) s.result = std::move(*earlier), s.done = true;
      } catch (const std::exception& e) {
        s.drawn.reset();
        s.result = failed_result(k->name(), op_module(t.op).basic_case(t.dtype), Disposition::Failed,
                                 std::string("harness error: case generation failed: ") + e.what());
        s.done = true;
      }
      return s;
    };
    // The pool's worker draws the cases itself (its kernel answers the generator's
    // supports() questions without a round trip each), unless a journal is resumed: its
    // results are found by the case, so this thread draws them first.
    const bool worker_draws = pool && !(journal && journal->loaded());
    const auto collect = [&] {  // one finished case from the pool
      const auto wait_start = std::chrono::steady_clock::now();
      IsolatedEvaluator::Finished f = pool->next_result();
      p.waiting += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
      Slot& s = slots.at(static_cast<std::int64_t>(f.id));
      s.result = std::move(f.result);
      s.result_json = std::move(f.result_json);
      if (worker_draws) s.value = std::move(f.requested), s.value_json = std::move(f.requested_json);
      s.done = s.checked = true;
    };
    const std::int64_t lookahead = pool ? kLookahead * static_cast<std::int64_t>(o.jobs) : 1;
    std::int64_t i = begin, next_draw = begin;
    while (i < end) {
      while (next_draw < end && next_draw - i < lookahead && (!pool || pool->in_flight() < 2 * std::size_t(o.jobs)) &&
             !budget_spent()) {
        const auto id = static_cast<std::uint64_t>(next_draw);
        if (worker_draws) {
          pool->submit(id, k->name(),
                       DrawSpec{t.op, t.dtype, tr.seed, static_cast<std::uint64_t>(next_draw), case_limits(o, next_draw)},
                       options);
          slots.emplace(next_draw++, Slot{});
          continue;
        }
        Slot s = draw(next_draw);
        if (!s.done && pool) {
          pool->submit(id, k->name(), s.value, options);
        } else if (!s.done) {
          s.result = check_generated(registry, *k, s.value, options, isolated);
          s.done = s.checked = true;
        }
        slots.emplace(next_draw++, std::move(s));
      }
      const auto it = slots.find(i);
      if (it == slots.end()) break;  // the time budget ended the drawing before case i
      if (!it->second.done) {
        collect();
        continue;
      }
      Slot s = std::move(it->second);
      slots.erase(it);
      if (s.checked && journal) journal->append(k->name(), s.value, s.result, s.value_json, s.result_json);
      CaseResult r = std::move(s.result);
      r.target = target_name(t);
      r.origin = "generated";
      r.reproducer = fuzz_reproducer(o, t, i);
      ++p.cases;
      p.elapsed = elapsed();
      if (!r.verdict.passed) {
        ++p.failures;
        if (!o.cases_dir.empty()) r.reproducer = replay_cmd + shell_word(save_case(o.cases_dir, r));
        say(fmt::format("FAIL {} {} case {}, {} [{}]: {} ({})", t.kernel, t.dtype, i, shape_text(r.spec), r.signature,
                        r.verdict.reasons.front(), r.reproducer));
      }
      if (progress) progress(p);
      if (!r.verdict.passed && worker_draws) {
        // To shrink it this thread needs the case's shrinks: drawn again here, the same
        // case (the same generator and supports() answers), or not shrunk if it is not.
        try {
          s.drawn = draw_case(gen_of(tr, i), tr.seed, static_cast<std::uint64_t>(i));
          if (to_json(s.drawn->value()) != to_json(s.value)) s.drawn.reset();
        } catch (const std::exception&) {
          s.drawn.reset();
        }
      }
      if (!r.verdict.passed && s.drawn && !shrinking) failures->push_back({i, out.size(), s.value});
      const bool shrink_it = shrinking && !r.verdict.passed && s.drawn &&
                             std::none_of(shrunk_signatures.begin(), shrunk_signatures.end(),
                                          [&](const std::string& sig) { return same_failure(sig, r.signature); });
      std::optional<CaseResult> kept;  // for shrinking only
      if (shrink_it) kept = r;
      out.push_back(std::move(r));
      ++i;
      if (!kept) continue;
      // Shrinking checks one case at a time with the planning worker; the pool's cases in
      // flight finish first, so no case waits on it past its timeout.
      while (pool && pool->in_flight()) collect();
      shrunk_signatures.push_back(kept->signature);
      if (auto m = shrink_failure(tr, *s.drawn, *kept, i - 1)) out.push_back(std::move(*m));
    }
    return i - begin;
  };

  if (!shared) {
    // The corpus first: every saved failure of a kernel in this shard is rerun.
    for (const auto& f : corpus) record.cases.push_back(replay_corpus(f));
    // From planning the targets: every shard planned them, shard 0 records it.
    if (o.shard_index == 0) take_support_failures();
    else if (isolated) support_failures_seen = isolated->support_failures().size();
    for (std::size_t target_index = 0; target_index < targets.size(); ++target_index) {
      if (!owns(target_index)) continue;
      const TargetRun tr = target_run(target_index);
      std::vector<std::string> shrunk_signatures;
      const std::int64_t taken = run_cases(tr, 0, o.cases, true, shrunk_signatures, record.cases, nullptr);
      if (taken < o.cases) {
        record.not_run.push_back({target_name(*tr.t), o.cases, taken, fmt::format("time budget (--time {}) spent", o.seconds)});
        say(fmt::format("time budget spent: {} of {} cases of {} not run", o.cases - taken, o.cases, target_name(*tr.t)));
      }
      take_support_failures();
    }
    take_support_failures();
    return record;
  }
  // Shared (o.scheduler, fuzz under mpirun): the processes claim the campaign's units as
  // they become free (dynamic load balancing) and exchange what they found; every process
  // assembles the same record, the single-process run's. Units: each corpus file, then each
  // target's cases in runs of kSharedUnitCases; shrinking waits until every case is known, so
  // that the failures shrunk are those a single process shrinks (the first of each
  // signature in each target, in case order), each shrink a unit of its own.
  FuzzScheduler& sched = *shared;
  const auto results_json = [](const std::vector<CaseResult>& rs) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : rs) a.push_back(case_result_to_json(r));
    return a;
  };
  const auto results_of = [](const nlohmann::json& a) {
    std::vector<CaseResult> out;
    for (const auto& r : a) out.push_back(case_result_from_json(r, "result"));
    return out;
  };
  struct Unit {
    std::int64_t corpus = -1;  // a corpus file's index, or -1: cases [begin, end) of target
    std::size_t target = 0;
    std::int64_t begin = 0, end = 0;
  };
  std::vector<Unit> units;
  for (std::size_t f = 0; f < corpus.size(); ++f) units.push_back({static_cast<std::int64_t>(f)});
  for (std::size_t t = 0; t < targets.size(); ++t)
    for (std::int64_t b = 0; b < o.cases; b += kSharedUnitCases) units.push_back({-1, t, b, std::min(o.cases, b + kSharedUnitCases)});
  const auto n_units = static_cast<std::int64_t>(units.size());
  std::map<std::size_t, TargetRun> runs;
  const auto run_of = [&](std::size_t t) -> const TargetRun& {
    auto it = runs.find(t);
    if (it == runs.end()) it = runs.emplace(t, target_run(t)).first;
    return it->second;
  };
  std::string error;  // this process's, which stops its part of the work
  nlohmann::json mine{{"units", nlohmann::json::array()}};
  if (sched.rank() == 0) mine["planning"] = results_json(support_failures());
  else if (isolated) support_failures_seen = isolated->support_failures().size();
  try {
    for (std::int64_t u; (u = sched.claim(0, n_units)) < n_units;) {
      const Unit& unit = units[static_cast<std::size_t>(u)];
      nlohmann::json j{{"unit", u}};
      std::vector<CaseResult> out;
      if (unit.corpus >= 0) {
        out.push_back(replay_corpus(corpus[static_cast<std::size_t>(unit.corpus)]));
      } else {
        std::vector<std::string> unused;
        std::vector<Unshrunk> failures;
        j["taken"] = run_cases(run_of(unit.target), unit.begin, unit.end, false, unused, out, &failures);
        j["failures"] = nlohmann::json::array();
        for (const auto& f : failures)
          j["failures"].push_back({{"index", f.index}, {"position", f.position}, {"case", to_json(f.requested)}});
      }
      j["cases"] = results_json(out);
      j["supports"] = results_json(support_failures());
      mine["units"].push_back(std::move(j));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  mine["error"] = error;
  // Every process's units, by unit; the processes that failed.
  std::vector<nlohmann::json> unit_out(units.size());
  std::vector<CaseResult> planning;
  std::string lost_why;  // why units are missing: the processes that failed
  // (each process's list under `key`, its entries numbered by `id`)
  const auto take_exchange = [&](const std::vector<std::string>& texts, const char* key, const char* id,
                                 std::vector<nlohmann::json>& into) {
    for (std::size_t r = 0; r < texts.size(); ++r) {
      const nlohmann::json j = nlohmann::json::parse(texts[r]);
      for (const auto& x : j.at(key)) into[x.at(id).get<std::size_t>()] = x;
      if (j.contains("planning")) planning = results_of(j["planning"]);
      const std::string e = j.value("error", "");
      const bool known = std::any_of(sched.failures.begin(), sched.failures.end(), [&](const auto& f) { return f.first == static_cast<int>(r); });
      if (!e.empty() && !known) {
        sched.failures.push_back({static_cast<int>(r), e});
        lost_why += fmt::format("{}MPI rank {} failed: {}", lost_why.empty() ? "" : "; ", r, e);
      }
    }
  };
  take_exchange(sched.exchange(mine.dump()), "units", "unit", unit_out);

  // The failures to shrink, in the single process's order.
  struct Job {
    std::size_t unit = 0, target = 0, position = 0;
    std::int64_t index = 0;
    Case requested;
  };
  std::vector<Job> jobs;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    std::vector<std::string> signatures;
    for (std::size_t u = 0; u < units.size(); ++u) {
      if (units[u].corpus >= 0 || units[u].target != t || unit_out[u].is_null()) continue;
      for (const auto& f : unit_out[u].at("failures")) {
        const auto position = f.at("position").get<std::size_t>();
        const std::string sig = unit_out[u].at("cases").at(position).at("signature").get<std::string>();
        if (std::any_of(signatures.begin(), signatures.end(), [&](const std::string& x) { return same_failure(x, sig); }))
          continue;
        signatures.push_back(sig);
        jobs.push_back({u, t, position, f.at("index").get<std::int64_t>(), case_from_json(f.at("case"))});
      }
    }
  }
  nlohmann::json shrunk{{"jobs", nlohmann::json::array()}};
  if (error.empty()) {
    try {
      const auto n_jobs = static_cast<std::int64_t>(jobs.size());
      for (std::int64_t q; (q = sched.claim(1, n_jobs)) < n_jobs;) {
        const Job& job = jobs[static_cast<std::size_t>(q)];
        const TargetRun& tr = run_of(job.target);
        const CaseResult first = case_result_from_json(unit_out[job.unit]["cases"][job.position], "result");
        nlohmann::json j{{"job", q}, {"shrunk", nullptr}};
        const rc::Shrinkable<Case> drawn = draw_case(gen_of(tr, job.index), tr.seed, static_cast<std::uint64_t>(job.index));
        if (to_json(drawn.value()) == to_json(job.requested))
          if (auto m = shrink_failure(tr, drawn, first, job.index)) j["shrunk"] = case_result_to_json(*m);
        shrunk["jobs"].push_back(std::move(j));
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  shrunk["error"] = error;
  std::vector<nlohmann::json> job_out(jobs.size());
  take_exchange(sched.exchange(shrunk.dump()), "jobs", "job", job_out);

  // The record: the corpus, the planning's supports() failures, each target's cases (each
  // shrunk case after the case it came from) with the supports() failures met drawing them.
  std::map<std::pair<std::size_t, std::size_t>, CaseResult> shrunk_at;  // (unit, position)
  for (std::size_t q = 0; q < jobs.size(); ++q)
    if (!job_out[q].is_null() && !job_out[q]["shrunk"].is_null())
      shrunk_at.emplace(std::make_pair(jobs[q].unit, jobs[q].position), case_result_from_json(job_out[q]["shrunk"], "result"));
  for (std::size_t u = 0; u < units.size(); ++u)
    if (units[u].corpus >= 0 && !unit_out[u].is_null())
      for (auto& r : results_of(unit_out[u]["cases"])) record.cases.push_back(std::move(r));
  for (auto& r : planning) record.cases.push_back(std::move(r));
  for (std::size_t t = 0; t < targets.size(); ++t) {
    std::int64_t taken = 0;
    bool lost = false;
    std::vector<CaseResult> supports;
    for (std::size_t u = 0; u < units.size(); ++u) {
      if (units[u].corpus >= 0 || units[u].target != t) continue;
      if (unit_out[u].is_null()) {
        lost = true;
        continue;
      }
      taken += unit_out[u]["taken"].get<std::int64_t>();
      std::vector<CaseResult> cases = results_of(unit_out[u]["cases"]);
      for (std::size_t k = 0; k < cases.size(); ++k) {
        record.cases.push_back(std::move(cases[k]));
        if (auto it = shrunk_at.find({u, k}); it != shrunk_at.end()) record.cases.push_back(std::move(it->second));
      }
      for (auto& r : results_of(unit_out[u]["supports"])) supports.push_back(std::move(r));
    }
    for (auto& r : supports) record.cases.push_back(std::move(r));
    if (taken < o.cases)
      record.not_run.push_back({target_name(targets[t]), o.cases, taken,
                                lost ? lost_why : fmt::format("time budget (--time {}) spent", o.seconds)});
  }
  return record;
}

}  // namespace ulpgate
