// The shared schedule of a fuzz campaign (FuzzOptions::scheduler, fuzz under mpirun): the
// processes claim the campaign's units as they become free (dynamic load balancing) and
// exchange what they found; every process assembles the same record, the single-process
// run's. Units: each corpus file, then each target's cases in runs of kSharedUnitCases.
// Shrinking waits until every case is known, so that the failures shrunk are those a single
// process shrinks (the first of each signature in each target, in case order), each shrink
// a unit of its own.
#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "campaign/fuzz_campaign.hpp"

namespace ulpgate {
namespace {

nlohmann::json results_json(const std::vector<CaseResult>& rs) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rs) a.push_back(case_result_to_json(r));
  return a;
}

std::vector<CaseResult> results_of(const nlohmann::json& a) {
  std::vector<CaseResult> out;
  for (const auto& r : a) out.push_back(case_result_from_json(r, "result"));
  return out;
}

}  // namespace

RunRecord FuzzCampaign::run_shared() {
  FuzzScheduler& sched = *o_.scheduler;
  Shared s;
  list_units(s);
  const nlohmann::json mine = run_claimed_units(s);
  s.unit_out.resize(s.units.size());
  take_exchange(s, sched.exchange(mine.dump()), "units", "unit", s.unit_out);
  list_shrink_jobs(s);
  const nlohmann::json shrunk = run_claimed_shrinks(s);
  s.job_out.resize(s.jobs.size());
  take_exchange(s, sched.exchange(shrunk.dump()), "jobs", "job", s.job_out);
  assemble_shared_record(s);
  return std::move(record_);
}

void FuzzCampaign::list_units(Shared& s) const {
  for (std::size_t f = 0; f < corpus_.size(); ++f) s.units.push_back({static_cast<std::int64_t>(f)});
  for (std::size_t t = 0; t < targets_.size(); ++t)
    for (std::int64_t b = 0; b < o_.cases; b += kSharedUnitCases)
      s.units.push_back({-1, t, b, std::min(o_.cases, b + kSharedUnitCases)});
}

// Phase 0: the units this process claims, as the first exchange sends them (with rank 0's
// supports() failures from planning, and this process's error if its part threw).
nlohmann::json FuzzCampaign::run_claimed_units(Shared& s) {
  FuzzScheduler& sched = *o_.scheduler;
  nlohmann::json mine{{"units", nlohmann::json::array()}};
  if (sched.rank() == 0) mine["planning"] = results_json(new_support_failures());
  else skip_support_failures();
  try {
    const auto n_units = static_cast<std::int64_t>(s.units.size());
    for (std::int64_t u; (u = sched.claim(0, n_units)) < n_units;)
      mine["units"].push_back(run_unit(u, s.units[static_cast<std::size_t>(u)]));
  } catch (const std::exception& e) {
    s.error = e.what();
  }
  mine["error"] = s.error;
  return mine;
}

// One unit's results; a unit of generated cases lists its failures for shrinking later.
nlohmann::json FuzzCampaign::run_unit(std::int64_t u, const Unit& unit) {
  nlohmann::json j{{"unit", u}};
  std::vector<CaseResult> out;
  if (unit.corpus >= 0) {
    out.push_back(replay_corpus(corpus_[static_cast<std::size_t>(unit.corpus)]));
  } else {
    std::vector<std::string> unused;
    std::vector<Unshrunk> failures;
    j["taken"] = run_cases(target_run(unit.target), unit.begin, unit.end, false, unused, out, &failures);
    j["failures"] = nlohmann::json::array();
    for (const auto& f : failures)
      j["failures"].push_back({{"index", f.index}, {"position", f.position}, {"case", to_json(f.requested)}});
  }
  j["cases"] = results_json(out);
  j["supports"] = results_json(new_support_failures());
  return j;
}

// Every process's entries (its list under `key`, each numbered by `id`) into `into`; the
// planning's failures; the processes that failed, once each.
void FuzzCampaign::take_exchange(Shared& s, const std::vector<std::string>& texts, const char* key, const char* id,
                                 std::vector<nlohmann::json>& into) {
  FuzzScheduler& sched = *o_.scheduler;
  for (std::size_t r = 0; r < texts.size(); ++r) {
    const nlohmann::json j = nlohmann::json::parse(texts[r]);
    for (const auto& x : j.at(key)) into[x.at(id).get<std::size_t>()] = x;
    if (j.contains("planning")) s.planning = results_of(j["planning"]);
    const std::string e = j.value("error", "");
    const bool known = std::any_of(sched.failures.begin(), sched.failures.end(),
                                   [&](const auto& f) { return f.first == static_cast<int>(r); });
    if (!e.empty() && !known) {
      sched.failures.push_back({static_cast<int>(r), e});
      s.lost_why += fmt::format("{}MPI rank {} failed: {}", s.lost_why.empty() ? "" : "; ", r, e);
    }
  }
}

