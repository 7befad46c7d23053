#include "cli/results.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include <fmt/format.h>

#include "core/file_io.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

void print_case(const CaseResult& r) {
  std::printf("%s on %s: %s, verdict %s\n", r.kernel.c_str(), r.family.c_str(), std::string(name(r.status)).c_str(),
              r.verdict.passed ? "pass" : "FAIL");
  if (!r.message.empty()) std::printf("  %s\n", r.message.c_str());
  if (!r.signature.empty()) std::printf("  signature: %s\n", r.signature.c_str());
  for (const auto& why : r.verdict.reasons) std::printf("  - %s\n", why.c_str());
  for (const auto& m : r.metrics) {
    std::printf("  %s (%s): %lld elements, %lld correctly rounded; max |err|/sum|ab| %.4g (mean %.4g); max ULP %.4g "
                "(mean %.4g, bias %+.4g); max ULP distance from the correct rounding %llu\n",
                m.output.c_str(), std::string(name(m.format)).c_str(), static_cast<long long>(m.elements),
                static_cast<long long>(m.exact_matches), m.max_normalised, m.mean_normalised, m.max_ulp, m.mean_ulp,
                m.bias_ulp, static_cast<unsigned long long>(m.max_ulp_distance));
    if (!m.worst.index.empty()) {
      std::string idx;
      for (auto i : m.worst.index) idx += (idx.empty() ? "" : ",") + std::to_string(i);
      std::printf("  worst [%s]: got %s, correctly rounded %s, exact %s, sum|ab| %.4g\n", idx.c_str(), m.worst.got.c_str(),
                  m.worst.expected.c_str(), m.worst.exact.c_str(), m.worst.condition);
    }
  }
  for (const auto& [k, v] : r.notes) std::printf("  %s: %s\n", k.c_str(), v.c_str());
}

}  // namespace

Exit finish_single_case(CaseResult& r, const std::string& kind, const std::string& command, const std::string& out_json) {
  r.origin = kind;
  r.reproducer = command;
  print_case(r);
  if (!out_json.empty()) {
    RunRecord rec;
    rec.kind = kind;
    rec.seed = r.spec.seed;
    rec.command = command;
    rec.environment = capture_environment();
    rec.cases.push_back(r);
    write_record_file(out_json, rec);
  }
  return r.verdict.passed ? Exit::Ok : Exit::Failed;
}

Exit write_campaign_outputs(const RunRecord& r, const std::filesystem::path& out, bool no_html, bool allow_partial) {
  write_record_file((out / "fuzz.json").string(), r);
  write_text_file_atomically((out / "report.md").string(), render_markdown(r));
  write_text_file_atomically((out / "junit.xml").string(), render_junit(r));
  if (!no_html) write_text_file_atomically((out / "report.html").string(), render_html(r));
  // Shrunk cases are the failures' minimal forms, not cases of the campaign.
  std::int64_t cases = 0, failed = 0, unsupported = 0, shrunk = 0, not_run = 0;
  for (const auto& c : r.cases) {
    if (c.shrunk()) {
      ++shrunk;
      continue;
    }
    ++cases, failed += !c.verdict.passed, unsupported += c.status == Disposition::NotSupported;
  }
  for (const auto& n : r.not_run) not_run += n.planned - n.run;
  std::printf("%lld cases, %lld failed%s, %lld not supported by their kernel\n", static_cast<long long>(cases),
              static_cast<long long>(failed), shrunk ? fmt::format(" ({} shrunk to a minimal case)", shrunk).c_str() : "",
              static_cast<long long>(unsupported));
  if (not_run) {
    const bool lost_rank = std::any_of(r.not_run.begin(), r.not_run.end(),
                                       [](const NotRun& n) { return n.reason.rfind("MPI rank ", 0) == 0; });
    std::printf("PARTIAL: %lld planned cases not run (%zu targets cut short by %s)%s\n", static_cast<long long>(not_run),
                r.not_run.size(), lost_rank ? "the time budget or a failed MPI rank" : "the time budget",
                lost_rank ? "; a failed rank is exit 3"
                : allow_partial ? "; allowed by --allow-partial" : "; exit 1 (--allow-partial accepts it)");
  }
  std::printf("record %s, reports %s%s, %s\n", (out / "fuzz.json").c_str(),
              no_html ? "" : ((out / "report.html").string() + ", ").c_str(), (out / "report.md").c_str(),
              (out / "junit.xml").c_str());
  return failed || (not_run && !allow_partial) ? Exit::Failed : Exit::Ok;
}

}  // namespace ulpgate
