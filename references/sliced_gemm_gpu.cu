// The sliced path's integer products on the GPU (references/sliced_gemm_gpu.hpp). Kept
// free of the project's C++20 headers: this file compiles as CUDA C++17.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ulpgate {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("gpu_digit_gemm: ") + what + ": " + cudaGetErrorString(e));
}

// K per exact int32 sum, kInt32Chunk of sliced_gemm.hpp (2^31 / 127^2, a multiple of 4).
constexpr long long kChunkWords = 133144 / 4;

// out[i * n + j] = sum_q a[i][q] b[j][q] over rows padded to whole 4-byte words (zeros
// beyond k): int32 partial sums over kChunkWords words, added in int64. One thread per
// output element; rows i step by gridDim.y.
__global__ void digit_gemm_kernel(const int* a, const int* b, long long m, long long n, long long words,
                                  long long* out) {
  const long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  const int* y = b + j * words;
  for (long long i = blockIdx.y; i < m; i += gridDim.y) {
    const int* x = a + i * words;
    long long total = 0;
    for (long long w0 = 0; w0 < words; w0 += kChunkWords) {
      int part = 0;
      const long long end = w0 + kChunkWords < words ? w0 + kChunkWords : words;
      for (long long w = w0; w < end; ++w) part = __dp4a(x[w], y[w], part);
      total += part;
    }
    out[i * n + j] = total;
  }
}

struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(std::size_t bytes) { check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

}  // namespace

namespace detail {

void digit_gemm_gpu(const std::int8_t* a, const std::int8_t* b, std::int64_t m, std::int64_t n, std::int64_t k,
                    std::int64_t* out) {
    if (m == 0 || n == 0) return;
    const std::int64_t pitch = (k + 3) / 4 * 4;
    DeviceBytes da(static_cast<std::size_t>(m * pitch)), db(static_cast<std::size_t>(n * pitch)),
        dout(static_cast<std::size_t>(m * n) * sizeof(long long));
    check(cudaMemset(da.p, 0, static_cast<std::size_t>(m * pitch)), "cudaMemset");
    check(cudaMemset(db.p, 0, static_cast<std::size_t>(n * pitch)), "cudaMemset");
    if (k > 0) {
      check(cudaMemcpy2D(da.p, pitch, a, k, k, m, cudaMemcpyHostToDevice), "cudaMemcpy2D A");
      check(cudaMemcpy2D(db.p, pitch, b, k, k, n, cudaMemcpyHostToDevice), "cudaMemcpy2D B");
    }
    const dim3 block(128), grid(static_cast<unsigned>((n + 127) / 128), static_cast<unsigned>(m < 65535 ? m : 65535));
    digit_gemm_kernel<<<grid, block>>>(static_cast<const int*>(da.p), static_cast<const int*>(db.p), m, n, pitch / 4,
                                       static_cast<long long*>(dout.p));
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(out, dout.p, static_cast<std::size_t>(m * n) * sizeof(long long), cudaMemcpyDeviceToHost),
          "cudaMemcpy out");
    check(cudaDeviceSynchronize(), "kernel");
}

}  // namespace detail
}  // namespace ulpgate
