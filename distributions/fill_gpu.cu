// Per-element sampling on the GPU for large operands (fill.cpp). sampling.hpp's arithmetic
// is correctly rounded on both sides (the _rn intrinsics here, never contracted; this file
// is also built with --fmad=false), so the values are the CPU's bit for bit
// (tests/distributions/test_fill_gpu.cpp checks every family).
#include "distributions/fill_gpu.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

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

template <class Word>
__global__ void sample_store_kernel(sampling::Sampler s, std::uint64_t seed, std::uint32_t stream, std::int64_t first,
                                    std::int64_t n, std::int64_t channel_stride, std::int64_t channels, RneFormat f,
                                    Word* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t idx = first + i;
    const double v = sampling::sample(s, seed, stream, static_cast<std::uint64_t>(idx),
                                      static_cast<std::uint64_t>((idx / channel_stride) % channels));
    out[i] = static_cast<Word>(rne_storage(f, v));
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

bool gpu_sample_store(const sampling::Sampler& s, std::uint64_t seed, std::uint32_t stream, std::int64_t n,
                      std::int64_t channel_stride, std::int64_t channels, const RneFormat& format, int word_bytes,
                      void* out) {
  if (!gpu_fill_available() || (word_bytes != 1 && word_bytes != 2 && word_bytes != 4)) return false;
  // Chunks of 2^26 values in two device buffers: chunk c + 1 is sampled while chunk c is
  // copied out (one stream: the copy of c and the kernel of c + 1 are ordered by events).
  constexpr std::int64_t kChunk = std::int64_t{1} << 26;
  const auto bytes = static_cast<std::size_t>(std::min(n, kChunk)) * static_cast<std::size_t>(word_bytes);
  cudaStream_t compute = nullptr, copy = nullptr;
  cudaEvent_t sampled[2] = {}, copied[2] = {};
  void* dev[2] = {};
  bool ok = cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess &&
            cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking) == cudaSuccess;
  for (int b = 0; ok && b < 2; ++b)
    ok = cudaEventCreateWithFlags(&sampled[b], cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&copied[b], cudaEventDisableTiming) == cudaSuccess &&
         cudaMallocAsync(&dev[b], bytes, compute) == cudaSuccess;
  auto* host = static_cast<std::byte*>(out);
  std::int64_t chunk = 0;
  for (std::int64_t first = 0; ok && first < n; first += kChunk, ++chunk) {
    const int b = static_cast<int>(chunk % 2);
    const std::int64_t m = std::min(kChunk, n - first);
    const auto grid = static_cast<unsigned>(std::min<std::int64_t>((m + 255) / 256, 8192));
    if (chunk >= 2) ok = cudaStreamWaitEvent(compute, copied[b], 0) == cudaSuccess;  // buffer b is free again
    if (word_bytes == 1)
      sample_store_kernel<<<grid, 256, 0, compute>>>(s, seed, stream, first, m, channel_stride, channels, format,
                                                    static_cast<std::uint8_t*>(dev[b]));
    else if (word_bytes == 2)
      sample_store_kernel<<<grid, 256, 0, compute>>>(s, seed, stream, first, m, channel_stride, channels, format,
                                                    static_cast<std::uint16_t*>(dev[b]));
    else
      sample_store_kernel<<<grid, 256, 0, compute>>>(s, seed, stream, first, m, channel_stride, channels, format,
                                                    static_cast<std::uint32_t*>(dev[b]));
    ok = ok && cudaGetLastError() == cudaSuccess && cudaEventRecord(sampled[b], compute) == cudaSuccess &&
         cudaStreamWaitEvent(copy, sampled[b], 0) == cudaSuccess &&
         cudaMemcpyAsync(host + static_cast<std::size_t>(first) * static_cast<std::size_t>(word_bytes), dev[b],
                         static_cast<std::size_t>(m) * static_cast<std::size_t>(word_bytes), cudaMemcpyDeviceToHost,
                         copy) == cudaSuccess &&
         cudaEventRecord(copied[b], copy) == cudaSuccess;
  }
  ok = cudaStreamSynchronize(copy) == cudaSuccess && cudaStreamSynchronize(compute) == cudaSuccess && ok;
  for (int b = 0; b < 2; ++b) {
    if (dev[b]) cudaFreeAsync(dev[b], compute);
    if (sampled[b]) cudaEventDestroy(sampled[b]);
    if (copied[b]) cudaEventDestroy(copied[b]);
  }
  if (compute) cudaStreamSynchronize(compute), cudaStreamDestroy(compute);
  if (copy) cudaStreamDestroy(copy);
  return ok;
}

}  // namespace ulpgate::detail
