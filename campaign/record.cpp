#include "campaign/record.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <algorithm>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "kernels/device.hpp"
#include "core/hash.hpp"

#ifndef ULPGATE_VERSION
#define ULPGATE_VERSION "unknown"
#endif

namespace ulpgate {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& msg) { throw InputError(path + ": " + msg); }

// A JSON value shortened for a one-line message.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// Doubles: finite values are JSON numbers (nlohmann writes the shortest decimal that reads
// back to the same double, -0.0 included); NaN and the infinities, which JSON lacks, are
// the strings "nan", "inf" and "-inf".
json encode_double(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

double decode_double(const json& v, const std::string& path) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "nan") return NAN;
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
  }
  fail(path, "must be a number (or \"nan\", \"inf\", \"-inf\"), got " + shown(v));
}

json encode_doubles(const std::vector<double>& xs) {
  json a = json::array();
  for (double x : xs) a.push_back(encode_double(x));
  return a;
}

// Reads one JSON object field by field, so that every message names the field's path and
// fields nobody asked for are reported as unknown (a typo must not pass silently).
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail(path_, "must be a JSON object, got " + shown(j_));
  }
  std::string path(std::string_view key) const { return path_ + "." + std::string(key); }
  const json& need(std::string_view key) {
    seen_.insert(std::string(key));
    auto it = j_.find(std::string(key));
    if (it == j_.end()) fail(path(key), "missing");
    return *it;
  }
  bool has(std::string_view key) const { return j_.contains(std::string(key)); }
  std::string string(std::string_view key) {
    const json& v = need(key);
    if (!v.is_string()) fail(path(key), "must be a string, got " + shown(v));
    return v.get<std::string>();
  }
  std::int64_t integer(std::string_view key, std::int64_t min_value = INT64_MIN) {
    const json& v = need(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX))
      fail(path(key), "must be an integer, got " + shown(v));
    const auto x = v.get<std::int64_t>();
    if (x < min_value) fail(path(key), fmt::format("must be >= {}, got {}", min_value, x));
    return x;
  }
  std::uint64_t unsigned_integer(std::string_view key) {
    const json& v = need(key);
    if (!(v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0)))
      fail(path(key), "must be an unsigned 64-bit integer, got " + shown(v));
    return v.get<std::uint64_t>();
  }
  bool boolean(std::string_view key) {
    const json& v = need(key);
    if (!v.is_boolean()) fail(path(key), "must be true or false, got " + shown(v));
    return v.get<bool>();
  }
  double number(std::string_view key) { return decode_double(need(key), path(key)); }
  /// An array field; each element is handed to `element` with its path ("x.y[3]").
  template <class F>
  void array(std::string_view key, F&& element) {
    const json& v = need(key);
    if (!v.is_array()) fail(path(key), "must be an array, got " + shown(v));
    for (std::size_t i = 0; i < v.size(); ++i) element(v[i], fmt::format("{}[{}]", path(key), i));
  }
  std::vector<double> numbers(std::string_view key) {
    std::vector<double> out;
    array(key, [&](const json& e, const std::string& p) { out.push_back(decode_double(e, p)); });
    return out;
  }
  std::vector<std::int64_t> integers(std::string_view key, std::int64_t min_value) {
    std::vector<std::int64_t> out;
    array(key, [&](const json& e, const std::string& p) {
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<std::uint64_t>() > INT64_MAX))
        fail(p, "must be an integer, got " + shown(e));
      const auto x = e.get<std::int64_t>();
      if (x < min_value) fail(p, fmt::format("must be >= {}, got {}", min_value, x));
      out.push_back(x);
    });
    return out;
  }
  std::vector<std::string> strings(std::string_view key) {
    std::vector<std::string> out;
    array(key, [&](const json& e, const std::string& p) {
      if (!e.is_string()) fail(p, "must be a string, got " + shown(e));
      out.push_back(e.get<std::string>());
    });
    return out;
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) fail(path(it.key()), "unknown field");
  }

 private:
  const json& j_;
  std::string path_;
  std::set<std::string> seen_;
};

constexpr Disposition kDispositions[] = {Disposition::Ok, Disposition::NotSupported, Disposition::Failed,
                                         Disposition::Crashed, Disposition::TimedOut};

