// The renderers on a record with one of everything (tests/campaign/record_samples.hpp):
// Markdown carries the numbers and escapes text, JUnit XML is well-formed with the right
// structure (checked by xmllint), HTML is self-contained with one SVG per plot.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <set>

#include "core/error.hpp"
#include "reports/common.hpp"
#include "reports/report.hpp"
#include "tests/campaign/record_samples.hpp"
#include "tests/reports/report_test_util.hpp"

namespace ulpgate {
namespace {

using testing::run_command;
using testing::shell_quote;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = 0; (p = text.find(what, p)) != std::string::npos; p += what.size()) ++n;
  return n;
}

// '|' that separate Markdown table cells (not escaped ones).
int cell_separators(const std::string& line) {
  int n = 0;
  for (std::size_t i = 0; i < line.size(); ++i)
    if (line[i] == '|' && (i == 0 || line[i - 1] != '\\')) ++n;
  return n;
}

TEST(Markdown, ShowsTheNumbersFailuresFirstAndEscapesText) {
  const std::string md = render_markdown(samples::record(true));
  for (const char* s : {
           "6 cases: 2 passed, 1 failed, 1 skipped (not supported), 2 errors",
           "| 1.25e-07 | 0.75 | 1 | none |",           // the passed GEMM: max normalised, max ULP, distance
           "| 0.0035 | 1.23e+03 | 1235 | 2 unexpected NaN, 1 missed |",  // the failed one
           "| 0.0002 | 0.5 | 0 | none |",              // the attention case
           "got ` 0x3f800001 (0x1.000002p+0) `",      // worst element, hex
           "exact ` 0x1.0000001p+0 + 0x1.8p-60 `",
           "3 elements exceed the tolerance (worst 41.2x)",
           "| 0.501 ± 0.0123 | 23.8 |",                 // sweep fit and effective bits
           "| 0.501 ± 0.0123 | 7.91 |",
           "accumulator 24 bits",
           "at most 8 x that of ` cpu.fp32_seq `",
           "- seed: 42",
           "g++ 12.2.0",
       })
    EXPECT_NE(md.find(s), std::string::npos) << "missing: " << s << "\n" << md;
  // Failures first: errors (crashed, timed out), then the failed verdict, then skipped, then passed.
  // The answer first: the verdict line opens the page, before the summary and the tables.
  EXPECT_EQ(md.find("**FAIL**: "), md.find('\n') + 2) << md.substr(0, 300);
  EXPECT_LT(md.find("| kernel | dtype | cases | failed | not run |"), md.find("## Distinct failures"));
  EXPECT_LT(md.find("## Distinct failures"), md.find("## Cases"));
  const std::size_t cases_at = md.find("## Cases");
  const auto row = [&](const std::string& what) { return md.find("| " + what, cases_at); };
  EXPECT_LT(row("plugin.bad"), row("cpu.blockfma"));
  EXPECT_LT(md.find("| **FAIL** |", cases_at), md.find("| not_supported |"));
  EXPECT_LT(md.find("| not_supported |"), md.find("| pass |"));
  // Escaping: no raw HTML, no raw control character, every table row with its 10 cells.
  EXPECT_EQ(md.find("<script>"), std::string::npos);
  EXPECT_NE(md.find("\\<script\\>alert('x')\\</script\\>"), std::string::npos);
  EXPECT_EQ(md.find('\x01'), std::string::npos);
  EXPECT_EQ(md.find('\xff'), std::string::npos);
  std::istringstream lines(md.substr(cases_at));
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| ", 0) != 0) continue;
    ++rows;
    const int cells = cell_separators(line);
    EXPECT_TRUE(cells == 10 || cells == 8) << line;  // cases table: 9 columns, sweeps table: 7
  }
  EXPECT_EQ(rows, (1 + 6) + (1 + 3));  // header and rows of the cases and sweeps tables
}

