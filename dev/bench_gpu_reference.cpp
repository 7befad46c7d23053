// bench_gpu_reference: the GPU exact reference against cuBLAS DGEMM and the CPU exact
// reference, side by side in one run (docs/results/gpu_reference_h200.md), and with
// --crossover the CPU/GPU crossover of the whole GEMM reference (where auto should switch).
// Options, phases timed and outputs: see docs/dev/benchmarks.md.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/format.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "core/case.hpp"
#include "core/tensor.hpp"
#include "references/exact_dot.hpp"
#include "references/gemm_reference.hpp"
#include "references/sliced_gemm_gpu.hpp"

using namespace ulpgate;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(fmt::format("{}: {}", what, cublasGetStatusString(s)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// rows x k values normal(0, 1) rounded to f (Box-Muller on Philox words, stream `stream`).
std::vector<float> normal_rows(Format f, std::int64_t rows, std::int64_t k, std::uint64_t seed, std::uint32_t stream) {
  std::vector<float> v(static_cast<std::size_t>(rows * k));
  parallel_for(rows, [&](std::int64_t r) {
    for (std::int64_t q = 0; q < k; q += 2) {
      const RandomBlock b = random_block(seed, stream, static_cast<std::uint64_t>(r * k + q));
      const double u1 = to_unit_open_closed(low64(b)), u2 = to_unit_closed_open(high64(b));
      const double rad = std::sqrt(-2.0 * std::log(u1));
      const double z[2] = {rad * std::cos(6.283185307179586 * u2), rad * std::sin(6.283185307179586 * u2)};
      for (int t = 0; t < 2 && q + t < k; ++t)
        v[static_cast<std::size_t>(r * k + q + t)] = static_cast<float>(decode(f, encode(f, z[t])));
    }
  });
  return v;
}

struct Row {
  std::string format;
  std::int64_t k = 0;
  double digits_a = 0, digits_b = 0, dgemm = 0, slice = 0, products = 0, combine = 0, upload = 0, download = 0, cpu = 0;
  std::int64_t recomputed = 0, checked = 0, mismatches = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The GPU exact reference against cuBLAS DGEMM and the CPU exact reference"};
  std::int64_t m = 8192, n = 8192, cpu_rows = 32, check_count = 256;
  int reps = 3;
  std::uint64_t seed = 1;
  std::vector<std::int64_t> ks{1024, 2048, 4096, 8192, 16384, 32768, 65536};
  std::vector<std::string> formats{"fp16", "bf16", "fp32"};
  app.add_option("--m", m)->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--n", n)->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--k", ks)->delimiter(',')->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 22));
  app.add_option("--formats", formats)->delimiter(',');
  app.add_option("--reps", reps)->check(CLI::Range(1, 100));
  app.add_option("--cpu-rows", cpu_rows)->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  app.add_option("--check", check_count)->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  app.add_option("--seed", seed);
  std::vector<std::int64_t> crossover;
  app.add_option("--crossover", crossover)->delimiter(',')->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 14));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::vector<Format> fs;
  for (const std::string& s : formats) {
    const auto f = parse_format(s);
    if (!f || *f == Format::FP64) {
      std::fprintf(stderr, "bench_gpu_reference: --formats: '%s' is not an input format (fp32, tf32, fp16, bf16, e4m3, e5m2)\n", s.c_str());
      return 2;
    }
    fs.push_back(*f);
  }
  if (!gpu_sliced_available()) {
    std::fprintf(stderr, "bench_gpu_reference: no CUDA device\n");
    return 2;
  }
  cpu_rows = std::min(cpu_rows, m);
  if (!crossover.empty()) {
    std::printf("| M = N = K | product terms | CPU reference ms (%u threads) | GPU reference ms | CPU / GPU |\n|---|---|---|---|---|\n",
                default_threads());
    for (const std::int64_t size : crossover) {
      Case c;
      c.op = Op::Gemm;
      c.gemm.m = c.gemm.n = c.gemm.k = size;
      c.types = {{"A", Format::BF16}, {"B", Format::BF16}, {"D", Format::FP32}, {"compute", Format::FP32}};
      validate(c);
      std::map<std::string, Tensor> in;
      for (const char* op : {"A", "B"}) {
        const std::vector<float> v = normal_rows(Format::BF16, size, size, seed, op[0] == 'A' ? 1 : 2);
        Tensor t(Format::BF16, v.size());
        for (std::size_t e = 0; e < v.size(); ++e) t.set_value(e, v[e]);
        in.emplace(op, std::move(t));
      }
      double ms[2];
      for (const ReferencePath path : {ReferencePath::Cpu, ReferencePath::Gpu}) {
        set_reference_path(path);
        std::vector<double> times;
        for (int r = 0; r <= reps; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          const GemmReference ref = gemm_reference(c, in);
          const auto t1 = std::chrono::steady_clock::now();
          if (r > 0) times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
        ms[path == ReferencePath::Gpu] = median(times);
      }
      std::printf("| %lld | %.3g | %.2f | %.2f | %.2f |\n", static_cast<long long>(size), std::pow(static_cast<double>(size), 3.0),
                  ms[0], ms[1], ms[0] / ms[1]);
      std::fflush(stdout);
    }
    return 0;
  }
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  const SlicedPath gpu = gpu_sliced_path();
  std::printf("| format | K | digits A / B | DGEMM ms | slice ms | int8 products ms | combine ms | GPU exact ms | / DGEMM | "
              "upload + download ms | CPU exact s (%u threads) | GPU speed-up | recomputed | checked |\n",
              default_threads());
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const Format f : fs)
    for (const std::int64_t k : ks) {
      Row row;
      row.format = std::string(name(f)), row.k = k;
      const std::vector<float> a = normal_rows(f, m, k, seed, 1), b = normal_rows(f, n, k, seed, 2);

      // DGEMM on the same values: C (m x n, column-major) = A^T B with A, B stored K-major.
      {
        std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end());
        double *da = nullptr, *db = nullptr, *dc = nullptr;
        check(cudaMalloc(&da, ad.size() * 8), "cudaMalloc");
        check(cudaMalloc(&db, bd.size() * 8), "cudaMalloc");
        check(cudaMalloc(&dc, static_cast<std::size_t>(m * n) * 8), "cudaMalloc");
        check(cudaMemcpy(da, ad.data(), ad.size() * 8, cudaMemcpyHostToDevice), "upload");
        check(cudaMemcpy(db, bd.data(), bd.size() * 8, cudaMemcpyHostToDevice), "upload");
        cudaEvent_t e0, e1;
        check(cudaEventCreate(&e0), "event"), check(cudaEventCreate(&e1), "event");
        const double one = 1, zero = 0;
        std::vector<double> times;
        for (int r = 0; r <= reps; ++r) {
          check(cudaEventRecord(e0), "record");
          check(cublasDgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                            &one, da, static_cast<int>(k), db, static_cast<int>(k), &zero, dc, static_cast<int>(m)),
                "cublasDgemm");
          check(cudaEventRecord(e1), "record");
          check(cudaEventSynchronize(e1), "sync");
          float ms = 0;
          check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
          if (r > 0) times.push_back(ms);  // r = 0: the warm-up
        }
        row.dgemm = median(times);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        cudaFree(da), cudaFree(db), cudaFree(dc);
      }

      // The GPU exact path: a warm-up (allocations), then reps timed per phase.
      SlicedDots s;
      {
        std::vector<double> slice, products, combine, upload, download;
        for (int r = 0; r <= reps; ++r) {
          s = gpu(a, m, b, n, k);
          if (r == 0) continue;
          slice.push_back(s.ms_slice), products.push_back(s.ms_products), combine.push_back(s.ms_combine);
          upload.push_back(s.ms_upload), download.push_back(s.ms_download);
        }
        row.slice = median(slice), row.products = median(products), row.combine = median(combine);
        row.upload = median(upload), row.download = median(download);
        row.digits_a = static_cast<double>(s.stacked_a) / static_cast<double>(m);
        row.digits_b = static_cast<double>(s.stacked_b) / static_cast<double>(n);
        row.recomputed = s.recomputed;
      }

      // Spot check: elements spread over the matrix against the superaccumulator.
      ExactAccumulator acc;
      for (std::int64_t c = 0; c < check_count; ++c) {
        const std::int64_t i = (c * 7919) % m, j = (c * 104729 + c / m) % n;
        acc.clear();
        acc.add_products(std::span<const float>(a).subspan(static_cast<std::size_t>(i * k), static_cast<std::size_t>(k)),
                         std::span<const float>(b).subspan(static_cast<std::size_t>(j * k), static_cast<std::size_t>(k)));
        const std::size_t e = s.index(i, j);
        ++row.checked;
        if (!s.certified[e]) continue;  // the reference recomputes it on the CPU
        row.mismatches += !(s.value(i, j) == acc.value()) || s.condition[e] != acc.magnitude().to_double();
      }

      // The CPU exact reference on all cores: operands prepared (A rows scaled, B once),
      // then every dot product of cpu_rows rows, scaled to m rows.
      if (cpu_rows > 0) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<Operand> ops(static_cast<std::size_t>(cpu_rows + n));
        parallel_for(cpu_rows + n, [&](std::int64_t r) {
          const float* base = r < cpu_rows ? &a[static_cast<std::size_t>(r * k)] : &b[static_cast<std::size_t>((r - cpu_rows) * k)];
          ops[static_cast<std::size_t>(r)] = Operand(std::span<const float>(base, static_cast<std::size_t>(k)));
        });
        const auto t1 = std::chrono::steady_clock::now();
        std::vector<double> sink(static_cast<std::size_t>(cpu_rows * n));
        const std::int64_t col_block = 64, blocks = (n + col_block - 1) / col_block;
        parallel_for(cpu_rows * blocks, [&](std::int64_t t) {
          ExactAccumulator x;
          const std::int64_t i = t % cpu_rows, jb = t / cpu_rows;
          for (std::int64_t j = jb * col_block; j < std::min(n, (jb + 1) * col_block); ++j) {
            x.clear();
            x.add_products(ops[static_cast<std::size_t>(i)], ops[static_cast<std::size_t>(cpu_rows + j)]);
            sink[static_cast<std::size_t>(i * n + j)] = x.value().to_double() + x.magnitude().to_double();
          }
        });
        const auto t2 = std::chrono::steady_clock::now();
        const double prep = std::chrono::duration<double>(t1 - t0).count(), dots = std::chrono::duration<double>(t2 - t1).count();
        // preparation: A's share scaled with the rows, B's once
        const double prep_a = prep * static_cast<double>(cpu_rows) / static_cast<double>(cpu_rows + n);
        row.cpu = (prep_a + dots) * static_cast<double>(m) / static_cast<double>(cpu_rows) + (prep - prep_a);
      }

      const double total = row.slice + row.products + row.combine;
      std::printf("| %s | %lld | %.2f / %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2fx | %.0f + %.0f | %.1f | %.0fx | %lld | %lld (%lld differ) |\n",
                  row.format.c_str(), static_cast<long long>(k), row.digits_a, row.digits_b, row.dgemm, row.slice,
                  row.products, row.combine, total, total / row.dgemm, row.upload, row.download, row.cpu,
                  row.cpu > 0 ? row.cpu * 1000 / total : 0.0, static_cast<long long>(row.recomputed),
                  static_cast<long long>(row.checked), static_cast<long long>(row.mismatches));
      std::fflush(stdout);
      std::fprintf(stderr,
                   "{\"format\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"digits_a\":%.4f,\"digits_b\":%.4f,\"dgemm_ms\":%.3f,"
                   "\"slice_ms\":%.3f,\"products_ms\":%.3f,\"combine_ms\":%.3f,\"upload_ms\":%.3f,\"download_ms\":%.3f,"
                   "\"cpu_s\":%.3f,\"recomputed\":%lld,\"checked\":%lld,\"mismatches\":%lld,\"int8_gemms\":%lld}\n",
                   row.format.c_str(), static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                   row.digits_a, row.digits_b, row.dgemm, row.slice, row.products, row.combine, row.upload, row.download,
                   row.cpu, static_cast<long long>(row.recomputed), static_cast<long long>(row.checked),
                   static_cast<long long>(row.mismatches), static_cast<long long>(s.products));
      if (row.mismatches > 0) return 1;
    }
  cublasDestroy(handle);
  return 0;
}