Disposition parse_disposition(const json& v, const std::string& path) {
  if (v.is_string())
    for (Disposition d : kDispositions)
      if (name(d) == v.get_ref<const std::string&>()) return d;
  std::string choices;
  for (Disposition d : kDispositions) choices += (choices.empty() ? "" : ", ") + std::string(name(d));
  const std::string got = v.is_string() ? "'" + v.get<std::string>() + "'" : shown(v);
  fail(path, fmt::format("unknown status {} (one of {})", got, choices));
}

Format parse_format_field(const json& v, const std::string& path) {
  const auto f = v.is_string() ? parse_format(v.get<std::string>()) : std::nullopt;
  if (!f) fail(path, "unknown format " + shown(v) + " (see `ulpgate list`)");
  return *f;
}

// --- Environment, tolerance, baseline --------------------------------------------------

json env_to_json(const Environment& e) {
  return {{"ulpgate_version", e.ulpgate_version},
          {"git_revision", e.git_revision},
          {"compiler", e.compiler},
          {"host", e.host},
          {"started_at", e.started_at},
          {"device", e.device},
          {"driver", e.driver},
          {"cuda_runtime", e.cuda_runtime},
          {"cublas", e.cublas},
          {"sm_clock_mhz", e.sm_clock_mhz}};
}

Environment env_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  Environment e;
  e.ulpgate_version = r.string("ulpgate_version");
  e.git_revision = r.string("git_revision");
  e.compiler = r.string("compiler");
  e.host = r.string("host");
  e.started_at = r.string("started_at");
  e.device = r.string("device");
  e.driver = r.string("driver");
  e.cuda_runtime = r.string("cuda_runtime");
  e.cublas = r.string("cublas");
  e.sm_clock_mhz = r.integer("sm_clock_mhz", 0);
  r.finish();
  return e;
}

}  // namespace

json tolerance_to_json(const ToleranceModel& t) {
  return {{"accumulator_bits", t.accumulator_bits},
          {"promote", t.promote},
          {"input_bits", t.input_bits},
          {"p_bits", t.p_bits},
          {"accumulator_eta", encode_double(t.accumulator_eta)},
          {"activation_error", encode_double(t.activation_error)},
          {"epilogue_rounding", encode_double(t.epilogue_rounding)},
          {"nearest", t.nearest},
          {"input_rounding", name(t.input_rounding)},
          {"rule", t.rule},
          {"probabilistic", t.probabilistic},
          {"lambda", encode_double(t.lambda)}};
}

ToleranceModel tolerance_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  ToleranceModel t;
  // Precision in bits including the implicit one: FP64's 53 is the most any model has.
  const auto bits = [&](std::string_view key, std::int64_t lo) {
    const std::int64_t b = r.integer(key, lo);
    if (b > 64) fail(r.path(key), fmt::format("must be <= 64, got {}", b));
    return static_cast<int>(b);
  };
  t.accumulator_bits = bits("accumulator_bits", 1);
  t.input_bits = bits("input_bits", 0);
  if (r.has("p_bits")) t.p_bits = bits("p_bits", 0);  // absent before attention
  if (r.has("promote")) t.promote = static_cast<int>(r.integer("promote", 0));  // absent before the probe models
  t.accumulator_eta = r.number("accumulator_eta");
  if (!(std::isfinite(t.accumulator_eta) && t.accumulator_eta >= 0))
    fail(r.path("accumulator_eta"), fmt::format("must be finite and >= 0, got {}", t.accumulator_eta));
  if (r.has("nearest")) t.nearest = r.boolean("nearest");  // absent before the precision rule
  if (r.has("input_rounding")) {  // absent before the bias test
    const std::string text = r.string("input_rounding");
    const auto rounding = parse_rounding(text);
    if (!rounding) fail(r.path("input_rounding"), fmt::format("must be rne, rna, rz, ru or rd, got '{}'", text));
    t.input_rounding = *rounding;
  }
  if (r.has("rule")) t.rule = r.string("rule");
  if (r.has("epilogue_rounding")) {  // absent before the admitted epilogue rounding
    t.epilogue_rounding = r.number("epilogue_rounding");
    if (!(std::isfinite(t.epilogue_rounding) && t.epilogue_rounding >= 0 && t.epilogue_rounding < 1))
      fail(r.path("epilogue_rounding"), fmt::format("must be in [0, 1), got {}", t.epilogue_rounding));
  }
  if (r.has("activation_error")) {  // absent before declared GELU evaluation errors
    t.activation_error = r.number("activation_error");
    if (!(std::isfinite(t.activation_error) && t.activation_error >= 0 && t.activation_error < 1))
      fail(r.path("activation_error"), fmt::format("must be in [0, 1), got {}", t.activation_error));
  }
  t.probabilistic = r.boolean("probabilistic");
  t.lambda = r.number("lambda");
  if (!(std::isfinite(t.lambda) && t.lambda > 0))
    fail(r.path("lambda"), fmt::format("must be finite and > 0, got {}", t.lambda));
  r.finish();
  return t;
}