TEST(Markdown, EscapeHelpers) {
  EXPECT_EQ(report::escape_markdown("a|b*c_d<e>&`f`\nnext"), "a\\|b\\*c\\_d\\<e\\>\\&\\`f\\` next");
  EXPECT_EQ(report::markdown_code("a ``b`` | c", true), "``` a ``b`` \\| c ```");
  EXPECT_EQ(report::markdown_code("", false), "");
  EXPECT_EQ(report::valid_utf8("ok \xc3\xbf \xff \xe2\x82 \xed\xa0\x80 \xc0\xaf"),
            "ok \xc3\xbf \xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd "
            "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(report::escape_html("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
  EXPECT_EQ(report::escape_xml("a\x01<\n"), "a\xef\xbf\xbd&lt;&#10;");
  EXPECT_EQ(report::number(NAN), "nan");
  EXPECT_EQ(report::number(-INFINITY), "-inf");
  EXPECT_EQ(report::unit_roundoff("bf16"), 0x1p-8);
  EXPECT_EQ(report::unit_roundoff("fp32"), 0x1p-24);
  EXPECT_EQ(report::unit_roundoff("fp32 via tf32"), 0.0);
}

std::string xpath(const std::string& file, const std::string& expr) {
  const auto r = run_command("xmllint --xpath " + shell_quote(expr) + " " + shell_quote(file) + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << expr << ": " << r.out;
  // xmllint ends its answer with a newline of its own.
  return !r.out.empty() && r.out.back() == '\n' ? r.out.substr(0, r.out.size() - 1) : r.out;
}

TEST(Junit, WellFormedWithOneSuitePerKernelAndTheRightElements) {
  ASSERT_EQ(run_command("command -v xmllint >/dev/null").exit_code, 0)
      << "xmllint is needed (Debian: libxml2-utils; .ci/install-deps installs it)";
  testing::TempDir dir("junit");
  const std::string f = dir.file("junit.xml");
  testing::write_file(f, render_junit(samples::record(true)));
  const auto lint = run_command("xmllint --noout " + shell_quote(f) + " 2>&1");
  ASSERT_EQ(lint.exit_code, 0) << lint.out;
  EXPECT_EQ(xpath(f, "count(/testsuites/testsuite)"), "3");
  EXPECT_EQ(xpath(f, "count(//testcase)"), "6");
  EXPECT_EQ(xpath(f, "count(//testcase/failure)"), "1");
  EXPECT_EQ(xpath(f, "count(//testcase/skipped)"), "1");
  EXPECT_EQ(xpath(f, "count(//testcase/error)"), "2");
  EXPECT_EQ(xpath(f, "string(/testsuites/@tests)"), "6");
  EXPECT_EQ(xpath(f, "string(/testsuites/@failures)"), "1");
  EXPECT_EQ(xpath(f, "string(/testsuites/@errors)"), "2");
  EXPECT_EQ(xpath(f, "string(/testsuites/@skipped)"), "1");
  EXPECT_EQ(xpath(f, "string(/testsuites/@time)"), "0.770000");
  const std::string suite = "/testsuites/testsuite[@name='cpu.fp32_seq']";
  EXPECT_EQ(xpath(f, "string(" + suite + "/@tests)"), "3");
  EXPECT_EQ(xpath(f, "string(" + suite + "/@time)"), "0.250000");
  EXPECT_EQ(xpath(f, "string(" + suite + "/@timestamp)"), "2026-11-29T12:00:00Z");
  EXPECT_EQ(xpath(f, "string(/testsuites/testsuite[@name='plugin.bad']/@errors)"), "2");
  EXPECT_EQ(xpath(f, "string(//error[@type='timed_out']/@message)"), "timed_out: no answer after 60 s");
  // Text survives escaping exactly (the control character becomes U+FFFD).
  std::string nasty = samples::kNasty;
  nasty.replace(nasty.find('\x01'), 1, "\xef\xbf\xbd");
  EXPECT_EQ(xpath(f, "string(//failure/@message)"), "3 elements exceed the tolerance (worst 41.2x); " + nasty);
  EXPECT_NE(xpath(f, "string(//failure)").find("reproduce: ulpgate replay 'cases/fail 1.json'"), std::string::npos);
  EXPECT_EQ(xpath(f, "string(//testcase[failure]/@name)"), "gemm bf16->fp32 " + nasty + " [seed 8]");
  EXPECT_EQ(xpath(f, "string(//testcase[skipped]/@time)"), "0.000000");
}

// A partial campaign says so in JUnit too: each target the time budget cut short is a
// skipped testcase naming how many cases did not run and why.
TEST(Junit, CasesNotRunAreSkippedTestcases) {
  testing::TempDir dir("junit_partial");
  const std::string f = dir.file("junit.xml");
  const RunRecord r = samples::campaign_record();
  ASSERT_FALSE(r.not_run.empty());
  testing::write_file(f, render_junit(r));
  ASSERT_EQ(run_command("xmllint --noout " + shell_quote(f) + " 2>&1").exit_code, 0);
  const std::string suite = "/testsuites/testsuite[@name='not run']";
  EXPECT_EQ(xpath(f, "count(" + suite + "/testcase/skipped)"), std::to_string(r.not_run.size()));
  EXPECT_EQ(xpath(f, "string(" + suite + "/testcase/@name)"), r.not_run[0].target);
  const auto& n = r.not_run[0];
  EXPECT_EQ(xpath(f, "string(" + suite + "/testcase/skipped/@message)"),
            fmt::format("{} of {} cases not run: {}", n.planned - n.run, n.planned, n.reason));
}

// id='...' and id="..." values in a document.
std::vector<std::string> ids(const std::string& html) {
  std::vector<std::string> out;
  static const std::regex id(R"re(\sid=['"]([^'"]+)['"])re");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), id); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

TEST(Html, SelfContainedWithOneSvgPerPlotAndEscapedText) {
  const std::string html = render_html(samples::record(true));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count(html, "<svg"), static_cast<std::size_t>(samples::kRecordPlots));
  EXPECT_EQ(count(html, "</svg>"), static_cast<std::size_t>(samples::kRecordPlots));
  // Nothing fetched: no external src/href/url()/@import, no scripts, links or iframes.
  static const std::regex external(R"re((src|href)\s*=\s*['"]?\s*(https?:|//)|url\(\s*['"]?\s*(https?:|//)|@import)re",
                                   std::regex::icase);
  EXPECT_FALSE(std::regex_search(html, external));
  for (const char* tag : {"<script", "<link", "<iframe", "<object", "<embed"})
    EXPECT_EQ(count(html, tag), 0u) << tag;
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find('\xff'), std::string::npos);
  // Ids are unique across the page's SVGs (gnuplot uses the same ones in every plot).
  const auto all = ids(html);
  EXPECT_GT(all.size(), 0u);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), all.size());
  // Sections and the numbers.
  for (const char* s : {"<h2>Sweeps</h2>", "<h2>ULP error histograms</h2>", "<h2>Error maps</h2>",
                        "<h2>Distinct failures (1)</h2>", "0x3f800001 (0x1.000002p+0)", "0.501 &plusmn; 0.0123",
                        "6 cases: 2 passed, 1 failed", "non-finite mismatch"})
    EXPECT_NE(html.find(s), std::string::npos) << s;
  // The sweep plot draws the reference lines for each format, the ULP one draws none.
  EXPECT_NE(html.find("sqrt(K) u, u = 2^-24 (fp32)"), std::string::npos);
  EXPECT_NE(html.find("sqrt(K) u, u = 2^-8 (bf16)"), std::string::npos);
  EXPECT_EQ(count(html, "sqrt(K) u"), 2u);
}

