// The counter-based RNG gives the same bits on the GPU as on the CPU (label gpu).
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <vector>

#include "core/rng.hpp"

using namespace ulpgate;

namespace {

__global__ void fill(std::uint64_t seed, std::uint32_t stream, std::uint64_t first, std::size_t n,
                     RandomBlock* out, double* unit) {
  // Grid-stride loop: each element's bits depend only on its index, not on the thread.
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = random_block(seed, stream, first + i);
    unit[i] = to_unit_closed_open(low64(out[i]));
  }
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(call)                                                             \
  do {                                                                            \
    const cudaError_t e_ = (call);                                                \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);        \
  } while (0)

}  // namespace

TEST(RngGpu, BitIdenticalToCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::size_t n = std::size_t{1} << 24;
  const std::uint64_t seeds[] = {0, 42, 0xDEADBEEFCAFEF00Dull};
  const std::uint64_t first = (std::uint64_t{1} << 32) - 1000;  // crosses the 32-bit boundary
  RandomBlock* d_blocks = nullptr;
  double* d_unit = nullptr;
  CUDA_OK(cudaMalloc(&d_blocks, n * sizeof(RandomBlock)));
  CUDA_OK(cudaMalloc(&d_unit, n * sizeof(double)));
  std::vector<RandomBlock> blocks(n);
  std::vector<double> unit(n);
  std::size_t compared = 0;
  for (std::uint64_t seed : seeds)
    for (std::uint32_t stream : {0u, 5u}) {
      for (int grid : {7, 1024}) {  // two launch shapes: the bits must not care
        fill<<<grid, 256>>>(seed, stream, first, n, d_blocks, d_unit);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(blocks.data(), d_blocks, n * sizeof(RandomBlock), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(unit.data(), d_unit, n * sizeof(double), cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < n; ++i) {
          const RandomBlock c = random_block(seed, stream, first + i);
          for (int w = 0; w < 4; ++w) ASSERT_EQ(blocks[i].w[w], c.w[w]) << "element " << i;
          ASSERT_EQ(unit[i], to_unit_closed_open(low64(c)));
        }
        compared += n;
      }
    }
  cudaFree(d_blocks);
  cudaFree(d_unit);
  std::printf("[ rng ] %zu Philox blocks (128 bits each) bit-identical on GPU and CPU\n", compared);
}
