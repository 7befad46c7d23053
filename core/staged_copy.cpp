#include "core/staged_copy.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

#include "core/parallel.hpp"

namespace ulpgate {
namespace {

constexpr std::size_t kChunk = std::size_t{32} << 20;  // bytes per DMA

// This thread's two page-locked chunk buffers and the events that free them, made on first
// use and never released (as thread_stream: the CUDA runtime may be gone at thread exit).
struct Staging {
  void* host[2] = {};
  cudaEvent_t done[2] = {};
  cudaError_t status = cudaSuccess;
  Staging() {
    for (int b = 0; status == cudaSuccess && b < 2; ++b) {
      status = cudaHostAlloc(&host[b], kChunk, cudaHostAllocDefault);
      if (status == cudaSuccess) status = cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming);
    }
  }
};

Staging& staging() {
  thread_local Staging* s = new Staging;
  return *s;
}

std::size_t chunk_bytes(std::size_t bytes, std::size_t c) { return std::min(kChunk, bytes - c * kChunk); }

// The error after letting the stream finish: a staging buffer may be refilled only once no
// DMA reads or writes it.
cudaError_t fail(cudaError_t e, cudaStream_t s) {
  cudaStreamSynchronize(s);
  return e;
}

#define STAGED_TRY(call)                        \
  do {                                          \
    const cudaError_t e_ = (call);              \
    if (e_ != cudaSuccess) return fail(e_, s);  \
  } while (0)

// Device chunks into the staging buffers, each handed to take(chunk, staged bytes, length)
// once it has arrived, while the DMA of the next one runs; take returns false to stop early.
template <class Take>
cudaError_t download_chunks(const void* dev, std::size_t bytes, cudaStream_t s, Take&& take) {
  Staging& st = staging();
  if (st.status != cudaSuccess) return st.status;
  const std::size_t chunks = (bytes + kChunk - 1) / kChunk;
  const auto issue = [&](std::size_t c) {
    const int b = static_cast<int>(c % 2);
    const cudaError_t e = cudaMemcpyAsync(st.host[b], static_cast<const std::byte*>(dev) + c * kChunk,
                                          chunk_bytes(bytes, c), cudaMemcpyDeviceToHost, s);
    return e != cudaSuccess ? e : cudaEventRecord(st.done[b], s);
  };
  if (chunks) STAGED_TRY(issue(0));
  for (std::size_t c = 0; c < chunks; ++c) {
    // buffer (c + 1) % 2 last held chunk c - 1, taken in the previous round
    if (c + 1 < chunks) STAGED_TRY(issue(c + 1));
    const int b = static_cast<int>(c % 2);
    STAGED_TRY(cudaEventSynchronize(st.done[b]));
    if (!take(c, static_cast<const std::byte*>(st.host[b]), chunk_bytes(bytes, c))) break;
  }
  return cudaStreamSynchronize(s);
}

}  // namespace

cudaError_t staged_upload(void* dev, const void* host, std::size_t bytes, cudaStream_t s) {
  if (bytes < kStagedCopyMinBytes) {
    STAGED_TRY(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
    return cudaStreamSynchronize(s);
  }
  Staging& st = staging();
  if (st.status != cudaSuccess) return st.status;
  const std::size_t chunks = (bytes + kChunk - 1) / kChunk;
  for (std::size_t c = 0; c < chunks; ++c) {
    const int b = static_cast<int>(c % 2);
    if (c >= 2) STAGED_TRY(cudaEventSynchronize(st.done[b]));  // chunk c - 2 has left buffer b
    const std::size_t len = chunk_bytes(bytes, c);
    const auto* from = static_cast<const std::byte*>(host) + c * kChunk;
    auto* to = static_cast<std::byte*>(st.host[b]);
    parallel_memcpy(to, from, len);
    STAGED_TRY(cudaMemcpyAsync(static_cast<std::byte*>(dev) + c * kChunk, to, len, cudaMemcpyHostToDevice, s));
    STAGED_TRY(cudaEventRecord(st.done[b], s));
  }
  return cudaStreamSynchronize(s);
}

cudaError_t staged_download(void* host, const void* dev, std::size_t bytes, cudaStream_t s) {
  if (bytes < kStagedCopyMinBytes) {
    STAGED_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
    return cudaStreamSynchronize(s);
  }
  return download_chunks(dev, bytes, s, [&](std::size_t c, const std::byte* staged, std::size_t len) {
    parallel_memcpy(static_cast<std::byte*>(host) + c * kChunk, staged, len);
    return true;
  });
}

cudaError_t staged_equal(const void* dev, const void* host, std::size_t bytes, cudaStream_t s, bool& equal) {
  equal = true;
  return download_chunks(dev, bytes, s, [&](std::size_t c, const std::byte* staged, std::size_t len) {
    const auto* want = static_cast<const std::byte*>(host) + c * kChunk;
    std::atomic<bool> same{true};
    for_each_piece(len, [&](std::size_t at, std::size_t n) {
      if (same.load(std::memory_order_relaxed) && std::memcmp(staged + at, want + at, n) != 0) same = false;
    });
    equal = same;
    return equal;
  });
}

}  // namespace ulpgate
