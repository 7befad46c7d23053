// The run record: JSON round trip (a RapidCheck property over generated records, doubles
// bit for bit), the message of every malformed field, damaged files, atomic writes, and
// the captured environment.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "check/ops/op.hpp"
#include "core/error.hpp"
#include "campaign/record.hpp"
#include "tests/campaign/record_samples.hpp"

namespace ulpgate {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// --- Bitwise comparison (NaN equals NaN, -0 differs from +0) -----------------------------

bool same(double a, double b) { return std::isnan(a) ? std::isnan(b) : std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }
bool same(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}
bool same(const ErrorMetrics& a, const ErrorMetrics& b) {
  const auto& w = a.worst;
  const auto& v = b.worst;
  return a.output == b.output && a.format == b.format && a.elements == b.elements && a.compared == b.compared &&
         a.exact_matches == b.exact_matches && same(a.max_abs, b.max_abs) && same(a.mean_abs, b.mean_abs) &&
         same(a.max_rel, b.max_rel) && same(a.mean_rel, b.mean_rel) && same(a.normwise, b.normwise) &&
         same(a.max_normalised, b.max_normalised) && same(a.mean_normalised, b.mean_normalised) &&
         same(a.max_ulp, b.max_ulp) && same(a.mean_ulp, b.mean_ulp) && same(a.bias_ulp, b.bias_ulp) &&
         a.max_ulp_distance == b.max_ulp_distance && a.ulp_histogram == b.ulp_histogram &&
         a.expected_nonfinite == b.expected_nonfinite && a.unexpected_nan == b.unexpected_nan &&
         a.unexpected_inf == b.unexpected_inf && a.missed_nonfinite == b.missed_nonfinite &&
         a.mismatched_nonfinite == b.mismatched_nonfinite && a.unwritten == b.unwritten &&
         a.padding_written == b.padding_written && w.index == v.index && w.got == v.got && w.expected == v.expected &&
         w.exact == v.exact && same(w.condition, v.condition) && same(w.normalised, v.normalised) &&
         same(w.ulp, v.ulp) && a.map.rows == b.map.rows && a.map.cols == b.map.cols &&
         a.map.cell_rows == b.map.cell_rows && a.map.cell_cols == b.map.cell_cols &&
         a.map.grid_rows == b.map.grid_rows && a.map.grid_cols == b.map.grid_cols &&
         same(a.map.max_normalised, b.map.max_normalised);
}
bool same(const RunRecord& a, const RunRecord& b) {
  if (!(a.version == b.version && a.kind == b.kind && a.seed == b.seed && a.command == b.command &&
        a.environment == b.environment && a.tolerance.accumulator_bits == b.tolerance.accumulator_bits &&
        a.tolerance.input_bits == b.tolerance.input_bits && a.tolerance.probabilistic == b.tolerance.probabilistic &&
        same(a.tolerance.lambda, b.tolerance.lambda) && a.baseline.model == b.baseline.model &&
        same(a.baseline.factor, b.baseline.factor) && a.cases.size() == b.cases.size() &&
        a.sweeps.size() == b.sweeps.size() && a.campaign == b.campaign && a.not_run.size() == b.not_run.size()))
    return false;
  for (std::size_t i = 0; i < a.cases.size(); ++i) {
    const auto& c = a.cases[i];
    const auto& d = b.cases[i];
    if (!(c.kernel == d.kernel && c.spec == d.spec && c.family == d.family && c.status == d.status && c.id == d.id &&
          c.target == d.target && c.origin == d.origin && c.signature == d.signature && c.verdict.checks == d.verdict.checks &&
          c.message == d.message && c.notes == d.notes && c.metrics.size() == d.metrics.size() &&
          c.verdict.passed == d.verdict.passed && c.verdict.reasons == d.verdict.reasons &&
          c.reproducer == d.reproducer && same(c.seconds, d.seconds)))
      return false;
    for (std::size_t k = 0; k < c.metrics.size(); ++k)
      if (!same(c.metrics[k], d.metrics[k])) return false;
  }
  for (std::size_t i = 0; i < a.sweeps.size(); ++i) {
    const auto& s = a.sweeps[i];
    const auto& t = b.sweeps[i];
    if (!(s.kernel == t.kernel && s.format == t.format && s.dist == t.dist && s.parameter == t.parameter &&
          s.metric == t.metric && same(s.x, t.x) && same(s.y, t.y) && same(s.fit.exponent, t.fit.exponent) &&
          same(s.fit.exponent_stderr, t.fit.exponent_stderr) && same(s.fit.intercept, t.fit.intercept) &&
          s.fit.points == t.fit.points && same(s.effective_bits, t.effective_bits)))
      return false;
  }
  return true;
}

// --- Generators ------------------------------------------------------------------------------

// Any double, by bit pattern: NaN, infinities, -0 and subnormals included.
rc::Gen<double> any_double() {
  return rc::gen::oneOf(rc::gen::map(rc::gen::arbitrary<std::uint64_t>(), [](std::uint64_t b) { return std::bit_cast<double>(b); }),
                        rc::gen::element(0.0, -0.0, NAN, INFINITY, -INFINITY, 0x1p-1074, 1.0 / 3, 0.1));
}
rc::Gen<double> positive_finite() {
  return rc::gen::map(rc::gen::inRange<std::uint64_t>(1, 0x7ff0000000000000ull),
                      [](std::uint64_t b) { return std::bit_cast<double>(b); });
}

// Valid UTF-8 text, with quotes, backslashes, control characters and multi-byte characters.
rc::Gen<std::string> text() {
  return rc::gen::map(rc::gen::container<std::vector<std::uint32_t>>(rc::gen::oneOf(
                          rc::gen::inRange<std::uint32_t>(0, 0x80), rc::gen::element<std::uint32_t>('"', '\\', '\n', 0, 0x7f),
                          rc::gen::inRange<std::uint32_t>(0x80, 0xd800), rc::gen::inRange<std::uint32_t>(0xe000, 0x110000))),
                      [](const std::vector<std::uint32_t>& cps) {
                        std::string s;
                        for (std::uint32_t c : cps) {
                          if (c < 0x80) s += static_cast<char>(c);
                          else if (c < 0x800) s += {static_cast<char>(0xc0 | c >> 6), static_cast<char>(0x80 | (c & 0x3f))};
                          else if (c < 0x10000)
                            s += {static_cast<char>(0xe0 | c >> 12), static_cast<char>(0x80 | (c >> 6 & 0x3f)),
                                  static_cast<char>(0x80 | (c & 0x3f))};
                          else
                            s += {static_cast<char>(0xf0 | c >> 18), static_cast<char>(0x80 | (c >> 12 & 0x3f)),
                                  static_cast<char>(0x80 | (c >> 6 & 0x3f)), static_cast<char>(0x80 | (c & 0x3f))};
                        }
                        return s;
                      });
}

ErrorMetrics any_metrics() {
  ErrorMetrics m;
  m.output = *text();
  m.format = *rc::gen::element(Format::FP64, Format::FP32, Format::TF32, Format::FP16, Format::BF16, Format::E4M3,
                               Format::E5M2);
  m.elements = *rc::gen::inRange<std::int64_t>(0, INT64_MAX);
  m.compared = *rc::gen::inRange<std::int64_t>(0, m.elements + (m.elements < INT64_MAX));
  m.exact_matches = *rc::gen::inRange<std::int64_t>(0, m.compared + (m.compared < INT64_MAX));
  for (double* d : {&m.max_abs, &m.mean_abs, &m.max_rel, &m.mean_rel, &m.normwise, &m.max_normalised,
                    &m.mean_normalised, &m.max_ulp, &m.mean_ulp, &m.bias_ulp, &m.worst.condition,
                    &m.worst.normalised, &m.worst.ulp})
    *d = *any_double();
  m.max_ulp_distance = *rc::gen::arbitrary<std::uint64_t>();
  for (auto& n : m.ulp_histogram) n = *rc::gen::inRange<std::int64_t>(0, INT64_MAX);
  for (std::int64_t* n : {&m.expected_nonfinite, &m.unexpected_nan, &m.unexpected_inf, &m.missed_nonfinite,
                          &m.mismatched_nonfinite, &m.unwritten, &m.padding_written})
    *n = *rc::gen::inRange<std::int64_t>(0, 1 << 30);
  m.worst.index = *rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(0, 1 << 20));
  m.worst.got = *text(), m.worst.expected = *text(), m.worst.exact = *text();
  m.map.rows = *rc::gen::inRange<std::int64_t>(0, 1 << 20), m.map.cols = *rc::gen::inRange<std::int64_t>(0, 1 << 20);
  m.map.cell_rows = *rc::gen::inRange<std::int64_t>(1, 64), m.map.cell_cols = *rc::gen::inRange<std::int64_t>(1, 64);
  m.map.grid_rows = *rc::gen::inRange<std::int64_t>(0, 9), m.map.grid_cols = *rc::gen::inRange<std::int64_t>(0, 9);
  m.map.max_normalised = *rc::gen::container<std::vector<double>>(
      static_cast<std::size_t>(m.map.grid_rows * m.map.grid_cols), any_double());
  return m;
}

