// Per-element sampling on the GPU for large operands (fill.cpp). sampling.hpp's arithmetic
// is correctly rounded on both sides (the _rn intrinsics here, never contracted; this file
// is also built with --fmad=false), so the values are the CPU's bit for bit
// (tests/distributions/test_fill_gpu.cpp checks every family).
#include "distributions/fill_gpu.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <mutex>

#include "core/parallel.hpp"
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
                                    std::int64_t n, std::int64_t channel_stride, std::int64_t channels,
                                    StorageOrder order, RneFormat f, Word* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t p = first + i;  // storage position
    std::int64_t idx = 0;              // its logical index
    for (int a = 0; a < order.axes; ++a) idx += p / order.storage_stride[a] % order.dim[a] * order.logical_stride[a];
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
                      std::int64_t channel_stride, std::int64_t channels, const StorageOrder& order,
                      const RneFormat& format, int word_bytes, void* out) {
  if (!gpu_fill_available() || (word_bytes != 1 && word_bytes != 2 && word_bytes != 4)) return false;
  // Chunks of 2^24 values through two device buffers and two page-locked host buffers (a
  // copy from the device into pageable memory ran at about 1 GB/s on the H200 host): while
  // the host copies chunk c - 1 out of its page-locked buffer on several threads, the GPU
  // samples chunk c and copies it into the other one. One fill at a time per process (the
  // buffers are kept for the next).
  constexpr std::int64_t kChunk = std::int64_t{1} << 24;
  constexpr std::size_t kBytes = static_cast<std::size_t>(kChunk) * 4;
  struct Staging {
    std::mutex mutex;
    cudaStream_t compute = nullptr, copy = nullptr;
    cudaEvent_t sampled[2] = {}, copied[2] = {};
    void* dev[2] = {};
    void* host[2] = {};
    bool ok = false;
    Staging() {
      ok = cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess &&
           cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking) == cudaSuccess;
      for (int b = 0; ok && b < 2; ++b)
        ok = cudaEventCreateWithFlags(&sampled[b], cudaEventDisableTiming) == cudaSuccess &&
             cudaEventCreateWithFlags(&copied[b], cudaEventDisableTiming) == cudaSuccess &&
             cudaMalloc(&dev[b], kBytes) == cudaSuccess && cudaHostAlloc(&host[b], kBytes, cudaHostAllocDefault) == cudaSuccess;
    }
  };
  static Staging* staging = new Staging;  // never freed: the CUDA context may be gone at exit
  std::lock_guard<std::mutex> lock(staging->mutex);
  if (!staging->ok) return false;
  Staging& st = *staging;
  auto* dest = static_cast<std::byte*>(out);
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  const auto drain = [&](std::int64_t c) {  // chunk c from its page-locked buffer into out
    const int b = static_cast<int>(c % 2);
    if (cudaEventSynchronize(st.copied[b]) != cudaSuccess) return false;
    const std::size_t bytes = static_cast<std::size_t>(std::min(kChunk, n - c * kChunk)) * word_bytes;
    parallel_memcpy(dest + static_cast<std::size_t>(c * kChunk) * word_bytes, st.host[b], bytes);
    return true;
  };
  bool ok = true;
  for (std::int64_t c = 0; ok && c < chunks; ++c) {
    const int b = static_cast<int>(c % 2);
    const std::int64_t first = c * kChunk, m = std::min(kChunk, n - first);
    const auto grid = static_cast<unsigned>(std::min<std::int64_t>((m + 255) / 256, 8192));
    // dev[b] and host[b] last held chunk c - 2, copied out by then (drain(c - 2) ran).
    if (word_bytes == 1)
      sample_store_kernel<<<grid, 256, 0, st.compute>>>(s, seed, stream, first, m, channel_stride, channels, order, format,
                                                       static_cast<std::uint8_t*>(st.dev[b]));
    else if (word_bytes == 2)
      sample_store_kernel<<<grid, 256, 0, st.compute>>>(s, seed, stream, first, m, channel_stride, channels, order, format,
                                                       static_cast<std::uint16_t*>(st.dev[b]));
    else
      sample_store_kernel<<<grid, 256, 0, st.compute>>>(s, seed, stream, first, m, channel_stride, channels, order, format,
                                                       static_cast<std::uint32_t*>(st.dev[b]));
    ok = cudaGetLastError() == cudaSuccess && cudaEventRecord(st.sampled[b], st.compute) == cudaSuccess &&
         cudaStreamWaitEvent(st.copy, st.sampled[b], 0) == cudaSuccess &&
         cudaMemcpyAsync(st.host[b], st.dev[b], static_cast<std::size_t>(m) * word_bytes, cudaMemcpyDeviceToHost,
                         st.copy) == cudaSuccess &&
         cudaEventRecord(st.copied[b], st.copy) == cudaSuccess;
    if (ok && c > 0) ok = drain(c - 1);
  }
  if (ok && chunks > 0) ok = drain(chunks - 1);
  const bool idle = cudaStreamSynchronize(st.copy) == cudaSuccess && cudaStreamSynchronize(st.compute) == cudaSuccess;
  return ok && idle;
}

}  // namespace ulpgate::detail
