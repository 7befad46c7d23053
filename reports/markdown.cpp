// The Markdown summary: what a reviewer reads in a CI log or a pull request.
#include <map>
#include <string>

#include <fmt/format.h>

#include "reports/common.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

using report::escape_markdown;
using report::markdown_code;
using report::number;

std::string or_unknown(const std::string& s) { return s.empty() ? "unknown" : escape_markdown(s); }

void environment(std::string& out, const RunRecord& r) {
  const auto& e = r.environment;
  out += "## Environment\n\n";
  out += fmt::format("- ulpgate {} (git {}), {}\n", or_unknown(e.ulpgate_version), or_unknown(e.git_revision),
                     or_unknown(e.compiler));
  out += fmt::format("- host {}, started {}\n", or_unknown(e.host), or_unknown(e.started_at));
  out += fmt::format("- device: {}\n", or_unknown(e.device));
  out += fmt::format("- driver {}, CUDA runtime {}, cuBLAS {}, SM clock {}\n", or_unknown(e.driver),
                     or_unknown(e.cuda_runtime), or_unknown(e.cublas),
                     e.sm_clock_mhz > 0 ? fmt::format("{} MHz", e.sm_clock_mhz) : "unknown");
  out += fmt::format("- command: {}\n", r.command.empty() ? "unknown" : markdown_code(r.command, false));
  out += fmt::format("- seed: {}\n\n", r.seed);
}

void tolerance(std::string& out, const RunRecord& r) {
  const auto& t = r.tolerance;
  out += "## Tolerance\n\n";
  out += fmt::format("- model: accumulator {} bits, inputs {}, {}\n", t.accumulator_bits,
                     t.input_bits ? fmt::format("rounded to {} bits", t.input_bits) : "used as given",
                     t.probabilistic ? fmt::format("probabilistic bound (lambda = {})", number(t.lambda))
                                     : "deterministic bound (gamma_n)");
  out += fmt::format("- baseline rule: max normalised error at most {} x that of {}\n\n", number(r.baseline.factor),
                     markdown_code(r.baseline.model, false));
}

std::string index_text(const std::vector<std::int64_t>& index) { return fmt::format("[{}]", fmt::join(index, ", ")); }

void failures(std::string& out, const RunRecord& r, const std::vector<std::size_t>& order) {
  bool any = false;
  for (std::size_t i : order) {
    const CaseResult& c = r.cases[i];
    const auto o = report::outcome(c);
    if ((o != report::Outcome::Error && o != report::Outcome::Failure) || c.shrunk()) continue;
    if (!any) out += "## Failures\n\n";
    any = true;
    out += fmt::format("### {} — {} ({})\n\n", escape_markdown(c.kernel), escape_markdown(c.family),
                       o == report::Outcome::Error ? "status " + std::string(name(c.status)) : "verdict failed");
    out += fmt::format("- shape: {}\n", escape_markdown(shape_text(c.spec)));
    if (!c.message.empty()) out += fmt::format("- message: {}\n", escape_markdown(c.message));
    for (const auto& reason : c.verdict.reasons) out += fmt::format("- {}\n", escape_markdown(reason));
    for (const auto& m : c.metrics) {
      const auto& w = m.worst;
      if (w.index.empty()) continue;
      out += fmt::format(
          "- worst element of {} ({}) at {}: got {}, expected {}, exact {}; normalised error {}, {} ulp, "
          "condition {}\n",
          escape_markdown(m.output), name(m.format), index_text(w.index), markdown_code(w.got, false),
          markdown_code(w.expected, false), markdown_code(w.exact, false), number(w.normalised), number(w.ulp),
          number(w.condition));
    }
    if (!c.reproducer.empty()) out += fmt::format("- reproduce: {}\n", markdown_code(c.reproducer, false));
    out += "\n";
  }
}

void cases_table(std::string& out, const RunRecord& r, const std::vector<std::size_t>& order) {
  out += "## Cases\n\n";
  if (r.cases.empty()) {
    out += "No cases.\n\n";
    return;
  }
  out += "| kernel | family | status | verdict | max normalised | max ULP error | ULP distance | NaN/Inf | "
         "reproducer |\n";
  out += "|---|---|---|---|---:|---:|---:|---|---|\n";
  for (std::size_t i : order) {
    const CaseResult& c = r.cases[i];
    const auto f = report::figures(c);
    const std::string verdict = c.status != Disposition::Ok ? "—" : c.verdict.passed ? "pass" : "**FAIL**";
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", escape_markdown(c.kernel),
                       escape_markdown(c.family), name(c.status), verdict,
                       f.any_metrics ? number(f.max_normalised) : "—", f.any_metrics ? number(f.max_ulp) : "—",
                       f.any_metrics ? std::to_string(f.max_ulp_distance) : "—",
                       f.any_metrics ? report::nonfinite_summary(f) : "—", markdown_code(c.reproducer, true));
  }
  out += "\n";
}

