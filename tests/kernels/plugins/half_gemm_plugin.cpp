// Test equipment (tests/cli/test_cli.cpp): a host GEMM that takes FP16 A and B and writes
// FP16 D only, as many hand-written half kernels do; FP32 FMA accumulation, D rounded to
// nearest even once. Written against include/ulpgate/plugin.h only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "ulpgate/plugin.h"

namespace {

float from_half(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                  : e == 31 ? (m ? NAN : INFINITY)
                            : std::ldexp(static_cast<float>(m | 0x400), e - 25);
  return (h & 0x8000) ? -v : v;
}

// Round to nearest even: the significand as an integer at the binade's last bit (2^-24 for
// subnormals), rounded by nearbyint in the default mode.
uint16_t to_half(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const float a = std::fabs(f);
  if (std::isinf(a)) return sign | 0x7c00;
  const int q = std::max(a == 0 ? -14 : std::ilogb(a), -14) - 10;
  const float r = std::nearbyint(std::ldexp(a, -q));
  const double v = std::ldexp(static_cast<double>(r), q);
  if (v >= 65536) return sign | 0x7c00;
  if (v < 0x1p-14) return sign | static_cast<uint16_t>(r);
  const int e = std::ilogb(v);
  return sign | static_cast<uint16_t>((e + 15) << 10) | static_cast<uint16_t>(std::ldexp(v, 10 - e) - 1024);
}

int supports(const ulpgate_problem* p, char* why, size_t why_size) {
  if (p->struct_size < sizeof(ulpgate_problem) || p->op != ULPGATE_OP_GEMM) {
    std::snprintf(why, why_size, "GEMM only");
    return 0;
  }
  const ulpgate_gemm_problem& g = p->gemm;
  if (g.type_a != ULPGATE_FP16 || g.type_b != ULPGATE_FP16 || g.type_d != ULPGATE_FP16 ||
      g.type_compute != ULPGATE_FP32 || (g.beta != 0 && g.type_c != ULPGATE_FP16) || g.epilogue != ULPGATE_EPI_NONE) {
    std::snprintf(why, why_size, "FP16 A, B, C and D, FP32 compute, no epilogue");
    return 0;
  }
  return 1;
}

inline int64_t at(const ulpgate_gemm_problem& g, int64_t ld, int64_t r, int64_t c) {
  return g.layout == ULPGATE_ROW_MAJOR ? r * ld + c : c * ld + r;
}

int run(const ulpgate_problem* p, char*, size_t) {
  const ulpgate_gemm_problem& g = p->gemm;
  const auto* A = static_cast<const uint16_t*>(g.a);
  const auto* B = static_cast<const uint16_t*>(g.b);
  const auto* C = static_cast<const uint16_t*>(g.c);
  auto* D = static_cast<uint16_t*>(g.d);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < g.k; ++k)
          acc = std::fma(from_half(A[b * g.batch_stride_a + (g.trans_a ? at(g, g.lda, k, i) : at(g, g.lda, i, k))]),
                         from_half(B[b * g.batch_stride_b + (g.trans_b ? at(g, g.ldb, j, k) : at(g, g.ldb, k, j))]), acc);
        float v = static_cast<float>(g.alpha) * acc;
        if (g.beta != 0) v = std::fma(static_cast<float>(g.beta), from_half(C[b * g.batch_stride_c + at(g, g.ldc, i, j)]), v);
        D[b * g.batch_stride_d + at(g, g.ldd, i, j)] = to_half(v);
      }
  return 0;
}

const ulpgate_kernel kKernels[] = {
    {"test.hgemm_fp16_out", "test equipment: host GEMM, FP16 in and out only", ULPGATE_HOST_MEMORY, 1, supports, run}};
const ulpgate_plugin kPlugin = {ULPGATE_PLUGIN_ABI_VERSION, 1, kKernels};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ulpgate_plugin* ulpgate_plugin_entry(void) { return &kPlugin; }
