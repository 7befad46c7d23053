#include "campaign/gate.hpp"

#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace ulpgate {
namespace {

using json = nlohmann::json;

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default: o += ch;
    }
  }
  return o;
}

[[noreturn]] void bad(const std::string& path, const std::string& msg) { throw InputError(path + ": " + msg); }

// A metric of the baseline: finite, +inf (written "inf"), or NaN ("nan": no element compared).
double number(const json& j, const std::string& key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) bad(path + "." + key, "missing");
  if (it->is_number()) return it->get<double>();
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "inf") return INFINITY;
    if (s == "nan") return NAN;
  }
  bad(path + "." + key, "must be a number");
}

std::string text(const json& j, const std::string& key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) bad(path + "." + key, "missing");
  if (!it->is_string()) bad(path + "." + key, "must be a string");
  return it->get<std::string>();
}

json num(double x) { return std::isnan(x) ? json("nan") : std::isinf(x) ? json("inf") : json(x); }

// NaN (nothing compared) counts as no error.
double value(double x) { return std::isnan(x) ? 0.0 : x; }

}  // namespace

Baseline baseline_from_record(const RunRecord& r, double relative_slack, double absolute_slack_ulp) {
  if (r.campaign.kind != "fuzz") throw InputError("baseline update: the record is not a fuzz campaign (kind '" + r.kind + "')");
  std::int64_t failing = 0, not_run = 0;
  for (const auto& c : r.cases) failing += !c.verdict.passed;
  for (const auto& n : r.not_run) not_run += n.planned - n.run;
  if (failing)
    throw InputError(fmt::format("baseline update: the record has {} failing cases; a baseline is made from a passing run "
                                 "(the gate fails on any failing case)", failing));
  if (not_run)
    throw InputError(fmt::format("baseline update: {} planned cases of the campaign did not run (time budget); a baseline "
                                 "is made from a complete run (rerun with --time 0)", not_run));
  Baseline b;
  b.relative_slack = relative_slack;
  b.absolute_slack_ulp = absolute_slack_ulp;
  b.source = fmt::format("{} (seed {})", r.command, r.seed);
  b.campaign = r.campaign;
  std::set<std::string> seen;
  for (const auto& c : r.cases) {
    if (c.status == Disposition::NotSupported || !seen.insert(c.id).second) continue;
    BaselineCase e{c.id, c.kernel, c.target, c.family, {}};
    for (const auto& m : c.metrics) e.outputs.push_back({m.output, m.format, m.max_normalised, m.max_ulp});
    b.cases.push_back(std::move(e));
  }
  return b;
}

json to_json(const Baseline& b) {
  json cases = json::array();
  for (const auto& c : b.cases) {
    json outs = json::array();
    for (const auto& o : c.outputs)
      outs.push_back({{"output", o.output}, {"format", name(o.format)}, {"max_normalised", num(o.max_normalised)},
                      {"max_ulp", num(o.max_ulp)}});
    cases.push_back({{"id", c.id}, {"kernel", c.kernel}, {"target", c.target}, {"family", c.family}, {"outputs", outs}});
  }
  return {{"ulpgate_baseline", kBaselineSchemaVersion}, {"relative_slack", b.relative_slack},
          {"absolute_slack_ulp", b.absolute_slack_ulp}, {"source", b.source},
          {"campaign", campaign_to_json(b.campaign)}, {"cases", cases}};
}

