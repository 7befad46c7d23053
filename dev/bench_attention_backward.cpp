// Times the flash attention backward (kernels/attention/backward.cu) at training shapes:
// B=4, H=16, S=4096, D=128, FP16 and BF16, non-causal and causal, by CUDA events (warm-up,
// then the median of --reps runs), as TFLOP/s with FLOPs = 2.5 x the forward's 4 B H S^2 D
// (halved for causal). O and LSE come from the forward flash kernel. One line per
// configuration, and a JSON array with --json. docs/results/attention_backward.md.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kernels/attention/attention_backward.hpp"
#include "kernels/attention/launch.hpp"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Normal(0, 1) values (Box-Muller over a 64-bit LCG) as 16-bit words of the format.
std::vector<std::uint16_t> random_words(std::size_t n, bool bf16, std::uint64_t seed) {
  std::vector<std::uint16_t> out(n);
  std::uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  const auto uniform = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0;
  };
  for (std::size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
    if (bf16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(v);
      std::memcpy(&out[i], &h, 2);
    } else {
      const __half h = __float2half_rn(v);
      std::memcpy(&out[i], &h, 2);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("flash attention backward timing");
  long long batch = 4, heads = 16, seq = 4096, dim = 128;
  int reps = 25, warmup = 3;
  bool det = false, variants = false;
  std::string json;
  app.add_option("--batch", batch);
  app.add_option("--heads", heads);
  app.add_option("--seq", seq);
  app.add_option("--dim", dim)->check(CLI::IsMember({64, 128}));
  app.add_option("--reps", reps);
  app.add_option("--warmup", warmup);
  app.add_flag("--det", det, "also time the deterministic variant");
  app.add_flag("--variants", variants,
               "also time the tilings (a warp per 32 keys x 32 queries, or per 16 keys) with float4 and float2 dQ atomics "
               "(flash_attention_backward_lab; head_dim 128)");
  app.add_option("--json", json, "write the results here as JSON");
  CLI11_PARSE(app, argc, argv);

  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  const std::size_t n = static_cast<std::size_t>(batch * heads * seq * dim), rows = static_cast<std::size_t>(batch * heads * seq);
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *lse, *dsum, *acc;
  for (void** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) check(cudaMalloc(p, n * 2), "cudaMalloc");
  check(cudaMalloc(&lse, rows * 4), "cudaMalloc");
  check(cudaMalloc(&dsum, rows * 4), "cudaMalloc");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");

  std::vector<std::string> results;
  for (const bool bf16 : {false, true}) {
    std::uint64_t seed = 1;
    for (void* p : {q, k, v, dout}) {
      const auto w = random_words(n, bf16, seed++);
      check(cudaMemcpy(p, w.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    for (const bool causal : {false, true}) {
      using namespace ulpgate::attn;
      Shape s{batch, heads, seq, seq, dim, dim, 1, causal, static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim))), nullptr};
      const auto op = [&](const void* p, void* out) {
        Operand x;
        x.p = p, x.out = out, x.format = bf16 ? kBf16 : kFp16;
        x.batch = batch, x.heads = heads, x.seq = seq, x.dim = dim;
        return x;
      };
      s.lse = lse;
      check(flash_attention(s, op(q, nullptr), op(k, nullptr), op(v, nullptr), op(nullptr, o), true, stream), "forward");
      s.lse = nullptr;
      BackwardOperands io;
      io.q = op(q, nullptr), io.k = op(k, nullptr), io.v = op(v, nullptr), io.o = op(o, nullptr), io.dout = op(dout, nullptr);
      io.dq = op(nullptr, dq), io.dk = op(nullptr, dk), io.dv = op(nullptr, dv), io.lse = lse;
      const double flops = 2.5 * 4.0 * batch * heads * static_cast<double>(seq) * seq * dim / (causal ? 2 : 1);
      // Runs: the registered kernel (atomic, then deterministic with --det), then the lab variants.
      struct Run {
        std::string name;
        bool deterministic, lab, k32, quad;
      };
      std::vector<Run> runs{{"ours", false, false, false, false}};
      if (det) runs.push_back({"ours_det", true, false, false, false});
      if (variants && dim == 128)
        for (const bool k32 : {true, false})
          for (const bool quad : {true, false})
            runs.push_back({fmt::format("{}.{}", k32 ? "k32" : "k16", quad ? "f4" : "f2"), false, true, k32, quad});
      for (const Run& run : runs) {
        const bool deterministic = run.deterministic;
        const std::size_t acc_bytes = static_cast<std::size_t>(flash_backward_workspace_floats(s, deterministic)) * 4;
        if (cudaMalloc(&acc, acc_bytes) != cudaSuccess) {
          std::printf("%s %s%s: no memory for %zu bytes of dQ workspace\n", bf16 ? "bf16" : "fp16", causal ? "causal" : "non-causal",
                      deterministic ? " det" : "", acc_bytes);
          cudaGetLastError();
          continue;
        }
        std::vector<float> ms;
        for (int r = 0; r < warmup + reps; ++r) {
          check(cudaEventRecord(e0, stream), "record");
          check(run.lab ? flash_attention_backward_lab(s, io, dsum, acc, run.k32, run.quad, stream)
                        : flash_attention_backward(s, io, dsum, acc, deterministic, false, stream),
                "backward");
          check(cudaEventRecord(e1, stream), "record");
          check(cudaEventSynchronize(e1), "sync");
          float t = 0;
          check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
          if (r >= warmup) ms.push_back(t);
        }
        check(cudaFree(acc), "cudaFree");
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        const double tflops = flops / (med * 1e-3) / 1e12;
        const std::string& name = run.name;
        std::printf("%-9s %s %-10s B%lld H%lld S%lld D%lld: median %.3f ms (min %.3f, max %.3f, %d reps) %.1f TFLOP/s\n",
                    name.c_str(), bf16 ? "bf16" : "fp16", causal ? "causal" : "non-causal", batch, heads, seq, dim, med, ms.front(),
                    ms.back(), reps, tflops);
        results.push_back(fmt::format(R"({{"impl":"{}","dtype":"{}","causal":{},"batch":{},"heads":{},"seq":{},"dim":{},)"
                                      R"("median_ms":{:.4f},"min_ms":{:.4f},"reps":{},"tflops":{:.2f}}})",
                                      name, bf16 ? "bf16" : "fp16", causal, batch, heads, seq, dim, med, ms.front(), reps, tflops));
      }
    }
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) return 1;
    std::fprintf(f, "[\n");
    for (std::size_t i = 0; i < results.size(); ++i) std::fprintf(f, "  %s%s\n", results[i].c_str(), i + 1 < results.size() ? "," : "");
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
}
