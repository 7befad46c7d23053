// Renderers of a run record (campaign/record.hpp): a Markdown summary, a self-contained
// HTML page with plots, and JUnit XML for CI systems. They only read the record; every
// piece of text from it is escaped for the target format.
#pragma once

#include <string>

#include "campaign/bench.hpp"
#include "campaign/record.hpp"

namespace ulpgate {

/// Markdown: environment, tolerance and baseline rule, counts, the failures (reasons, worst
/// element with hex values, reproducer), a table of every case (failures first) and a table
/// of sweep fits.
std::string render_markdown(const RunRecord& r);

/// JUnit XML: one <testsuite> per kernel, one <testcase> per case. A failed verdict is a
/// <failure>, status not_supported a <skipped/>, status failed/crashed/timed_out an
/// <error>; times from CaseResult::seconds, timestamp from the environment. Targets the time
/// budget cut short (RunRecord::not_run) are skipped testcases of a suite "not run".
std::string render_junit(const RunRecord& r);

/// The cases that get an ULP histogram and an error map in the HTML page: at most this
/// many, the first case of each distinct failure first, then other failed ones, then by
/// error (max ULP error for histograms, max normalised error for maps).
inline constexpr int kHtmlCasePlots = 6;

/// Self-contained HTML (inline CSS, plots as inline SVG; no scripts, fonts or images from
/// anywhere), the answer first, in this order:
///  1. the verdict of report::headline (PASS, FAIL, PARTIAL), big and in its colour, with
///     every RunRecord::not_run entry (target, planned, run, reason) and the counts;
///  2. the per kernel x dtype summary (report::target_summaries);
///  3. each distinct failure (report::distinct_failures): kernel, signature, number of cases,
///     the first case's reasons and worst elements, the reproducers of the first and of the
///     minimal (shrunk) case as copyable code, and the first case's histogram and map;
///  4. the sweeps: a table of fits and, per (kernel, parameter, metric), one log-log plot:
///     each series' points, its fitted power law, and the reference lines sqrt(n) u and n u
///     per format (u = 2^-(fraction bits + 1)) when the parameter is a reduction length (K,
///     seq_kv) and the metric is not in ULPs; then the ULP error histograms and error maps
///     (log10 max normalised error per cell) of the other plotted cases (kHtmlCasePlots);
///  5. environment and tolerance, then, closed (<details>), every failing case in detail and
///     the full case table, failures first.
/// The page fits a 1280 px window without horizontal scrolling: long strings wrap anywhere
/// and the case table has fixed column widths (tests/reports/test_html_chromium.cpp
/// measures it in Chromium).
/// Plots are drawn by gnuplot (svg terminal), run as a subprocess; $ULPGATE_GNUPLOT names
/// another program. Throws InputError when gnuplot cannot be run.
std::string render_html(const RunRecord& r);

/// `ulpgate bench --html`: the method, a speed-vs-size plot per case kind (GEMM TFLOP/s
/// against (M N K)^(1/3), attention against seq_kv; one series per kernel) and the table,
/// self-contained (inline CSS and SVG). Throws as report::render_svgs without gnuplot.
std::string render_bench_html(const BenchReport& r);

}  // namespace ulpgate
