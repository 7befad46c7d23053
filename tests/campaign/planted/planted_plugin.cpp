// Test equipment: a plugin of kernels that misbehave on purpose, for the isolation tests
// (tests/campaign/test_isolate.cpp). Written against include/ulpgate/plugin.h only.
//   planted.segfault         writes through a null pointer (SIGSEGV)
//   planted.abort            calls abort() (SIGABRT)
//   planted.hang             sleeps forever (the timeout must end it)
//   planted.exit             calls _exit(3) in the middle of the case
//   planted.noisy            prints garbage to stdout (and a fake protocol line), then
//                            computes correctly: sequential FMA in FP32, as cpu.fp32_seq
//   planted.illegal_address  device: a CUDA kernel writing far out of bounds (CUDA builds)
//   planted.release          a correct kernel whose accuracy can regress: pairwise summation
//                            of FP32 products, or (PLANTED_REGRESSION=1 in its environment)
//                            sequential FMA, still within tolerance but with larger errors
//                            (the release-workflow test gates the one against the other)
//   planted.supports_segfault  its supports() writes through a null pointer
//   planted.supports_hang      its supports() sleeps forever
// Each says on stderr what it is about to do, so the tests can check that a crash message
// carries the tail of the worker's stderr. All take FP32 GEMMs without epilogue.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ulpgate/plugin.h"

#ifdef PLANTED_WITH_CUDA
int planted_illegal_address(const ulpgate_gemm_problem* g, void* stream, char* err, size_t err_size);
#endif

namespace {

// Read through a volatile pointer, so the compiler cannot see it is null and turn the
// store into a trap instruction (SIGILL) instead of the SIGSEGV the test expects.
int* volatile g_null_target = nullptr;

int supports_fp32_gemm(const ulpgate_problem* p, char* why, size_t why_size) {
  if (p->struct_size < sizeof(ulpgate_problem) || p->op != ULPGATE_OP_GEMM) {
    std::snprintf(why, why_size, "GEMM only");
    return 0;
  }
  const ulpgate_gemm_problem& g = p->gemm;
  if (g.type_a != ULPGATE_FP32 || g.type_b != ULPGATE_FP32 || g.type_d != ULPGATE_FP32 ||
      g.type_compute != ULPGATE_FP32 || (g.beta != 0 && g.type_c != ULPGATE_FP32) || g.epilogue != ULPGATE_EPI_NONE) {
    std::snprintf(why, why_size, "FP32 A, B, C, D and compute, no epilogue");
    return 0;
  }
  return 1;
}

inline int64_t at(const ulpgate_gemm_problem& g, int64_t ld, int64_t r, int64_t c) {
  return g.layout == ULPGATE_ROW_MAJOR ? r * ld + c : c * ld + r;
}

// The correct answer, as cpu.fp32_seq computes it: FMA along k in order, then alpha, beta.
void sgemm(const ulpgate_gemm_problem& g) {
  const float* A = static_cast<const float*>(g.a);
  const float* B = static_cast<const float*>(g.b);
  const float* C = static_cast<const float*>(g.c);
  float* D = static_cast<float*>(g.d);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < g.k; ++k) {
          const float x = A[b * g.batch_stride_a + (g.trans_a ? at(g, g.lda, k, i) : at(g, g.lda, i, k))];
          const float y = B[b * g.batch_stride_b + (g.trans_b ? at(g, g.ldb, j, k) : at(g, g.ldb, k, j))];
          acc = std::fma(x, y, acc);
        }
        float v = static_cast<float>(g.alpha) * acc;
        if (g.beta != 0) v = std::fma(static_cast<float>(g.beta), C[b * g.batch_stride_c + at(g, g.ldc, i, j)], v);
        D[b * g.batch_stride_d + at(g, g.ldd, i, j)] = v;
      }
}

// Pairwise (tree) summation of the rounded products x_k y_k: error growth log2(K).
float pairwise(const float* p, int64_t n) {
  if (n == 1) return p[0];
  const int64_t h = n / 2;
  return pairwise(p, h) + pairwise(p + h, n - h);
}

int run_release(const ulpgate_problem* p, char*, size_t) {
  const ulpgate_gemm_problem& g = p->gemm;
  const char* regress = std::getenv("PLANTED_REGRESSION");
  if ((regress && *regress == '1') || g.k == 0) {
    sgemm(g);
    return 0;
  }
  const float* A = static_cast<const float*>(g.a);
  const float* B = static_cast<const float*>(g.b);
  const float* C = static_cast<const float*>(g.c);
  float* D = static_cast<float*>(g.d);
  std::string buf(static_cast<std::size_t>(g.k) * sizeof(float), '\0');
  float* prod = reinterpret_cast<float*>(buf.data());
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t k = 0; k < g.k; ++k)
          prod[k] = A[b * g.batch_stride_a + (g.trans_a ? at(g, g.lda, k, i) : at(g, g.lda, i, k))] *
                    B[b * g.batch_stride_b + (g.trans_b ? at(g, g.ldb, j, k) : at(g, g.ldb, k, j))];
        float v = static_cast<float>(g.alpha) * pairwise(prod, g.k);
        if (g.beta != 0) v = std::fma(static_cast<float>(g.beta), C[b * g.batch_stride_c + at(g, g.ldc, i, j)], v);
        D[b * g.batch_stride_d + at(g, g.ldd, i, j)] = v;
      }
  return 0;
}