RunRecord any_record() {
  RunRecord r;
  r.kind = *text();
  r.seed = *rc::gen::arbitrary<std::uint64_t>();
  r.command = *text();
  auto& e = r.environment;
  for (std::string* s : {&e.ulpgate_version, &e.git_revision, &e.compiler, &e.host, &e.started_at, &e.device,
                         &e.driver, &e.cuda_runtime, &e.cublas})
    *s = *text();
  e.sm_clock_mhz = *rc::gen::inRange<std::int64_t>(0, INT64_MAX);
  r.tolerance.accumulator_bits = *rc::gen::inRange(1, 65);
  r.tolerance.input_bits = *rc::gen::inRange(0, 65);
  r.tolerance.probabilistic = *rc::gen::arbitrary<bool>();
  r.tolerance.lambda = *positive_finite();
  r.baseline.model = *text();
  r.baseline.factor = *positive_finite();
  const int cases = *rc::gen::inRange(0, 4);
  for (int i = 0; i < cases; ++i) {
    CaseResult c;
    c.kernel = *text();
    c.spec = *rc::gen::oneOf(op_module(Op::Gemm).generate("", nullptr, {}), op_module(Op::Attention).generate("", nullptr, {}));
    c.family = *text();
    c.status = *rc::gen::element(Disposition::Ok, Disposition::NotSupported, Disposition::Failed,
                                 Disposition::Crashed, Disposition::TimedOut);
    c.message = *text();
    const int notes = *rc::gen::inRange(0, 3);
    for (int k = 0; k < notes; ++k) c.notes[*text()] = *text();
    const int outputs = *rc::gen::inRange(0, 3);
    for (int k = 0; k < outputs; ++k) c.metrics.push_back(any_metrics());
    c.verdict.passed = *rc::gen::arbitrary<bool>();
    c.verdict.reasons = *rc::gen::container<std::vector<std::string>>(text());
    for (std::size_t k = 0; k < c.verdict.reasons.size(); ++k) c.verdict.checks.push_back(*text());
    c.id = *text(), c.target = *text(), c.origin = *text(), c.signature = *text();
    c.reproducer = *text();
    c.seconds = std::fabs(*positive_finite());
    r.cases.push_back(c);
  }
  r.campaign.kind = *text();
  r.campaign.seed = *rc::gen::arbitrary<std::uint64_t>();
  r.campaign.cases = *rc::gen::inRange<std::int64_t>(0, 1000);
  r.campaign.max_k = *rc::gen::inRange<std::int64_t>(0, 1 << 20);
  r.campaign.metamorphic = *rc::gen::arbitrary<bool>();
  r.campaign.gelu = *rc::gen::arbitrary<bool>();
  r.campaign.targets = *rc::gen::container<std::vector<std::string>>(text());
  const int plugins = *rc::gen::inRange(0, 3);
  for (int i = 0; i < plugins; ++i) r.campaign.plugins.push_back({*text(), *text()});
  r.campaign.ulpgate_version = *text(), r.campaign.tolerance = *text(), r.campaign.baseline_rule = *text();
  const int not_run = *rc::gen::inRange(0, 3);
  for (int i = 0; i < not_run; ++i)
    r.not_run.push_back({*text(), *rc::gen::inRange<std::int64_t>(0, 100), *rc::gen::inRange<std::int64_t>(0, 100), *text()});
  const int sweeps = *rc::gen::inRange(0, 3);
  for (int i = 0; i < sweeps; ++i) {
    SweepSeries s;
    s.kernel = *text(), s.format = *text(), s.dist = *text(), s.parameter = *text(), s.metric = *text();
    const auto n = *rc::gen::inRange<std::size_t>(0, 12);
    s.x = *rc::gen::container<std::vector<double>>(n, any_double());
    s.y = *rc::gen::container<std::vector<double>>(n, any_double());
    s.fit = {*any_double(), *any_double(), *any_double(), *rc::gen::inRange<std::int64_t>(0, static_cast<std::int64_t>(n) + 1)};
    s.effective_bits = *any_double();
    r.sweeps.push_back(s);
  }
  return r;
}

