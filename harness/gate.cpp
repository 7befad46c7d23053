#include "harness/gate.hpp"

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace ulpgate {
namespace {

using json = nlohmann::json;
using Key = std::pair<std::string, std::string>;

std::map<Key, BaselineEntry> aggregate(const RunRecord& r) {
  std::map<Key, BaselineEntry> m;
  for (const auto& c : r.cases) {
    if (c.status == Disposition::NotSupported) continue;
    BaselineEntry& e = m[{c.kernel, c.family}];
    e.kernel = c.kernel, e.family = c.family;
    ++e.cases;
    if (!c.verdict.passed) ++e.failed;
    for (const auto& mm : c.metrics) {
      // NaN metrics (no finite element compared) do not lower the maximum
      if (mm.max_normalised > e.max_normalised) e.max_normalised = mm.max_normalised;
      if (mm.max_ulp > e.max_ulp) e.max_ulp = mm.max_ulp;
    }
  }
  return m;
}

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

double number(const json& j, const std::string& key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) bad(path + "." + key, "missing");
  if (it->is_number()) return it->get<double>();
  if (it->is_string()) {  // "inf" (a metric can be infinite)
    const std::string s = it->get<std::string>();
    if (s == "inf") return INFINITY;
  }
  bad(path + "." + key, "must be a number");
}

std::string text(const json& j, const std::string& key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) bad(path + "." + key, "missing");
  if (!it->is_string()) bad(path + "." + key, "must be a string");
  return it->get<std::string>();
}

json num(double x) { return std::isinf(x) ? json("inf") : json(x); }

}  // namespace

Baseline baseline_from_record(const RunRecord& r, double relative_slack, double absolute_slack) {
  Baseline b;
  b.relative_slack = relative_slack;
  b.absolute_slack = absolute_slack;
  b.source = fmt::format("{} (seed {})", r.command, r.seed);
  for (auto& [k, e] : aggregate(r)) b.entries.push_back(e);
  return b;
}

json to_json(const Baseline& b) {
  json entries = json::array();
  for (const auto& e : b.entries)
    entries.push_back({{"kernel", e.kernel}, {"family", e.family}, {"cases", e.cases}, {"failed", e.failed},
                       {"max_normalised", num(e.max_normalised)}, {"max_ulp", num(e.max_ulp)}});
  return {{"ulpgate_baseline", kBaselineSchemaVersion}, {"relative_slack", b.relative_slack},
          {"absolute_slack", b.absolute_slack}, {"source", b.source}, {"entries", entries}};
}

Baseline baseline_from_json(const json& j) {
  if (!j.is_object()) bad("baseline", "must be a JSON object");
  auto v = j.find("ulpgate_baseline");
  if (v == j.end()) bad("baseline.ulpgate_baseline", "missing (not a baseline file?)");
  if (!v->is_number_integer() || v->get<int>() != kBaselineSchemaVersion)
    bad("baseline.ulpgate_baseline", fmt::format("unsupported version {} (this build reads {})", v->dump(), kBaselineSchemaVersion));
  Baseline b;
  b.relative_slack = number(j, "relative_slack", "baseline");
  b.absolute_slack = number(j, "absolute_slack", "baseline");
  if (!(b.relative_slack >= 0) || !(b.absolute_slack >= 0)) bad("baseline", "slack must be >= 0");
  b.source = text(j, "source", "baseline");
  auto es = j.find("entries");
  if (es == j.end() || !es->is_array()) bad("baseline.entries", "must be an array");
  for (std::size_t i = 0; i < es->size(); ++i) {
    const json& e = (*es)[i];
    const std::string p = fmt::format("baseline.entries[{}]", i);
    if (!e.is_object()) bad(p, "must be an object");
    BaselineEntry x;
    x.kernel = text(e, "kernel", p);
    x.family = text(e, "family", p);
    x.cases = static_cast<std::int64_t>(number(e, "cases", p));
    x.failed = static_cast<std::int64_t>(number(e, "failed", p));
    x.max_normalised = number(e, "max_normalised", p);
    x.max_ulp = number(e, "max_ulp", p);
    b.entries.push_back(std::move(x));
  }
  return b;
}