json baseline_to_json(const BaselineRule& b) { return {{"model", b.model}, {"factor", encode_double(b.factor)}}; }

BaselineRule baseline_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  BaselineRule b;
  b.model = r.string("model");
  b.factor = r.number("factor");
  if (!(std::isfinite(b.factor) && b.factor > 0))
    fail(r.path("factor"), fmt::format("must be finite and > 0, got {}", b.factor));
  r.finish();
  return b;
}

namespace {

// --- Metrics -----------------------------------------------------------------------------

json worst_to_json(const WorstElement& w) {
  return {{"index", w.index},
          {"got", w.got},
          {"expected", w.expected},
          {"exact", w.exact},
          {"condition", encode_double(w.condition)},
          {"normalised", encode_double(w.normalised)},
          {"ulp", encode_double(w.ulp)}};
}

WorstElement worst_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  WorstElement w;
  w.index = r.integers("index", 0);
  w.got = r.string("got");
  w.expected = r.string("expected");
  w.exact = r.string("exact");
  w.condition = r.number("condition");
  w.normalised = r.number("normalised");
  w.ulp = r.number("ulp");
  r.finish();
  return w;
}

json map_to_json(const ErrorMap& m) {
  return {{"rows", m.rows},           {"cols", m.cols},           {"cell_rows", m.cell_rows},
          {"cell_cols", m.cell_cols}, {"grid_rows", m.grid_rows}, {"grid_cols", m.grid_cols},
          {"max_normalised", encode_doubles(m.max_normalised)}};
}

ErrorMap map_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  ErrorMap m;
  m.rows = r.integer("rows", 0);
  m.cols = r.integer("cols", 0);
  m.cell_rows = r.integer("cell_rows", 1);
  m.cell_cols = r.integer("cell_cols", 1);
  m.grid_rows = r.integer("grid_rows", 0);
  m.grid_cols = r.integer("grid_cols", 0);
  // analyze.hpp bounds the grid at 64 x 64 cells; the bound also keeps the product below
  // overflow before the size check.
  for (auto [key, v] : {std::pair{"grid_rows", m.grid_rows}, {"grid_cols", m.grid_cols}})
    if (v > 4096) fail(r.path(key), fmt::format("must be <= 4096, got {}", v));
  m.max_normalised = r.numbers("max_normalised");
  if (static_cast<std::int64_t>(m.max_normalised.size()) != m.grid_rows * m.grid_cols)
    fail(r.path("max_normalised"), fmt::format("must have grid_rows x grid_cols = {} entries, got {}",
                                               m.grid_rows * m.grid_cols, m.max_normalised.size()));
  r.finish();
  return m;
}

json metrics_to_json(const ErrorMetrics& m) {
  return {{"output", m.output},
          {"format", name(m.format)},
          {"elements", m.elements},
          {"compared", m.compared},
          {"exact_matches", m.exact_matches},
          {"max_abs", encode_double(m.max_abs)},
          {"mean_abs", encode_double(m.mean_abs)},
          {"max_rel", encode_double(m.max_rel)},
          {"mean_rel", encode_double(m.mean_rel)},
          {"normwise", encode_double(m.normwise)},
          {"max_normalised", encode_double(m.max_normalised)},
          {"mean_normalised", encode_double(m.mean_normalised)},
          {"max_ulp", encode_double(m.max_ulp)},
          {"mean_ulp", encode_double(m.mean_ulp)},
          {"bias_ulp", encode_double(m.bias_ulp)},
          {"ulp_fair", m.ulp_fair},
          {"bias", encode_double(m.bias)},
          {"bias_toward_zero", encode_double(m.bias_toward_zero)},
          {"bias_allowed", encode_double(m.bias_allowed)},
          {"max_ulp_distance", m.max_ulp_distance},
          {"ulp_histogram", m.ulp_histogram},
          {"expected_nonfinite", m.expected_nonfinite},
          {"unexpected_nan", m.unexpected_nan},
          {"unexpected_inf", m.unexpected_inf},
          {"missed_nonfinite", m.missed_nonfinite},
          {"mismatched_nonfinite", m.mismatched_nonfinite},
          {"overflowed", m.overflowed},
          {"unwritten", m.unwritten},
          {"padding_written", m.padding_written},
          {"worst", worst_to_json(m.worst)},
          {"map", map_to_json(m.map)}};
}

