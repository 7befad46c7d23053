// planted.illegal_address (test equipment): every thread stores 2^40 elements past D, far
// outside any allocation, so the launch ends in cudaErrorIllegalAddress: a sticky error
// that poisons the CUDA context of the process, which the isolation worker must detect.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "ulpgate/plugin.h"

namespace {

// The offset is a parameter so that nothing about the address is known at compile time.
__global__ void store_out_of_bounds(float* d, std::int64_t offset) {
  volatile float* target = d + offset + threadIdx.x;
  *target = 1.0f;
}

}  // namespace

int planted_illegal_address(const ulpgate_gemm_problem* g, void* stream, char* err, size_t err_size) {
  std::fputs("planted.illegal_address: storing 2^40 elements past D\n", stderr);
  store_out_of_bounds<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<float*>(g->d),
                                                                        std::int64_t{1} << 40);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_size, "launch: %s", cudaGetErrorString(e));
    return 1;
  }
  // No synchronisation here: the runner's cudaDeviceSynchronize meets the fault, as it
  // would with a real kernel's asynchronous bug.
  return 0;
}