RC_GTEST_PROP(Record, RoundTripsExactlyThroughJsonText, ()) {
  const RunRecord r = any_record();
  const json j = to_json(r);
  const RunRecord back = record_from_json(json::parse(j.dump()));
  RC_ASSERT(same(r, back));
  RC_ASSERT(to_json(back) == j);  // the header's promise: to_json(record_from_json(j)) == j
}

// --- Files ----------------------------------------------------------------------------------------

class RecordFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("ulpgate-test-record-{}", ::getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& content) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
  std::string error_of(const std::string& path) const {
    try {
      read_record_file(path);
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  }
  fs::path dir_;
};

TEST_F(RecordFiles, WriteThenReadGivesTheSameRecordAndLeavesNoTemporaryFile) {
  RunRecord r = samples::record();
  r.cases[1].family = "gemm bf16->fp32 <&> \"\\ \x01";  // valid UTF-8: comes back unchanged
  const std::string p = (dir_ / "run.json").string();
  write_record_file(p, r);
  write_record_file(p, r);  // replaces the file in place
  EXPECT_TRUE(same(read_record_file(p), r));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(RecordFiles, InvalidUtf8IsWrittenAsReplacementCharacters) {
  RunRecord r = samples::record();
  r.cases[0].message = "bad \xff byte";
  const std::string p = (dir_ / "run.json").string();
  write_record_file(p, r);
  EXPECT_EQ(read_record_file(p).cases[0].message, "bad \xef\xbf\xbd byte");
}

TEST_F(RecordFiles, DamagedFilesAreInputErrorsNamingFileAndByte) {
  const std::string full = to_json(samples::record()).dump(1);
  const std::string truncated = file("truncated.json", full.substr(0, full.size() / 2));
  EXPECT_EQ(error_of(truncated).rfind(truncated + ": not valid JSON at byte " + std::to_string(full.size() / 2 + 1) + ": ", 0), 0u)
      << error_of(truncated);
  const std::string garbage = file("garbage.json", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16));
  EXPECT_EQ(error_of(garbage).rfind(garbage + ": not valid JSON at byte 1: ", 0), 0u) << error_of(garbage);
  const std::string empty = file("empty.json", "");
  EXPECT_EQ(error_of(empty).rfind(empty + ": not valid JSON at byte 1: ", 0), 0u) << error_of(empty);
  const std::string trailing = file("trailing.json", full + "}");
  EXPECT_EQ(error_of(trailing).rfind(trailing + ": not valid JSON at byte " + std::to_string(full.size() + 1), 0), 0u)
      << error_of(trailing);
  const std::string bad_utf8 = file("utf8.json", "{\"kind\": \"\xff\"}");
  EXPECT_EQ(error_of(bad_utf8).rfind(bad_utf8 + ": not valid JSON at byte 11: ", 0), 0u) << error_of(bad_utf8);
  // Deep nesting: the parser must not recurse itself to death.
  const std::string deep = file("deep.json", std::string(200000, '['));
  EXPECT_EQ(error_of(deep).rfind(deep + ": not valid JSON at byte 200001: ", 0), 0u) << error_of(deep);
  const std::string array = file("array.json", "[1, 2]");
  EXPECT_EQ(error_of(array), array + ": record: must be a JSON object, got [1,2]");
  EXPECT_EQ(error_of((dir_ / "missing.json").string()),
            (dir_ / "missing.json").string() + ": cannot open (No such file or directory)");
  EXPECT_EQ(error_of(dir_.string()), dir_.string() + ": is a directory, not a run record");
  for (const auto& e : {truncated, garbage, empty, trailing, bad_utf8, deep, array})
    EXPECT_EQ(error_of(e).find('\n'), std::string::npos) << "one line: " << error_of(e);
}