ErrorMetrics metrics_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  ErrorMetrics m;
  m.output = r.string("output");
  m.format = parse_format_field(r.need("format"), r.path("format"));
  m.elements = r.integer("elements", 0);
  m.compared = r.integer("compared", 0);
  m.exact_matches = r.integer("exact_matches", 0);
  if (m.compared > m.elements)
    fail(r.path("compared"), fmt::format("must be <= elements ({}), got {}", m.elements, m.compared));
  if (m.exact_matches > m.compared)
    fail(r.path("exact_matches"), fmt::format("must be <= compared ({}), got {}", m.compared, m.exact_matches));
  m.max_abs = r.number("max_abs");
  m.mean_abs = r.number("mean_abs");
  m.max_rel = r.number("max_rel");
  m.mean_rel = r.number("mean_rel");
  m.normwise = r.number("normwise");
  m.max_normalised = r.number("max_normalised");
  m.mean_normalised = r.number("mean_normalised");
  m.max_ulp = r.number("max_ulp");
  m.mean_ulp = r.number("mean_ulp");
  m.bias_ulp = r.number("bias_ulp");
  if (r.has("ulp_fair")) m.ulp_fair = r.integer("ulp_fair", 0);  // absent before the ULP-fair rule: every compared element
  else m.ulp_fair = m.compared;
  if (r.has("bias")) {  // absent before the bias test
    m.bias = r.number("bias");
    m.bias_toward_zero = r.number("bias_toward_zero");
    m.bias_allowed = r.number("bias_allowed");
  }
  m.max_ulp_distance = r.unsigned_integer("max_ulp_distance");
  m.ulp_histogram = r.integers("ulp_histogram", 0);
  if (m.ulp_histogram.size() != static_cast<std::size_t>(kUlpHistogramBins))
    fail(r.path("ulp_histogram"),
         fmt::format("must have {} bins, got {}", kUlpHistogramBins, m.ulp_histogram.size()));
  m.expected_nonfinite = r.integer("expected_nonfinite", 0);
  m.unexpected_nan = r.integer("unexpected_nan", 0);
  m.unexpected_inf = r.integer("unexpected_inf", 0);
  m.missed_nonfinite = r.integer("missed_nonfinite", 0);
  m.mismatched_nonfinite = r.integer("mismatched_nonfinite", 0);
  m.overflowed = r.integer("overflowed", 0);
  m.unwritten = r.integer("unwritten", 0);
  m.padding_written = r.integer("padding_written", 0);
  m.worst = worst_from_json(r.need("worst"), r.path("worst"));
  m.map = map_from_json(r.need("map"), r.path("map"));
  r.finish();
  return m;
}

json verdict_to_json(const Verdict& v) { return {{"passed", v.passed}, {"reasons", v.reasons}, {"checks", v.checks}}; }

Verdict verdict_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  Verdict v;
  v.passed = r.boolean("passed");
  v.reasons = r.strings("reasons");
  v.checks = r.strings("checks");
  if (v.checks.size() != v.reasons.size())
    fail(r.path("checks"), fmt::format("must have one entry per reason ({}), got {}", v.reasons.size(), v.checks.size()));
  r.finish();
  return v;
}

// --- Cases and sweeps --------------------------------------------------------------------

}  // namespace

json case_result_to_json(const CaseResult& c) {
  return {{"kernel", c.kernel},
          {"case", to_json(c.spec)},
          {"id", c.id},
          {"family", c.family},
          {"target", c.target},
          {"origin", c.origin},
          {"signature", c.signature},
          {"status", name(c.status)},
          {"message", c.message},
          {"notes", c.notes},
          {"metrics", [&] {
             json a = json::array();
             for (const auto& m : c.metrics) a.push_back(metrics_to_json(m));
             return a;
           }()},
          {"verdict", verdict_to_json(c.verdict)},
          {"reproducer", c.reproducer},
          {"seconds", encode_double(c.seconds)}};
}

