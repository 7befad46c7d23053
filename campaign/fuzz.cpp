#include "campaign/fuzz.hpp"

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/rng.hpp"
#include "campaign/fuzz_campaign.hpp"

namespace ulpgate {

std::uint64_t target_seed(std::uint64_t campaign_seed, const FuzzTarget& t) {
  return low64(random_block(campaign_seed, 0xF022u, fnv1a64(target_name(t))));
}

rc::Shrinkable<Case> draw_case(const rc::Gen<Case>& gen, std::uint64_t target_seed, std::uint64_t index) {
  return gen(rc::Random(low64(random_block(target_seed, 0xF023u, index))), static_cast<int>((37 * index) % 101));
}

GenLimits case_limits(const FuzzOptions& o, std::int64_t index) {
  const std::int64_t nth = o.sizes == SizeSchedule::Large ? index : index / 5;
  const bool large = large_case(o.sizes, index);
  return GenLimits{.max_reduction = o.max_k, .gelu = o.gelu, .large = large, .large_kind = large ? static_cast<int>(nth % 5) : -1,
                   .mapping = !large && (index % 5 == 1 || index % 5 == 3), .forward_kernel = o.forward_kernel};
}

Case campaign_case(const FuzzOptions& o, const FuzzTarget& t, const Kernel& k, std::int64_t index) {
  const rc::Gen<Case> gen = op_module(t.op).generate(t.dtype, &k, case_limits(o, index));
  return draw_case(gen, target_seed(o.seed, t), static_cast<std::uint64_t>(index)).value();
}

std::string failed_exchange(const std::string& error) {
  return nlohmann::json{{"units", nlohmann::json::array()}, {"jobs", nlohmann::json::array()}, {"error", error}}.dump();
}

std::string target_name(const FuzzTarget& t) {
  return fmt::format("{} {} {}", t.kernel, t.dtype, name(t.op));
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
  c.forward_kernel = o.forward_kernel;
  return c;
}

std::string fuzz_reproducer(const FuzzOptions& o, const FuzzTarget& t, std::int64_t index) {
  std::string cmd = "ulpgate" + plugin_flags(o.plugins);
  cmd += fmt::format(" fuzz --kernel {} --dtype {} --seed {} --cases {} --max-k {} --sizes {} --time 0",
                     shell_word(t.kernel), t.dtype, o.seed, index + 1, o.max_k, name(o.sizes));
  if (!o.metamorphic) cmd += " --no-metamorphic";
  if (!o.forward_kernel.empty()) cmd += " --forward-kernel " + shell_word(o.forward_kernel);
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
  if (!c.forward_kernel.empty() && !registry.resolve(c.forward_kernel))
    throw InputError(fmt::format("case.forward_kernel: '{}' is not a kernel here (see ulpgate list)", c.forward_kernel));
  return check_case(*k, c, options, &registry);
}

RunRecord run_fuzz(Registry& registry, const FuzzOptions& o, const std::function<void(const FuzzProgress&)>& progress,
                   const std::function<void(const std::string&)>& log) {
  return FuzzCampaign(registry, o, progress, log).run();
}

}  // namespace ulpgate
