#include "kernels/device.hpp"

#include <fmt/format.h>

#include "kernels/kernel.hpp"

#if ULPGATE_HAVE_CUDA
#include "kernels/cuda_check.hpp"
#endif

namespace ulpgate {

#if ULPGATE_HAVE_CUDA

void throw_call_failed(const char* call, const std::string& status, const char* file, int line) {
  throw KernelError(fmt::format("{} failed: {} ({}:{})", call, status, file, line));
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes) ULPGATE_CHECK(cudaMalloc(&p_, bytes));
}
DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_, bytes_ = o.bytes_;
    o.p_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer to_device(const Tensor& t) {
  DeviceBuffer d(t.size_bytes());
  if (t.size_bytes()) ULPGATE_CHECK(cudaMemcpy(d.get(), t.data(), t.size_bytes(), cudaMemcpyHostToDevice));
  return d;
}

void to_host(Tensor& t, const DeviceBuffer& d) {
  if (t.size_bytes() != d.size()) throw KernelError("to_host: size mismatch");
  if (d.size()) ULPGATE_CHECK(cudaMemcpy(t.data(), d.get(), d.size(), cudaMemcpyDeviceToHost));
}

void device_synchronize() {
  ULPGATE_CHECK(cudaGetLastError());
  ULPGATE_CHECK(cudaDeviceSynchronize());
}

std::string device_description() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return "no CUDA device";
  int dev = 0, driver = 0, runtime = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, dev);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  return fmt::format("{} (sm_{}{}, {} SMs), CUDA driver {}.{}, runtime {}.{}, cuBLAS {}.{}.{}", p.name, p.major,
                     p.minor, p.multiProcessorCount, driver / 1000, driver % 1000 / 10, runtime / 1000,
                     runtime % 1000 / 10, major, minor, patch);
}

#else

namespace {
[[noreturn]] void no_cuda() { throw KernelError("ulpgate was built without CUDA"); }
}  // namespace
DeviceBuffer::DeviceBuffer(std::size_t) { no_cuda(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
DeviceBuffer to_device(const Tensor&) { no_cuda(); }
void to_host(Tensor&, const DeviceBuffer&) { no_cuda(); }
void device_synchronize() { no_cuda(); }
std::string device_description() { return "built without CUDA"; }

#endif

}  // namespace ulpgate
