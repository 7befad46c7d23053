// The one checking macro for CUDA runtime, cuBLAS and cuBLASLt calls: a failure throws
// KernelError naming the call, the status, the file and the line.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/kernel.hpp"

namespace ulpgate {

[[noreturn]] void throw_call_failed(const char* call, const std::string& status, const char* file, int line);

inline void check_status(cudaError_t s, const char* call, const char* file, int line) {
  if (s != cudaSuccess) throw_call_failed(call, cudaGetErrorString(s), file, line);
}
inline void check_status(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_call_failed(call, cublasGetStatusString(s), file, line);
}

}  // namespace ulpgate

#define ULPGATE_CHECK(call)                                            \
  do {                                                                 \
    ::ulpgate::check_status((call), #call, __FILE__, __LINE__);        \
  } while (0)
