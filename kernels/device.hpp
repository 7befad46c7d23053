// Device memory for the runner: RAII buffers and copies. Built without CUDA, every call
// throws KernelError ("built without CUDA").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.hpp"

namespace ulpgate {

/// Device memory. With a stream, allocated and freed in that stream's order from the
/// device's memory pool (cudaMallocAsync / cudaFreeAsync: no device-wide synchronisation,
/// memory reused across cases); without one (nullptr), cudaMalloc / cudaFree.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes, void* stream = nullptr);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_), stream_(o.stream_) { o.p_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  std::size_t size() const { return bytes_; }

 private:
  void release() noexcept;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  void* stream_ = nullptr;  ///< the stream it is ordered on (pooled); nullptr: cudaMalloc
};

/// This thread's own CUDA stream (created on first use, kept for the thread's life): a
/// device kernel that is thread-safe (KernelTraits::thread_safe) runs on it, so that cases
/// checked by several threads at once overlap on the GPU. It is a blocking stream, so work
/// on the legacy default stream still orders with it.
void* thread_stream();

/// This thread's page-locked host buffer of at least `bytes` (kept and reused by the thread;
/// grown when a case needs more), or nullptr above kMaxStagingBytes: copies through it are
/// plain DMA, with no driver staging and its locks.
void* pinned_staging(std::size_t bytes);
inline constexpr std::size_t kMaxStagingBytes = std::size_t{256} << 20;
/// Copies on a stream: host to device (returns at once for page-locked src), and device to
/// host (returns once the copy, and the stream's work before it, is done).
void copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream);
void copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream);
/// Waits for a stream's work, ignoring any error (for unwinding: a staging buffer must not
/// be refilled while a copy from it may still run).
void wait_quietly(void* stream) noexcept;

/// A device copy of a host tensor (stream: nullptr, or the stream every later use of the
/// buffer is ordered on); large ones through page-locked chunks (core/staged_copy.hpp).
/// Returns once the copy is done.
DeviceBuffer to_device(const Tensor& t, void* stream = nullptr);
/// Copies a device buffer back into a host tensor of the same size; returns once the
/// copy (and the stream's work before it) is done.
void to_host(Tensor& t, const DeviceBuffer& d, void* stream = nullptr);
/// Whether a device buffer holds exactly a host tensor's bytes (no host copy made).
bool equals_host(const DeviceBuffer& d, const Tensor& t, void* stream = nullptr);
/// Waits for the device (stream nullptr) or for one stream, and throws KernelError if a
/// kernel failed (e.g. illegal address).
void device_synchronize(void* stream = nullptr);
/// Milliseconds of stream work between two points, by CUDA events: start() records the first
/// event, stop() the second; elapsed_ms() waits for the second and returns the time between.
class StreamTimer {
 public:
  explicit StreamTimer(void* stream);
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;
  void start();
  void stop();
  double elapsed_ms();

 private:
  void* stream_;
  void* begin_ = nullptr;
  void* end_ = nullptr;
};
/// Sets `bytes` of device memory to `value` on the stream (e.g. to evict the L2 cache).
void device_memset(void* p, int value, std::size_t bytes, void* stream);

/// "NVIDIA H200, driver 13.0, CUDA runtime 13.0, cuBLAS 13.0.0" (or why there is none).
std::string device_description();

/// The device a run used (device 0 of this process), for the run record's environment.
/// Fields that cannot be found out are empty (0 for the clock).
struct DeviceInfo {
  bool present = false;        ///< a CUDA device was found
  std::string description;     ///< device_description()
  std::string name;            ///< "NVIDIA H200"
  std::string arch;            ///< "sm_90"
  int sm_count = 0;
  std::string driver;          ///< NVML's driver version and the CUDA version it supports,
                               ///< "580.65.06 (CUDA 13.0)"; "CUDA 13.0" without NVML
  std::string cuda_runtime;    ///< "13.0"
  std::string cublas;          ///< "13.0.0"
  std::int64_t sm_clock_mhz = 0;  ///< current SM clock (NVML); 0 when unknown
};
/// Queries the device. NVML is loaded at run time (dlopen of libnvidia-ml.so.1), so the
/// binaries start on machines without a driver; without it driver and clock are partial.
DeviceInfo device_info();

}  // namespace ulpgate
