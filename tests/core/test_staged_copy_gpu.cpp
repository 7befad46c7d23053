// Large host <-> device copies through page-locked chunks (core/staged_copy.hpp): every
// byte arrives, at every size around the chunk boundaries, and the comparison sees a single
// changed byte in any chunk (label gpu: skips without a device).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "core/staged_copy.hpp"

using namespace ulpgate;

namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint32_t salt) {
  std::vector<std::uint8_t> v(bytes);
  std::uint32_t x = salt * 2654435761u + 1;
  for (auto& b : v) x = x * 1664525u + 1013904223u, b = static_cast<std::uint8_t>(x >> 24);
  return v;
}

}  // namespace

TEST(StagedCopyGpu, EveryByteArrivesBothWaysAndEveryChangeIsSeen) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr std::size_t kChunk = std::size_t{32} << 20;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  int sizes = 0;
  for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, kStagedCopyMinBytes - 1, kChunk, kChunk + 1,
                                  2 * kChunk - 3, 5 * kChunk + 4097}) {
    const auto host = pattern(bytes, static_cast<std::uint32_t>(bytes));
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, bytes + 1), cudaSuccess);
    ASSERT_EQ(staged_upload(dev, host.data(), bytes, stream), cudaSuccess) << bytes;
    std::vector<std::uint8_t> back(bytes, 0xA5);
    ASSERT_EQ(staged_download(back.data(), dev, bytes, stream), cudaSuccess) << bytes;
    EXPECT_TRUE(back == host) << bytes << " bytes";
    bool equal = false;
    ASSERT_EQ(staged_equal(dev, host.data(), bytes, stream, equal), cudaSuccess);
    EXPECT_TRUE(equal) << bytes;
    // One byte changed on the host side, in the first, a middle and the last chunk.
    for (const std::size_t at : {std::size_t{0}, bytes / 2, bytes ? bytes - 1 : 0}) {
      if (bytes == 0) break;
      auto other = host;
      other[at] ^= 0x10;
      ASSERT_EQ(staged_equal(dev, other.data(), bytes, stream, equal), cudaSuccess);
      EXPECT_FALSE(equal) << bytes << " bytes, changed at " << at;
    }
    cudaFree(dev);
    ++sizes;
  }
  EXPECT_EQ(sizes, 7);
  cudaStreamDestroy(stream);
}