Baseline read_baseline_file(const std::string& path) {
  return read_json_file_as(path, [](const json& j) { return baseline_from_json(j); });
}

void write_baseline_file(const std::string& path, const Baseline& b) {
  write_text_file_atomically(path, to_json(b).dump(2) + "\n");
}

GateResult gate(const Baseline& baseline, const RunRecord& run) {
  GateResult g;
  auto current = aggregate(run);
  for (const auto& b : baseline.entries) {
    GateRow row{b.kernel, b.family, "ok", "", false};
    auto it = current.find({b.kernel, b.family});
    if (it == current.end()) {
      row.what = "missing";
      row.detail = fmt::format("{} cases in the baseline, none in this run", b.cases);
    } else {
      const BaselineEntry& c = it->second;
      std::vector<std::string> moved;
      if (b.failed == 0 && c.failed > 0) {
        row.what = "new failure", row.regression = true;
        moved.push_back(fmt::format("{} of {} cases fail", c.failed, c.cases));
      }
      auto check = [&](const char* metric, double base, double now) {
        const double allowed = base * (1 + baseline.relative_slack) + baseline.absolute_slack;
        if (now > allowed) {
          if (!row.regression) row.what = "regressed";
          row.regression = true;
          moved.push_back(fmt::format("{} {:.4g} -> {:.4g} (allowed {:.4g})", metric, base, now, allowed));
        } else if (now * (1 + baseline.relative_slack) < base && row.what == "ok") {
          row.what = "improved";
          moved.push_back(fmt::format("{} {:.4g} -> {:.4g}", metric, base, now));
        }
      };
      check("max_normalised", b.max_normalised, c.max_normalised);
      check("max_ulp", b.max_ulp, c.max_ulp);
      row.detail = fmt::format("{}", fmt::join(moved, "; "));
      current.erase(it);
    }
    g.regression |= row.regression;
    g.rows.push_back(std::move(row));
  }
  for (const auto& [k, c] : current)
    g.rows.push_back({c.kernel, c.family, "new", fmt::format("{} cases, not in the baseline", c.cases), false});
  return g;
}

std::string render_gate_table(const GateResult& g) {
  std::string out;
  std::int64_t ok = 0;
  for (const auto& r : g.rows) {
    if (r.what == "ok") {
      ++ok;
      continue;
    }
    out += fmt::format("  {:<12} {:<40} {:<44} {}\n", r.what, r.kernel, r.family, r.detail);
  }
  std::int64_t regressions = 0;
  for (const auto& r : g.rows) regressions += r.regression;
  out += fmt::format("gate: {} ({} families unchanged, {} regressed, {} rows in all)\n",
                     g.regression ? "REGRESSION" : "pass", ok, regressions, g.rows.size());
  return out;
}

std::string render_gate_junit(const GateResult& g) {
  std::int64_t failures = 0;
  for (const auto& r : g.rows) failures += r.regression;
  std::string out = fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"ulpgate gate\" tests=\"{}\" "
                                "failures=\"{}\">\n<testsuite name=\"gate\" tests=\"{}\" failures=\"{}\">\n",
                                g.rows.size(), failures, g.rows.size(), failures);
  for (const auto& r : g.rows) {
    out += fmt::format("  <testcase classname=\"{}\" name=\"{}\">", xml_escape(r.kernel), xml_escape(r.family));
    if (r.regression)
      out += fmt::format("<failure message=\"{}\">{}</failure>", xml_escape(r.what), xml_escape(r.detail));
    else if (r.what == "missing")
      out += fmt::format("<skipped message=\"{}\"/>", xml_escape(r.detail));
    out += "</testcase>\n";
  }
  out += "</testsuite>\n</testsuites>\n";
  return out;
}

}  // namespace ulpgate
