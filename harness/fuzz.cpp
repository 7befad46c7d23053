#include "harness/fuzz.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>
#include <rapidcheck/detail/TestListenerAdapter.h>

#include "distributions/case_gen.hpp"
#include "distributions/fill.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "harness/isolate.hpp"
#include "harness/journal.hpp"

namespace rc::detail {
// Defined in librapidcheck (detail/Configuration.cpp) but not declared in its headers:
// the string RC_PARAMS="reproduce=..." takes.
std::string reproduceMapToString(const std::unordered_map<std::string, Reproduce>& reproduceMap);
}  // namespace rc::detail

namespace ulpgate {
namespace {

constexpr int kMaxShrinkSteps = 400;

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

std::string short_hash(const std::string& s) { return fmt::format("{:016x}", fnv1a(s)); }

std::uint64_t target_key(const FuzzTarget& t) {
  return fnv1a(fmt::format("{} {} {}", t.kernel, t.dtype, t.op == Op::Gemm ? "gemm" : "attention"));
}

// Checks one generated case: in the worker when isolated (the parent never runs kernel
// code), else in this process. Every problem is in the verdict.
CaseResult check_generated(Registry& registry, Kernel& k, const Case& generated, const EvaluationOptions& options,
                           IsolatedEvaluator* isolated) {
  return isolated ? isolated->evaluate(k.name(), generated, options) : check_case(k, generated, options, &registry);
}

}  // namespace

std::vector<FuzzTarget> all_targets(const Registry& registry) {
  std::vector<FuzzTarget> out;
  for (const auto& k : registry.all())
    for (const OpModule* op : all_op_modules())
      for (const std::string& dt : op->dtypes())
        if (k->supports(op->basic_case(dt))) out.push_back({k->name(), dt, op->op()});
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
  const auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  // RC_PARAMS="reproduce=..." (printed with each failure) replays that shrunk failure.
  std::unordered_map<std::string, rc::detail::Reproduce> reproduce;
  if (const char* env = std::getenv("RC_PARAMS")) {
    try {
      reproduce = rc::detail::configFromString(env).reproduce;
    } catch (const rc::detail::ConfigurationException& e) {
      throw InputError(fmt::format("RC_PARAMS: {}", e.what()));
    }
  }
  RunRecord record;
  record.kind = "fuzz";
  record.seed = o.seed;
  record.environment = capture_environment();
  if (o.evaluation.tolerance) record.tolerance = *o.evaluation.tolerance;
  if (o.evaluation.baseline) record.baseline = *o.evaluation.baseline;
  const std::vector<FuzzTarget> targets = o.targets.empty() ? all_targets(registry) : o.targets;
  EvaluationOptions options = o.evaluation;
  options.relations = o.metamorphic;
  FuzzProgress p;
  p.total = static_cast<std::int64_t>(targets.size()) * o.cases;
  std::unique_ptr<IsolatedEvaluator> own;
  IsolatedEvaluator* isolated = o.evaluator;
  if (!isolated && o.isolation) isolated = (own = std::make_unique<IsolatedEvaluator>(*o.isolation)).get();
  std::size_t support_failures_seen = 0;
  // A supports() query that crashed or hung the worker: recorded as a failed result (the
  // kernel is then unsupported everywhere and the campaign goes on).
  const auto take_support_failures = [&] {
    if (!isolated) return;
    for (; support_failures_seen < isolated->support_failures().size(); ++support_failures_seen) {
      CaseResult r = isolated->support_failures()[support_failures_seen];
      say(fmt::format("FAIL {}: {}", r.kernel, r.message));
      ++p.failures;
      record.cases.push_back(std::move(r));
    }
  };
  std::unique_ptr<Journal> journal;
  if (!o.journal_path.empty()) {
    nlohmann::json campaign = {{"seed", o.seed}, {"cases", o.cases}, {"max_k", o.max_k}, {"metamorphic", o.metamorphic}};
    for (const auto& t : targets) campaign["targets"].push_back(t.kernel + " " + t.dtype);
    journal = std::make_unique<Journal>(o.journal_path, campaign, o.resume);
    if (journal->loaded()) say(fmt::format("resuming: {} cases from {}", journal->loaded(), o.journal_path));
    for (const auto& n : journal->notes()) say(n);
  }

  // The corpus first: every saved failure of a kernel in this campaign is rerun.
  if (!o.corpus_dir.empty() && std::filesystem::is_directory(o.corpus_dir)) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(o.corpus_dir))
      if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      Case c = read_case_file(f.string());
      const bool wanted = std::any_of(targets.begin(), targets.end(), [&](const FuzzTarget& t) { return t.kernel == c.kernel; });
      if (!wanted || !registry.resolve(c.kernel)) continue;
      CaseResult r = isolated ? isolated->evaluate(c.kernel, c, options) : replay_case(registry, c, options);
      r.family = "corpus " + r.family;
      r.reproducer = "ulpgate replay " + f.string();
      if (!r.verdict.passed) ++p.failures;
      say(fmt::format("corpus {}: {}", f.filename().string(), r.verdict.passed ? "passes now" : "still fails"));
      record.cases.push_back(std::move(r));
    }
  }

  take_support_failures();  // from planning the targets
  for (std::size_t ti = 0; ti < targets.size(); ++ti) {
    const FuzzTarget& t = targets[ti];
    Kernel* k = registry.resolve(t.kernel);
    if (!k) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", t.kernel));
    if (o.seconds > 0 && elapsed() > o.seconds) {
      say(fmt::format("time budget spent: {} {} not fuzzed", t.kernel, t.dtype));
      continue;
    }
    // State shared with the property: results of the first pass, and the last failure
    // (RapidCheck calls the property again while shrinking; the last failing call is the
    // minimal counterexample).
    std::vector<CaseResult> results;
    bool shrinking = false;
    int shrink_steps = 0;
    std::optional<CaseResult> minimal;
    auto property = [&]() {
      const Case generated = *op_module(t.op).generate(t.dtype, k, GenLimits{o.max_k, o.gelu});
      if (!shrinking && o.seconds > 0 && elapsed() > o.seconds) return;  // budget spent: pass quietly
      // Shrinking can try thousands of candidates; past kMaxShrinkSteps, or once the time
      // budget is spent, the smallest failure found so far is the one reported (later
      // candidates pass, which ends the search).
      if (shrinking && (++shrink_steps > kMaxShrinkSteps || (o.seconds > 0 && elapsed() > o.seconds))) return;
      const auto run_case = [&] {
        try {
          return check_generated(registry, *k, generated, options, isolated);
        } catch (const std::exception& e) {
          // A generated case the harness itself cannot handle: recorded as a failure so that
          // it is seen and shrunk like any other.
          CaseResult r;
          r.kernel = k->name();
          r.spec = generated;
          r.family = case_family(generated);
          r.status = Disposition::Failed;
          r.message = std::string("harness error: ") + e.what();
          r.verdict.passed = false;
          r.verdict.reasons = {r.message};
          return r;
        }
      };
      CaseResult r = journal ? journal->resume_or_run(k->name(), generated, run_case) : run_case();
      if (!shrinking) {
        ++p.cases;
        p.elapsed = elapsed();
        if (!r.verdict.passed) ++p.failures;
        if (progress) progress(p);
        results.push_back(r);
      }
      if (!r.verdict.passed) {
        shrinking = true;
        minimal = r;
        RC_FAIL(fmt::format("{} on {}: {}", k->name(), r.family, r.verdict.reasons.front()));
      }
    };
    rc::detail::TestParams params;
    // One seed per target from the campaign seed and the target's own name, so that its
    // cases do not depend on which other targets run (or in which order).
    params.seed = low64(random_block(o.seed, 0xF022u, target_key(t)));
    params.maxSuccess = static_cast<int>(o.cases);
    params.maxSize = 100;
    rc::detail::TestMetadata meta;
    meta.id = meta.description = fmt::format("{} {}", t.kernel, t.dtype);
    // A listener and parameters of our own: RapidCheck's defaults read RC_PARAMS, print
    // "Using configuration" with a seed that plays no part here, and print every reproduce
    // string again at exit; the campaign seeds and reports everything itself.
    rc::detail::TestListenerAdapter quiet;
    const rc::detail::TestResult result =
        rc::detail::checkProperty(rc::detail::toProperty(property), meta, params, quiet, reproduce);
    for (auto& r : results) {
      r.reproducer = fmt::format("ulpgate fuzz --kernel {} --dtype {} --seed {} --cases {}", t.kernel, t.dtype, o.seed, o.cases);
      record.cases.push_back(std::move(r));
    }
    rc::detail::FailureResult failure;
    if (result.match(failure) && minimal) {
      CaseResult m = *minimal;
      m.family = "shrunk " + m.family;
      const std::string reproduce =
          rc::detail::reproduceMapToString({{meta.id, failure.reproduce}});
      m.notes["rapidcheck_reproduce"] = fmt::format("RC_PARAMS=\"reproduce={}\"", reproduce);
      if (!o.corpus_dir.empty()) {
        std::filesystem::create_directories(o.corpus_dir);
        const std::string stem = fmt::format("{}-{}", t.kernel, short_hash(to_json(m.spec).dump()));
        std::string file;
        for (char ch : stem) file += std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.' ? ch : '_';
        const auto path = std::filesystem::path(o.corpus_dir) / (file + ".json");
        write_case_file(path.string(), m.spec);
        m.reproducer = "ulpgate replay " + path.string();
        say(fmt::format("FAIL {} {}: {} (minimal case: {}; {})", t.kernel, t.dtype, m.verdict.reasons.front(),
                        path.string(), m.notes["rapidcheck_reproduce"]));
      } else {
        say(fmt::format("FAIL {} {}: {}", t.kernel, t.dtype, m.verdict.reasons.front()));
      }
      record.cases.push_back(std::move(m));
    }
    take_support_failures();
  }
  take_support_failures();
  return record;
}

}  // namespace ulpgate