Baseline baseline_from_json(const json& j) {
  if (!j.is_object()) bad("baseline", "must be a JSON object");
  auto v = j.find("ulpgate_baseline");
  if (v == j.end()) bad("baseline.ulpgate_baseline", "missing (not a baseline file?)");
  // Compared as the 64-bit integer it is: read through an int, 2^32 + 2 was version 2.
  const bool current = v->is_number_integer() && v->get<std::int64_t>() == kBaselineSchemaVersion &&
                       !(v->is_number_unsigned() && v->get<std::uint64_t>() > INT64_MAX);
  if (!current)
    bad("baseline.ulpgate_baseline", fmt::format("unsupported version {} (this build reads {}; regenerate it with "
                                                 "'ulpgate baseline update')", v->dump(), kBaselineSchemaVersion));
  Baseline b;
  b.relative_slack = number(j, "relative_slack", "baseline");
  b.absolute_slack_ulp = number(j, "absolute_slack_ulp", "baseline");
  if (!(b.relative_slack >= 0) || !(b.absolute_slack_ulp >= 0) || std::isinf(b.relative_slack) ||
      std::isinf(b.absolute_slack_ulp))
    bad("baseline", "slack must be finite and >= 0");
  b.source = text(j, "source", "baseline");
  auto camp = j.find("campaign");
  if (camp == j.end()) bad("baseline.campaign", "missing");
  b.campaign = campaign_from_json(*camp, "baseline.campaign");
  auto cs = j.find("cases");
  if (cs == j.end() || !cs->is_array()) bad("baseline.cases", "must be an array");
  for (std::size_t i = 0; i < cs->size(); ++i) {
    const json& e = (*cs)[i];
    const std::string p = fmt::format("baseline.cases[{}]", i);
    if (!e.is_object()) bad(p, "must be an object");
    BaselineCase c;
    c.id = text(e, "id", p);
    c.kernel = text(e, "kernel", p);
    c.target = text(e, "target", p);
    c.family = text(e, "family", p);
    auto os = e.find("outputs");
    if (os == e.end() || !os->is_array()) bad(p + ".outputs", "must be an array");
    for (std::size_t k = 0; k < os->size(); ++k) {
      const std::string q = fmt::format("{}.outputs[{}]", p, k);
      const json& o = (*os)[k];
      if (!o.is_object()) bad(q, "must be an object");
      BaselineOutput out;
      out.output = text(o, "output", q);
      const auto f = parse_format(text(o, "format", q));
      if (!f) bad(q + ".format", "unknown format");
      out.format = *f;
      out.max_normalised = number(o, "max_normalised", q);
      out.max_ulp = number(o, "max_ulp", q);
      c.outputs.push_back(std::move(out));
    }
    b.cases.push_back(std::move(c));
  }
  return b;
}

Baseline read_baseline_file(const std::string& path) {
  return read_json_file_as(path, [](const json& j) { return baseline_from_json(j); });
}

void write_baseline_file(const std::string& path, const Baseline& b) {
  write_text_file_atomically(path, to_json(b).dump(1) + "\n");
}

GateResult gate(const Baseline& baseline, const RunRecord& run, const GateOptions& options) {
  if (run.campaign.kind != "fuzz")
    throw InputError(fmt::format("gate: the run record is not a fuzz campaign (kind '{}'); gate a record written by "
                                 "'ulpgate fuzz'", run.kind));
  GateResult g;
  // A rebuilt plugin is what the gate judges: its bytes (hash) may differ, not its file
  // name, nor its kernels (the targets name them), nor anything else of the campaign.
  CampaignDefinition same_build = run.campaign;
  for (std::size_t i = 0; i < same_build.plugins.size(); ++i) {
    if (i >= baseline.campaign.plugins.size()) break;
    const PluginIdentity &was = baseline.campaign.plugins[i], &now = run.campaign.plugins[i];
    if (was.name != now.name || was.hash == now.hash) continue;
    g.rebuilt_plugins.push_back(fmt::format("{} ({} in the baseline, {} in the run)", now.name, was.hash, now.hash));
    same_build.plugins[i].hash = was.hash;
  }
  g.campaign_differences = campaign_differences(baseline.campaign, same_build);
  if (!g.campaign_differences.empty() && !options.allow_different_campaign)
    throw InputError(fmt::format("gate: the run is of another campaign than the baseline ({}); rerun the baseline's "
                                 "campaign, or pass --allow-different-campaign",
                                 fmt::join(g.campaign_differences, "; ")));
  std::map<std::string, const CaseResult*> current;
  for (const auto& c : run.cases)
    if (c.status != Disposition::NotSupported) current.emplace(c.id, &c);
  std::map<std::string, const NotRun*> not_run;
  for (const auto& n : run.not_run) not_run[n.target] = &n;

  // Every failing case of the run fails the gate, in the baseline or not.
  for (const auto& c : run.cases)
    if (!c.verdict.passed) {
      ++g.failing;
      g.rows.push_back({"failing", c.id, c.kernel, c.family,
                        fmt::format("{} [{}]: {}", c.verdict.reasons.empty() ? "failed" : c.verdict.reasons.front(),
                                    c.signature, c.reproducer),
                        true});
    }
  std::set<std::string> in_baseline;
  for (const auto& b : baseline.cases) {
    in_baseline.insert(b.id);
    auto it = current.find(b.id);
    if (it == current.end()) {
      auto nr = not_run.find(b.target);
      if (nr != not_run.end()) {
        ++g.not_run;
        g.rows.push_back({"not run", b.id, b.kernel, b.family, nr->second->reason, !options.allow_missing});
      } else {
        ++g.missing;
        g.rows.push_back({"missing", b.id, b.kernel, b.family, "in the baseline, not in this run", !options.allow_missing});
      }
      continue;
    }
    ++g.matched;
    const CaseResult& c = *it->second;
    if (!c.verdict.passed) continue;  // already a failing row
    std::vector<std::string> worse, better;
    for (const auto& o : b.outputs) {
      const ErrorMetrics* m = nullptr;
      for (const auto& x : c.metrics)
        if (x.output == o.output) m = &x;
      if (!m) {
        worse.push_back(fmt::format("{}: no metrics in this run", o.output));
        continue;
      }
      const double unit = std::ldexp(1.0, -info(o.format).frac_bits);
      const auto compare = [&](const char* metric, double base, double now, double floor) {
        base = value(base), now = value(now);
        const double slack = std::max(baseline.relative_slack * base, floor);
        if (now > base + slack)
          worse.push_back(fmt::format("{} {} {:.4g} -> {:.4g} (allowed {:.4g})", o.output, metric, base, now, base + slack));
        else if (now + slack < base)
          better.push_back(fmt::format("{} {} {:.4g} -> {:.4g}", o.output, metric, base, now));
      };
      compare("max_ulp", o.max_ulp, m->max_ulp, baseline.absolute_slack_ulp);
      compare("max_normalised", o.max_normalised, m->max_normalised, baseline.absolute_slack_ulp * unit);
    }
    if (!worse.empty()) {
      ++g.regressed;
      g.rows.push_back({"regressed", b.id, b.kernel, b.family, fmt::format("{}", fmt::join(worse, "; ")), true});
    } else if (!better.empty()) {
      ++g.improved;
      g.rows.push_back({"improved", b.id, b.kernel, b.family, fmt::format("{}", fmt::join(better, "; ")), false});
    } else {
      g.rows.push_back({"ok", b.id, b.kernel, b.family, "", false});
    }
  }
  for (const auto& c : run.cases)
    if (c.status != Disposition::NotSupported && !in_baseline.count(c.id)) {
      ++g.new_cases;
      if (c.verdict.passed) g.rows.push_back({"new", c.id, c.kernel, c.family, "not in the baseline", false});
    }
  for (const auto& r : g.rows) g.failed |= r.fails;
  return g;
}