TEST_F(RecordFiles, UnknownVersionIsRefusedWithTheVersionFound) {
  json j = to_json(samples::record());
  j["ulpgate_record"] = 3;
  const std::string p = file("v3.json", j.dump());
  EXPECT_EQ(error_of(p), p + ": record.ulpgate_record: unsupported run record version 3 (this build reads 2)");
  j["ulpgate_record"] = "1";
  EXPECT_EQ(error_of(file("v1s.json", j.dump())),
            (dir_ / "v1s.json").string() + ": record.ulpgate_record: unsupported run record version \"1\" (this build reads 2)");
}

TEST_F(RecordFiles, WriteIntoAMissingFolderIsAnInputError) {
  const std::string p = (dir_ / "no" / "run.json").string();
  try {
    write_record_file(p, samples::record());
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), p + ": cannot write (No such file or directory)");
  }
}

// --- Every malformed field -------------------------------------------------------------------

struct Malformed {
  std::string what;
  std::function<void(json&)> damage;
  std::string message;
};

TEST(Record, EveryMalformedFieldIsNamedInTheMessage) {
  const json good = to_json(samples::record());
  const std::vector<Malformed> table = {
      {"not an object", [](json& j) { j = 3; }, "record: must be a JSON object, got 3"},
      {"no version", [](json& j) { j.erase("ulpgate_record"); }, "record.ulpgate_record: missing"},
      {"unknown field", [](json& j) { j["colour"] = "red"; }, "record.colour: unknown field"},
      {"kind", [](json& j) { j["kind"] = 1; }, "record.kind: must be a string, got 1"},
      {"seed", [](json& j) { j["seed"] = -1; }, "record.seed: must be an unsigned 64-bit integer, got -1"},
      {"seed float", [](json& j) { j["seed"] = 1.5; }, "record.seed: must be an unsigned 64-bit integer, got 1.5"},
      {"command", [](json& j) { j.erase("command"); }, "record.command: missing"},
      {"environment", [](json& j) { j["environment"] = json::array(); }, "record.environment: must be a JSON object, got []"},
      {"environment field", [](json& j) { j["environment"].erase("host"); }, "record.environment.host: missing"},
      {"clock", [](json& j) { j["environment"]["sm_clock_mhz"] = -5; }, "record.environment.sm_clock_mhz: must be >= 0, got -5"},
      {"accumulator bits", [](json& j) { j["tolerance"]["accumulator_bits"] = 0; },
       "record.tolerance.accumulator_bits: must be >= 1, got 0"},
      {"input bits", [](json& j) { j["tolerance"]["input_bits"] = 65; }, "record.tolerance.input_bits: must be <= 64, got 65"},
      {"probabilistic", [](json& j) { j["tolerance"]["probabilistic"] = "yes"; },
       "record.tolerance.probabilistic: must be true or false, got \"yes\""},
      {"lambda", [](json& j) { j["tolerance"]["lambda"] = "nan"; }, "record.tolerance.lambda: must be finite and > 0, got nan"},
      {"factor", [](json& j) { j["baseline"]["factor"] = 0; }, "record.baseline.factor: must be finite and > 0, got 0"},
      {"baseline model", [](json& j) { j["baseline"]["model"] = nullptr; }, "record.baseline.model: must be a string, got null"},
      {"cases", [](json& j) { j["cases"] = json::object(); }, "record.cases: must be an array, got {}"},
      {"status", [](json& j) { j["cases"][3]["status"] = "meh"; },
       "record.cases[3].status: unknown status 'meh' (one of ok, not_supported, failed, crashed, timed_out)"},
      {"status type", [](json& j) { j["cases"][0]["status"] = 0; },
       "record.cases[0].status: unknown status 0 (one of ok, not_supported, failed, crashed, timed_out)"},
      {"case field", [](json& j) { j["cases"][0]["case"]["gemm"]["lda"] = 3; },
       "record.cases[0].case.gemm.lda: must be 0 (packed) or >= 4096 for a row-major 16x4096 matrix, got 3"},
      {"case version", [](json& j) { j["cases"][1]["case"]["ulpgate_case"] = 7; },
       "record.cases[1].case.ulpgate_case: unsupported case version 7 (this build reads 1)"},
      {"no case", [](json& j) { j["cases"][2].erase("case"); }, "record.cases[2].case: missing"},
      {"notes", [](json& j) { j["cases"][5]["notes"]["algorithm"] = 3; },
       "record.cases[5].notes.algorithm: must be a string, got 3"},
      {"seconds", [](json& j) { j["cases"][0]["seconds"] = -1; }, "record.cases[0].seconds: must be >= 0, got -1"},
      {"seconds text", [](json& j) { j["cases"][0]["seconds"] = "soon"; },
       "record.cases[0].seconds: must be a number (or \"nan\", \"inf\", \"-inf\"), got \"soon\""},
      {"verdict", [](json& j) { j["cases"][1]["verdict"]["passed"] = 0; },
       "record.cases[1].verdict.passed: must be true or false, got 0"},
      {"reasons", [](json& j) { j["cases"][1]["verdict"]["reasons"][1] = false; },
       "record.cases[1].verdict.reasons[1]: must be a string, got false"},
      {"metrics", [](json& j) { j["cases"][0]["metrics"] = 1; }, "record.cases[0].metrics: must be an array, got 1"},
      {"format", [](json& j) { j["cases"][0]["metrics"][0]["format"] = "fp7"; },
       "record.cases[0].metrics[0].format: unknown format \"fp7\" (see `ulpgate list`)"},
      {"metric", [](json& j) { j["cases"][0]["metrics"][0]["max_ulp"] = true; },
       "record.cases[0].metrics[0].max_ulp: must be a number (or \"nan\", \"inf\", \"-inf\"), got true"},
      {"metric string", [](json& j) { j["cases"][0]["metrics"][0]["max_abs"] = "NaN"; },
       "record.cases[0].metrics[0].max_abs: must be a number (or \"nan\", \"inf\", \"-inf\"), got \"NaN\""},
      {"compared", [](json& j) { j["cases"][0]["metrics"][0]["compared"] = 2000; },
       "record.cases[0].metrics[0].compared: must be <= elements (1024), got 2000"},
      {"exact matches", [](json& j) { j["cases"][0]["metrics"][0]["exact_matches"] = 1021; },
       "record.cases[0].metrics[0].exact_matches: must be <= compared (1020), got 1021"},
      {"count", [](json& j) { j["cases"][0]["metrics"][0]["unexpected_nan"] = -2; },
       "record.cases[0].metrics[0].unexpected_nan: must be >= 0, got -2"},
      {"distance", [](json& j) { j["cases"][0]["metrics"][0]["max_ulp_distance"] = -1; },
       "record.cases[0].metrics[0].max_ulp_distance: must be an unsigned 64-bit integer, got -1"},
      {"histogram", [](json& j) { j["cases"][0]["metrics"][0]["ulp_histogram"].erase(0); },
       "record.cases[0].metrics[0].ulp_histogram: must have 33 bins, got 32"},
      {"histogram bin", [](json& j) { j["cases"][0]["metrics"][0]["ulp_histogram"][4] = -1; },
       "record.cases[0].metrics[0].ulp_histogram[4]: must be >= 0, got -1"},
      {"worst index", [](json& j) { j["cases"][1]["metrics"][0]["worst"]["index"][2] = "x"; },
       "record.cases[1].metrics[0].worst.index[2]: must be an integer, got \"x\""},
      {"worst got", [](json& j) { j["cases"][1]["metrics"][0]["worst"].erase("got"); },
       "record.cases[1].metrics[0].worst.got: missing"},
      {"map size", [](json& j) { j["cases"][0]["metrics"][0]["map"]["max_normalised"].erase(0); },
       "record.cases[0].metrics[0].map.max_normalised: must have grid_rows x grid_cols = 16 entries, got 15"},
      {"map cell", [](json& j) { j["cases"][0]["metrics"][0]["map"]["cell_rows"] = 0; },
       "record.cases[0].metrics[0].map.cell_rows: must be >= 1, got 0"},
      {"map grid", [](json& j) { j["cases"][0]["metrics"][0]["map"]["grid_rows"] = 5000; },
       "record.cases[0].metrics[0].map.grid_rows: must be <= 4096, got 5000"},
      {"map value", [](json& j) { j["cases"][0]["metrics"][0]["map"]["max_normalised"][3] = "big"; },
       "record.cases[0].metrics[0].map.max_normalised[3]: must be a number (or \"nan\", \"inf\", \"-inf\"), got \"big\""},
      {"metrics field", [](json& j) { j["cases"][0]["metrics"][0]["max_error"] = 1; },
       "record.cases[0].metrics[0].max_error: unknown field"},
      {"sweeps", [](json& j) { j.erase("sweeps"); }, "record.sweeps: missing"},
      {"sweep y", [](json& j) { j["sweeps"][1]["y"].erase(0); }, "record.sweeps[1].y: must have as many points as x (5), got 4"},
      {"sweep x", [](json& j) { j["sweeps"][0]["x"][2] = nullptr; },
       "record.sweeps[0].x[2]: must be a number (or \"nan\", \"inf\", \"-inf\"), got null"},
      {"fit points", [](json& j) { j["sweeps"][0]["fit"]["points"] = 6; },
       "record.sweeps[0].fit.points: must be <= the series' points (5), got 6"},
      {"fit", [](json& j) { j["sweeps"][2]["fit"].erase("exponent"); }, "record.sweeps[2].fit.exponent: missing"},
      {"shard index", [](json& j) { j["shard"] = {{"index", 3}, {"count", 3}}; },
       "record.shard: index 3 of 3 shards: must be below the count (at most 2^20)"},
      {"shard count past int", [](json& j) { j["shard"] = {{"index", 1}, {"count", 4294967298LL}}; },
       "record.shard: index 1 of 4294967298 shards: must be below the count (at most 2^20)"},
      {"shard index past int", [](json& j) { j["shard"] = {{"index", 4294967296LL}, {"count", 2}}; },
       "record.shard: index 4294967296 of 2 shards: must be below the count (at most 2^20)"},
      {"effective bits", [](json& j) { j["sweeps"][0]["effective_bits"] = "-" ; },
       "record.sweeps[0].effective_bits: must be a number (or \"nan\", \"inf\", \"-inf\"), got \"-\""},
  };
  for (const auto& m : table) {
    json j = good;
    m.damage(j);
    try {
      record_from_json(j);
      ADD_FAILURE() << m.what << ": accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), m.message) << m.what;
    }
  }
  EXPECT_NO_THROW(record_from_json(good));
}