CaseResult case_result_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  CaseResult c;
  c.kernel = r.string("kernel");
  {
    // case_from_json names fields from "case"; inside a record they live at path.case.
    const std::string case_path = r.path("case");
    const json& spec = r.need("case");
    try {
      c.spec = case_from_json(spec);
    } catch (const InputError& e) {
      const std::string what = e.what();
      throw InputError(what.rfind("case", 0) == 0 ? case_path + what.substr(4) : case_path + ": " + what);
    }
  }
  c.id = r.string("id");
  c.family = r.string("family");
  c.target = r.string("target");
  c.origin = r.string("origin");
  c.signature = r.string("signature");
  c.status = parse_disposition(r.need("status"), r.path("status"));
  c.message = r.string("message");
  {
    const json& notes = r.need("notes");
    if (!notes.is_object()) fail(r.path("notes"), "must be a JSON object of strings, got " + shown(notes));
    for (const auto& [k, v] : notes.items()) {
      if (!v.is_string()) fail(r.path("notes") + "." + k, "must be a string, got " + shown(v));
      c.notes[k] = v.get<std::string>();
    }
  }
  r.array("metrics", [&](const json& e, const std::string& p) { c.metrics.push_back(metrics_from_json(e, p)); });
  c.verdict = verdict_from_json(r.need("verdict"), r.path("verdict"));
  c.reproducer = r.string("reproducer");
  c.seconds = r.number("seconds");
  if (!(c.seconds >= 0)) fail(r.path("seconds"), fmt::format("must be >= 0, got {}", c.seconds));
  r.finish();
  return c;
}

namespace {

json fit_to_json(const PowerFit& f) {
  return {{"exponent", encode_double(f.exponent)},
          {"exponent_stderr", encode_double(f.exponent_stderr)},
          {"intercept", encode_double(f.intercept)},
          {"points", f.points}};
}

PowerFit fit_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  PowerFit f;
  f.exponent = r.number("exponent");
  f.exponent_stderr = r.number("exponent_stderr");
  f.intercept = r.number("intercept");
  f.points = r.integer("points", 0);
  r.finish();
  return f;
}

json sweep_to_json(const SweepSeries& s) {
  return {{"kernel", s.kernel},       {"format", s.format},           {"dist", s.dist},
          {"parameter", s.parameter}, {"metric", s.metric},           {"x", encode_doubles(s.x)},
          {"y", encode_doubles(s.y)}, {"fit", fit_to_json(s.fit)},    {"effective_bits", encode_double(s.effective_bits)}};
}

SweepSeries sweep_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  SweepSeries s;
  s.kernel = r.string("kernel");
  s.format = r.string("format");
  s.dist = r.string("dist");
  s.parameter = r.string("parameter");
  s.metric = r.string("metric");
  s.x = r.numbers("x");
  s.y = r.numbers("y");
  if (s.x.size() != s.y.size())
    fail(r.path("y"), fmt::format("must have as many points as x ({}), got {}", s.x.size(), s.y.size()));
  s.fit = fit_from_json(r.need("fit"), r.path("fit"));
  if (s.fit.points > static_cast<std::int64_t>(s.x.size()))
    fail(r.path("fit.points"), fmt::format("must be <= the series' points ({}), got {}", s.x.size(), s.fit.points));
  s.effective_bits = r.number("effective_bits");
  r.finish();
  return s;
}

}  // namespace

std::string_view name(SizeSchedule s) {
  switch (s) {
    case SizeSchedule::Small: return "small";
    case SizeSchedule::Realistic: return "realistic";
    case SizeSchedule::Large: return "large";
  }
  return "?";
}

std::optional<SizeSchedule> parse_size_schedule(std::string_view s) {
  for (SizeSchedule x : {SizeSchedule::Small, SizeSchedule::Realistic, SizeSchedule::Large})
    if (name(x) == s) return x;
  return std::nullopt;
}

json campaign_to_json(const CampaignDefinition& c) {
  json plugins = json::array();
  for (const auto& p : c.plugins) plugins.push_back({{"name", p.name}, {"hash", p.hash}});
  return {{"kind", c.kind},       {"seed", c.seed},
          {"cases", c.cases},     {"max_k", c.max_k}, {"sizes", name(c.sizes)},
          {"metamorphic", c.metamorphic}, {"gelu", c.gelu},
          {"targets", c.targets}, {"plugins", plugins},
          {"ulpgate_version", c.ulpgate_version}, {"tolerance", c.tolerance},
          {"baseline_rule", c.baseline_rule}, {"forward_kernel", c.forward_kernel}};
}

