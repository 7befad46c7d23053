// bench_sgemm_configs: shapes of the ladder's step-7 kernel (sgemm_configs.cu) beside cuBLAS
// SGEMM (FP32, default math mode) on row-major square problems D = A B, cuBLAS timed before
// and after the shapes so clock drift shows; every shape's output is checked against
// cuBLAS's. Options and method: see docs/dev/benchmarks.md.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dev/sgemm_configs.hpp"
#include "campaign/bench.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"

using namespace ulpgate;

namespace {

constexpr std::size_t kFlushBytes = std::size_t{256} << 20;
constexpr double kWrongAt = 1e-5;

struct CublasDeleter {
  void operator()(cublasContext* h) const { cublasDestroy(h); }
};
using Cublas = std::unique_ptr<cublasContext, CublasDeleter>;

struct Row {
  std::string config, shape;
  std::int64_t n = 0;
  BenchTiming t;
  double tflops = 0, percent = -1;
  double diff = -1;  // max normalised difference from cuBLAS; -1: not checked (cuBLAS itself)
  bool ok = true;
  std::string worst;  // the worst element, where WRONG
  int regs = 0, blocks_per_sm = 0;
  std::size_t local_bytes = 0, smem_bytes = 0;
  const bench::SgemmConfig* cfg = nullptr;
};

// `warmup` untimed runs of f, then `reps` runs each after the L2 eviction, in milliseconds.
template <class F>
std::vector<double> time_runs(F&& f, int warmup, int reps, void* flush) {
  for (int i = 0; i < warmup; ++i) f();
  StreamTimer timer(nullptr);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    device_memset(flush, i & 0xff, kFlushBytes, nullptr);
    timer.start();
    f();
    timer.stop();
    ms.push_back(timer.elapsed_ms());
  }
  return ms;
}

std::string shape_cell(const Row& r) { return r.cfg ? r.shape : "cublasSgemm, default math mode"; }

void print_row(const Row& r) {
  const std::string res = r.cfg ? fmt::format("{} | {} | {:.1f} | {}", r.regs, r.local_bytes, r.smem_bytes / 1024.0,
                                              r.blocks_per_sm)
                                : " |  |  | ";
  const std::string check = r.cfg ? fmt::format("{:.2e} | {}", r.diff, r.ok ? "ok" : "WRONG " + r.worst) : " | ";
  std::printf("| %s | %s | %lld | %s | %.3f | %.3f - %.3f | %.2f | %.1f | %s |\n", r.config.c_str(),
              shape_cell(r).c_str(), static_cast<long long>(r.n), res.c_str(), r.t.median_ms, r.t.min_ms, r.t.max_ms,
              r.tflops, r.percent, check.c_str());
  std::fflush(stdout);
}