// The failures to shrink, in the single process's order: the first of each signature in
// each target.
void FuzzCampaign::list_shrink_jobs(Shared& s) const {
  for (std::size_t t = 0; t < targets_.size(); ++t) {
    std::vector<std::string> signatures;
    for (std::size_t u = 0; u < s.units.size(); ++u) {
      if (s.units[u].corpus >= 0 || s.units[u].target != t || s.unit_out[u].is_null()) continue;
      for (const auto& f : s.unit_out[u].at("failures")) {
        const auto position = f.at("position").get<std::size_t>();
        const std::string sig = s.unit_out[u].at("cases").at(position).at("signature").get<std::string>();
        if (std::any_of(signatures.begin(), signatures.end(), [&](const std::string& x) { return same_failure(x, sig); }))
          continue;
        signatures.push_back(sig);
        s.jobs.push_back({u, t, position, f.at("index").get<std::int64_t>(), case_from_json(f.at("case"))});
      }
    }
  }
}

// Phase 1: the shrinks this process claims, as the second exchange sends them. A failure
// is shrunk only when drawing it again here gives the case that failed.
nlohmann::json FuzzCampaign::run_claimed_shrinks(Shared& s) {
  FuzzScheduler& sched = *o_.scheduler;
  nlohmann::json shrunk{{"jobs", nlohmann::json::array()}};
  if (s.error.empty()) {
    try {
      const auto n_jobs = static_cast<std::int64_t>(s.jobs.size());
      for (std::int64_t q; (q = sched.claim(1, n_jobs)) < n_jobs;) {
        const ShrinkJob& job = s.jobs[static_cast<std::size_t>(q)];
        const TargetRun& tr = target_run(job.target);
        const CaseResult first = case_result_from_json(s.unit_out[job.unit]["cases"][job.position], "result");
        nlohmann::json j{{"job", q}, {"shrunk", nullptr}};
        const rc::Shrinkable<Case> drawn = draw_case(gen_of(tr, job.index), tr.seed, static_cast<std::uint64_t>(job.index));
        if (to_json(drawn.value()) == to_json(job.requested))
          if (auto m = shrink_failure(tr, drawn, first, job.index)) j["shrunk"] = case_result_to_json(*m);
        shrunk["jobs"].push_back(std::move(j));
      }
    } catch (const std::exception& e) {
      s.error = e.what();
    }
  }
  shrunk["error"] = s.error;
  return shrunk;
}

// The record: the corpus, the planning's supports() failures, each target's cases (each
// shrunk case after the case it came from) with the supports() failures met drawing them.
void FuzzCampaign::assemble_shared_record(Shared& s) {
  std::map<std::pair<std::size_t, std::size_t>, CaseResult> shrunk_at;  // (unit, position)
  for (std::size_t q = 0; q < s.jobs.size(); ++q)
    if (!s.job_out[q].is_null() && !s.job_out[q]["shrunk"].is_null())
      shrunk_at.emplace(std::make_pair(s.jobs[q].unit, s.jobs[q].position), case_result_from_json(s.job_out[q]["shrunk"], "result"));
  for (std::size_t u = 0; u < s.units.size(); ++u)
    if (s.units[u].corpus >= 0 && !s.unit_out[u].is_null())
      for (auto& r : results_of(s.unit_out[u]["cases"])) record_.cases.push_back(std::move(r));
  for (auto& r : s.planning) record_.cases.push_back(std::move(r));
  for (std::size_t t = 0; t < targets_.size(); ++t) record_target_units(s, t, shrunk_at);
}

// One target's units in the record, and its not-run entry when cases are missing.
void FuzzCampaign::record_target_units(Shared& s, std::size_t target,
                                       std::map<std::pair<std::size_t, std::size_t>, CaseResult>& shrunk_at) {
  std::int64_t taken = 0;
  bool lost = false;
  std::vector<CaseResult> supports;
  for (std::size_t u = 0; u < s.units.size(); ++u) {
    if (s.units[u].corpus >= 0 || s.units[u].target != target) continue;
    if (s.unit_out[u].is_null()) {
      lost = true;
      continue;
    }
    taken += s.unit_out[u]["taken"].get<std::int64_t>();
    std::vector<CaseResult> cases = results_of(s.unit_out[u]["cases"]);
    for (std::size_t k = 0; k < cases.size(); ++k) {
      record_.cases.push_back(std::move(cases[k]));
      if (auto it = shrunk_at.find({u, k}); it != shrunk_at.end()) record_.cases.push_back(std::move(it->second));
    }
    for (auto& r : results_of(s.unit_out[u]["supports"])) supports.push_back(std::move(r));
  }
  for (auto& r : supports) record_.cases.push_back(std::move(r));
  if (taken < o_.cases)
    record_.not_run.push_back({target_name(targets_[target]), o_.cases, taken,
                               lost ? s.lost_why : fmt::format("time budget (--time {}) spent", o_.seconds)});
}

}  // namespace ulpgate
