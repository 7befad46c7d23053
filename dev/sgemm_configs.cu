// The shapes bench_sgemm_configs times: each one instantiation of the ladder's step-7 kernel
// (simt_warptile.cuh), so that the ladder switches to a winner by changing Step7Config's
// arguments, and the device helpers of the check against cuBLAS. CUDA C++17.
#include "dev/sgemm_configs.hpp"

#include <cmath>
#include <cstdint>

#include "kernels/gemm/simt_warptile.cuh"

namespace ulpgate::bench {
namespace {

using simt::Staging;
using simt::WarptileConfig;

template <class Cfg>
SgemmConfig config(const char* name) {
  const bool cp = Cfg::kStaging == Staging::CpAsync;
  const auto n = [](int v) { return std::to_string(v); };
  std::string shape = n(Cfg::BM) + "x" + n(Cfg::BN) + "x" + n(Cfg::BK) + " warp " + n(Cfg::WM) + "x" + n(Cfg::WN) +
                      " lane " + n(Cfg::TM) + "x" + n(Cfg::TN) + ", " + n(Cfg::kThreads) + " threads, min " +
                      n(Cfg::kMinBlocks) + " block" + (Cfg::kMinBlocks > 1 ? "s" : "") + ", " +
                      (cp ? "cp.async " + n(Cfg::kStages) + " stages" : std::string("registers 2 buffers"));
  return {name,
          shape,
          Cfg::BM,
          Cfg::BN,
          Cfg::BK,
          Cfg::WM,
          Cfg::WN,
          Cfg::TM,
          Cfg::TN,
          Cfg::kThreads,
          Cfg::kMinBlocks,
          Cfg::kStages,
          cp,
          Cfg::kSmemBytes,
          reinterpret_cast<const void*>(&simt::warptile<Cfg>),
          [](const simt::Problem& p, bool vec_a, bool vec_b, bool vec_d, cudaStream_t stream) {
            return simt::launch_warptile<Cfg>(p, vec_a, vec_b, vec_d, simt::Split{1, p.k, simt::Sink::D, nullptr, 0},
                                              stream);
          }};
}

constexpr Staging kCp = Staging::CpAsync;

// splitmix64 of (seed, i): independent of the launch shape.
__global__ void fill_uniform_kernel(float* p, float* abs_p, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float v = static_cast<float>(static_cast<std::int64_t>(z >> 40) - (1 << 23)) * 0x1p-23f;  // 24 bits: exact
    p[i] = v, abs_p[i] = fabsf(v);
  }
}

__global__ void max_normalised_diff_kernel(const float* d, const float* ref, const float* abs_ref, std::int64_t n,
                                           unsigned long long* worst) {
  unsigned long long mine = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    const float diff = fabsf(d[i] - ref[i]);
    float r = abs_ref[i] > 0 ? diff / abs_ref[i] : (diff == 0 ? 0.0f : INFINITY);
    if (!(r <= INFINITY)) r = INFINITY;  // NaN
    const unsigned long long key = static_cast<unsigned long long>(__float_as_uint(r)) << 32 | static_cast<std::uint32_t>(i);
    if (key > mine) mine = key;
  }
  atomicMax(worst, mine);  // non-negative floats order as their bits
}

}  // namespace

std::vector<SgemmConfig> sgemm_configs() {
  // None spills (ptxas -v, sm_90a, CUDA 13.0). Left out because they spill: 8 x 8 per lane
  // capped at 128 registers (MIN_BLOCKS 2 at 256 threads), BK 32 at 8 x 8, BK 16 or cp.async
  // at 8 x 16, and 4 x 8 per lane at 256 threads and MIN_BLOCKS 2.
  return {
      config<simt::Step7Config>("step7"),
      config<WarptileConfig<128, 128, 8, 64, 32, 8, 8>>("bk8"),
      config<WarptileConfig<128, 128, 16, 32, 64, 8, 8>>("w32x64"),
      config<WarptileConfig<128, 128, 16, 64, 32, 8, 8, 1, kCp, 3>>("cp3"),
      config<WarptileConfig<128, 128, 8, 64, 32, 8, 8, 1, kCp, 4>>("bk8_cp4"),
      // 8 x 16 per lane: 128 FMAs per 6 float4 reads of shared memory (8 x 8: 64 per 4)
      config<WarptileConfig<128, 128, 8, 64, 64, 8, 16, 2>>("t128_8x16"),
      config<WarptileConfig<256, 128, 8, 64, 64, 8, 16>>("256x128_8x16"),
      config<WarptileConfig<128, 256, 8, 64, 64, 8, 16>>("128x256_8x16"),
      // 8 x 4 and 4 x 8 per lane: 16 warps per SM within 128 registers
      config<WarptileConfig<128, 64, 16, 64, 16, 8, 4, 2>>("128x64_8x4"),
      config<WarptileConfig<128, 128, 16, 32, 32, 4, 8>>("t512_4x8"),
      config<WarptileConfig<128, 128, 16, 32, 32, 4, 8, 1, kCp, 3>>("t512_4x8_cp3"),
  };
}

void fill_uniform(float* p, float* abs_p, std::int64_t n, std::uint64_t seed, cudaStream_t stream) {
  fill_uniform_kernel<<<1024, 256, 0, stream>>>(p, abs_p, n, seed);
}

void max_normalised_diff(const float* d, const float* ref, const float* abs_ref, std::int64_t n,
                         unsigned long long* worst, cudaStream_t stream) {
  max_normalised_diff_kernel<<<1024, 256, 0, stream>>>(d, ref, abs_ref, n, worst);
}

}  // namespace ulpgate::bench
