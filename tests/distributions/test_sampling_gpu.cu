// Per-element sampling gives the same bits on the GPU as on the CPU (label gpu): every
// family and modifier, plus the hand-written log / exp / sincos on wide input ranges.
// Built with --fmad=false as a second guard; sampling.hpp already uses the _rn intrinsics,
// which are never contracted.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "distributions/sampling.hpp"

using namespace ulpgate;
using namespace ulpgate::sampling;

namespace {

__global__ void sample_kernel(Sampler s, std::uint64_t seed, std::uint32_t stream, std::uint64_t first,
                              std::uint64_t channels, std::size_t n, double* out) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = sample(s, seed, stream, first + i, (first + i) % channels);
}

// Inputs spread over the whole positive double range, subnormals included:
// x_i = (1 + i/n) 2^e with e = (i mod 2098) - 1074, formed exactly in two power-of-two steps.
__host__ __device__ double helper_input(std::size_t i, std::size_t n) {
  const double m = 1.0 + static_cast<double>(i) / static_cast<double>(n);
  const int e = static_cast<int>(i % 2098) - 1074;
  const int e1 = e / 2, e2 = e - e1;
  return m * pow2(e1) * pow2(e2);
}

__global__ void helpers_kernel(std::size_t n, double* out) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const double x = helper_input(i, n);
    double s, c;
    sincos_turns(static_cast<double>(i) / static_cast<double>(n), s, c);
    out[4 * i + 0] = log_pos(x);
    out[4 * i + 1] = exp_rn((static_cast<double>(i) / static_cast<double>(n) - 0.5) * 1500.0);
    out[4 * i + 2] = s;
    out[4 * i + 3] = c;
  }
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(call)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (call);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_); \
  } while (0)

struct Named {
  std::string name;
  Sampler s;
};

std::vector<Named> every_family() {
  auto make = [](Kind k, double a, double b, double c = 0, double d = 0) {
    Sampler s;
    s.kind = k, s.a = a, s.b = b, s.c = c, s.d = d;
    return s;
  };
  std::vector<Named> v = {
      {"uniform", make(Kind::Uniform, -9, 9)},
      {"normal", make(Kind::Normal, 0.5, 3)},
      {"lognormal", make(Kind::LogNormal, 0, 2)},
      {"student_t(3)", make(Kind::StudentT, 3, 1)},
      {"student_t(0.7)", make(Kind::StudentT, 0.7, 2)},
      {"cauchy", make(Kind::Cauchy, 1, 0.5)},
      {"activations", make(Kind::Activations, 1, 0.05, 20)},
      {"softmax weights", make(Kind::SoftmaxWeight, 2, 0)},
      {"sparse", make(Kind::Sparse, 0.1, 1)},
      {"relu", make(Kind::Relu, 0, 1)},
      {"positive", make(Kind::Positive, 0, 1)},
      {"near_overflow", make(Kind::NearOverflow, 0.25 * 448, 448)},
      {"subnormal fp16", make(Kind::Subnormal, 0.5, 0x1p-24, 1024, 0x1p-14)},
      {"subnormal fp64", make(Kind::Subnormal, 0.5, 0x1p-1074, 0x1p52, 0x1p-1022)},
      {"exact", make(Kind::Exact, 8, 0.25)},
  };
  Sampler mods = make(Kind::Normal, 0, 1);
  mods.outlier_rate = 0.01, mods.outlier_scale = 100, mods.nan_rate = 0.01, mods.inf_rate = 0.01,
  mods.negzero_rate = 0.01;
  v.push_back({"outliers+specials", mods});
  return v;
}

}  // namespace

TEST(SamplingGpu, EveryFamilyBitIdenticalToCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::size_t n = std::size_t{1} << 21;
  const std::uint64_t first = (std::uint64_t{1} << 32) - 4096;  // crosses the 32-bit counter boundary
  double* d_out = nullptr;
  CUDA_OK(cudaMalloc(&d_out, n * sizeof(double)));
  std::vector<double> gpu(n);
  std::size_t compared = 0;
  for (const Named& f : every_family())
    for (std::uint64_t seed : {std::uint64_t{1}, std::uint64_t{0xDEADBEEFCAFEF00Dull}})
      for (int grid : {13, 2048}) {
        sample_kernel<<<grid, 256>>>(f.s, seed, 1u, first, 4096, n, d_out);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(gpu.data(), d_out, n * sizeof(double), cudaMemcpyDeviceToHost));
        std::size_t mismatches = 0, first_bad = n;
        for (std::size_t i = 0; i < n; ++i) {
          const double cpu = sample(f.s, seed, 1u, first + i, (first + i) % 4096);
          if (std::memcmp(&cpu, &gpu[i], sizeof cpu) != 0) {
            if (!mismatches) first_bad = i;
            ++mismatches;
          }
        }
        EXPECT_EQ(mismatches, 0u) << f.name << " seed " << seed << ": first at index " << first_bad
                                  << " cpu " << sample(f.s, seed, 1u, first + first_bad, (first + first_bad) % 4096)
                                  << " gpu " << gpu[first_bad < n ? first_bad : 0];
        compared += n;
      }
  cudaFree(d_out);
  std::printf("[ sampling ] %zu samples over %zu family configurations bit-identical on GPU and CPU\n",
              compared, every_family().size());
}

TEST(SamplingGpu, HelpersBitIdenticalToCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::size_t n = std::size_t{1} << 22;
  double* d_out = nullptr;
  CUDA_OK(cudaMalloc(&d_out, 4 * n * sizeof(double)));
  helpers_kernel<<<1024, 256>>>(n, d_out);
  CUDA_OK(cudaGetLastError());
  std::vector<double> gpu(4 * n);
  CUDA_OK(cudaMemcpy(gpu.data(), d_out, 4 * n * sizeof(double), cudaMemcpyDeviceToHost));
  cudaFree(d_out);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = helper_input(i, n);
    double s, c;
    sincos_turns(static_cast<double>(i) / static_cast<double>(n), s, c);
    const double cpu[4] = {log_pos(x), exp_rn((static_cast<double>(i) / static_cast<double>(n) - 0.5) * 1500.0), s, c};
    for (int k = 0; k < 4; ++k)
      if (std::memcmp(&cpu[k], &gpu[4 * i + k], sizeof(double)) != 0 && mismatches++ < 5)
        ADD_FAILURE() << "helper " << k << " at i = " << i << ": cpu " << cpu[k] << " gpu " << gpu[4 * i + k];
  }
  EXPECT_EQ(mismatches, 0u);
  std::printf("[ sampling ] log/exp/sincos: %zu inputs each bit-identical on GPU and CPU\n", n);
}
