// Test equipment: kernels at the edges of the plugin contract (include/ulpgate/plugin.h).
//   planted_edge.unterminated     fills the whole `why` / `err` buffer with no terminating
//                                 NUL: supports() for any non-FP32 case, run() always
//   planted_edge.forks_and_hangs  forks a helper that sleeps (in the worker's process group),
//                                 writes its pid to $PLANTED_CHILD_PID_FILE, then hangs
//   planted_edge.device           a device-memory kernel with no device code: on a machine
//                                 without a CUDA device it must never be run
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ulpgate/plugin.h"

namespace {

bool fp32_gemm(const ulpgate_problem* p) {
  if (p->struct_size < sizeof(ulpgate_problem) || p->op != ULPGATE_OP_GEMM) return false;
  const ulpgate_gemm_problem& g = p->gemm;
  return g.type_a == ULPGATE_FP32 && g.type_b == ULPGATE_FP32 && g.type_d == ULPGATE_FP32 &&
         g.type_compute == ULPGATE_FP32 && (g.beta == 0 || g.type_c == ULPGATE_FP32) && g.epilogue == ULPGATE_EPI_NONE;
}

int supports_fp32_gemm(const ulpgate_problem* p, char* why, size_t why_size) {
  if (fp32_gemm(p)) return 1;
  std::snprintf(why, why_size, "FP32 GEMM without epilogue only");
  return 0;
}

int supports_unterminated(const ulpgate_problem* p, char* why, size_t why_size) {
  if (fp32_gemm(p)) return 1;
  std::memset(why, 'W', why_size);  // every byte, no NUL
  return 0;
}

int run_unterminated(const ulpgate_problem*, char* err, size_t err_size) {
  std::memset(err, 'E', err_size);  // every byte, no NUL
  return 7;
}

int run_forks_and_hangs(const ulpgate_problem*, char*, size_t) {
  const pid_t child = ::fork();
  if (child == 0) {
    for (;;) ::pause();
  }
  if (const char* f = std::getenv("PLANTED_CHILD_PID_FILE")) {
    const std::string tmp = std::string(f) + ".tmp";
    if (FILE* out = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(out, "%d\n", static_cast<int>(child));
      std::fclose(out);
      std::rename(tmp.c_str(), f);
    }
  }
  for (;;) ::pause();
}

int run_device(const ulpgate_problem*, char* err, size_t err_size) {
  std::snprintf(err, err_size, "planted_edge.device ran (it has no device code)");
  return 1;
}

const ulpgate_kernel kKernels[] = {
    {"planted_edge.unterminated", "test equipment: messages without a terminating NUL", ULPGATE_HOST_MEMORY, 1,
     supports_unterminated, run_unterminated},
    {"planted_edge.forks_and_hangs", "test equipment: forks a sleeping helper, then hangs", ULPGATE_HOST_MEMORY, 1,
     supports_fp32_gemm, run_forks_and_hangs},
    {"planted_edge.device", "test equipment: device memory, no device code", ULPGATE_DEVICE_MEMORY, 1,
     supports_fp32_gemm, run_device},
};

const ulpgate_plugin kPlugin = {ULPGATE_PLUGIN_ABI_VERSION, sizeof kKernels / sizeof kKernels[0], kKernels};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ulpgate_plugin* ulpgate_plugin_entry(void) { return &kPlugin; }
