// Device memory for the runner: RAII buffers and copies. Built without CUDA, every call
// throws KernelError ("built without CUDA").
#pragma once

#include <cstddef>

#include "harness/core/tensor.hpp"

namespace ulpgate {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  std::size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

/// A device copy of a host tensor.
DeviceBuffer to_device(const Tensor& t);
/// Copies a device buffer back into a host tensor of the same size.
void to_host(Tensor& t, const DeviceBuffer& d);
/// Waits for the device and throws KernelError if a kernel failed (e.g. illegal address).
void device_synchronize();
/// "NVIDIA H200, driver 13.0, CUDA runtime 13.0, cuBLAS 13.0.0" (or why there is none).
std::string device_description();

}  // namespace ulpgate