CampaignDefinition campaign_from_json(const json& j, const std::string& path) {
  Reader r(j, path);
  CampaignDefinition c;
  c.kind = r.string("kind");
  c.seed = r.unsigned_integer("seed");
  c.cases = r.integer("cases", 0);
  c.max_k = r.integer("max_k", 0);
  // Written since the size schedule exists; earlier campaigns drew the small regime only.
  if (r.has("sizes")) {
    const std::string s = r.string("sizes");
    const auto schedule = parse_size_schedule(s);
    if (!schedule) fail(r.path("sizes"), fmt::format("must be small, realistic or large, got '{}'", s));
    c.sizes = *schedule;
  }
  c.metamorphic = r.boolean("metamorphic");
  c.gelu = r.boolean("gelu");
  c.targets = r.strings("targets");
  r.array("plugins", [&](const json& e, const std::string& p) {
    Reader pr(e, p);
    PluginIdentity id{pr.string("name"), pr.string("hash")};
    pr.finish();
    c.plugins.push_back(std::move(id));
  });
  c.ulpgate_version = r.string("ulpgate_version");
  c.tolerance = r.string("tolerance");
  c.baseline_rule = r.string("baseline_rule");
  if (r.has("forward_kernel")) c.forward_kernel = r.string("forward_kernel");  // absent in earlier records: ""
  r.finish();
  return c;
}

json to_json(const RunRecord& r) {
  json cases = json::array(), sweeps = json::array(), not_run = json::array();
  for (const auto& c : r.cases) cases.push_back(case_result_to_json(c));
  for (const auto& s : r.sweeps) sweeps.push_back(sweep_to_json(s));
  for (const auto& n : r.not_run)
    not_run.push_back({{"target", n.target}, {"planned", n.planned}, {"run", n.run}, {"reason", n.reason}});
  json j = {{"ulpgate_record", r.version},
            {"kind", r.kind},
            {"seed", r.seed},
            {"command", r.command},
            {"campaign", campaign_to_json(r.campaign)},
            {"not_run", std::move(not_run)},
            {"environment", env_to_json(r.environment)},
            {"tolerance", tolerance_to_json(r.tolerance)},
            {"baseline", baseline_to_json(r.baseline)},
            {"cases", std::move(cases)},
            {"sweeps", std::move(sweeps)}};
  if (r.shard_count > 1) j["shard"] = {{"index", r.shard_index}, {"count", r.shard_count}};
  return j;
}

RunRecord record_from_json(const json& j) {
  Reader r(j, "record");
  RunRecord rec;
  const json& version = r.need("ulpgate_record");
  if (!version.is_number_integer() || version.get<std::int64_t>() != kRecordSchemaVersion)
    fail("record.ulpgate_record", fmt::format("unsupported run record version {} (this build reads {})",
                                              shown(version), kRecordSchemaVersion));
  rec.version = kRecordSchemaVersion;
  rec.kind = r.string("kind");
  rec.seed = r.unsigned_integer("seed");
  rec.command = r.string("command");
  rec.campaign = campaign_from_json(r.need("campaign"), "record.campaign");
  r.array("not_run", [&](const json& e, const std::string& p) {
    Reader nr(e, p);
    NotRun n;
    n.target = nr.string("target");
    n.planned = nr.integer("planned", 0);
    n.run = nr.integer("run", 0);
    n.reason = nr.string("reason");
    nr.finish();
    rec.not_run.push_back(std::move(n));
  });
  if (r.has("shard")) {
    Reader sr(r.need("shard"), "record.shard");
    const std::int64_t count = sr.integer("count", 1), index = sr.integer("index", 0);
    sr.finish();
    if (count > 1 << 20 || index >= count)  // checked before narrowing to int
      fail("record.shard", fmt::format("index {} of {} shards: must be below the count (at most 2^20)", index, count));
    rec.shard_count = static_cast<int>(count), rec.shard_index = static_cast<int>(index);
  }
  rec.environment = env_from_json(r.need("environment"), "record.environment");
  rec.tolerance = tolerance_from_json(r.need("tolerance"), "record.tolerance");
  rec.baseline = baseline_from_json(r.need("baseline"), "record.baseline");
  r.array("cases", [&](const json& e, const std::string& p) { rec.cases.push_back(case_result_from_json(e, p)); });
  r.array("sweeps", [&](const json& e, const std::string& p) { rec.sweeps.push_back(sweep_from_json(e, p)); });
  r.finish();
  return rec;
}

