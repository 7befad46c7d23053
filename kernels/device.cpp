#include "kernels/device.hpp"

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "kernels/kernel.hpp"

#if ULPGATE_HAVE_CUDA
#include <dlfcn.h>

#include "core/staged_copy.hpp"
#include "kernels/cuda_check.hpp"
#endif

namespace ulpgate {

#if ULPGATE_HAVE_CUDA

void throw_call_failed(const char* call, const std::string& status, const char* file, int line) {
  throw KernelError(fmt::format("{} failed: {} ({}:{})", call, status, file, line));
}

namespace {

// The device's default memory pool keeps up to this much freed memory for reuse instead of
// giving it back at every synchronisation (its default threshold is 0).
constexpr std::uint64_t kPoolKeepBytes = std::uint64_t{4} << 30;

void keep_pool_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    cudaMemPool_t pool;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
      std::uint64_t keep = kPoolKeepBytes;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
  });
}

}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes, void* stream) : bytes_(bytes), stream_(stream) {
  if (!bytes) return;
  if (stream_) {
    keep_pool_memory();
    ULPGATE_CHECK(cudaMallocAsync(&p_, bytes, static_cast<cudaStream_t>(stream)));
  } else {
    ULPGATE_CHECK(cudaMalloc(&p_, bytes));
  }
}
void DeviceBuffer::release() noexcept {
  if (!p_) return;
  if (stream_) cudaFreeAsync(p_, static_cast<cudaStream_t>(stream_));
  else cudaFree(p_);
  p_ = nullptr;
}
DeviceBuffer::~DeviceBuffer() { release(); }
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_, bytes_ = o.bytes_, stream_ = o.stream_;
    o.p_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

void* thread_stream() {
  // Never destroyed: a thread's stream lives as long as the process may still use it
  // (thread-exit destructors can run after the CUDA runtime has shut down).
  thread_local cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    ULPGATE_CHECK(cudaStreamCreate(&s));
    return s;
  }();
  return stream;
}

void* pinned_staging(std::size_t bytes) {
  if (bytes > kMaxStagingBytes) return nullptr;
  struct Staging {  // never freed, never shrunk (as thread_stream: it must outlive any use)
    void* p = nullptr;
    std::size_t bytes = 0;
  };
  thread_local Staging s;
  if (s.bytes < bytes) {
    if (s.p) cudaFreeHost(s.p);
    s.p = nullptr, s.bytes = 0;
    const std::size_t want = std::max<std::size_t>(bytes, std::size_t{1} << 20);
    ULPGATE_CHECK(cudaMallocHost(&s.p, want));
    s.bytes = want;
  }
  return s.p;
}

void copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream) {
  if (bytes) ULPGATE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream) {
  if (bytes) ULPGATE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)));
  ULPGATE_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

void wait_quietly(void* stream) noexcept { cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); }

DeviceBuffer to_device(const Tensor& t, void* stream) {
  DeviceBuffer d(t.size_bytes(), stream);
  ULPGATE_CHECK(staged_upload(d.get(), t.data(), t.size_bytes(), static_cast<cudaStream_t>(stream)));
  return d;
}

void to_host(Tensor& t, const DeviceBuffer& d, void* stream) {
  if (t.size_bytes() != d.size()) throw KernelError("to_host: size mismatch");
  ULPGATE_CHECK(staged_download(t.data(), d.get(), d.size(), static_cast<cudaStream_t>(stream)));
}

bool equals_host(const DeviceBuffer& d, const Tensor& t, void* stream) {
  if (t.size_bytes() != d.size()) return false;
  bool equal = true;
  ULPGATE_CHECK(staged_equal(d.get(), t.data(), d.size(), static_cast<cudaStream_t>(stream), equal));
  return equal;
}

StreamTimer::StreamTimer(void* stream) : stream_(stream) {
  cudaEvent_t b = nullptr, e = nullptr;
  ULPGATE_CHECK(cudaEventCreate(&b));
  if (const cudaError_t err = cudaEventCreate(&e); err != cudaSuccess) {
    cudaEventDestroy(b);
    ULPGATE_CHECK(err);
  }
  begin_ = b, end_ = e;
}
StreamTimer::~StreamTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(begin_));
  cudaEventDestroy(static_cast<cudaEvent_t>(end_));
}
void StreamTimer::start() { ULPGATE_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(begin_), static_cast<cudaStream_t>(stream_))); }
void StreamTimer::stop() { ULPGATE_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(end_), static_cast<cudaStream_t>(stream_))); }
double StreamTimer::elapsed_ms() {
  ULPGATE_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end_)));
  float ms = 0;
  ULPGATE_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin_), static_cast<cudaEvent_t>(end_)));
  return ms;
}
void device_memset(void* p, int value, std::size_t bytes, void* stream) {
  ULPGATE_CHECK(cudaMemsetAsync(p, value, bytes, static_cast<cudaStream_t>(stream)));
}

