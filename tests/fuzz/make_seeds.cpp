// Writes the seed corpora under tests/fuzz/corpus/<harness>/ with the project's own writers, so
// that the seeds follow the schemas: `make_seeds DIR` (DIR = tests/fuzz/corpus). Each seed stays
// under the 4096 bytes the fuzz runs allow (-max_len=4096).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/npy.hpp"
#include "distributions/spec.hpp"
#include "campaign/gate.hpp"
#include "campaign/journal.hpp"
#include "campaign/record.hpp"
#include "tests/core/npy_samples.hpp"
#include "tests/campaign/record_samples.hpp"

using namespace ulpgate;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path root;

void seed(const std::string& harness, const std::string& name, const std::string& text) {
  const fs::path dir = root / harness;
  fs::create_directories(dir);
  if (text.size() > 4096) std::fprintf(stderr, "make_seeds: %s/%s is %zu bytes (over -max_len)\n",
                                       harness.c_str(), name.c_str(), text.size());
  write_text_file_atomically((dir / name).string(), text);
}

std::string compact(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Case fp8_gemm_case() {
  Case c = samples::gemm_case(32, 16, 64, 5);
  c.gemm.layout = Layout::ColMajor, c.gemm.trans_a = true, c.gemm.lda = 80, c.gemm.batch = 2;
  c.types = {{"A", Format::E4M3}, {"B", Format::E5M2}, {"C", Format::BF16}, {"D", Format::FP16},
             {"bias", Format::FP32}, {"compute", Format::FP32}};
  c.alpha = 0.5, c.beta = 2, c.epilogue = Epilogue::BiasGeluTanh;
  c.scales = {{"A", 0.25}, {"B", 4}};
  c.dist = {{"A", "gendot(cond=1e6)"}, {"C", "outliers(rate=0.01,base=uniform(-1,1))"}, {"bias", "sparse(0.5,1)"}};
  c.kernel = "cpu.fp32_seq";
  return c;
}

Case masked_attention_case() {
  Case c = samples::attention_case(12);
  c.attention.batch = 2, c.attention.heads = 2, c.attention.layout = AttentionLayout::BSHD;
  c.attention.softmax_scale = 0.125, c.attention.kv_lengths = {33, 7};
  c.dist = {{"Q", "masked(frac=0.25)"}, {"K", "masked(frac=0.25)"}, {"V", "softmax(2)"}};
  return c;
}

CaseResult small_result(const Case& spec, Disposition status) {
  CaseResult r;
  r.kernel = "cpu.fp32_seq";
  r.spec = spec;
  r.family = "gemm bf16->fp32 normal(0,1)";
  r.target = "cpu.fp32_seq bf16 gemm";
  r.origin = "generated";
  r.status = status;
  if (status == Disposition::Ok) {
    r.metrics = {samples::metrics(1.25e-7, 0.75, 1, 1)};
  } else {
    r.message = "signal 11 (SIGSEGV)";
  }
  r.reproducer = "ulpgate replay cases/x.json";
  r.seconds = 0.125;
  stamp(r);
  return r;
}

RunRecord small_record() {
  RunRecord r;
  r.kind = "fuzz";
  r.seed = 42;
  r.command = "ulpgate fuzz --cases 2 --seed 42";
  r.environment = {"0.1.0", "abc123def456", "g++ 12.2.0", "ci-host", "2026-11-29T12:00:00Z", "no CUDA device", "", "", "", 0};
  r.tolerance.accumulator_bits = 24;
  r.baseline.factor = 8;
  r.campaign.kind = "fuzz";
  r.campaign.seed = 42, r.campaign.cases = 2, r.campaign.max_k = 4096;
  r.campaign.targets = {"cpu.fp32_seq bf16 gemm"};
  r.campaign.plugins = {{"example_plugin.so", "fnv1a64:0123456789abcdef"}};
  r.campaign.ulpgate_version = "0.1.0";
  r.campaign.tolerance = "nominal per case";
  r.cases = {small_result(samples::gemm_case(16, 16, 64, 7), Disposition::Ok)};
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR (tests/fuzz/corpus)\n");
    return 2;
  }
  root = argv[1];

  seed("case", "gemm.json", to_json(samples::gemm_case(16, 16, 64, 7)).dump(2));
  seed("case", "gemm_fp8_bias_batched.json", to_json(fp8_gemm_case()).dump(2));
  seed("case", "attention.json", to_json(samples::attention_case(11)).dump(2));
  seed("case", "attention_masked_bshd.json", to_json(masked_attention_case()).dump(2));

  for (const FamilyInfo& f : all_families()) seed("spec", std::string(f.name), parse_dist(f.name).canonical());
  const char* specs[] = {"normal(0,1)", "gendot(cond=1e12)", "normal(0,0x1p-8)", " uniform ( -1 , 1 ) ",
                         "outliers(rate=0.01,scale=100,base=lognormal(0,2))",
                         "specials(0.01,0.01,0.01,base=amax(0.5,base=student_t(3,1)))",
                         "normal(0,)", "outliers(rate=2)", "gaussian", "exact(max=16,frac=0)"};
  for (int i = 0; i < static_cast<int>(std::size(specs)); ++i) seed("spec", "text" + std::to_string(i), specs[i]);

  // Every format's words as export writes them (values 0, 1, -2, ... and a NaN), and the
  // other versions and shapes the reader takes, an array of no elements among them.
  for (const Format f : kAllFormats) {
    Tensor t(f, 6);
    for (std::size_t i = 0; i + 1 < t.size(); ++i) t.set_value(i, (i % 2 ? -1.0 : 1.0) * static_cast<double>(i));
    t.set_value(t.size() - 1, std::nan(""));
    seed("npy", std::string(name(f)) + ".npy", npy_bytes(t));
  }
  const std::string words(12, '\x3c');  // six FP16 words 0x3c3c
  seed("npy", "v2_fp16_2x3.npy", samples::npy_file(2, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }", words));
  seed("npy", "v3_bf16_scalar.npy", samples::npy_file(3, "{\"shape\": (), \"descr\": \"<u2\", \"fortran_order\": False}", words.substr(0, 2)));
  seed("npy", "empty_fp32.npy", npy_bytes(Tensor(Format::FP32, 0)));
  seed("npy", "fortran_order.npy", samples::npy_file(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", words));

  RunRecord record = small_record();
  seed("record", "fuzz_pass.json", compact(to_json(record)));
  seed("baseline", "baseline.json", to_json(baseline_from_record(record)).dump(1));
  record.kind = "replay", record.campaign = {};
  record.cases.push_back(small_result(samples::gemm_case(3, 5, 7, 9), Disposition::Crashed));
  record.not_run.push_back({"cpu.fp32_seq bf16 attention", 2, 1, "time budget (--time 300) spent"});
  SweepSeries s;
  s.kernel = "cpu.fp32_seq", s.format = "fp32", s.dist = "normal(0,1)", s.parameter = "K", s.metric = "max_ulp";
  s.x = {256, 1024, 4096}, s.y = {0, 1.5, 2.5}, s.fit = {0.75, 0.05, -3.5, 2}, s.effective_bits = 23.8;
  record.sweeps.push_back(s);
  seed("record", "replay_crash_sweep.json", compact(to_json(record)));

  // A journal as Journal writes it, and the same with the truncated last line a SIGKILL leaves.
  const std::string journal = (root / "journal.tmp").string();
  {
    Journal j(journal, json{{"seed", 42}, {"cases", 2}}, /*resume=*/false, /*sync=*/false);
    j.append("cpu.fp32_seq", samples::gemm_case(4, 4, 16, 1), small_result(samples::gemm_case(4, 4, 16, 1), Disposition::Ok));
    j.append("cpu.fp32_seq", samples::gemm_case(4, 4, 16, 2), small_result(samples::gemm_case(4, 4, 16, 2), Disposition::Crashed));
  }
  std::ifstream in(journal, std::ios::binary);
  const std::string lines((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(journal);
  seed("journal", "two_entries.jsonl", lines);
  seed("journal", "truncated_tail.jsonl", lines.substr(0, lines.size() - 40));
  seed("journal", "header_only.jsonl", lines.substr(0, lines.find('\n') + 1));
  return 0;
}
