// cp.async (sm_80+): global to shared memory without registers, in commit groups. Shared by
// the SIMT steps 7-9 (simt_warptile.cuh) and the tensor-core steps (tensor_core.cu).
#pragma once

#include <cstdint>

namespace ulpgate {

/// Copies `bytes` (0..16) from src to the shared address dst and zero-fills the rest of 16.
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
/// One float (bytes 4) or +0 (bytes 0): the transposing copy of a tile stored along k.
__device__ __forceinline__ void cp_async4(std::uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace ulpgate
