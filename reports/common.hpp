// What the renderers share: escaping for each output language, number formatting, and how
// a case is classified and ordered (failures first).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "campaign/record.hpp"

namespace ulpgate::report {

/// Replaces every byte sequence that is not valid UTF-8 with U+FFFD, so that one bad byte
/// from a kernel's message cannot make a whole document invalid.
std::string valid_utf8(std::string_view s);
/// Text for HTML element content and attribute values (quoted with ' or ").
std::string escape_html(std::string_view s);

/// The colours of a plot's series, in order (a colour-blind-safe palette).
inline constexpr const char* kSeriesColours[] = {"#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#000000"};
/// Text for XML 1.0 content and attributes: escapes markup, and replaces characters XML
/// cannot carry at all (control characters other than tab, newline, CR) with U+FFFD.
std::string escape_xml(std::string_view s);
/// Text inside a Markdown line or table cell (never at a line's start, where '#', '-' and
/// '1.' would matter): one line, with every character that has an inline meaning
/// backslash-escaped ('|' too, for tables; '<' and '&' so no HTML gets through).
std::string escape_markdown(std::string_view s);
/// A Markdown code span holding s literally (a fence longer than any backtick run in s);
/// in_table escapes '|', which GFM splits cells on even inside code spans.
std::string markdown_code(std::string_view s, bool in_table);

/// A metric for a table: 3 significant digits, "nan", "inf", "-inf".
std::string number(double x);

/// How a case ended, worst first: the order failures-first listings use.
enum class Outcome { Error, Failure, Skipped, Passed };
Outcome outcome(const CaseResult& c);
std::string_view name(Outcome o);  ///< "error", "failed", "skipped", "passed"

/// The per-case figures of the summary tables, combined over the case's outputs: maxima
/// of the errors, sums of the counts.
struct CaseFigures {
  double max_normalised = 0, max_ulp = 0;
  std::uint64_t max_ulp_distance = 0;
  std::int64_t unexpected_nan = 0, unexpected_inf = 0, missed_nonfinite = 0, mismatched_nonfinite = 0, overflowed = 0,
               expected_nonfinite = 0;
  bool any_metrics = false;
};
CaseFigures figures(const CaseResult& c);
/// "2 unexpected NaN, 1 missed" or "none" (expected non-finite values are not a problem and
/// are shown apart).
std::string nonfinite_summary(const CaseFigures& f);

/// Indices of r.cases, errors first, then failures, skipped, passed; stable within each.
std::vector<std::size_t> failures_first(const RunRecord& r);

/// "12 cases: 9 passed, 2 failed, 1 skipped, 0 errors" (shrunk cases are not counted).
std::string counts_line(const RunRecord& r);

/// The answer first: "PASS", "FAIL" or "PARTIAL" (nothing failed, but part of the
/// campaign did not run), with the counts behind it, e.g.
/// "FAIL: 3 of 120 cases failed (2 distinct failures); 40 planned cases not run (time budget)".
struct Headline {
  std::string verdict;  ///< PASS, FAIL, PARTIAL
  std::string text;
};
Headline headline(const RunRecord& r);

/// Planned cases the run did not run (sum over RunRecord::not_run).
std::int64_t not_run_cases(const RunRecord& r);

/// One row of the per-kernel x dtype summary. dtype is the target's ("fp16"), or the
/// input format of the case when it has no target (replay, corpus).
struct TargetSummary {
  std::string kernel, dtype;
  std::int64_t cases = 0, failed = 0, not_run = 0;
  double worst_normalised = 0, worst_ulp = 0;  ///< over the cases' outputs (overflowed elements excluded)
  double bias_ulp = 0;  ///< the mean over the cases of their outputs' signed mean ULP error
};
std::vector<TargetSummary> target_summaries(const RunRecord& r);

/// A distinct failure: the failing cases of one kernel with the same signature
/// (same_failure), the first one found, and the minimal case shrunk from one of them.
struct DistinctFailure {
  std::string kernel, signature;
  std::vector<std::size_t> cases;  ///< indices into r.cases (shrunk ones excluded)
  std::size_t first = 0;           ///< the first of them
  std::optional<std::size_t> shrunk;  ///< its minimal case, when one was shrunk to
};
std::vector<DistinctFailure> distinct_failures(const RunRecord& r);

/// The unit roundoff 2^-(fraction bits + 1) of a format named as in SweepSeries::format;
/// 0 when the name is not a format.
double unit_roundoff(std::string_view format);

}  // namespace ulpgate::report
