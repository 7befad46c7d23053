// Renderers of a run record (harness/record.hpp): a Markdown summary, a self-contained
// HTML page with plots, and JUnit XML for CI systems. They only read the record; every
// piece of text from it is escaped for the target format.
#pragma once

#include <string>

#include "harness/record.hpp"

namespace ulpgate {

/// Markdown: environment, tolerance and baseline rule, counts, the failures (reasons, worst
/// element with hex values, reproducer), a table of every case (failures first) and a table
/// of sweep fits.
std::string render_markdown(const RunRecord& r);

/// JUnit XML: one <testsuite> per kernel, one <testcase> per case. A failed verdict is a
/// <failure>, status not_supported a <skipped/>, status failed/crashed/timed_out an
/// <error>; times from CaseResult::seconds, timestamp from the environment.
std::string render_junit(const RunRecord& r);

/// The cases that get an ULP histogram and an error map in the HTML page: at most this
/// many, failed ones first, then by error (max ULP error for histograms, max normalised
/// error for maps).
inline constexpr int kHtmlCasePlots = 6;

/// Self-contained HTML (inline CSS, plots as inline SVG; no scripts, fonts or images from
/// anywhere): everything the Markdown summary shows, plus
///  - per (kernel, parameter, metric) of the sweeps, one log-log plot: each series' points,
///    its fitted power law, and the reference lines sqrt(n) u and n u per format
///    (u = 2^-(fraction bits + 1)) when the parameter is a reduction length (K, seq_kv) and
///    the metric is not in ULPs;
///  - the ULP error histogram of up to kHtmlCasePlots cases with compared elements;
///  - the error map (log10 max normalised error per cell) of up to kHtmlCasePlots cases.
/// Plots are drawn by gnuplot (svg terminal), run as a subprocess; $ULPGATE_GNUPLOT names
/// another program. Throws InputError when gnuplot cannot be run.
std::string render_html(const RunRecord& r);

}  // namespace ulpgate
