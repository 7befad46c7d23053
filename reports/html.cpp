// The HTML report: one self-contained page (inline CSS, inline SVG plots by gnuplot; no
// scripts and nothing fetched from anywhere), readable offline and attachable to a CI run.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "harness/analyze.hpp"
#include "reports/common.hpp"
#include "reports/gnuplot.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

using report::escape_html;
using report::gnuplot_string;
using report::number;
using report::Plot;

constexpr const char* kStyle = R"(
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; font-size: .9em; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.error td:first-child { border-left: 6px solid #b00020; }
tr.failed td:first-child { border-left: 6px solid #e65100; }
tr.skipped td:first-child { border-left: 6px solid #9e9e9e; }
tr.passed td:first-child { border-left: 6px solid #2e7d32; }
.counts { font-size: 1.1em; font-weight: 600; }
code { background: #f5f5f5; padding: 0 .2em; word-break: break-all; }
.failure { border: 1px solid #e0b4b4; background: #fff8f8; padding: .5em 1em; margin: 1em 0; }
figure { margin: 1em 0; } figcaption { font-size: .9em; color: #555; }
figure svg { width: 100%; max-width: 900px; height: auto; display: block; }
figure svg image { image-rendering: pixelated; }
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
constexpr const char* kColours[] = {"#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#000000"};

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
    const std::string colour = kColours[k % std::size(kColours)];
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

// Up to kHtmlCasePlots cases that have something to show, failed ones first, then by the
// given error (NaN first: a non-finite mismatch is the worst error there is).
template <class Has, class Error>
std::vector<std::size_t> plotted_cases(const RunRecord& r, Has has, Error error) {
  std::vector<std::size_t> pick;
  for (std::size_t i = 0; i < r.cases.size(); ++i)
    if (has(r.cases[i])) pick.push_back(i);
  const auto key = [&](std::size_t i) {
    const double e = error(r.cases[i]);
    return std::tuple(report::outcome(r.cases[i]) == report::Outcome::Passed, std::isnan(e) ? 0 : 1,
                      std::isnan(e) ? 0.0 : -e);
  };
  std::stable_sort(pick.begin(), pick.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  if (pick.size() > static_cast<std::size_t>(kHtmlCasePlots)) pick.resize(kHtmlCasePlots);
  return pick;
}

// --- Page sections -------------------------------------------------------------------------

void environment(std::string& out, const RunRecord& r) {
  const auto& e = r.environment;
  out += "<h2>Environment</h2>\n<table>\n";
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
  out += "</table>\n";
}

void tolerance(std::string& out, const RunRecord& r) {
  const auto& t = r.tolerance;
  out += "<h2>Tolerance</h2>\n<table>\n";
  out += fmt::format("<tr><th>accumulator</th><td>{} bits</td></tr>\n", t.accumulator_bits);
  out += fmt::format("<tr><th>inputs</th><td>{}</td></tr>\n",
                     t.input_bits ? fmt::format("rounded to {} bits", t.input_bits) : "used as given");
  out += fmt::format("<tr><th>bound</th><td>{}</td></tr>\n",
                     t.probabilistic ? fmt::format("probabilistic, lambda = {}", number(t.lambda))
                                     : "deterministic (gamma_n)");
  out += fmt::format("<tr><th>baseline rule</th><td>max normalised error at most {} &times; that of {}</td></tr>\n",
                     number(r.baseline.factor), code(r.baseline.model));
  out += "</table>\n";
}

void failures(std::string& out, const RunRecord& r, const std::vector<std::size_t>& order) {
  bool any = false;
  for (std::size_t i : order) {
    const CaseResult& c = r.cases[i];
    const auto o = report::outcome(c);
    if (o != report::Outcome::Error && o != report::Outcome::Failure) continue;
    if (!any) out += "<h2>Failures</h2>\n";
    any = true;
    out += fmt::format("<div class=\"failure\"><h3>{}</h3>\n<p>{}</p>\n", escape_html(case_title(c)),
                       o == report::Outcome::Error ? "status " + std::string(name(c.status)) : "verdict failed");
    out += "<ul>\n";
    if (!c.message.empty()) out += "<li>" + escape_html(c.message) + "</li>\n";
    for (const auto& reason : c.verdict.reasons) out += "<li>" + escape_html(reason) + "</li>\n";
    out += "</ul>\n";
    for (const auto& m : c.metrics) {
      const auto& w = m.worst;
      if (w.index.empty()) continue;
      out += fmt::format("<table><tr><th colspan=\"2\">worst element of {} ({})</th></tr>\n", escape_html(m.output),
                         name(m.format));
      out += fmt::format("<tr><th>index</th><td>[{}]</td></tr>\n", fmt::join(w.index, ", "));
      out += fmt::format("<tr><th>got</th><td>{}</td></tr>\n<tr><th>expected</th><td>{}</td></tr>\n", code(w.got),
                         code(w.expected));
      out += fmt::format("<tr><th>exact</th><td>{}</td></tr>\n", code(w.exact));
      out += fmt::format("<tr><th>normalised error</th><td>{}</td></tr>\n<tr><th>ULP error</th><td>{}</td></tr>\n",
                         number(w.normalised), number(w.ulp));
      out += fmt::format("<tr><th>condition</th><td>{}</td></tr>\n</table>\n", number(w.condition));
    }
    if (!c.reproducer.empty()) out += "<p>reproduce: " + code(c.reproducer) + "</p>\n";
    out += "</div>\n";
  }
}

void cases_table(std::string& out, const RunRecord& r, const std::vector<std::size_t>& order) {
  out += "<h2>Cases</h2>\n";
  if (r.cases.empty()) {
    out += "<p>No cases.</p>\n";
    return;
  }
  out += "<table>\n<tr><th>kernel</th><th>family</th><th>status</th><th>verdict</th><th>max normalised</th>"
         "<th>max ULP error</th><th>ULP distance</th><th>NaN/Inf</th><th>seconds</th><th>reproducer</th></tr>\n";
  for (std::size_t i : order) {
    const CaseResult& c = r.cases[i];
    const auto f = report::figures(c);
    const std::string dash = "&mdash;";
    out += fmt::format("<tr class=\"{}\">", name(report::outcome(c)));
    out += td(escape_html(c.kernel)) + td(escape_html(c.family)) + td(std::string(name(c.status)));
    out += td(c.status != Disposition::Ok ? dash : c.verdict.passed ? "pass" : "<strong>FAIL</strong>");
    out += td(f.any_metrics ? number(f.max_normalised) : dash, true);
    out += td(f.any_metrics ? number(f.max_ulp) : dash, true);
    out += td(f.any_metrics ? std::to_string(f.max_ulp_distance) : dash, true);
    out += td(f.any_metrics ? escape_html(report::nonfinite_summary(f)) : dash);
    out += td(fmt::format("{:.3f}", c.seconds), true) + td(code(c.reproducer));
    out += "</tr>\n";
  }
  out += "</table>\n";
}

void sweeps_table(std::string& out, const RunRecord& r) {
  out += "<table>\n<tr><th>kernel</th><th>format</th><th>dist</th><th>metric vs parameter</th><th>points</th>"
         "<th>fitted exponent</th><th>effective bits</th></tr>\n";
  for (const auto& s : r.sweeps)
    out += "<tr>" + td(escape_html(s.kernel)) + td(escape_html(s.format)) + td(escape_html(s.dist)) +
           td(escape_html(s.metric + " vs " + s.parameter)) + td(std::to_string(s.x.size()), true) +
           td(number(s.fit.exponent) + " &plusmn; " + number(s.fit.exponent_stderr), true) +
           td(number(s.effective_bits), true) + "</tr>\n";
  out += "</table>\n";
}

std::string figure(const std::string& svg, const std::string& caption) {
  return "<figure>\n" + svg + "\n<figcaption>" + caption + "</figcaption>\n</figure>\n";
}

}  // namespace

std::string render_html(const RunRecord& r) {
  // All plots are drawn in one gnuplot run, then placed into the page.
  const auto groups = sweep_groups(r);
  const auto hist_cases = plotted_cases(
      r,
      [](const CaseResult& c) {
        for (const auto& m : c.metrics)
          for (auto n : m.ulp_histogram)
            if (n > 0) return true;
        return false;
      },
      [](const CaseResult& c) { return report::figures(c).max_ulp; });
  const auto map_cases = plotted_cases(
      r, [](const CaseResult& c) { return map_output(c) != nullptr; },
      [](const CaseResult& c) { return map_output(c)->max_normalised; });
  std::vector<Plot> plots;
  for (const auto& g : groups) plots.push_back(sweep_plot(g));
  for (std::size_t i : hist_cases) plots.push_back(histogram_plot(r.cases[i]));
  for (std::size_t i : map_cases) plots.push_back(map_plot(r.cases[i], *map_output(r.cases[i])));
  const std::vector<std::string> svgs = report::render_svgs(plots);
  std::size_t next = 0;

  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += fmt::format("<title>ulpgate {} run</title>\n<style>{}</style>\n</head>\n<body>\n", escape_html(r.kind), kStyle);
  out += fmt::format("<h1>ulpgate {} run</h1>\n<p class=\"counts\">{}</p>\n", escape_html(r.kind),
                     escape_html(report::counts_line(r)));
  environment(out, r);
  tolerance(out, r);
  const auto order = report::failures_first(r);
  failures(out, r, order);
  cases_table(out, r, order);
  if (!r.sweeps.empty()) {
    out += "<h2>Sweeps</h2>\n";
    sweeps_table(out, r);
    for (const auto& g : groups) {
      const bool refs = is_reduction_length(g.parameter) && g.metric.find("ulp") == std::string::npos;
      out += figure(svgs[next++],
                    fmt::format("{}: {} against {}, log-log; points are measurements (zeros cannot be drawn), "
                                "solid lines the fitted power laws{}.",
                                escape_html(g.kernel), escape_html(g.metric), escape_html(g.parameter),
                                refs ? ", dashed sqrt(n)&middot;u and dotted n&middot;u the typical and worst-case "
                                       "growth of accumulated rounding error for each format's unit roundoff u"
                                     : ""));
    }
  }
  if (!hist_cases.empty()) {
    out += "<h2>ULP error histograms</h2>\n";
    for (std::size_t i : hist_cases)
      out += figure(svgs[next++], escape_html(case_title(r.cases[i])) +
                                      ": elements per bin of |error| in ULPs (log scale); a correctly rounded "
                                      "result has every element in [0,0.5].");
  }
  if (!map_cases.empty()) {
    out += "<h2>Error maps</h2>\n";
    for (std::size_t i : map_cases)
      out += figure(svgs[next++], escape_html(case_title(r.cases[i])) +
                                      ": the largest normalised error in each cell of the output; a tile or "
                                      "boundary bug shows as a pattern. Red crosses: non-finite mismatches.");
  }
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace ulpgate