TEST(Record, NonFiniteDoublesAreStrings) {
  RunRecord r = samples::record();
  r.cases[0].metrics[0].max_abs = -INFINITY;
  r.cases[0].metrics[0].max_rel = INFINITY;
  const json j = to_json(r);
  const json& m = j["cases"][0]["metrics"][0];
  EXPECT_EQ(m["max_abs"], "-inf");
  EXPECT_EQ(m["max_rel"], "inf");
  EXPECT_EQ(j["cases"][1]["metrics"][0]["map"]["max_normalised"][5], "nan");
  EXPECT_EQ(j["ulpgate_record"], kRecordSchemaVersion);
  EXPECT_TRUE(same(record_from_json(j), r));
}

TEST(Record, CaptureEnvironmentNamesThisBuildAndTime) {
  const std::time_t before = std::time(nullptr);
  const Environment e = capture_environment();
  EXPECT_EQ(e.ulpgate_version, ULPGATE_TEST_VERSION);
  // The revision of the build: HEAD's when the tree is committed (read at build time, so a
  // commit made after configuring shows), with "-dirty" when tracked files differed.
  std::string head;
  if (FILE* p = popen("git -C " ULPGATE_SOURCE_DIR " rev-parse --short=12 HEAD 2>/dev/null", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, p)) head = buf;
    pclose(p);
  }
  while (!head.empty() && (head.back() == '\n' || head.back() == '\r')) head.pop_back();
  if (head.empty()) EXPECT_EQ(e.git_revision, "unknown");
  else EXPECT_EQ(e.git_revision.substr(0, 12), head) << "a revision from an earlier build";
  EXPECT_TRUE(e.compiler.rfind("g++ ", 0) == 0 || e.compiler.rfind("clang ", 0) == 0) << e.compiler;
  EXPECT_FALSE(e.host.empty());
  EXPECT_FALSE(e.device.empty());
  ASSERT_TRUE(std::regex_match(e.started_at, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"))) << e.started_at;
  std::tm tm{};
  ASSERT_NE(::strptime(e.started_at.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm), nullptr);
  const std::time_t t = ::timegm(&tm);
  EXPECT_GE(t, before - 1);
  EXPECT_LE(t, std::time(nullptr) + 1);
  EXPECT_GE(e.sm_clock_mhz, 0);
}

}  // namespace
}  // namespace ulpgate
