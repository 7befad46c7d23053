// JUnit XML, the format CI systems (GitLab, Jenkins, GitHub test reporters) read. There is
// no single schema; this follows the common subset: <testsuites> of <testsuite name tests
// failures errors skipped time timestamp hostname>, each of <testcase name classname time>
// with at most one of <failure message type>, <error message type>, <skipped message>.
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "reports/common.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

using report::escape_xml;
using report::Outcome;

std::string seconds(double s) { return fmt::format("{:.6f}", std::isfinite(s) && s > 0 ? s : 0.0); }

// The body of a <failure> or <error>: everything needed to act on it without the record.
std::string details(const CaseResult& c) {
  std::string text = "shape: " + shape_text(c.spec) + "\n";
  if (!c.message.empty()) text += c.message + "\n";
  for (const auto& reason : c.verdict.reasons) text += reason + "\n";
  for (const auto& m : c.metrics) {
    const auto& w = m.worst;
    if (w.index.empty()) continue;
    text += fmt::format("worst element of {} ({}) at [{}]: got {}, expected {}, exact {}; normalised error {}, {} ulp\n",
                        m.output, name(m.format), fmt::join(w.index, ", "), w.got, w.expected, w.exact,
                        report::number(w.normalised), report::number(w.ulp));
  }
  if (!c.reproducer.empty()) text += "reproduce: " + c.reproducer + "\n";
  return text;
}

struct Suite {
  std::vector<const CaseResult*> cases;
  std::int64_t failures = 0, errors = 0, skipped = 0;
  double time = 0;
};

}  // namespace

std::string render_junit(const RunRecord& r) {
  // std::map: suites in name order, the same for the same record.
  std::map<std::string, Suite> suites;
  std::int64_t failures = 0, errors = 0, skipped = 0;
  double total = 0;
  for (const auto& c : r.cases) {
    Suite& s = suites[c.kernel];
    s.cases.push_back(&c);
    const Outcome o = report::outcome(c);
    s.failures += o == Outcome::Failure, failures += o == Outcome::Failure;
    s.errors += o == Outcome::Error, errors += o == Outcome::Error;
    s.skipped += o == Outcome::Skipped, skipped += o == Outcome::Skipped;
    const double t = std::isfinite(c.seconds) && c.seconds > 0 ? c.seconds : 0.0;
    s.time += t, total += t;
  }
  const auto& env = r.environment;
  const std::size_t tests = r.cases.size() + r.not_run.size();
  skipped += static_cast<std::int64_t>(r.not_run.size());
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format("<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{}\">\n",
                     escape_xml("ulpgate " + r.kind), tests, failures, errors, skipped, seconds(total));
  // What the time budget did not reach: one skipped testcase per target cut short, so a CI
  // view of a partial campaign shows it (fuzz exits 1 for it unless --allow-partial).
  if (!r.not_run.empty()) {
    out += fmt::format("  <testsuite name=\"not run\" tests=\"{}\" failures=\"0\" errors=\"0\" skipped=\"{}\" time=\"0\">\n",
                       r.not_run.size(), r.not_run.size());
    for (const auto& n : r.not_run)
      out += fmt::format("    <testcase name=\"{}\" classname=\"ulpgate.not_run\" time=\"0\">\n"
                         "      <skipped message=\"{}\"/>\n    </testcase>\n",
                         escape_xml(n.target),
                         escape_xml(fmt::format("{} of {} cases not run: {}", n.planned - n.run, n.planned, n.reason)));
    out += "  </testsuite>\n";
  }
  for (const auto& [kernel, s] : suites) {
    out += fmt::format(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{}\" "
        "timestamp=\"{}\" hostname=\"{}\">\n",
        escape_xml(kernel), s.cases.size(), s.failures, s.errors, s.skipped, seconds(s.time),
        escape_xml(env.started_at), escape_xml(env.host));
    out += "    <properties>\n";
    for (const auto& [k, v] : {std::pair<std::string, std::string>{"seed", std::to_string(r.seed)},
                               {"command", r.command},
                               {"ulpgate_version", env.ulpgate_version},
                               {"git_revision", env.git_revision},
                               {"device", env.device}})
      out += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", k, escape_xml(v));
    out += "    </properties>\n";
    // Test names must be stable from run to run (CI tracks them): the family and the seed,
    // numbered only when a suite holds the same pair twice.
    std::map<std::string, int> seen;
    for (const CaseResult* c : s.cases) {
      std::string test = fmt::format("{} [seed {}]", c->family, c->spec.seed);
      if (const int n = seen[test]++; n > 0) test += fmt::format(" #{}", n + 1);
      out += fmt::format("    <testcase name=\"{}\" classname=\"{}\" time=\"{}\"", escape_xml(test),
                         escape_xml("ulpgate." + kernel), seconds(c->seconds));
      const Outcome o = report::outcome(*c);
      if (o == Outcome::Passed) {
        out += "/>\n";
        continue;
      }
      out += ">\n";
      if (o == Outcome::Skipped) {
        out += fmt::format("      <skipped message=\"{}\"/>\n", escape_xml(c->message.empty() ? "not supported" : c->message));
      } else {
        const bool failure = o == Outcome::Failure;
        const std::string message = failure ? fmt::format("{}", fmt::join(c->verdict.reasons, "; "))
                                            : fmt::format("{}: {}", name(c->status), c->message);
        out += fmt::format("      <{} message=\"{}\" type=\"{}\">{}</{}>\n", failure ? "failure" : "error",
                           escape_xml(message.empty() ? "verdict failed" : message),
                           failure ? "verdict" : std::string(name(c->status)), escape_xml(details(*c)),
                           failure ? "failure" : "error");
      }
      out += "    </testcase>\n";
    }
    out += "  </testsuite>\n";
  }
  out += "</testsuites>\n";
  return out;
}

}  // namespace ulpgate