void say(const char* what) {
  std::fputs(what, stderr);
  std::fflush(stderr);
}

int run_segfault(const ulpgate_problem*, char*, size_t) {
  say("planted.segfault: writing through a null pointer\n");
  *g_null_target = 1;
  return 0;
}

int run_abort(const ulpgate_problem*, char*, size_t) {
  say("planted.abort: calling abort()\n");
  std::abort();
}

int run_hang(const ulpgate_problem*, char*, size_t) {
  say("planted.hang: sleeping forever\n");
  for (;;) ::sleep(3600);
}

int run_exit(const ulpgate_problem*, char*, size_t) {
  say("planted.exit: calling _exit(3)\n");
  ::_exit(3);
}

int run_noisy(const ulpgate_problem* p, char*, size_t) {
  // Everything a careless kernel might print: stdio, raw writes to fd 1, a line that looks
  // like the worker protocol, a line without its newline, and more than a pipe holds.
  std::printf("planted.noisy: hello from printf {\"result\": 42}\n");
  std::fflush(stdout);
  const char fake[] = "ulpgate-worker-v1 {\"reply\": \"result\", \"result\": {\"status\": \"ok\"}, \"restart\": true}\n";
  [[maybe_unused]] ssize_t ignored = ::write(STDOUT_FILENO, fake, sizeof fake - 1);
  const std::string bulk(256 * 1024, 'x');
  std::fwrite(bulk.data(), 1, bulk.size(), stdout);
  std::printf("\nplanted.noisy: no newline at the end");
  std::fflush(stdout);
  ignored = ::write(STDERR_FILENO, bulk.data(), 64 * 1024);
  sgemm(p->gemm);
  return 0;
}

int run_error_above_k8(const ulpgate_problem* p, char* err, size_t err_size) {
  if (p->gemm.k > 8) {
    std::snprintf(err, err_size, "planted.error_above_k8: K = %lld is above 8", static_cast<long long>(p->gemm.k));
    return 5;
  }
  sgemm(p->gemm);
  return 0;
}

int supports_segfault(const ulpgate_problem*, char*, size_t) {
  say("planted.supports_segfault: supports() writing through a null pointer\n");
  *g_null_target = 1;
  return 1;
}

int supports_hang(const ulpgate_problem*, char*, size_t) {
  say("planted.supports_hang: supports() sleeping forever\n");
  for (;;) ::sleep(3600);
}

#ifdef PLANTED_WITH_CUDA
int run_illegal_address(const ulpgate_problem* p, char* err, size_t err_size) {
  return planted_illegal_address(&p->gemm, p->stream, err, err_size);
}
#endif

const ulpgate_kernel kKernels[] = {
    {"planted.segfault", "test equipment: writes through a null pointer", ULPGATE_HOST_MEMORY, 1, supports_fp32_gemm,
     run_segfault},
    {"planted.abort", "test equipment: calls abort()", ULPGATE_HOST_MEMORY, 1, supports_fp32_gemm, run_abort},
    {"planted.hang", "test equipment: sleeps forever", ULPGATE_HOST_MEMORY, 1, supports_fp32_gemm, run_hang},
    {"planted.exit", "test equipment: calls _exit(3)", ULPGATE_HOST_MEMORY, 1, supports_fp32_gemm, run_exit},
    {"planted.noisy", "test equipment: prints garbage to stdout, then computes correctly", ULPGATE_HOST_MEMORY, 1,
     supports_fp32_gemm, run_noisy},
    {"planted.release", "test equipment: pairwise FP32 GEMM; sequential with PLANTED_REGRESSION=1", ULPGATE_HOST_MEMORY, 1,
     supports_fp32_gemm, run_release},
    {"planted.error_above_k8", "test equipment: returns an error when K > 8, else pairwise FP32 GEMM",
     ULPGATE_HOST_MEMORY, 1, supports_fp32_gemm, run_error_above_k8},
    {"planted.supports_segfault", "test equipment: supports() segfaults", ULPGATE_HOST_MEMORY, 1, supports_segfault,
     run_noisy},
    {"planted.supports_hang", "test equipment: supports() hangs", ULPGATE_HOST_MEMORY, 1, supports_hang, run_noisy},
#ifdef PLANTED_WITH_CUDA
    {"planted.illegal_address", "test equipment: a CUDA kernel writing far out of bounds", ULPGATE_DEVICE_MEMORY, 1,
     supports_fp32_gemm, run_illegal_address},
#endif
};

const ulpgate_plugin kPlugin = {ULPGATE_PLUGIN_ABI_VERSION, sizeof kKernels / sizeof kKernels[0], kKernels};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ulpgate_plugin* ulpgate_plugin_entry(void) { return &kPlugin; }
