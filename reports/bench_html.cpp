// `ulpgate bench --html`: the bench table and a speed-vs-size plot per case kind (GEMM:
// TFLOP/s against M N K; attention: against seq_kv), one series per kernel, as a
// self-contained page (inline CSS and SVG).
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "reports/common.hpp"
#include "reports/gnuplot.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

// The size a row is drawn at: M N K for GEMM (the cube root reads as a side), seq_kv for
// attention.
double size_of(const Case& c) {
  return c.op == Op::Gemm ? std::cbrt(static_cast<double>(c.gemm.m) * static_cast<double>(c.gemm.n) * static_cast<double>(c.gemm.k))
                          : static_cast<double>(c.attention.seq_kv);
}

report::Plot speed_plot(const BenchReport& r, Op op) {
  std::map<std::string, std::vector<std::pair<double, double>>> series;  // kernel -> (size, TFLOP/s)
  std::vector<std::string> order;
  for (const BenchRow& row : r.rows) {
    if (row.c.op != op || row.status != "ok" || !(row.tflops > 0)) continue;
    if (!series.count(row.kernel)) order.push_back(row.kernel);
    series[row.kernel].emplace_back(size_of(row.c), row.tflops);
  }
  std::string data, plot;
  for (std::size_t k = 0; k < order.size(); ++k) {
    auto& points = series[order[k]];
    std::sort(points.begin(), points.end());
    data += fmt::format("$s{} << EOD\n", k);
    for (const auto& [x, y] : points) data += fmt::format("{:.17g} {:.17g}\n", x, y);
    data += "EOD\n";
    plot += fmt::format("$s{} using 1:2 with linespoints pt 7 ps 0.8 lc rgb '{}' title {}, ", k, report::kSeriesColours[k % std::size(report::kSeriesColours)],
                        report::gnuplot_string(order[k]));
  }
  const std::string x = op == Op::Gemm ? "(M N K)^(1/3)" : "seq_kv";
  std::string script = data + fmt::format("set title {}\nset xlabel {}\nset ylabel 'TFLOP/s (median)'\nset grid\n"
                                          "set key outside right top box\n",
                                          report::gnuplot_string(op == Op::Gemm ? "GEMM: speed vs size" : "attention: speed vs seq_kv"),
                                          report::gnuplot_string(x));
  if (plot.empty()) script += "set xrange [0:1]\nset yrange [0:1]\nset label 'nothing timed' at 0.5,0.5 center\nplot 2 notitle\n";
  else script += "set logscale x 2\nset yrange [0:*]\nplot " + plot.substr(0, plot.size() - 2) + "\n";
  return report::Plot{script, 900, 460};
}

}  // namespace

std::string render_bench_html(const BenchReport& r) {
  std::set<Op> ops;
  for (const BenchRow& row : r.rows) ops.insert(row.c.op);
  std::vector<report::Plot> plots;
  for (const Op op : ops) plots.push_back(speed_plot(r, op));
  const std::vector<std::string> svgs = report::render_svgs(plots);
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ulpgate bench</title>\n"
                  "<style>body{font-family:sans-serif;margin:1.5em;max-width:1200px}table{border-collapse:collapse;"
                  "font-size:90%}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,"
                  "td:nth-child(2),th{text-align:left}.fail{color:#b00;font-weight:bold}</style></head><body>\n";
  h += "<h1>ulpgate bench</h1>\n";
  h += fmt::format("<p>{}; SM clock {} MHz before, {} MHz after. {} warm-up and {} timed runs per kernel; {}. TFLOP/s from "
                   "the median; each timed output checked against the exact reference.</p>\n",
                   report::escape_html(r.device), r.clock_before_mhz, r.clock_after_mhz, r.options.warmup, r.options.reps,
                   r.options.flush_l2 ? "device kernels timed by CUDA events with L2 evicted before each run" : "L2 not flushed");
  for (const std::string& svg : svgs) h += "<figure>" + svg + "</figure>\n";
  h += fmt::format("<table><tr><th>kernel</th><th>case</th><th>median ms</th><th>p10 - p90 ms</th><th>TFLOP/s</th>"
                   "<th>% of {}</th><th>check</th><th>max normalised</th><th>effective bits</th></tr>\n",
                   report::escape_html(r.baseline.empty() ? "baseline" : r.baseline));
  for (const BenchRow& row : r.rows) {
    if (row.status != "ok") {
      h += fmt::format("<tr><td>{}</td><td>{}</td><td colspan=\"7\">{}</td></tr>\n", report::escape_html(row.kernel),
                       report::escape_html(bench_case_text(row.c)), report::escape_html(row.status));
      continue;
    }
    const std::string check = !row.checked ? "not checked" : row.passed ? "pass" : "<span class=\"fail\">FAIL</span>: " + report::escape_html(row.verdict);
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.4g}</td><td>{:.4g} - {:.4g}</td><td>{:.4g}</td><td>{}</td><td>{}</td>"
                     "<td>{}</td><td>{}</td></tr>\n",
                     report::escape_html(row.kernel), report::escape_html(bench_case_text(row.c)), row.t.median_ms, row.t.p10_ms,
                     row.t.p90_ms, row.tflops, row.percent_of_baseline < 0 ? "" : fmt::format("{:.1f}", row.percent_of_baseline),
                     check, row.max_normalised < 0 ? "" : fmt::format("{:.3g}", row.max_normalised),
                     std::isfinite(row.effective_bits) ? fmt::format("{:.2f}", row.effective_bits) : "");
  }
  h += "</table>\n</body></html>\n";
  return h;
}

}  // namespace ulpgate