// The text of the element that starts at `at` (an opening tag) up to its closing tag
// (elements of the same name are not nested in the page's sections).
std::string element_at(const std::string& html, std::size_t at) {
  if (at == std::string::npos) return "";
  const std::size_t name_end = html.find_first_of(" >", at);
  const std::string close = "</" + html.substr(at + 1, name_end - at - 1) + ">";
  const std::size_t end = html.find(close, at);
  return end == std::string::npos ? "" : html.substr(at, end + close.size() - at);
}

// The opening tag of the element with this id.
std::size_t element_with_id(const std::string& html, const std::string& id) {
  const std::size_t at = html.find(" id=\"" + id + "\"");
  return at == std::string::npos ? at : html.rfind('<', at);
}

TEST(Html, TheAnswerComesFirstAndTheFullCaseTableLastAndClosed) {
  const RunRecord r = samples::campaign_record();
  const std::string html = render_html(r);
  const std::size_t verdict = element_with_id(html, "verdict"), summary = element_with_id(html, "summary"),
                    failures = element_with_id(html, "failures"), sweeps = element_with_id(html, "sweeps"),
                    environment = element_with_id(html, "environment"), cases = element_with_id(html, "cases");
  for (std::size_t at : {verdict, summary, failures, sweeps, environment, cases}) ASSERT_NE(at, std::string::npos);
  // The verdict opens the page; then the summary, the distinct failures, the sweep plots, the
  // environment, and the full case table last.
  EXPECT_EQ(verdict, html.find("<body>") + 7) << html.substr(html.find("<body>"), 200);
  EXPECT_LT(verdict, summary);
  EXPECT_LT(summary, failures);
  EXPECT_LT(failures, sweeps);
  EXPECT_LT(sweeps, environment);
  EXPECT_LT(environment, cases);
  // The verdict: the headline's word and text, big and coloured (a class per verdict).
  const auto h = report::headline(r);
  ASSERT_EQ(h.verdict, "FAIL");
  const std::string head = element_at(html, verdict);
  EXPECT_EQ(head.rfind("<header id=\"verdict\" class=\"verdict fail\">", 0), 0u) << head;
  EXPECT_NE(head.find(">FAIL<"), std::string::npos) << head;
  EXPECT_NE(head.find(report::escape_html(h.text)), std::string::npos) << head;
  // What did not run is in the verdict's box: target, planned and run, reason.
  for (const char* s : {"cpu.fp32_seq fp16 attention", ">100<", ">37<", ">63<", "time budget (--time 300) spent"})
    EXPECT_NE(head.find(s), std::string::npos) << s << "\n" << head;
  // The summary: one row per kernel x dtype with the worst errors.
  const std::string sum = html.substr(summary, failures - summary);
  EXPECT_NE(sum.find("<th>worst normalised</th>"), std::string::npos) << sum;
  EXPECT_NE(sum.find("<th>bias (ULP)</th>"), std::string::npos) << sum;
  for (const auto& t : report::target_summaries(r))
    EXPECT_NE(sum.find("<td>" + report::escape_html(t.kernel) + "</td><td>" + report::escape_html(t.dtype) + "</td>"),
              std::string::npos)
        << t.kernel << " " << t.dtype << "\n" << sum;
  // The distinct failure: kernel, signature, its cases, first reason, both reproducers as
  // copyable code, and the first case's histogram and map.
  const std::string fail = html.substr(failures, sweeps - failures);
  for (const std::string s :
       {std::string("cpu.blockfma:block=16,frac=3,round=rz"), std::string("D:tolerance@interior + D:unexpected_nan@edge"),
        std::string("2 cases"), std::string("3 elements exceed the tolerance (worst 41.2x)"),
        "<pre class=\"repro\"><code>" + report::escape_html(r.cases[1].reproducer) + "</code></pre>",
        "<pre class=\"repro\"><code>" + report::escape_html(r.cases.back().reproducer) + "</code></pre>",
        std::string("0x3f800001 (0x1.000002p+0)")})
    EXPECT_NE(fail.find(s), std::string::npos) << s << "\n" << fail;
  EXPECT_EQ(count(fail, "<svg"), 2u);
  EXPECT_EQ(count(html.substr(sweeps, environment - sweeps), "<svg"), 6u);  // 2 sweeps, 4 of other cases
  EXPECT_EQ(count(html, "<svg"), static_cast<std::size_t>(samples::kRecordPlots));
  // The full case table: last, in a <details> closed by default, one row per case.
  const std::string all = element_at(html, cases);
  EXPECT_EQ(all.rfind("<details id=\"cases\">", 0), 0u) << all.substr(0, 200);
  EXPECT_EQ(count(all, "<tr class="), r.cases.size());
  EXPECT_EQ(html.substr(cases + all.size()), "\n</body>\n</html>\n");
  EXPECT_EQ(count(html, "<details open"), 0u);
}