nlohmann::json to_json(const Row& r) {
  nlohmann::json j = {{"config", r.config},
                      {"shape", shape_cell(r)},
                      {"m", r.n},
                      {"n", r.n},
                      {"k", r.n},
                      {"ms",
                       {{"median", r.t.median_ms},
                        {"min", r.t.min_ms},
                        {"max", r.t.max_ms},
                        {"p10", r.t.p10_ms},
                        {"p90", r.t.p90_ms},
                        {"reps", r.t.reps}}},
                      {"tflops", r.tflops},
                      {"percent_of_cublas", r.percent}};
  if (r.cfg) {
    const bench::SgemmConfig& c = *r.cfg;
    j["params"] = {{"bm", c.bm},           {"bn", c.bn},       {"bk", c.bk},
                   {"wm", c.wm},           {"wn", c.wn},       {"tm", c.tm},
                   {"tn", c.tn},           {"threads", c.threads}, {"min_blocks", c.min_blocks},
                   {"staging", c.cp_async ? "cp.async" : "registers"}, {"stages", c.stages}};
    j["registers"] = r.regs;
    j["local_bytes"] = r.local_bytes;
    j["smem_bytes"] = r.smem_bytes;
    j["blocks_per_sm"] = r.blocks_per_sm;
    j["max_normalised_diff"] = r.diff;
    j["ok"] = r.ok;
    if (!r.ok) j["worst"] = r.worst;
  }
  return j;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

int run(const std::vector<std::int64_t>& sizes, int warmup, int reps, const std::string& only, std::uint64_t seed,
        const std::string& json_path) {
  std::vector<bench::SgemmConfig> configs;
  const std::vector<std::string> wanted = split_list(only);
  for (const bench::SgemmConfig& c : bench::sgemm_configs())
    if (wanted.empty() || std::find(wanted.begin(), wanted.end(), c.name) != wanted.end()) configs.push_back(c);
  if (configs.empty()) throw std::invalid_argument("--only " + only + ": no such configuration");

  const DeviceInfo dev = device_info();
  std::printf("%s; %d SMs; SM clock %lld MHz before\n", dev.description.c_str(), dev.sm_count,
              static_cast<long long>(dev.sm_clock_mhz));
  std::printf("Row-major D = A B, FP32, A and B uniform [-1, 1) (seed %llu); %d warm-up + %d timed runs, L2 evicted "
              "(256 MiB memset) before each; WRONG at a max normalised difference from cuBLAS of %.0e\n\n",
              static_cast<unsigned long long>(seed), warmup, reps, kWrongAt);
  std::printf("| config | shape | n | regs | local B | smem KiB | blocks/SM | median ms | min - max ms | TFLOP/s | %% of "
              "cuBLAS | max normalised diff | check |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");

  Cublas handle;
  {
    cublasHandle_t h = nullptr;
    ULPGATE_CHECK(cublasCreate(&h));
    handle.reset(h);
  }
  ULPGATE_CHECK(cublasSetMathMode(handle.get(), CUBLAS_DEFAULT_MATH));
  const DeviceBuffer flush(kFlushBytes);
  DeviceBuffer worst_buf(sizeof(unsigned long long));
  auto* worst = static_cast<unsigned long long*>(worst_buf.get());
  std::vector<Row> rows;
  bool all_ok = true;

  for (const std::int64_t n : sizes) {
    const std::size_t bytes = static_cast<std::size_t>(n * n) * sizeof(float);
    DeviceBuffer a(bytes), b(bytes), abs_a(bytes), abs_b(bytes), ref(bytes), abs_ref(bytes), d(bytes);
    const auto f = [](const DeviceBuffer& x) { return static_cast<float*>(x.get()); };
    bench::fill_uniform(f(a), f(abs_a), n * n, seed, nullptr);
    bench::fill_uniform(f(b), f(abs_b), n * n, seed + 1, nullptr);
    // Row-major X is column-major X^T: D^T = B^T A^T.
    const auto sgemm = [&](const float* x, const float* y, float* out) {
      const float one = 1.0f, zero = 0.0f;
      const int ni = static_cast<int>(n);
      ULPGATE_CHECK(cublasSgemm(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &one, y, ni, x, ni, &zero, out, ni));
    };
    sgemm(f(a), f(b), f(ref));
    sgemm(f(abs_a), f(abs_b), f(abs_ref));
    device_synchronize();

    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    const auto cublas_row = [&](const char* name, const std::vector<double>& ms) {
      Row r;
      r.config = name, r.n = n, r.t = timing_of(ms), r.tflops = flops / (r.t.median_ms * 1e-3) / 1e12;
      return r;
    };
    const auto cublas_run = [&] { sgemm(f(a), f(b), f(d)); };
    std::vector<double> before = time_runs(cublas_run, warmup, reps, flush.get());
    const std::size_t first = rows.size();
    rows.push_back(cublas_row("cublas (before)", before));

    simt::Problem p;
    p.m = p.n = p.k = n;
    p.a = simt::Panel{f(a), n, 0, true};   // A(i, k) at i n + k
    p.b = simt::Panel{f(b), n, 0, false};  // B(j, k) at k n + j
    p.d = f(d), p.ldd = n;
    const bool vec = n % 4 == 0;  // cudaMalloc'd: 256-byte aligned
    for (const bench::SgemmConfig& c : configs) {
      Row r;
      r.config = c.name, r.shape = c.shape, r.n = n, r.cfg = &c, r.smem_bytes = c.smem_bytes;
      const auto launch = [&] { ULPGATE_CHECK(c.launch(p, vec, vec, vec, nullptr)); };
      r.t = timing_of(time_runs(launch, warmup, reps, flush.get()));
      r.tflops = flops / (r.t.median_ms * 1e-3) / 1e12;
      cudaFuncAttributes attr{};
      ULPGATE_CHECK(cudaFuncGetAttributes(&attr, c.kernel));
      r.regs = attr.numRegs, r.local_bytes = attr.localSizeBytes;
      ULPGATE_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, c.kernel, c.threads, c.smem_bytes));
      // The checked run: D all NaN first (0xff bytes), so an element left unwritten fails.
      ULPGATE_CHECK(cudaMemset(d.get(), 0xff, bytes));
      launch();
      ULPGATE_CHECK(cudaMemset(worst, 0, sizeof(*worst)));
      bench::max_normalised_diff(f(d), f(ref), f(abs_ref), n * n, worst, nullptr);
      unsigned long long key = 0;
      ULPGATE_CHECK(cudaMemcpy(&key, worst, sizeof(key), cudaMemcpyDeviceToHost));
      const auto bits = static_cast<std::uint32_t>(key >> 32);
      const auto index = static_cast<std::int64_t>(key & 0xffffffffu);
      float diff = 0;
      std::memcpy(&diff, &bits, sizeof(diff));
      r.diff = diff, r.ok = diff < kWrongAt;
      if (!r.ok) {
        float got = 0, want = 0;
        ULPGATE_CHECK(cudaMemcpy(&got, f(d) + index, sizeof(got), cudaMemcpyDeviceToHost));
        ULPGATE_CHECK(cudaMemcpy(&want, f(ref) + index, sizeof(want), cudaMemcpyDeviceToHost));
        r.worst = fmt::format("D({}, {}) = {:a}, cuBLAS {:a}", index / n, index % n, got, want);
        all_ok = false;
      }
      rows.push_back(r);
    }

    std::vector<double> after = time_runs(cublas_run, warmup, reps, flush.get());
    rows.push_back(cublas_row("cublas (after)", after));
    before.insert(before.end(), after.begin(), after.end());
    const double cublas_median = timing_of(before).median_ms;
    for (std::size_t i = first; i < rows.size(); ++i) {
      rows[i].percent = 100.0 * cublas_median / rows[i].t.median_ms;
      print_row(rows[i]);
    }
  }

  const DeviceInfo end = device_info();
  std::printf("\nSM clock %lld MHz after\n", static_cast<long long>(end.sm_clock_mhz));
  if (!json_path.empty()) {
    nlohmann::json j = {{"device", dev.description},
                        {"sm_count", dev.sm_count},
                        {"sm_clock_mhz_before", dev.sm_clock_mhz},
                        {"sm_clock_mhz_after", end.sm_clock_mhz},
                        {"seed", seed},
                        {"warmup", warmup},
                        {"reps", reps},
                        {"l2_flush_bytes", kFlushBytes},
                        {"wrong_at", kWrongAt},
                        {"rows", nlohmann::json::array()}};
    for (const Row& r : rows) j["rows"].push_back(to_json(r));
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Step-7 SGEMM shapes of the GEMM ladder beside cuBLAS SGEMM"};
  std::string sizes = "2048,4096,8192", only, json_path;
  int reps = 20, warmup = 3;
  std::uint64_t seed = 1;
  app.add_option("--sizes", sizes, "M = N = K of each problem, comma-separated");
  app.add_option("--reps", reps, "timed runs per kernel and size (at least 20 for a reported median)")->check(CLI::Range(1, 10000));
  app.add_option("--warmup", warmup, "untimed runs first")->check(CLI::Range(0, 1000));
  app.add_option("--only", only, "configurations to time, comma-separated (default: all)");
  app.add_option("--seed", seed, "seed of the inputs");
  app.add_option("--json", json_path, "write the rows as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<std::int64_t> ns;
    for (const std::string& s : split_list(sizes)) {
      ns.push_back(std::stoll(s));
      if (ns.back() <= 0 || ns.back() > 46340) throw std::invalid_argument("--sizes: " + s + " out of 1..46340");
    }
    return run(ns, warmup, reps, only, seed, json_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sgemm_configs: %s\n", e.what());
    return 2;
  }
}
