// Times the GEMM ladder's kernels (ladder.*, through Kernel::run as ulpgate runs them) and
// cuBLAS SGEMM on one shape, in one process: CUDA events around each run, L2 flushed before
// each (a 256 MiB memset outside the events), median and spread of --reps runs after --warmup,
// TFLOP/s = 2 M N K / t. Row-major, no transposes, alpha 1, beta 0, inputs uniform in [-1, 1).
// Each kernel's D is compared with cuBLAS's (not the exact reference: ulpgate fuzz does that).
//   bench_ladder [--shape 4096x4096x4096] [--reps 20] [--warmup 3] [--kernel ladder.]...
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/case.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"
#include "kernels/gemm/ladder.hpp"

using namespace ulpgate;

namespace {

struct Event {
  cudaEvent_t e = nullptr;
  Event() { ULPGATE_CHECK(cudaEventCreate(&e)); }
  ~Event() { cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

struct CublasHandle {
  cublasHandle_t h = nullptr;
  CublasHandle() { ULPGATE_CHECK(cublasCreate(&h)); }
  ~CublasHandle() { cublasDestroy(h); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Runs f warmup times, then reps times between events, each after an L2 flush.
template <class F>
Timing time_runs(F&& f, int warmup, int reps, void* flush, std::size_t flush_bytes, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<Event> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    ULPGATE_CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream));
    ULPGATE_CHECK(cudaEventRecord(start[i].e, stream));
    f();
    ULPGATE_CHECK(cudaEventRecord(stop[i].e, stream));
  }
  ULPGATE_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    ULPGATE_CHECK(cudaEventElapsedTime(&t, start[i].e, stop[i].e));
    ms[i] = t;
  }
  std::sort(ms.begin(), ms.end());
  const double median = reps % 2 ? ms[reps / 2] : (ms[reps / 2 - 1] + ms[reps / 2]) / 2;
  return {median, ms.front(), ms.back()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times the GEMM ladder's kernels against cuBLAS SGEMM on one shape"};
  std::string shape = "4096x4096x4096";
  int reps = 20, warmup = 3;
  std::vector<std::string> prefixes{"ladder."};
  app.add_option("--shape", shape, "MxNxK");
  app.add_option("--reps", reps, "timed runs per kernel (at least 20)")->check(CLI::Range(20, 100000));
  app.add_option("--warmup", warmup, "untimed runs first")->check(CLI::Range(1, 1000));
  app.add_option("--kernel", prefixes, "kernel name prefix (repeatable)");
  CLI11_PARSE(app, argc, argv);
  long long m = 0, n = 0, k = 0;
  if (std::sscanf(shape.c_str(), "%lldx%lldx%lld", &m, &n, &k) != 3 || m < 1 || n < 1 || k < 1) {
    std::fprintf(stderr, "bench_ladder: --shape '%s': expected MxNxK\n", shape.c_str());
    return 2;
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "bench_ladder: needs a CUDA device; none here\n");
    return 2;
  }
  try {
    cudaStream_t stream = static_cast<cudaStream_t>(thread_stream());
    Case c;
    c.gemm.m = m, c.gemm.n = n, c.gemm.k = k;
    c.types = {{"A", Format::FP32}, {"B", Format::FP32}, {"D", Format::FP32}, {"compute", Format::FP32}};
    const std::size_t na = m * k, nb = k * n, nd = m * n;
    std::vector<float> host(std::max(na, nb));
    std::uint64_t state = 0x9e3779b97f4a7c15u;
    const auto fill = [&](DeviceBuffer& buf, std::size_t count) {
      for (std::size_t i = 0; i < count; ++i) {
        state = state * 6364136223846793005u + 1442695040888963407u;
        host[i] = static_cast<float>(static_cast<double>(state >> 40) * 0x1p-23 - 1.0);  // 24 bits: exact
      }
      copy_to_device(buf.get(), host.data(), count * sizeof(float), stream);
    };
    DeviceBuffer a(na * sizeof(float), stream), b(nb * sizeof(float), stream), d(nd * sizeof(float), stream),
        d_ref(nd * sizeof(float), stream);
    fill(a, na);
    fill(b, nb);
    const std::size_t flush_bytes = std::size_t{256} << 20;
    DeviceBuffer flush(flush_bytes, stream);
    const CublasHandle cublas;
    cublasHandle_t handle = cublas.h;
    ULPGATE_CHECK(cublasSetStream(handle, stream));
    const float one = 1, zero = 0;
    // Row-major D = A B is the column-major D^T = B^T A^T.
    const auto sgemm = [&] {
      ULPGATE_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                static_cast<int>(k), &one, static_cast<const float*>(b.get()), static_cast<int>(n),
                                static_cast<const float*>(a.get()), static_cast<int>(k), &zero,
                                static_cast<float*>(d_ref.get()), static_cast<int>(n)));
    };
    const DeviceInfo info = device_info();
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    std::printf("Device: %s, SM clock %lld MHz before\n", info.description.c_str(),
                static_cast<long long>(info.sm_clock_mhz));
    std::printf("Shape %lldx%lldx%lld row-major NN, FP32, alpha 1, beta 0; %d warm-up + %d timed runs each, L2 "
                "flushed (256 MiB memset) before each timed run\n\n",
                m, n, k, warmup, reps);
    const Timing ref = time_runs(sgemm, warmup, reps, flush.get(), flush_bytes, stream);
    std::vector<float> want(nd), got(nd);
    copy_to_host(want.data(), d_ref.get(), nd * sizeof(float), stream);
    double ref_max = 0;
    for (float v : want) ref_max = std::max(ref_max, static_cast<double>(std::fabs(v)));
    std::printf("| kernel | median ms | min - max ms | TFLOP/s | %% of cuBLAS | max abs diff / max abs (cuBLAS) "
                "| notes |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    const auto row = [&](const std::string& name, const Timing& t, double diff, const std::string& notes) {
      std::printf("| %s | %.3f | %.3f - %.3f | %.2f | %.1f | %s | %s |\n", name.c_str(), t.median_ms, t.min_ms,
                  t.max_ms, flops / (t.median_ms * 1e-3) / 1e12, 100.0 * ref.median_ms / t.median_ms,
                  diff < 0 ? "" : fmt::format("{:.2e}", diff).c_str(), notes.c_str());
      std::fflush(stdout);
    };
    row("cublasSgemm", ref, -1, "default math mode");
    for (auto& kernel : make_ladder_kernels()) {
      if (std::none_of(prefixes.begin(), prefixes.end(),
                       [&](const std::string& p) { return kernel->name().rfind(p, 0) == 0; }))
        continue;
      if (auto why = kernel->unsupported(c)) {
        std::printf("| %s | not supported: %s | | | | | |\n", kernel->name().c_str(), why->c_str());
        continue;
      }
      KernelIo io;
      io.in = {{"A", a.get()}, {"B", b.get()}};
      io.out = {{"D", d.get()}};
      io.stream = stream;
      RunNotes notes;
      const Timing t = time_runs([&] { kernel->run(c, io, notes); }, warmup, reps, flush.get(), flush_bytes, stream);
      copy_to_host(got.data(), d.get(), nd * sizeof(float), stream);
      double diff = 0;
      for (std::size_t i = 0; i < nd; ++i) diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
      std::string note = notes.count("algorithm") ? notes.at("algorithm") : "";
      for (const char* key : {"vector_access", "split_k"})
        if (notes.count(key)) note += fmt::format("; {}: {}", key, notes.at(key));
      row(kernel->name(), t, ref_max > 0 ? diff / ref_max : diff, note);
    }
    std::printf("\nSM clock %lld MHz after\n", static_cast<long long>(device_info().sm_clock_mhz));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ladder: %s\n", e.what());
    return 3;
  }
  return 0;
}