void sweeps_table(std::string& out, const RunRecord& r) {
  if (r.sweeps.empty()) return;
  out += "## Sweeps\n\n";
  out += "| kernel | format | dist | metric vs parameter | points | fitted exponent | effective bits |\n";
  out += "|---|---|---|---|---:|---:|---:|\n";
  for (const auto& s : r.sweeps)
    out += fmt::format("| {} | {} | {} | {} vs {} | {} | {} ± {} | {} |\n", escape_markdown(s.kernel),
                       escape_markdown(s.format), escape_markdown(s.dist), escape_markdown(s.metric),
                       escape_markdown(s.parameter), s.x.size(), number(s.fit.exponent),
                       number(s.fit.exponent_stderr), number(s.effective_bits));
  out += "\nThe exponent p fits error ~ parameter^p (p = 0.5: random-walk accumulation error, p = 1: the "
         "worst case).\n\n";
}

}  // namespace

// The answer first: verdict, what did not run, the per kernel x dtype summary, and each
// distinct failure once with its reproducers.
void summary(std::string& out, const RunRecord& r) {
  const auto h = report::headline(r);
  out += fmt::format("**{}**: {}\n\n", h.verdict, escape_markdown(h.text));
  for (const auto& n : r.not_run)
    out += fmt::format("- not run: {} of {} cases of {} ({})\n", n.planned - n.run, n.planned, markdown_code(n.target, false),
                       escape_markdown(n.reason));
  if (!r.not_run.empty()) out += "\n";
  const auto rows = report::target_summaries(r);
  if (!rows.empty()) {
    out += "| kernel | dtype | cases | failed | not run | worst normalised | worst ULP | bias (ULP) |\n";
    out += "|---|---|---:|---:|---:|---:|---:|---:|\n";
    for (const auto& t : rows)
      out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", escape_markdown(t.kernel), escape_markdown(t.dtype),
                         t.cases, t.failed ? fmt::format("**{}**", t.failed) : "0", t.not_run, number(t.worst_normalised),
                         number(t.worst_ulp), number(t.bias_ulp));
    out += "\n";
  }
  // Kernels whose arithmetic was measured (the probe), as their results say it.
  std::map<std::string, std::string> arithmetic;
  for (const CaseResult& c : r.cases)
    if (const auto it = c.notes.find("arithmetic"); it != c.notes.end()) arithmetic.emplace(c.kernel, it->second);
  for (const auto& [kernel, what] : arithmetic) out += fmt::format("- {}: {}\n", escape_markdown(kernel), escape_markdown(what));
  if (!arithmetic.empty()) out += "\n";
  const auto distinct = report::distinct_failures(r);
  if (distinct.empty()) return;
  out += "## Distinct failures\n\n";
  for (const auto& d : distinct) {
    const CaseResult& first = r.cases[d.first];
    out += fmt::format("- {} `{}`: {} case{}; {}\n", escape_markdown(d.kernel), escape_markdown(d.signature), d.cases.size(),
                       d.cases.size() == 1 ? "" : "s",
                       escape_markdown(first.verdict.reasons.empty() ? "failed" : first.verdict.reasons.front()));
    out += fmt::format("  - first ({}): {}\n", escape_markdown(shape_text(first.spec)), markdown_code(first.reproducer, false));
    if (d.shrunk)
      out += fmt::format("  - minimal ({}): {}\n", escape_markdown(shape_text(r.cases[*d.shrunk].spec)),
                         markdown_code(r.cases[*d.shrunk].reproducer, false));
  }
  out += "\n";
}

std::string render_markdown(const RunRecord& r) {
  std::string out = fmt::format("# ulpgate {} run\n\n", escape_markdown(r.kind.empty() ? "unnamed" : r.kind));
  summary(out, r);
  out += report::counts_line(r) + "\n\n";
  environment(out, r);
  tolerance(out, r);
  const auto order = report::failures_first(r);
  failures(out, r, order);
  cases_table(out, r, order);
  sweeps_table(out, r);
  return out;
}

}  // namespace ulpgate