RunRecord read_record_file(const std::string& path) { return read_json_file_as(path, record_from_json, "run record"); }

void write_record_file(const std::string& path, const RunRecord& r) {
  // Strings from kernels and plugins are not guaranteed UTF-8; invalid bytes become U+FFFD
  // rather than making the whole record unwritable.
  write_text_file_atomically(path, to_json(r).dump(1, ' ', false, json::error_handler_t::replace) + "\n");
}


PluginIdentity plugin_identity(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw InputError(fmt::format("--plugin {}: cannot read the file", path));
  std::uint64_t h = kFnv1aOffset;
  char buf[1 << 16];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) h = fnv1a64(std::string_view(buf, n), h);
  std::fclose(f);
  const std::size_t slash = path.find_last_of('/');
  return {slash == std::string::npos ? path : path.substr(slash + 1), fmt::format("fnv1a64:{:016x}", h)};
}

std::vector<std::string> campaign_differences(const CampaignDefinition& a, const CampaignDefinition& b,
                                              const std::string& an, const std::string& bn) {
  std::vector<std::string> d;
  const auto differ = [&](const char* field, const std::string& x, const std::string& y) {
    if (x != y) d.push_back(fmt::format("{}: {} in {}, {} in {}", field, x.empty() ? "none" : x, an, y.empty() ? "none" : y, bn));
  };
  const auto list = [](const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, ", ")); };
  differ("kind", a.kind, b.kind);
  differ("seed", std::to_string(a.seed), std::to_string(b.seed));
  differ("cases per target", std::to_string(a.cases), std::to_string(b.cases));
  differ("max-k", std::to_string(a.max_k), std::to_string(b.max_k));
  differ("sizes", std::string(name(a.sizes)), std::string(name(b.sizes)));
  differ("metamorphic relations", a.metamorphic ? "on" : "off", b.metamorphic ? "on" : "off");
  differ("GELU epilogues", a.gelu ? "on" : "off", b.gelu ? "on" : "off");
  if (a.targets != b.targets) {
    std::vector<std::string> only_a, only_b;
    for (const auto& t : a.targets)
      if (std::find(b.targets.begin(), b.targets.end(), t) == b.targets.end()) only_a.push_back(t);
    for (const auto& t : b.targets)
      if (std::find(a.targets.begin(), a.targets.end(), t) == a.targets.end()) only_b.push_back(t);
    if (only_a.empty() && only_b.empty())
      d.push_back("targets: the same, in another order");
    else
      d.push_back(fmt::format("targets: {} only in {}; {} only in {}", only_a.empty() ? "none" : list(only_a), an,
                              only_b.empty() ? "none" : list(only_b), bn));
  }
  const auto plugins = [&](const std::vector<PluginIdentity>& ps) {
    std::vector<std::string> v;
    for (const auto& p : ps) v.push_back(p.name + " (" + p.hash + ")");
    return list(v);
  };
  differ("plugins", plugins(a.plugins), plugins(b.plugins));
  differ("ulpgate version", a.ulpgate_version, b.ulpgate_version);
  differ("tolerance", a.tolerance, b.tolerance);
  differ("baseline rule", a.baseline_rule, b.baseline_rule);
  differ("forward kernel", a.forward_kernel, b.forward_kernel);
  return d;
}

Environment capture_environment() {
  Environment e;
  e.ulpgate_version = ULPGATE_VERSION;
  e.git_revision = git_revision();
#if defined(__clang__)
  e.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  e.compiler = "g++ " __VERSION__;
#else
  e.compiler = "unknown";
#endif
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) e.host = host;
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
  e.started_at = when;
  const DeviceInfo d = device_info();
  e.device = d.description;
  e.driver = d.driver;
  e.cuda_runtime = d.cuda_runtime;
  e.cublas = d.cublas;
  e.sm_clock_mhz = d.sm_clock_mhz;
  return e;
}

}  // namespace ulpgate
