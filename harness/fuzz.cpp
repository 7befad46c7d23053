#include "harness/fuzz.hpp"

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
#include "harness/isolate.hpp"
#include "harness/journal.hpp"

namespace ulpgate {
namespace {

constexpr int kMaxShrinkSteps = 400;
// A failure from the large regime shrinks by at most this many evaluations: each costs up
// to a second or more, and the first few shrinks (halving K, M, N) find most of the way.
constexpr int kMaxLargeShrinkSteps = 24;
// How far (in multiples of jobs) drawing runs ahead of the oldest case not yet taken.
constexpr std::int64_t kLookahead = 32;

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

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
  return low64(random_block(campaign_seed, 0xF022u, fnv1a(target_name(t))));
}

rc::Shrinkable<Case> draw_case(const rc::Gen<Case>& gen, std::uint64_t target_seed, std::uint64_t index) {
  return gen(rc::Random(low64(random_block(target_seed, 0xF023u, index))), static_cast<int>((37 * index) % 101));
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
        if (k->supports(op->basic_case(dt))) out.push_back({k->name(), dt, op->op()});
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
  const auto take_support_failures = [&] {
    if (!isolated) return;
    for (; support_failures_seen < isolated->support_failures().size(); ++support_failures_seen) {
      CaseResult r = isolated->support_failures()[support_failures_seen];
      r.origin = "supports";
      say(fmt::format("FAIL {}: {}", r.kernel, r.message));
      ++p.failures;
      record.cases.push_back(std::move(r));
    }
  };
  std::unique_ptr<Journal> journal;
  if (!o.journal_path.empty()) {
    nlohmann::json campaign = {{"seed", o.seed}, {"cases", o.cases}, {"max_k", o.max_k}, {"metamorphic", o.metamorphic},
                               {"stream", 2}};
    for (const auto& t : targets) campaign["targets"].push_back(t.kernel + " " + t.dtype);
    journal = std::make_unique<Journal>(o.journal_path, campaign, o.resume);
    if (journal->loaded()) say(fmt::format("resuming: {} cases from {}", journal->loaded(), o.journal_path));
    for (const auto& n : journal->notes()) say(n);
  }
  const auto save_case = [&](const std::string& dir, const CaseResult& r) {
    std::filesystem::create_directories(dir);
    const auto path = std::filesystem::path(dir) / (file_stem(r.kernel, r.id) + ".json");
    write_case_file(path.string(), r.spec);
    return path.string();
  };

  // The corpus first: every saved failure of a kernel in this campaign is rerun.
  {
    std::vector<std::string> files = o.corpus_files ? *o.corpus_files : corpus_files(o.corpus_dir);
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      Case c = read_case_file(f);
      if (!owns_kernel(c.kernel) || !registry.resolve(c.kernel)) continue;
      CaseResult r = isolated ? isolated->evaluate(c.kernel, c, options) : replay_case(registry, c, options);
      r.origin = "corpus";
      r.reproducer = replay_cmd + shell_word(f);
      if (!r.verdict.passed) ++p.failures;
      say(fmt::format("corpus {}: {}", std::filesystem::path(f).filename().string(), r.verdict.passed ? "passes now" : "still fails"));
      record.cases.push_back(std::move(r));
    }
  }