std::string render_gate_table(const GateResult& g) {
  std::string out;
  for (const auto& p : g.rebuilt_plugins) out += "  plugin rebuilt: " + p + "\n";
  for (const auto& d : g.campaign_differences) out += "  campaign differs: " + d + "\n";
  std::map<std::string, int> shown;
  std::map<std::string, int> hidden;
  for (const auto& r : g.rows) {
    if (r.what == "ok") continue;
    if (++shown[r.what] > 40) {
      ++hidden[r.what];
      continue;
    }
    out += fmt::format("  {:<9} {} {:<36} {:<44} {}\n", r.what, r.id, r.kernel, r.family, r.detail);
  }
  for (const auto& [what, n] : hidden) out += fmt::format("  ... and {} more {}\n", n, what);
  out += fmt::format("gate: {} ({} matched, {} regressed, {} improved, {} new, {} missing, {} not run, {} failing)\n",
                     g.failed ? "FAIL" : "pass", g.matched, g.regressed, g.improved, g.new_cases, g.missing, g.not_run,
                     g.failing);
  return out;
}

std::string render_gate_junit(const GateResult& g) {
  std::int64_t failures = 0, skipped = 0;
  for (const auto& r : g.rows) failures += r.fails, skipped += !r.fails && (r.what == "missing" || r.what == "not run");
  std::string out = fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"ulpgate gate\" tests=\"{}\" "
                                "failures=\"{}\">\n<testsuite name=\"gate\" tests=\"{}\" failures=\"{}\" skipped=\"{}\">\n",
                                g.rows.size(), failures, g.rows.size(), failures, skipped);
  for (const auto& r : g.rows) {
    out += fmt::format("  <testcase classname=\"{}\" name=\"{} [{}]\">", xml_escape(r.kernel), xml_escape(r.family),
                       xml_escape(r.id));
    if (r.fails)
      out += fmt::format("<failure message=\"{}\">{}</failure>", xml_escape(r.what), xml_escape(r.detail));
    else if (r.what == "missing" || r.what == "not run")
      out += fmt::format("<skipped message=\"{}: {}\"/>", xml_escape(r.what), xml_escape(r.detail));
    out += "</testcase>\n";
  }
  out += "</testsuite>\n</testsuites>\n";
  return out;
}

}  // namespace ulpgate
