// Large copies between pageable host memory and the device at page-locked speed: a plain
// cudaMemcpy with pageable memory runs at about 1 GB/s, so the bytes go through page-locked
// chunks while host threads copy or compare the previous one. See docs/dev/benchmarks.md.
//
// Only in builds with CUDA (ULPGATE_CUDA); every function returns the first CUDA error
// (cudaSuccess when none), leaving the stream idle, for the caller's own checking macro.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace ulpgate {

/// Below this size a plain cudaMemcpyAsync is as fast: the functions below use it.
inline constexpr std::size_t kStagedCopyMinBytes = std::size_t{32} << 20;

/// Host to device on `stream` (nullptr: the legacy default stream), after the stream's
/// earlier work; returns once the copy is done.
cudaError_t staged_upload(void* dev, const void* host, std::size_t bytes, cudaStream_t stream);
/// Device to host; returns once the copy is done.
cudaError_t staged_download(void* host, const void* dev, std::size_t bytes, cudaStream_t stream);
/// Whether the device bytes equal the host bytes (into `equal`), without a host copy of them.
cudaError_t staged_equal(const void* dev, const void* host, std::size_t bytes, cudaStream_t stream, bool& equal);

}  // namespace ulpgate