void device_synchronize(void* stream) {
  ULPGATE_CHECK(cudaGetLastError());
  if (stream) ULPGATE_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  else ULPGATE_CHECK(cudaDeviceSynchronize());
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

namespace {

// The few NVML entry points device_info() needs, declared here and looked up with dlsym:
// the toolkit ships no nvml.h here, and linking libnvidia-ml would stop every binary from
// starting on a machine without the driver. These signatures are NVML's stable C ABI.
using nvmlReturn = int;  // NVML_SUCCESS == 0
using nvmlDevice = struct nvmlDevice_st*;
constexpr unsigned kNvmlClockSm = 1;  // NVML_CLOCK_SM

class Nvml {
 public:
  Nvml() {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    const auto init = sym<nvmlReturn (*)()>("nvmlInit_v2");
    driver_version_ = sym<nvmlReturn (*)(char*, unsigned)>("nvmlSystemGetDriverVersion");
    by_pci_ = sym<nvmlReturn (*)(const char*, nvmlDevice*)>("nvmlDeviceGetHandleByPciBusId_v2");
    clock_ = sym<nvmlReturn (*)(nvmlDevice, unsigned, unsigned*)>("nvmlDeviceGetClockInfo");
    shutdown_ = sym<nvmlReturn (*)()>("nvmlShutdown");
    ok_ = init && shutdown_ && init() == 0;
  }
  ~Nvml() {
    if (ok_) shutdown_();
    if (lib_) ::dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  std::string driver_version() const {
    char v[96] = {};
    if (!ok_ || !driver_version_ || driver_version_(v, sizeof v) != 0) return "";
    return v;
  }
  /// Current SM clock in MHz of the device at this PCI bus id; 0 when unknown.
  std::int64_t sm_clock_mhz(const char* pci_bus_id) const {
    nvmlDevice d = nullptr;
    unsigned mhz = 0;
    if (!ok_ || !by_pci_ || !clock_ || by_pci_(pci_bus_id, &d) != 0 || clock_(d, kNvmlClockSm, &mhz) != 0) return 0;
    return mhz;
  }

 private:
  template <class F>
  F sym(const char* name) const {
    return reinterpret_cast<F>(::dlsym(lib_, name));
  }
  void* lib_ = nullptr;
  bool ok_ = false;
  nvmlReturn (*driver_version_)(char*, unsigned) = nullptr;
  nvmlReturn (*by_pci_)(const char*, nvmlDevice*) = nullptr;
  nvmlReturn (*clock_)(nvmlDevice, unsigned, unsigned*) = nullptr;
  nvmlReturn (*shutdown_)() = nullptr;
};

std::string cuda_version_text(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }

}  // namespace

DeviceInfo device_info() {
  DeviceInfo info;
  info.description = device_description();
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) info.cuda_runtime = cuda_version_text(runtime);
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    info.cublas = fmt::format("{}.{}.{}", major, minor, patch);
  const Nvml nvml;
  const std::string nvml_driver = nvml.driver_version();
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  if (have_driver) {
    info.driver = nvml_driver.empty() ? "CUDA " + cuda_version_text(driver)
                                      : fmt::format("{} (CUDA {})", nvml_driver, cuda_version_text(driver));
  } else {
    info.driver = nvml_driver;
  }
  int n = 0, dev = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaGetDevice(&dev) != cudaSuccess) return info;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return info;
  info.present = true;
  info.name = p.name;
  info.arch = fmt::format("sm_{}{}", p.major, p.minor);
  info.sm_count = p.multiProcessorCount;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) == cudaSuccess) info.sm_clock_mhz = nvml.sm_clock_mhz(bus);
  return info;
}

#else

namespace {
[[noreturn]] void no_cuda() { throw KernelError("ulpgate was built without CUDA"); }
}  // namespace
DeviceBuffer::DeviceBuffer(std::size_t, void*) { no_cuda(); }
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::release() noexcept {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
void* thread_stream() { no_cuda(); }
void* pinned_staging(std::size_t) { no_cuda(); }
void copy_to_device(void*, const void*, std::size_t, void*) { no_cuda(); }
void copy_to_host(void*, const void*, std::size_t, void*) { no_cuda(); }
void wait_quietly(void*) noexcept {}
DeviceBuffer to_device(const Tensor&, void*) { no_cuda(); }
void to_host(Tensor&, const DeviceBuffer&, void*) { no_cuda(); }
bool equals_host(const DeviceBuffer&, const Tensor&, void*) { no_cuda(); }
void device_synchronize(void*) { no_cuda(); }
StreamTimer::StreamTimer(void* stream) : stream_(stream) { no_cuda(); }
StreamTimer::~StreamTimer() = default;
void StreamTimer::start() { no_cuda(); }
void StreamTimer::stop() { no_cuda(); }
double StreamTimer::elapsed_ms() { no_cuda(); }
void device_memset(void*, int, std::size_t, void*) { no_cuda(); }
std::string device_description() { return "built without CUDA"; }
DeviceInfo device_info() {
  DeviceInfo info;
  info.description = device_description();
  return info;
}

#endif

}  // namespace ulpgate