TEST(Html, APartialRunSaysSoAtTheTop) {
  RunRecord r = samples::campaign_record();
  std::erase_if(r.cases, [](const CaseResult& c) { return !c.verdict.passed; });
  ASSERT_EQ(report::headline(r).verdict, "PARTIAL");
  const std::string html = render_html(r);
  const std::string head = element_at(html, element_with_id(html, "verdict"));
  EXPECT_EQ(head.rfind("<header id=\"verdict\" class=\"verdict partial\">", 0), 0u) << head;
  EXPECT_NE(head.find(">PARTIAL<"), std::string::npos) << head;
  EXPECT_NE(head.find("63 planned cases not run"), std::string::npos) << head;
  EXPECT_NE(head.find("cpu.fp32_seq fp16 attention"), std::string::npos) << head;
  EXPECT_EQ(element_with_id(html, "failures"), std::string::npos);  // nothing failed
  // A complete run has no not-run box, and passes.
  r.not_run.clear();
  const std::string pass = render_html(r);
  const std::string pass_head = element_at(pass, element_with_id(pass, "verdict"));
  EXPECT_EQ(pass_head.rfind("<header id=\"verdict\" class=\"verdict pass\">", 0), 0u) << pass_head;
  EXPECT_EQ(pass_head.find("not run"), std::string::npos) << pass_head;
}

