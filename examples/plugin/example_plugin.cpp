// An ulpgate plugin, written against include/ulpgate/plugin.h only (no ulpgate headers):
//   example.host_sgemm    host memory, FP32 A/B/D, sequential FMA accumulation in FP32
//   example.device_sgemm  device memory, the same arithmetic as a naive CUDA kernel
// Both handle row/column layouts, transposes, leading dimensions, batch, alpha and beta.
// Build: a shared library exporting ulpgate_plugin_entry(); load with --plugin.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ulpgate/plugin.h"

#ifdef EXAMPLE_WITH_CUDA
int example_device_sgemm(const ulpgate_gemm_problem* g, void* stream, char* err, size_t err_size);
#endif

namespace {

int supports_sgemm(const ulpgate_problem* p, char* why, size_t why_size) {
  if (p->struct_size < sizeof(ulpgate_problem)) {
    std::snprintf(why, why_size, "problem struct from an older ulpgate");
    return 0;
  }
  if (p->op != ULPGATE_OP_GEMM) {
    std::snprintf(why, why_size, "GEMM only");
    return 0;
  }
  const ulpgate_gemm_problem& g = p->gemm;
  if (g.type_a != ULPGATE_FP32 || g.type_b != ULPGATE_FP32 || g.type_d != ULPGATE_FP32 ||
      g.type_compute != ULPGATE_FP32 || (g.beta != 0 && g.type_c != ULPGATE_FP32)) {
    std::snprintf(why, why_size, "FP32 A, B, C, D and compute only");
    return 0;
  }
  if (g.epilogue != ULPGATE_EPI_NONE) {
    std::snprintf(why, why_size, "no epilogues");
    return 0;
  }
  return 1;
}

// Offset of element (r, c) of a matrix stored rows x cols in the problem's layout.
inline int64_t at(const ulpgate_gemm_problem& g, int64_t ld, int64_t r, int64_t c) {
  return g.layout == ULPGATE_ROW_MAJOR ? r * ld + c : c * ld + r;
}

int run_host_sgemm(const ulpgate_problem* p, char* err, size_t err_size) {
  const ulpgate_gemm_problem& g = p->gemm;
  if (!g.a || !g.b || !g.d) {
    std::snprintf(err, err_size, "null operand pointer");
    return 1;
  }
  const float* A = static_cast<const float*>(g.a);
  const float* B = static_cast<const float*>(g.b);
  const float* C = static_cast<const float*>(g.c);
  float* D = static_cast<float*>(g.d);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < g.k; ++k) {
          const float a = A[b * g.batch_stride_a + (g.trans_a ? at(g, g.lda, k, i) : at(g, g.lda, i, k))];
          const float x = B[b * g.batch_stride_b + (g.trans_b ? at(g, g.ldb, j, k) : at(g, g.ldb, k, j))];
          acc = std::fma(a, x, acc);
        }
        // FP32 operands carry no scale (scale_a..scale_d are 1 for non-FP8, plugin.h).
        float v = static_cast<float>(g.alpha) * acc;
        if (g.beta != 0) v = std::fma(static_cast<float>(g.beta), C[b * g.batch_stride_c + at(g, g.ldc, i, j)], v);
        D[b * g.batch_stride_d + at(g, g.ldd, i, j)] = v;
      }
  return 0;
}

#ifdef EXAMPLE_WITH_CUDA
int run_device_sgemm(const ulpgate_problem* p, char* err, size_t err_size) {
  return example_device_sgemm(&p->gemm, p->stream, err, err_size);
}
#endif

const ulpgate_kernel kKernels[] = {
    {"example.host_sgemm", "example plugin: host FP32 GEMM, sequential FMA", ULPGATE_HOST_MEMORY, 1, supports_sgemm,
     run_host_sgemm},
#ifdef EXAMPLE_WITH_CUDA
    {"example.device_sgemm", "example plugin: naive CUDA FP32 GEMM, sequential FMA", ULPGATE_DEVICE_MEMORY, 1,
     supports_sgemm, run_device_sgemm},
#endif
};

const ulpgate_plugin kPlugin = {ULPGATE_PLUGIN_ABI_VERSION, sizeof kKernels / sizeof kKernels[0], kKernels};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ulpgate_plugin* ulpgate_plugin_entry(void) { return &kPlugin; }