  // From planning the targets: every shard planned them, shard 0 records it.
  if (o.shard_index == 0) take_support_failures();
  else if (isolated) support_failures_seen = isolated->support_failures().size();
  for (std::size_t target_index = 0; target_index < targets.size(); ++target_index) {
    if (!owns(target_index)) continue;
    const FuzzTarget& t = targets[target_index];
    Kernel* k = registry.resolve(t.kernel);
    if (!k) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", t.kernel));
    // Case i's limits: the small regime, or when the size schedule says so (large_case) the
    // large one, the n-th large case of the target drawing shape kind n mod 5 (rotating);
    // one generator for each of those six limits.
    const auto limits_of = [&](std::int64_t index) {
      if (!large_case(o.sizes, index)) return GenLimits{o.max_k, o.gelu, false};
      const std::int64_t nth = o.sizes == SizeSchedule::Large ? index : index / 5;
      return GenLimits{o.max_k, o.gelu, true, static_cast<int>(nth % 5)};
    };
    std::vector<rc::Gen<Case>> gens;  // [0]: small; [1 + kind]: large
    gens.push_back(op_module(t.op).generate(t.dtype, k, GenLimits{o.max_k, o.gelu, false}));
    for (int kind = 0; kind < 5; ++kind)
      gens.push_back(op_module(t.op).generate(t.dtype, k, GenLimits{o.max_k, o.gelu, true, kind}));
    const auto gen_of = [&](std::int64_t index) -> const rc::Gen<Case>& {
      const GenLimits l = limits_of(index);
      return gens[l.large ? 1 + static_cast<std::size_t>(l.large_kind) : 0];
    };
    const std::uint64_t seed_of_target = target_seed(o.seed, t);
    // A shrink candidate that passes is rejected, and one that fails only a metamorphic
    // relation has another signature: unless the failure being shrunk is a relation's,
    // candidates run without the relations (a passing one would otherwise run the kernel
    // four or five more times, seconds for a large case), which changes no decision. Those
    // bypass the journal, whose results are complete evaluations.
    EvaluationOptions without_relations = options;
    without_relations.relations = false;
    const auto evaluate = [&](const Case& c, bool relations = true) {
      const EvaluationOptions& eo = relations ? options : without_relations;
      CaseResult r = journal && relations
                         ? journal->resume_or_run(k->name(), c, [&] { return check_generated(registry, *k, c, eo, isolated); })
                         : check_generated(registry, *k, c, eo, isolated);
      r.target = target_name(t);
      return r;
    };
    // Shrinks a failing case towards a minimal one with the same signature: the first
    // shrink that still fails that way is taken, until none does (or the step or time
    // budget ends it: the smallest so far is the result).
    const auto shrink = [&](rc::Shrinkable<Case> failing, const CaseResult& first, int max_steps) {
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
          CaseResult cr = evaluate(cc, relation_failure);
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
    std::vector<std::string> shrunk_signatures;
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
    // Drawn and not taken yet, by case index (also the case's id in the pool: a target's
    // cases are all taken before the next target's are drawn, so ids never meet).
    std::map<std::int64_t, Slot> slots;
    const auto draw = [&](std::int64_t index) {
      Slot s;
      try {
        s.drawn = draw_case(gen_of(index), seed_of_target, static_cast<std::uint64_t>(index));
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
    std::int64_t i = 0, next_draw = 0;
    while (i < o.cases) {
      while (next_draw < o.cases && next_draw - i < lookahead && (!pool || pool->in_flight() < 2 * std::size_t(o.jobs)) &&
             !budget_spent()) {
        const auto id = static_cast<std::uint64_t>(next_draw);
        if (worker_draws) {
          pool->submit(id, k->name(),
                       DrawSpec{t.op, t.dtype, seed_of_target, static_cast<std::uint64_t>(next_draw), limits_of(next_draw)},
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
        say(fmt::format("FAIL {} {} case {} [{}]: {} ({})", t.kernel, t.dtype, i, r.signature, r.verdict.reasons.front(),
                        r.reproducer));
      }
      if (progress) progress(p);
      if (!r.verdict.passed && worker_draws) {
        // To shrink it this thread needs the case's shrinks: drawn again here, the same
        // case (the same generator and supports() answers), or not shrunk if it is not.
        try {
          s.drawn = draw_case(gen_of(i), seed_of_target, static_cast<std::uint64_t>(i));
          if (to_json(s.drawn->value()) != to_json(s.value)) s.drawn.reset();
        } catch (const std::exception&) {
          s.drawn.reset();
        }
      }
      const bool shrink_it = !r.verdict.passed && s.drawn &&
                             std::none_of(shrunk_signatures.begin(), shrunk_signatures.end(),
                                          [&](const std::string& sig) { return same_failure(sig, r.signature); });
      std::optional<CaseResult> kept;  // for shrinking only
      if (shrink_it) kept = r;
      record.cases.push_back(std::move(r));
      ++i;
      if (!kept) continue;
      const CaseResult& first = *kept;
      // Shrinking checks one case at a time with the planning worker; the pool's cases in
      // flight finish first, so no case waits on it past its timeout.
      while (pool && pool->in_flight()) collect();
      shrunk_signatures.push_back(first.signature);
      CaseResult m = shrink(*s.drawn, first, large_case(o.sizes, i) ? kMaxLargeShrinkSteps : kMaxShrinkSteps);
      if (!o.corpus_dir.empty()) {
        const std::string path = save_case(o.corpus_dir, m);
        say(fmt::format("  shrunk to {}{}", path, m.id == first.id ? " (no smaller case fails the same way)" : ""));
        m.reproducer = replay_cmd + shell_word(path);
      }
      if (m.id != first.id) {
        m.origin = "shrunk";
        m.notes["shrunk_from"] = first.id;
        record.cases.push_back(std::move(m));
      }
    }
    if (i < o.cases) {
      record.not_run.push_back({target_name(t), o.cases, i, fmt::format("time budget (--time {}) spent", o.seconds)});
      say(fmt::format("time budget spent: {} of {} cases of {} not run", o.cases - i, o.cases, target_name(t)));
    }
    take_support_failures();
  }
  take_support_failures();
  return record;
}

}  // namespace ulpgate
