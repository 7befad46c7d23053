// Per-element sampling on the GPU for large operands (fill.cpp). sampling.hpp's arithmetic
// is correctly rounded on both sides (the _rn intrinsics here, never contracted; this file
// is also built with --fmad=false), so the values are the CPU's bit for bit
// (tests/distributions/test_fill_gpu.cpp checks every family).
#include "distributions/fill_gpu.hpp"

#include <cuda_runtime.h>

#include "distributions/sampling.hpp"

namespace ulpgate::detail {
namespace {

__global__ void sample_kernel(sampling::Sampler s, std::uint64_t seed, std::uint32_t stream, std::int64_t first,
                              std::int64_t n, std::int64_t channel_stride, std::int64_t channels, double* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t idx = first + i;
    out[i] = sampling::sample(s, seed, stream, static_cast<std::uint64_t>(idx),
                              static_cast<std::uint64_t>((idx / channel_stride) % channels));
  }
}

}  // namespace

bool gpu_fill_available() {
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
}

bool gpu_sample_range(const sampling::Sampler& s, std::uint64_t seed, std::uint32_t stream, std::int64_t n,
                      std::int64_t channel_stride, std::int64_t channels, double* out) {
  if (!gpu_fill_available()) return false;
  // In chunks of 2^25 values (256 MB of device memory), each copied straight into `out`.
  constexpr std::int64_t kChunk = std::int64_t{1} << 25;
  cudaStream_t st = nullptr;
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return false;
  double* dev = nullptr;
  bool ok = cudaMallocAsync(&dev, static_cast<std::size_t>(std::min(n, kChunk)) * sizeof(double), st) == cudaSuccess;
  for (std::int64_t first = 0; ok && first < n; first += kChunk) {
    const std::int64_t m = std::min(kChunk, n - first);
    sample_kernel<<<static_cast<unsigned>(std::min<std::int64_t>((m + 255) / 256, 4096)), 256, 0, st>>>(
        s, seed, stream, first, m, channel_stride, channels, dev);
    ok = cudaGetLastError() == cudaSuccess &&
         cudaMemcpyAsync(out + first, dev, static_cast<std::size_t>(m) * sizeof(double), cudaMemcpyDeviceToHost, st) ==
             cudaSuccess &&
         cudaStreamSynchronize(st) == cudaSuccess;
  }
  if (dev) cudaFreeAsync(dev, st);
  cudaStreamSynchronize(st);
  cudaStreamDestroy(st);
  return ok;
}

}  // namespace ulpgate::detail
