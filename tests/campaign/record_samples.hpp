// A hand-built run record with one of everything a renderer must show: passed, failed,
// not supported, crashed and timed-out cases, GEMM and attention, NaN in metrics and maps,
// text that needs escaping, and two sweep plot groups.
#pragma once

#include <cmath>
#include <string>

#include "campaign/record.hpp"

namespace ulpgate::samples {

/// Text with every character that HTML, XML and Markdown treat specially (valid UTF-8,
/// with a control character that XML cannot carry).
inline const std::string kNasty = "<script>alert('x')</script> & \"q\" | *b* _i_ `c` [l](u) \x01 \xc3\xbf";

inline Case gemm_case(std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t seed) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = m, c.gemm.n = n, c.gemm.k = k;
  c.types = {{"A", Format::BF16}, {"B", Format::BF16}, {"D", Format::FP32}, {"compute", Format::FP32}};
  c.dist = {{"A", "normal(0,1)"}};
  c.seed = seed;
  return c;
}

inline Case attention_case(std::uint64_t seed) {
  Case c;
  c.op = Op::Attention;
  c.attention.seq_q = 17, c.attention.seq_kv = 33, c.attention.head_dim = 64, c.attention.causal = true;
  c.types = {{"Q", Format::FP16}, {"K", Format::FP16}, {"V", Format::FP16}, {"O", Format::FP16},
             {"compute", Format::FP32}};
  c.seed = seed;
  return c;
}

inline ErrorMetrics metrics(double max_normalised, double max_ulp, std::uint64_t distance, std::int64_t grid) {
  ErrorMetrics m;
  m.output = "D";
  m.format = Format::FP32;
  m.elements = 1024, m.compared = 1020, m.exact_matches = 700;
  m.max_abs = 2.5e-6, m.mean_abs = 1e-7, m.max_rel = 3e-6, m.mean_rel = 2e-7, m.normwise = 1.5e-7;
  m.max_normalised = max_normalised, m.mean_normalised = max_normalised / 10;
  m.max_ulp = max_ulp, m.mean_ulp = 0.3, m.bias_ulp = -0.01;
  m.max_ulp_distance = distance;
  m.ulp_histogram[0] = 700, m.ulp_histogram[1] = 300, m.ulp_histogram[3] = 20;
  m.worst.index = {0, 3, 5};
  m.worst.got = "0x3f800001 (0x1.000002p+0)";
  m.worst.expected = "0x3f800000 (0x1p+0)";
  m.worst.exact = "0x1.0000001p+0 + 0x1.8p-60";
  m.worst.condition = 12.5, m.worst.normalised = max_normalised, m.worst.ulp = max_ulp;
  m.map.rows = grid * 2, m.map.cols = grid * 2, m.map.cell_rows = 2, m.map.cell_cols = 2;
  m.map.grid_rows = grid, m.map.grid_cols = grid;
  for (std::int64_t i = 0; i < grid * grid; ++i) m.map.max_normalised.push_back(max_normalised * (i + 1) / (grid * grid));
  return m;
}

