// The HTML report: one self-contained page (inline CSS, inline SVG plots by gnuplot; no
// scripts and nothing fetched from anywhere), readable offline and attachable to a CI run.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "check/analyze.hpp"
#include "reports/common.hpp"
#include "reports/gnuplot.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

using report::escape_html;
using report::gnuplot_string;
using report::number;
using report::Plot;

// The layout fits a 1280 px window without horizontal scrolling: every long string (kernel
// names, families, reproducers) may wrap anywhere, tables shrink to the page, and only the
// full case table, which has the most columns, scrolls inside its own box if it must.
// Verdict colours are used by nothing else on the page (a test finds the verdict by them).
constexpr const char* kStyle = R"(
*, *::before, *::after { box-sizing: border-box; }
body { font: 15px/1.4 system-ui, sans-serif; margin: 0 auto; max-width: 1240px; padding: 1em 1.25em 3em;
       color: #222; overflow-wrap: anywhere; }
h2 { font-size: 1.3em; border-bottom: 1px solid #ccc; padding-bottom: .15em; margin: 1.6em 0 .5em; }
h3 { font-size: 1.1em; margin: 0 0 .3em; }
p, ul { margin: .3em 0; } ul { padding-left: 1.4em; }
.verdict { border: 2px solid var(--c); border-left-width: 14px; background: var(--bg); padding: .7em 1em; }
.verdict.pass { --c: #1b7a2e; --bg: #eef8f0; }
.verdict.fail { --c: #b00020; --bg: #fdf0f2; }
.verdict.partial { --c: #a85400; --bg: #fff5e8; }
.verdict h1 { margin: 0; font-size: 1.25em; font-weight: 600; display: flex; flex-wrap: wrap; align-items: center;
              gap: .2em .7em; }
.verdict .word { background: var(--c); color: #fff; font-size: 1.9em; font-weight: 800; letter-spacing: .05em;
                 padding: 0 .45em; border-radius: 4px; }
.verdict .headline { font-size: 1.2em; font-weight: 600; margin: .5em 0 .3em; }
.verdict .counts { color: #444; }
.verdict table { background: #fff; }
.verdict caption { text-align: left; font-weight: 600; padding: .2em 0; }
nav { margin: .6em 0 0; font-size: .95em; color: #555; }
nav a { color: #1a5fb4; margin-right: 1.2em; }
table { border-collapse: collapse; margin: .4em 0; font-size: .9em; max-width: 100%; }
th, td { border: 1px solid #d0d0d0; padding: .12em .45em; text-align: left; vertical-align: top; line-height: 1.3; }
th { background: #f3f3f3; font-weight: 600; }
.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; overflow-wrap: normal; }
td.bad { color: #c62828; font-weight: 700; } td.warn { color: #b26200; font-weight: 700; }
tr.error td:first-child { border-left: 5px solid #8e0000; }
tr.failed td:first-child { border-left: 5px solid #e65100; }
tr.skipped td:first-child { border-left: 5px solid #9e9e9e; }
tr.passed td:first-child { border-left: 5px solid #2e7d32; }
code { font: .88em/1.3 ui-monospace, SFMono-Regular, Menlo, monospace; background: #f3f3f3; padding: 0 .2em; }
pre.repro { margin: .15em 0 .4em; padding: .3em .5em; background: #f6f8fa; border: 1px solid #d8dde3;
            white-space: pre-wrap; overflow-wrap: anywhere; user-select: all; }
pre.repro code { background: none; padding: 0; }
.failure { border: 1px solid #e0b4b4; border-left: 5px solid #e65100; background: #fffafa; padding: .6em 1em;
           margin: .8em 0; }
.failure .label { color: #555; font-size: .9em; margin-top: .4em; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 420px), 1fr)); gap: .4em 1.2em; }
.plots > figure { min-width: 0; }
figure { margin: .6em 0; } figcaption { font-size: .88em; color: #555; }
figure svg { width: 100%; max-width: 900px; height: auto; display: block; }
figure svg image { image-rendering: pixelated; }
details { margin: 1.2em 0; }
details > summary { cursor: pointer; }
details > summary h2 { display: inline-block; margin: 0; border: none; }
.scroll { overflow-x: auto; max-width: 100%; }
table.cases { width: 100%; min-width: 900px; font-size: .85em; table-layout: fixed; }
table.cases small { color: #666; }
table.cases td.num { white-space: normal; overflow-wrap: anywhere; }
col.kernel { width: 12%; } col.family { width: 18%; } col.status { width: 9.5%; } col.verdict { width: 6%; }
col.normalised { width: 8%; } col.ulp, col.distance { width: 6.5%; } col.nonfinite { width: 9%; }
col.seconds { width: 6%; } col.reproducer { width: 18.5%; }
)";

std::string td(const std::string& html, bool numeric = false) {
  return fmt::format("<td{}>{}</td>", numeric ? " class=\"num\"" : "", html);
}
std::string code(const std::string& text) { return text.empty() ? "" : "<code>" + escape_html(text) + "</code>"; }
std::string or_unknown(const std::string& s) { return s.empty() ? "unknown" : escape_html(s); }

// A double for a gnuplot data block (all 17 digits: plots must show the recorded value).
std::string datum(double x) { return fmt::format("{:.17g}", x); }

std::string case_title(const CaseResult& c) { return c.kernel + " — " + c.family; }

// --- Plots -----------------------------------------------------------------------------------

// Series colours, distinguishable in print and for common colour blindness (Paul Tol).

bool is_reduction_length(const std::string& parameter) {
  return parameter == "K" || parameter == "k" || parameter == "seq_kv";
}

struct SweepGroup {
  std::string kernel, parameter, metric;
  std::vector<const SweepSeries*> series;
};

std::vector<SweepGroup> sweep_groups(const RunRecord& r) {
  std::vector<SweepGroup> groups;
  for (const auto& s : r.sweeps) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const SweepGroup& g) {
      return std::tie(g.kernel, g.parameter, g.metric) == std::tie(s.kernel, s.parameter, s.metric);
    });
    if (it == groups.end()) it = groups.insert(groups.end(), SweepGroup{s.kernel, s.parameter, s.metric, {}});
    it->series.push_back(&s);
  }
  return groups;
}

Plot sweep_plot(const SweepGroup& g) {
  std::string data, plot;
  double xlo = INFINITY, xhi = 0;
  for (const auto* s : g.series)
    for (std::size_t i = 0; i < s->x.size(); ++i)
      if (std::isfinite(s->x[i]) && s->x[i] > 0) xlo = std::min(xlo, s->x[i]), xhi = std::max(xhi, s->x[i]);
  const bool refs = is_reduction_length(g.parameter) && g.metric.find("ulp") == std::string::npos;
  std::map<std::string, std::size_t> format_colour;  // reference lines once per format
  for (std::size_t k = 0; k < g.series.size(); ++k) {
    const SweepSeries& s = *g.series[k];
    const std::string colour = report::kSeriesColours[k % std::size(report::kSeriesColours)];
    const std::string label = s.format + " " + s.dist;
    std::string points;
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.x[i]) && s.x[i] > 0 && std::isfinite(s.y[i]) && s.y[i] > 0)  // log axes
        points += datum(s.x[i]) + " " + datum(s.y[i]) + "\n";
    if (!points.empty()) {
      data += fmt::format("$s{} << EOD\n{}EOD\n", k, points);
      plot += fmt::format("$s{} using 1:2 with points pt 7 ps 0.8 lc rgb '{}' title {}, ", k, colour,
                          gnuplot_string(label));
    }
    const auto& f = s.fit;
    if (f.points >= 2 && std::isfinite(f.exponent) && std::isfinite(f.intercept) && xhi > 0) {
      const auto at = [&](double x) { return std::exp(f.intercept + f.exponent * std::log(x)); };
      if (std::isfinite(at(xlo)) && at(xlo) > 0 && std::isfinite(at(xhi)) && at(xhi) > 0) {
        data += fmt::format("$f{} << EOD\n{} {}\n{} {}\nEOD\n", k, datum(xlo), datum(at(xlo)), datum(xhi), datum(at(xhi)));
        plot += fmt::format("$f{} using 1:2 with lines lw 1.5 lc rgb '{}' title {}, ", k, colour,
                            gnuplot_string(fmt::format("fit {}: exponent {} ± {}", label, number(f.exponent),
                                                       number(f.exponent_stderr))));
      }
    }
    const double u = report::unit_roundoff(s.format);
    if (refs && u > 0 && xhi > 0 && format_colour.emplace(s.format, k).second) {
      data += fmt::format("$r{} << EOD\n{} {}\n{} {}\nEOD\n", k, datum(xlo), datum(std::sqrt(xlo) * u), datum(xhi),
                          datum(std::sqrt(xhi) * u));
      data += fmt::format("$q{} << EOD\n{} {}\n{} {}\nEOD\n", k, datum(xlo), datum(xlo * u), datum(xhi), datum(xhi * u));
      plot += fmt::format("$r{} using 1:2 with lines dt 2 lc rgb '{}' title {}, ", k, colour,
                          gnuplot_string(fmt::format("sqrt({}) u, u = 2^-{} ({})", g.parameter,
                                                     -std::ilogb(u), s.format)));
      plot += fmt::format("$q{} using 1:2 with lines dt 3 lc rgb '{}' title {}, ", k, colour,
                          gnuplot_string(fmt::format("{} u ({})", g.parameter, s.format)));
    }
  }
  std::string script = data;
  script += fmt::format("set title {}\nset xlabel {}\nset ylabel {}\n",
                        gnuplot_string(fmt::format("{}: {} vs {}", g.kernel, g.metric, g.parameter)),
                        gnuplot_string(g.parameter), gnuplot_string(g.metric));
  script += "set grid\nset key outside right top box\n";
  if (plot.empty()) {
    script += "set xrange [0:1]\nset yrange [0:1]\nset label 'no positive values to draw' at 0.5,0.5 center\n"
              "plot 2 notitle\n";
  } else {
    script += "set logscale xy\nset format y '%.0e'\n";
    script += "plot " + plot.substr(0, plot.size() - 2) + "\n";
  }
  return Plot{script, 900, 460};
}

std::string bin_label(int bin) {
  const auto [lo, hi] = ulp_histogram_edges(bin);
  const auto edge = [](double x) {
    if (std::isinf(x)) return std::string("inf");
    const int e = std::ilogb(x);
    return x >= 1024 && std::ldexp(1.0, e) == x ? fmt::format("2^{}", e) : fmt::format("{:g}", x);
  };
  return fmt::format("{}{},{}]", bin == 0 ? "[" : "(", edge(lo), edge(hi));
}

Plot histogram_plot(const CaseResult& c) {
  std::vector<std::int64_t> counts(kUlpHistogramBins, 0);
  for (const auto& m : c.metrics)
    for (int b = 0; b < kUlpHistogramBins && b < static_cast<int>(m.ulp_histogram.size()); ++b)
      counts[b] += m.ulp_histogram[b];
  int last = 0;
  for (int b = 0; b < kUlpHistogramBins; ++b)
    if (counts[b] > 0) last = b;
  std::string data = "$h << EOD\n", tics;
  for (int b = 0; b <= last; ++b) {
    if (counts[b] > 0) data += fmt::format("{} {}\n", b, counts[b]);
    tics += fmt::format("{}{} {}", b ? ", " : "", gnuplot_string(bin_label(b)), b);
  }
  data += "EOD\n";
  std::string script = data;
  script += fmt::format("set title {}\n", gnuplot_string(case_title(c)));
  script += "set xlabel '|error| in ULPs of the output format'\nset ylabel 'elements'\n";
  script += fmt::format("set xtics ({}) rotate by -45\nset xrange [-0.6:{}.6]\n", tics, last);
  script += "set logscale y\nset yrange [0.7:*]\nset grid ytics\nset style fill solid 0.7 border -1\n"
            "set boxwidth 0.8\nplot $h using 1:2 with boxes lc rgb '#4477aa' notitle\n";
  return Plot{script, 720, 380};
}

// The output whose map to draw: the one with the largest error (NaN, a non-finite
// mismatch, counts as largest).
const ErrorMetrics* map_output(const CaseResult& c) {
  const ErrorMetrics* best = nullptr;
  for (const auto& m : c.metrics) {
    if (m.map.grid_rows * m.map.grid_cols == 0) continue;
    if (!best || std::isnan(m.max_normalised) || m.max_normalised > best->max_normalised) best = &m;
  }
  return best;
}

Plot map_plot(const CaseResult& c, const ErrorMetrics& m) {
  const ErrorMap& map = m.map;
  double lo = INFINITY, hi = -INFINITY;
  for (double v : map.max_normalised)
    if (std::isfinite(v) && v > 0) lo = std::min(lo, std::log10(v)), hi = std::max(hi, std::log10(v));
  // Cells with no error sit one decade below the smallest error; all-zero maps get a
  // one-decade scale so that the colour range is not empty.
  if (!std::isfinite(lo)) lo = hi = -17;
  const double floor = lo - 1;
  if (hi <= floor) hi = floor + 1;
  std::string image = "$map << EOD\n", bad;
  for (std::int64_t i = 0; i < map.grid_rows; ++i) {
    for (std::int64_t j = 0; j < map.grid_cols; ++j) {
      const double v = map.max_normalised[i * map.grid_cols + j];
      double shown = floor;
      if (std::isnan(v) || std::isinf(v)) {
        shown = hi;  // drawn at the top of the scale and marked
        bad += fmt::format("{} {}\n", j, i);
      } else if (v > 0) {
        shown = std::log10(v);
      }
      image += (j ? " " : "") + datum(shown);
    }
    image += "\n";
  }
  image += "EOD\n";
  std::string script = image;
  if (!bad.empty()) script += "$bad << EOD\n" + bad + "EOD\n";
  // The case's full name is in the caption; the title stays short enough to fit.
  script += fmt::format("set title {}\n", gnuplot_string(fmt::format("{}, {} ({}): log10 max normalised error per cell",
                                                                     c.kernel, m.output, name(m.format))));
  script += fmt::format("set xlabel {}\nset ylabel {}\n",
                        gnuplot_string(fmt::format("column cell ({} columns of {} each)", map.cols, map.cell_cols)),
                        gnuplot_string(fmt::format("row cell ({} rows of {} each)", map.rows, map.cell_rows)));
  // Row 0 at the top, as the output matrix is written (an explicit range ignores "reverse").
  script += fmt::format("set xrange [-0.5:{}]\nset yrange [{}:-0.5]\nset cbrange [{}:{}]\n",
                        datum(map.grid_cols - 0.5), datum(map.grid_rows - 0.5), datum(floor), datum(hi));
  script += "set palette defined (0 '#440154', 1 '#3b528b', 2 '#21918c', 3 '#5ec962', 4 '#fde725')\n"
            "set key outside bottom center\n";
  script += "plot $map matrix with image notitle";
  if (!bad.empty()) script += ", $bad using 1:2 with points pt 2 ps 1.2 lc rgb '#ff0000' title 'non-finite mismatch'";
  script += "\n";
  return Plot{script, 720, 560};
}

// Up to kHtmlCasePlots cases that have something to show: the first case of each distinct
// failure (in their order, so that each failure's block can show its plots), then other
// failed ones, then by the given error (NaN first: a non-finite mismatch is the worst error
// there is).
template <class Has, class Error>
std::vector<std::size_t> plotted_cases(const RunRecord& r, const std::vector<std::size_t>& firsts, Has has, Error error) {
  std::vector<std::size_t> pick;
  for (std::size_t i = 0; i < r.cases.size(); ++i)
    if (has(r.cases[i])) pick.push_back(i);
  const auto key = [&](std::size_t i) {
    const double e = error(r.cases[i]);
    const auto rank = static_cast<std::size_t>(std::find(firsts.begin(), firsts.end(), i) - firsts.begin());
    return std::tuple(rank, report::outcome(r.cases[i]) == report::Outcome::Passed, std::isnan(e) ? 0 : 1,
                      std::isnan(e) ? 0.0 : -e);
  };
  std::stable_sort(pick.begin(), pick.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  if (pick.size() > static_cast<std::size_t>(kHtmlCasePlots)) pick.resize(kHtmlCasePlots);
  return pick;
}

// --- Page sections -------------------------------------------------------------------------

std::string figure(const std::string& svg, const std::string& caption) {
  return "<figure>\n" + svg + "\n<figcaption>" + caption + "</figcaption>\n</figure>\n";
}

std::string histogram_figure(const RunRecord& r, std::size_t i, const std::string& svg) {
  return figure(svg, escape_html(case_title(r.cases[i])) +
                         ": elements per bin of |error| in ULPs (log scale); a correctly rounded result has every "
                         "element in [0,0.5].");
}

std::string map_figure(const RunRecord& r, std::size_t i, const std::string& svg) {
  return figure(svg, escape_html(case_title(r.cases[i])) +
                         ": the largest normalised error in each cell of the output; a tile or boundary bug shows as "
                         "a pattern. Red crosses: non-finite mismatches.");
}

std::string verdict_class(const std::string& verdict) {
  return verdict == "PASS" ? "pass" : verdict == "PARTIAL" ? "partial" : "fail";
}

// The answer: the verdict word in its colour, the headline, and what of the campaign did not
// run (a PARTIAL run must not pass for a PASS at a glance), then links down the page.
void verdict(std::string& out, const RunRecord& r, const report::Headline& h, bool any_failures) {
  out += fmt::format("<header id=\"verdict\" class=\"verdict {}\">\n", verdict_class(h.verdict));
  out += fmt::format("<h1><span class=\"word\">{}</span> <span>ulpgate {} run</span></h1>\n", escape_html(h.verdict),
                     escape_html(r.kind.empty() ? "unnamed" : r.kind));
  out += "<p class=\"headline\">" + escape_html(h.text) + "</p>\n";
  if (!r.not_run.empty()) {
    out += fmt::format("<table>\n<caption>Not run: {} planned cases</caption>\n", report::not_run_cases(r));
    out += "<tr><th>target</th><th class=\"num\">planned</th><th class=\"num\">run</th><th class=\"num\">not run</th>"
           "<th>reason</th></tr>\n";
    for (const auto& n : r.not_run)
      out += "<tr>" + td(escape_html(n.target)) + td(std::to_string(n.planned), true) + td(std::to_string(n.run), true) +
             td(std::to_string(n.planned - n.run), true) + td(escape_html(n.reason)) + "</tr>\n";
    out += "</table>\n";
  }
  out += "<p class=\"counts\">" + escape_html(report::counts_line(r)) + "</p>\n";
  out += "</header>\n<nav><a href=\"#summary\">Summary</a>";
  if (any_failures) out += "<a href=\"#failures\">Distinct failures</a>";
  if (!r.sweeps.empty()) out += "<a href=\"#sweeps\">Sweeps</a>";
  out += fmt::format("<a href=\"#environment\">Environment</a><a href=\"#cases\">All {} cases</a></nav>\n",
                     r.cases.size());
}

void summary(std::string& out, const RunRecord& r) {
  out += "<section id=\"summary\">\n<h2>Summary by kernel and dtype</h2>\n";
  const auto rows = report::target_summaries(r);
  if (rows.empty()) {
    out += "<p>No cases.</p>\n</section>\n";
    return;
  }
  out += "<table class=\"summary\">\n<tr><th>kernel</th><th>dtype</th><th class=\"num\">cases</th>"
         "<th class=\"num\">failed</th><th class=\"num\">not run</th><th>worst normalised</th><th>worst ULP</th>"
         "<th>bias (ULP)</th></tr>\n";
  for (const auto& t : rows) {
    out += "<tr>" + td(escape_html(t.kernel)) + td(escape_html(t.dtype)) + td(std::to_string(t.cases), true);
    out += t.failed ? fmt::format("<td class=\"num bad\">{}</td>", t.failed) : td("0", true);
    out += t.not_run ? fmt::format("<td class=\"num warn\">{}</td>", t.not_run) : td("0", true);
    out += td(number(t.worst_normalised), true) + td(number(t.worst_ulp), true) + td(number(t.bias_ulp), true);
    out += "</tr>\n";
  }
  out += "</table>\n<p>Worst errors over the cases' outputs (overflowed elements excluded); bias: the mean signed "
         "ULP error, which a correctly rounded kernel keeps near 0.</p>\n</section>\n";
}

// The worst element of each output, one line each: where, the values in hex, the errors.
std::string worst_elements(const CaseResult& c) {
  std::string out;
  for (const auto& m : c.metrics) {
    const auto& w = m.worst;
    if (w.index.empty()) continue;
    out += fmt::format(
        "<li>worst element of {} ({}) at [{}]: got {}, expected {}, exact {}; normalised error {}, {} ULP, "
        "condition {}</li>\n",
        escape_html(m.output), name(m.format), fmt::join(w.index, ", "), code(w.got), code(w.expected), code(w.exact),
        number(w.normalised), number(w.ulp), number(w.condition));
  }
  return out;
}

std::string reproducer(const std::string& label, const std::string& command) {
  if (command.empty()) return "<p class=\"label\">" + label + ": no reproducer recorded</p>\n";
  return "<p class=\"label\">" + label + ":</p>\n<pre class=\"repro\"><code>" + escape_html(command) + "</code></pre>\n";
}

// Each distinct failure once: what failed, how to rerun it (the first case and the minimal
// one, as text to copy), and the first case's plots.
void distinct(std::string& out, const RunRecord& r, const std::vector<report::DistinctFailure>& failures,
              const std::map<std::size_t, std::string>& hist_svg, const std::map<std::size_t, std::string>& map_svg) {
  if (failures.empty()) return;
  out += fmt::format("<section id=\"failures\">\n<h2>Distinct failures ({})</h2>\n", failures.size());
  for (const auto& d : failures) {
    const CaseResult& first = r.cases[d.first];
    out += fmt::format("<div class=\"failure\">\n<h3>{} &mdash; {} case{}</h3>\n", escape_html(d.kernel), d.cases.size(),
                       d.cases.size() == 1 ? "" : "s");
    out += "<p>signature " + code(d.signature.empty() ? "(none)" : d.signature) + "</p>\n";
    out += fmt::format("<p>first case: {}, {} ({}{})</p>\n<ul>\n", escape_html(shape_text(first.spec)),
                       escape_html(first.family), escape_html(first.origin.empty() ? "case" : first.origin),
                       first.status == Disposition::Ok ? "" : ", status " + std::string(name(first.status)));
    if (!first.message.empty()) out += "<li>" + escape_html(first.message) + "</li>\n";
    for (const auto& reason : first.verdict.reasons) out += "<li>" + escape_html(reason) + "</li>\n";
    out += worst_elements(first) + "</ul>\n";
    out += reproducer("reproduce the first case", first.reproducer);
    if (d.shrunk)
      out += reproducer(fmt::format("reproduce the minimal case ({}, {})", escape_html(shape_text(r.cases[*d.shrunk].spec)),
                                    escape_html(r.cases[*d.shrunk].family)),
                        r.cases[*d.shrunk].reproducer);
    const auto h = hist_svg.find(d.first), m = map_svg.find(d.first);
    if (h != hist_svg.end() || m != map_svg.end()) {
      out += "<div class=\"plots\">\n";
      if (h != hist_svg.end()) out += histogram_figure(r, d.first, h->second);
      if (m != map_svg.end()) out += map_figure(r, d.first, m->second);
      out += "</div>\n";
    }
    out += "</div>\n";
  }
  out += "</section>\n";
}

void sweeps_table(std::string& out, const RunRecord& r) {
  out += "<table>\n<tr><th>kernel</th><th>format</th><th>dist</th><th>metric vs parameter</th><th>points</th>"
         "<th>fitted exponent</th><th>effective bits</th></tr>\n";
  for (const auto& s : r.sweeps)
    out += "<tr>" + td(escape_html(s.kernel)) + td(escape_html(s.format)) + td(escape_html(s.dist)) +
           td(escape_html(s.metric + " vs " + s.parameter)) + td(std::to_string(s.x.size()), true) +
           td(number(s.fit.exponent) + " &plusmn; " + number(s.fit.exponent_stderr), true) +
           td(number(s.effective_bits), true) + "</tr>\n";
  out += "</table>\n<p>The exponent p fits error ~ parameter<sup>p</sup> (p = 0.5: random-walk accumulation error, "
         "p = 1: the worst case).</p>\n";
}

void sweeps(std::string& out, const RunRecord& r, const std::vector<SweepGroup>& groups,
            const std::vector<std::string>& svgs) {
  out += "<section id=\"sweeps\">\n<h2>Sweeps</h2>\n";
  sweeps_table(out, r);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const SweepGroup& g = groups[k];
    const bool refs = is_reduction_length(g.parameter) && g.metric.find("ulp") == std::string::npos;
    out += figure(svgs[k], fmt::format("{}: {} against {}, log-log; points are measurements (zeros cannot be drawn), "
                                       "solid lines the fitted power laws{}.",
                                       escape_html(g.kernel), escape_html(g.metric), escape_html(g.parameter),
                                       refs ? ", dashed sqrt(n)&middot;u and dotted n&middot;u the typical and "
                                              "worst-case growth of accumulated rounding error for each format's unit "
                                              "roundoff u"
                                            : ""));
  }
  out += "</section>\n";
}

// The plots of cases that are not a distinct failure's first case (shown in its block).
void case_plots(std::string& out, const RunRecord& r, const std::vector<std::pair<std::size_t, std::string>>& hists,
                const std::vector<std::pair<std::size_t, std::string>>& maps) {
  if (hists.empty() && maps.empty()) return;
  out += "<section id=\"plots\">\n";
  if (!hists.empty()) {
    out += "<h2>ULP error histograms</h2>\n<div class=\"plots\">\n";
    for (const auto& [i, svg] : hists) out += histogram_figure(r, i, svg);
    out += "</div>\n";
  }
  if (!maps.empty()) {
    out += "<h2>Error maps</h2>\n<div class=\"plots\">\n";
    for (const auto& [i, svg] : maps) out += map_figure(r, i, svg);
    out += "</div>\n";
  }
  out += "</section>\n";
}

void environment(std::string& out, const RunRecord& r) {
  const auto& e = r.environment;
  out += "<section id=\"environment\">\n<h2>Environment</h2>\n<table>\n";
  const std::pair<const char*, std::string> rows[] = {
      {"ulpgate", or_unknown(e.ulpgate_version) + " (git " + or_unknown(e.git_revision) + ")"},
      {"compiler", or_unknown(e.compiler)},
      {"host", or_unknown(e.host)},
      {"started", or_unknown(e.started_at)},
      {"device", or_unknown(e.device)},
      {"driver", or_unknown(e.driver)},
      {"CUDA runtime", or_unknown(e.cuda_runtime)},
      {"cuBLAS", or_unknown(e.cublas)},
      {"SM clock", e.sm_clock_mhz > 0 ? fmt::format("{} MHz", e.sm_clock_mhz) : "unknown"},
      {"command", r.command.empty() ? "unknown" : code(r.command)},
      {"seed", std::to_string(r.seed)},
  };
  for (const auto& [k, v] : rows) out += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", k, v);
  out += "</table>\n</section>\n";
}

void tolerance(std::string& out, const RunRecord& r) {
  const auto& t = r.tolerance;
  out += "<section id=\"tolerance\">\n<h2>Tolerance</h2>\n<table>\n";
  out += fmt::format("<tr><th>accumulator</th><td>{} bits</td></tr>\n", t.accumulator_bits);
  out += fmt::format("<tr><th>inputs</th><td>{}</td></tr>\n",
                     t.input_bits ? fmt::format("rounded to {} bits", t.input_bits) : "used as given");
  out += fmt::format("<tr><th>bound</th><td>{}</td></tr>\n",
                     t.probabilistic ? fmt::format("probabilistic, lambda = {}", number(t.lambda))
                                     : "deterministic (gamma_n)");
  out += fmt::format("<tr><th>baseline rule</th><td>max normalised error at most {} &times; that of {}</td></tr>\n",
                     number(r.baseline.factor), code(r.baseline.model));
  out += "</table>\n</section>\n";
}

// Every failed or errored case with its reasons, worst elements and reproducer: the
// distinct failures above show one case each; these are the rest, on request.
void failing_cases(std::string& out, const RunRecord& r, const std::vector<std::size_t>& order) {
  std::string body;
  std::size_t n = 0;
  for (std::size_t i : order) {
    const CaseResult& c = r.cases[i];
    const auto o = report::outcome(c);
    if (o != report::Outcome::Error && o != report::Outcome::Failure) continue;
    ++n;
    body += fmt::format("<div class=\"failure\">\n<h3>{}</h3>\n<p>{}, {}{}</p>\n<ul>\n", escape_html(case_title(c)),
                        escape_html(shape_text(c.spec)),
                        o == report::Outcome::Error ? "status " + std::string(name(c.status)) : "verdict failed",
                        c.origin.empty() ? "" : ", " + escape_html(c.origin));
    if (!c.message.empty()) body += "<li>" + escape_html(c.message) + "</li>\n";
    for (const auto& reason : c.verdict.reasons) body += "<li>" + escape_html(reason) + "</li>\n";
    body += worst_elements(c) + "</ul>\n" + reproducer("reproduce", c.reproducer) + "</div>\n";
  }
  if (n == 0) return;
  out += fmt::format("<details id=\"failing-cases\">\n<summary><h2>Failing cases in detail ({})</h2></summary>\n{}"
                     "</details>\n",
                     n, body);
}

// Every case, failures first: the longest part of the page, so it is last and closed.
void cases_table(std::string& out, const RunRecord& r, const std::vector<std::size_t>& order) {
  out += fmt::format("<details id=\"cases\">\n<summary><h2>All cases ({})</h2></summary>\n", r.cases.size());
  if (r.cases.empty()) {
    out += "<p>No cases.</p>\n</details>";
    return;
  }
  // Fixed column widths: in an automatic layout the long families and reproducers, which may
  // wrap anywhere, would squeeze the short cells ("FAIL", "crashed") into broken words.
  out += "<div class=\"scroll\">\n<table class=\"cases\">\n<colgroup><col class=\"kernel\"><col class=\"family\">"
         "<col class=\"status\"><col class=\"verdict\"><col class=\"normalised\"><col class=\"ulp\">"
         "<col class=\"distance\"><col class=\"nonfinite\"><col class=\"seconds\"><col class=\"reproducer\">"
         "</colgroup>\n<tr><th>kernel</th><th>family</th><th>status</th>"
         "<th>verdict</th><th>max normalised</th><th>max ULP error</th><th>ULP distance</th><th>NaN/Inf</th>"
         "<th>seconds</th><th>reproducer</th></tr>\n";
  for (std::size_t i : order) {
    const CaseResult& c = r.cases[i];
    const auto f = report::figures(c);
    const std::string dash = "&mdash;";
    out += fmt::format("<tr class=\"{}\">", name(report::outcome(c)));
    out += td(escape_html(c.kernel));
    std::string family = escape_html(c.family);
    if (!c.origin.empty() || !c.id.empty())
      family += "<br><small>" + escape_html(c.origin) + (c.origin.empty() || c.id.empty() ? "" : ", ") +
                (c.id.empty() ? "" : "id " + escape_html(c.id)) + "</small>";
    out += td(family) + td(std::string(name(c.status)));
    out += td(c.status != Disposition::Ok ? dash : c.verdict.passed ? "pass" : "<strong>FAIL</strong>");
    out += td(f.any_metrics ? number(f.max_normalised) : dash, true);
    out += td(f.any_metrics ? number(f.max_ulp) : dash, true);
    out += td(f.any_metrics ? std::to_string(f.max_ulp_distance) : dash, true);
    out += td(f.any_metrics ? escape_html(report::nonfinite_summary(f)) : dash);
    out += td(fmt::format("{:.3f}", c.seconds), true) + td(code(c.reproducer));
    out += "</tr>\n";
  }
  out += "</table>\n</div>\n</details>";
}

}  // namespace

std::string render_html(const RunRecord& r) {
  const auto distinct_list = report::distinct_failures(r);
  std::vector<std::size_t> firsts;
  for (const auto& d : distinct_list) firsts.push_back(d.first);
  // All plots are drawn in one gnuplot run, then placed into the page.
  const auto groups = sweep_groups(r);
  const auto hist_cases = plotted_cases(
      r, firsts,
      [](const CaseResult& c) {
        for (const auto& m : c.metrics)
          for (auto n : m.ulp_histogram)
            if (n > 0) return true;
        return false;
      },
      [](const CaseResult& c) { return report::figures(c).max_ulp; });
  const auto map_cases = plotted_cases(
      r, firsts, [](const CaseResult& c) { return map_output(c) != nullptr; },
      [](const CaseResult& c) { return map_output(c)->max_normalised; });
  std::vector<Plot> plots;
  for (const auto& g : groups) plots.push_back(sweep_plot(g));
  for (std::size_t i : hist_cases) plots.push_back(histogram_plot(r.cases[i]));
  for (std::size_t i : map_cases) plots.push_back(map_plot(r.cases[i], *map_output(r.cases[i])));
  std::vector<std::string> svgs = report::render_svgs(plots);
  // A distinct failure's first case is drawn in that failure's block, every other case below
  // the sweeps.
  std::map<std::size_t, std::string> failure_hist, failure_map;
  std::vector<std::pair<std::size_t, std::string>> other_hists, other_maps;
  std::size_t next = groups.size();
  const auto is_first = [&](std::size_t i) { return std::find(firsts.begin(), firsts.end(), i) != firsts.end(); };
  for (std::size_t i : hist_cases) {
    if (is_first(i)) failure_hist[i] = std::move(svgs[next++]);
    else other_hists.emplace_back(i, std::move(svgs[next++]));
  }
  for (std::size_t i : map_cases) {
    if (is_first(i)) failure_map[i] = std::move(svgs[next++]);
    else other_maps.emplace_back(i, std::move(svgs[next++]));
  }

  const auto h = report::headline(r);
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += fmt::format("<title>{}: ulpgate {} run</title>\n<style>{}</style>\n</head>\n<body>\n", escape_html(h.verdict),
                     escape_html(r.kind.empty() ? "unnamed" : r.kind), kStyle);
  // The answer first (verdict, what did not run, the summary, each distinct failure), then the
  // sweeps and other plots, then the details: environment, tolerance, every case.
  verdict(out, r, h, !distinct_list.empty());
  summary(out, r);
  distinct(out, r, distinct_list, failure_hist, failure_map);
  if (!r.sweeps.empty()) sweeps(out, r, groups, svgs);
  case_plots(out, r, other_hists, other_maps);
  environment(out, r);
  tolerance(out, r);
  const auto order = report::failures_first(r);
  failing_cases(out, r, order);
  cases_table(out, r, order);
  out += "\n</body>\n</html>\n";
  return out;
}

}  // namespace ulpgate