TEST(Html, SeriesWithNothingPositiveStillGetsAPlot) {
  RunRecord r;
  SweepSeries s;
  s.kernel = "cpu.exact", s.format = "fp32", s.parameter = "magnitude", s.metric = "max_normalised";
  s.x = {16, 32, 64};
  s.y = {0, 0, 0};  // an exact kernel
  r.sweeps.push_back(s);
  std::string html = render_html(r);
  EXPECT_EQ(count(html, "<svg"), 1u);
  EXPECT_NE(html.find("no positive values to draw"), std::string::npos);
  // Against K the reference lines are still drawn.
  r.sweeps[0].parameter = "K";
  html = render_html(r);
  EXPECT_EQ(count(html, "<svg"), 1u);
  EXPECT_EQ(html.find("no positive values to draw"), std::string::npos);
  EXPECT_NE(html.find("sqrt(K) u, u = 2^-24 (fp32)"), std::string::npos);
}

TEST(Html, MissingGnuplotIsAClearError) {
  ::setenv("ULPGATE_GNUPLOT", "/nonexistent/gnuplot", 1);
  try {
    render_html(samples::record());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the HTML report needs gnuplot, and '/nonexistent/gnuplot' cannot be run"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("gnuplot-nox"), std::string::npos);
  }
  ::unsetenv("ULPGATE_GNUPLOT");
}

// A failure says on what shape it failed (the case's, and its minimal case's), in every
// report; the shrunk minimal case is that failure's minimal form, not one more case.
TEST(Reports, FailuresShowTheirShapeAndShrunkCasesAreNotCounted) {
  RunRecord r = samples::campaign_record();
  CaseResult attention = r.cases[1];
  attention.kernel = "cpu.attn_naive";
  attention.spec = samples::attention_case(12);
  AttentionShape& a = attention.spec.attention;
  a.batch = 2, a.heads = 4, a.kv_heads = 2, a.head_dim_v = 32;
  stamp(attention);
  r.cases.insert(r.cases.begin() + 2, attention);
  RunRecord without = r;
  ASSERT_EQ(without.cases.back().origin, "shrunk");
  without.cases.pop_back();
  EXPECT_EQ(report::counts_line(r), report::counts_line(without));
  EXPECT_EQ(report::headline(r).text, report::headline(without).text);
  const auto rows = report::target_summaries(r), rows_without = report::target_summaries(without);
  ASSERT_EQ(rows.size(), rows_without.size());
  for (std::size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].cases, rows_without[i].cases) << rows[i].kernel;

  const std::string md = render_markdown(r);
  for (const char* s : {"- shape: 16x16x4096 (M x N x K)\n", "- shape: B2 H4/2 Sq17 Skv33 D64/32\n",
                        "  - minimal (1x1x17 (M x N x K)): "})
    EXPECT_NE(md.find(s), std::string::npos) << s << "\n" << md;
  EXPECT_EQ(md.find("- shape: 1x1x17"), std::string::npos) << "the minimal case listed as a failure of its own";
  const std::string html = render_html(r);
  for (const char* s : {"16x16x4096 (M x N x K)", "B2 H4/2 Sq17 Skv33 D64/32", "reproduce the minimal case (1x1x17 (M x N x K)"})
    EXPECT_NE(html.find(s), std::string::npos) << s;
  EXPECT_NE(render_junit(r).find("shape: B2 H4/2 Sq17 Skv33 D64/32"), std::string::npos);
}

}  // namespace
}  // namespace ulpgate