/// with_invalid_utf8: a kernel's message carries a byte that is not UTF-8 (renderers must
/// still produce valid documents; a record file stores it as U+FFFD).
inline RunRecord record(bool with_invalid_utf8 = false) {
  RunRecord r;
  r.kind = "fuzz";
  r.seed = 42;
  r.command = "ulpgate fuzz --kernel cpu.fp32_seq --cases 6 --seed 42 | tee `log`";
  r.environment = {"0.1.0", "abc123def456", "g++ 12.2.0", "ci-host", "2026-11-29T12:00:00Z",
                   "no CUDA device", "", "", "", 0};
  r.tolerance.accumulator_bits = 24;
  r.baseline.factor = 8;

  CaseResult pass;
  pass.kernel = "cpu.fp32_seq";
  pass.spec = gemm_case(16, 16, 4096, 7);
  pass.family = "gemm bf16->fp32 normal(0,1)";
  pass.metrics = {metrics(1.25e-7, 0.75, 1, 4)};
  pass.reproducer = "ulpgate replay cases/pass.json";
  pass.seconds = 0.125;
  r.cases.push_back(pass);

  CaseResult fail = pass;
  fail.kernel = "cpu.blockfma:block=16,frac=3,round=rz";
  fail.spec.seed = 8;
  fail.family = "gemm bf16->fp32 " + kNasty;
  fail.metrics = {metrics(3.5e-3, 1234.5, 1235, 8)};
  fail.metrics[0].unexpected_nan = 2;
  fail.metrics[0].missed_nonfinite = 1;
  fail.metrics[0].map.max_normalised[5] = NAN;
  fail.verdict.fail("D:tolerance@interior", "3 elements exceed the tolerance (worst 41.2x)");
  fail.verdict.fail("D:unexpected_nan@edge", kNasty);
  stamp(fail);
  fail.target = "cpu.fp32_seq fp16 gemm";
  fail.origin = "generated";
  fail.reproducer = "ulpgate replay 'cases/fail 1.json'";
  fail.seconds = 0.5;
  r.cases.push_back(fail);

  CaseResult unsupported;
  unsupported.kernel = "cpu.fp32_seq";
  unsupported.spec = gemm_case(3, 5, 7, 9);
  unsupported.family = "gemm bf16->fp32 sparse(0.1,1)";
  unsupported.status = Disposition::NotSupported;
  unsupported.message = "fp8 needs K % 16 == 0";
  r.cases.push_back(unsupported);

  CaseResult crashed = unsupported;
  crashed.kernel = "plugin.bad";
  crashed.status = Disposition::Crashed;
  crashed.message = "signal 11 (SIGSEGV) " + kNasty + (with_invalid_utf8 ? " bad\xff byte" : "");
  crashed.reproducer = "ulpgate replay cases/crash.json --plugin ./bad.so";
  crashed.seconds = 0.01;
  r.cases.push_back(crashed);

  CaseResult timed_out = crashed;
  timed_out.status = Disposition::TimedOut;
  timed_out.message = "no answer after 60 s";
  timed_out.spec.seed = 10;
  r.cases.push_back(timed_out);

  CaseResult attention = pass;
  attention.spec = attention_case(11);
  attention.family = "attention fp16 causal";
  attention.metrics = {metrics(2e-4, 0.5, 0, 2)};
  attention.metrics[0].output = "O";
  attention.metrics[0].format = Format::FP16;
  attention.notes = {{"algorithm", "online softmax"}};
  r.cases.push_back(attention);

  for (const char* format : {"fp32", "bf16"}) {
    SweepSeries s;
    s.kernel = "cpu.fp32_seq", s.format = format, s.dist = "normal(0,1)", s.parameter = "K";
    s.metric = "mean_normalised";
    s.x = {256, 1024, 4096, 16384, 65536};
    const double u = std::string(format) == "fp32" ? 0x1p-24 : 0x1p-8;
    for (double x : s.x) s.y.push_back(0.4 * std::sqrt(x) * u);
    s.fit = {0.5012345, 0.0123456, std::log(0.4 * u), 5};
    s.effective_bits = std::string(format) == "fp32" ? 23.84 : 7.91;
    r.sweeps.push_back(s);
  }
  SweepSeries ulp = r.sweeps[0];
  ulp.metric = "max_ulp";
  ulp.y = {0, 1.5, 2.5, 6, 11};  // a zero: cannot be drawn on log axes
  ulp.fit = {0.75, 0.05, -3.5, 4};
  r.sweeps.push_back(ulp);
  return r;
}

/// record() as a fuzz campaign the time budget cut short, with what the answer-first parts
/// of a report group and list: campaign targets, a second case of the failure (with a family
/// and a reproducer far wider than a page, with no space to break at), the minimal case
/// shrunk from the first one, and a target that did not run in full. Adds no plot (the
/// second failure and the shrunk case have neither histogram nor map).
inline RunRecord campaign_record() {
  RunRecord r = record();
  r.campaign.kind = "fuzz";
  r.campaign.seed = 42, r.campaign.cases = 100, r.campaign.max_k = 65536;
  r.campaign.targets = {"cpu.fp32_seq fp16 gemm", "cpu.fp32_seq fp16 attention"};
  r.campaign.ulpgate_version = "0.1.0";
  r.campaign.tolerance = "nominal per case";
  const CaseResult& first = r.cases[1];

  CaseResult again = first;
  again.spec.seed = 57;
  again.family = "gemm bf16->fp32 lognormal(mu=0,sigma=2.5)*scale(" + std::string(160, 'x') + ")";
  for (auto& m : again.metrics) m.ulp_histogram.assign(m.ulp_histogram.size(), 0), m.map = {};
  stamp(again);
  again.reproducer = "ulpgate fuzz --kernel cpu.blockfma:block=16,frac=3,round=rz --dtype fp16 --op gemm --seed 42 "
                     "--cases 100 --max-k 65536 --only-case=57 --plugin=/opt/ci/plugins/" + std::string(120, 'p') + ".so";
  r.cases.push_back(again);

  CaseResult minimal = first;
  minimal.spec = gemm_case(1, 1, 17, 8);
  minimal.family = "gemm bf16->fp32 normal(0,1)";
  for (auto& m : minimal.metrics) m.ulp_histogram.assign(m.ulp_histogram.size(), 0), m.map = {};
  stamp(minimal);
  minimal.origin = "shrunk";
  minimal.notes = {{"shrunk_from", first.id}};
  minimal.reproducer = "ulpgate replay corpus/cpu.blockfma_block=16_frac=3_round=rz-0123456789abcdef.json";
  r.cases.push_back(minimal);

  r.not_run.push_back({"cpu.fp32_seq fp16 attention", 100, 37, "time budget (--time 300) spent"});
  return r;
}

/// The number of plots render_html draws for record(): two sweep groups (mean_normalised
/// and max_ulp vs K), and a histogram and a map for each of the three cases with metrics.
inline constexpr int kRecordPlots = 2 + 3 + 3;

}  // namespace ulpgate::samples
