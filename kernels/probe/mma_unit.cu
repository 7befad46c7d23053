#include "kernels/probe/mma_unit.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace ulpgate {
namespace {

enum class Kind { F16, BF16, TF32, E4M3, E5M2, F16Acc16 };

// Fragments of a warp's m16n8kK tile (PTX ISA, "Matrix fragments for mma.m16n8k*"), lane =
// 4 g + t: only row 0 of A and column 0 of B hold values, so only lanes with g = 0 (0..3)
// load anything. The dot's factors for this instruction are x[0..k) and y[0..k).
//  k = 16 (f16, bf16): A reg 0 = row g, cols 2t, 2t+1; reg 2 = row g, cols 2t+8, 2t+9
//                      (regs 1, 3: row g+8); B reg 0 = rows 2t, 2t+1; reg 1 = rows 2t+8, 2t+9
//  k = 8 (tf32):       A reg 0 = (g, t), reg 2 = (g, t+4); B reg 0 = row t, reg 1 = row t+4
//  k = 32 (fp8):       A reg 0 = row g, cols 4t..4t+3; reg 2 = cols 4t+16..4t+19;
//                      B reg 0 = rows 4t..4t+3; reg 1 = rows 4t+16..4t+19
//  D: reg 0 of lane 0 is D[0][0].
template <Kind K>
__device__ void fragments(const std::uint32_t* x, const std::uint32_t* y, int t, std::uint32_t (&a)[4],
                          std::uint32_t (&b)[2]) {
  a[1] = a[3] = 0;
  if constexpr (K == Kind::F16 || K == Kind::BF16 || K == Kind::F16Acc16) {
    const auto pack = [](const std::uint32_t* v, int i) { return (v[i] & 0xFFFFu) | (v[i + 1] << 16); };
    a[0] = pack(x, 2 * t), a[2] = pack(x, 2 * t + 8);
    b[0] = pack(y, 2 * t), b[1] = pack(y, 2 * t + 8);
  } else if constexpr (K == Kind::TF32) {
    a[0] = x[t], a[2] = x[t + 4];
    b[0] = y[t], b[1] = y[t + 4];
  } else {
    const auto pack = [](const std::uint32_t* v, int i) {
      return (v[i] & 0xFFu) | ((v[i + 1] & 0xFFu) << 8) | ((v[i + 2] & 0xFFu) << 16) | (v[i + 3] << 24);
    };
    a[0] = pack(x, 4 * t), a[2] = pack(x, 4 * t + 16);
    b[0] = pack(y, 4 * t), b[1] = pack(y, 4 * t + 16);
  }
}

template <Kind K>
__device__ void mma(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (K == Kind::F16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else if constexpr (K == Kind::BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else if constexpr (K == Kind::TF32)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else if constexpr (K == Kind::E4M3)
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  (void)a, (void)b;
  d[0] = __int_as_float(0x7FC00000);  // not compiled for this device: NaN, and mma_available says no
#endif
}

// FP16 accumulation: C and D are two registers of two FP16 each; D[0][0] is the low half of
// register 0 of lane 0.
__device__ void mma_f16_acc(std::uint32_t (&d)[2], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
               : "+r"(d[0]), "+r"(d[1])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  (void)a, (void)b;
  d[0] = 0x7E00u;  // not compiled for this device: NaN
#endif
}

// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a): a warpgroup of 4 warps runs a chain of
// m64n8kK instructions, A from registers (warp w holds rows 16 w .. 16 w + 15 in mma.sync's
// fragment layout, so row 0 is warp 0's, as above), B from shared memory through a matrix
// descriptor, D (64 x 8 FP32, 4 per thread: d0, d1 row g, d2, d3 row g + 8 of the warp's
// rows) fed back with scale-d = 1. B is K-major (column n holds its K values contiguously)
// without swizzling: core matrices of 8 columns x 16 bytes, 128 contiguous bytes each, the
// two of one instruction's K one after the other (leading byte offset 128; the stride byte
// offset is unused with one group of 8 columns). Only column 0 holds values.
template <Kind K>
__device__ void wgmma(float (&d)[4], const std::uint32_t (&a)[4], std::uint64_t desc) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (K == Kind::F16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  else if constexpr (K == Kind::BF16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  else if constexpr (K == Kind::TF32)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  else if constexpr (K == Kind::E4M3)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e5m2 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#else
  (void)a, (void)desc;
  d[0] = __int_as_float(0x7FC00000);  // not sm_90a code: NaN
#endif
}

template <Kind K, int Step>
__global__ void wgmma_chain_kernel(const std::uint32_t* a, const std::uint32_t* b, long long dots, long long k, float* out) {
  __shared__ __align__(128) std::uint8_t bs[256];  // two core matrices of 8 columns x 16 bytes
  constexpr int kBytes = K == Kind::TF32 ? 4 : (K == Kind::E4M3 || K == Kind::E5M2) ? 1 : 2;
  constexpr int kPerCore = 16 / kBytes;  // K values of a column in one core matrix
  const long long dot = blockIdx.x;
  if (dot >= dots) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(bs));
  const std::uint64_t desc = (static_cast<std::uint64_t>((addr >> 4) & 0x3FFF)) | (static_cast<std::uint64_t>(128 >> 4) << 16) |
                             (static_cast<std::uint64_t>(256 >> 4) << 32);  // no swizzle (bits 62-63 zero)
  for (int i = threadIdx.x; i < 256; i += blockDim.x) bs[i] = 0;
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (long long s = 0; s < k; s += Step) {
    __syncthreads();  // the previous instruction has read B (wait_group 0 below)
    if (threadIdx.x < Step) {  // column 0's K values: core matrix (q / kPerCore), row 0
      const int q = threadIdx.x;
      const std::uint32_t w = b[dot * k + s + q];
      std::uint8_t* at = bs + (q / kPerCore) * 128 + (q % kPerCore) * kBytes;
      for (int byte = 0; byte < kBytes; ++byte) at[byte] = static_cast<std::uint8_t>(w >> (8 * byte));
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the generic writes, seen by wgmma
    __syncthreads();
    std::uint32_t fa[4] = {0, 0, 0, 0}, fb[2];
    if (warp == 0 && g == 0) fragments<K>(a + dot * k + s, b + dot * k + s, t, fa, fb);
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
    wgmma<K>(d, fa, desc);
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
  }
  if (threadIdx.x == 0) out[dot] = d[0];
}

template <Kind K, int Step>
__global__ void chain_kernel(const std::uint32_t* a, const std::uint32_t* b, long long dots, long long k, float* out) {
  const long long dot = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (dot >= dots) return;  // whole warps: blockDim is a multiple of 32
  const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  if constexpr (K == Kind::F16Acc16) {
    std::uint32_t d[2] = {0, 0};
    for (long long s = 0; s < k; s += Step) {
      std::uint32_t fa[4] = {0, 0, 0, 0}, fb[2] = {0, 0};
      if (g == 0) fragments<K>(a + dot * k + s, b + dot * k + s, t, fa, fb);
      mma_f16_acc(d, fa, fb);
    }
    if (lane == 0) out[dot] = __half2float(__ushort_as_half(static_cast<unsigned short>(d[0] & 0xFFFFu)));
  } else {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (long long s = 0; s < k; s += Step) {
      std::uint32_t fa[4] = {0, 0, 0, 0}, fb[2] = {0, 0};
      if (g == 0) fragments<K>(a + dot * k + s, b + dot * k + s, t, fa, fb);
      mma<K>(d, fa, fb);
    }
    if (lane == 0) out[dot] = d[0];
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("mma probe: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

const std::vector<MmaInstruction>& mma_instructions() {
  static const std::vector<MmaInstruction> list{
      {"mma.f16", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", Format::FP16, 16},
      {"mma.f16.f16acc", "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16", Format::FP16, 16, Format::FP16},
      {"mma.bf16", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", Format::BF16, 16},
      {"mma.tf32", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", Format::TF32, 8},
      {"mma.e4m3", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", Format::E4M3, 32},
      {"mma.e5m2", "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32", Format::E5M2, 32},
      {"wgmma.f16", "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16", Format::FP16, 16, Format::FP32, true},
      {"wgmma.bf16", "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16", Format::BF16, 16, Format::FP32, true},
      {"wgmma.tf32", "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32", Format::TF32, 8, Format::FP32, true},
      {"wgmma.e4m3", "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3", Format::E4M3, 32, Format::FP32, true},
      {"wgmma.e5m2", "wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e5m2", Format::E5M2, 32, Format::FP32, true},
  };
  return list;
}

const MmaInstruction* find_mma_instruction(const std::string& name) {
  for (const MmaInstruction& i : mma_instructions())
    if (i.name == name) return &i;
  return nullptr;
}

namespace {

// The compute capability of this process's device (major x 10 + minor), 0 without one.
int device_capability() {
  static const int cc = [] {
    int n = 0, dev = 0;
    cudaDeviceProp p{};
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && cudaGetDevice(&dev) == cudaSuccess &&
                    cudaGetDeviceProperties(&p, dev) == cudaSuccess;
    return ok ? p.major * 10 + p.minor : 0;
  }();
  return cc;
}

}  // namespace

bool wgmma_available() { return device_capability() == 90; }

bool mma_available() { return device_capability() >= 89; }

std::optional<Format> mma_converts_inputs(const MmaInstruction& inst) {
  if (inst.warpgroup || !is_fp8(inst.input)) return std::nullopt;  // wgmma: native FP8
  return device_capability() / 10 == 9 ? std::optional<Format>(Format::FP16) : std::nullopt;
}

std::vector<float> mma_dots(const MmaInstruction& inst, const std::vector<std::uint32_t>& a,
                            const std::vector<std::uint32_t>& b, std::int64_t dots, std::int64_t k) {
  if (!mma_available()) throw std::runtime_error("mma probe: no CUDA device of compute capability 8.9 or more");
  if (k % inst.k != 0 || a.size() != static_cast<std::size_t>(dots * k) || b.size() != a.size())
    throw std::logic_error("mma_dots: K must be a multiple of the instruction's k, with dots x K words of A and B");
  std::vector<float> out(static_cast<std::size_t>(dots));
  if (dots == 0) return out;
  std::uint32_t *da = nullptr, *db = nullptr;
  float* dout = nullptr;
  const std::size_t bytes = a.size() * sizeof(std::uint32_t);
  struct Free {
    void* p[3];
    ~Free() {
      for (void* q : p) cudaFree(q);
    }
  };
  check(cudaMalloc(&da, bytes), "cudaMalloc");
  Free freed{{da, nullptr, nullptr}};
  check(cudaMalloc(&db, bytes), "cudaMalloc");
  freed.p[1] = db;
  check(cudaMalloc(&dout, out.size() * sizeof(float)), "cudaMalloc");
  freed.p[2] = dout;
  check(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice), "upload");
  const unsigned threads = 128, blocks = static_cast<unsigned>((dots * 32 + threads - 1) / threads);
  if (inst.warpgroup) {  // a warpgroup (128 threads) per dot product
    const auto n = static_cast<unsigned>(dots);
    switch (inst.input) {
      case Format::FP16: wgmma_chain_kernel<Kind::F16, 16><<<n, 128>>>(da, db, dots, k, dout); break;
      case Format::BF16: wgmma_chain_kernel<Kind::BF16, 16><<<n, 128>>>(da, db, dots, k, dout); break;
      case Format::TF32: wgmma_chain_kernel<Kind::TF32, 8><<<n, 128>>>(da, db, dots, k, dout); break;
      case Format::E4M3: wgmma_chain_kernel<Kind::E4M3, 32><<<n, 128>>>(da, db, dots, k, dout); break;
      case Format::E5M2: wgmma_chain_kernel<Kind::E5M2, 32><<<n, 128>>>(da, db, dots, k, dout); break;
      default: throw std::logic_error("mma_dots: no warpgroup instruction for this input format");
    }
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  switch (inst.input) {
    case Format::FP16:
      if (inst.accumulator == Format::FP16) chain_kernel<Kind::F16Acc16, 16><<<blocks, threads>>>(da, db, dots, k, dout);
      else chain_kernel<Kind::F16, 16><<<blocks, threads>>>(da, db, dots, k, dout);
      break;
    case Format::BF16: chain_kernel<Kind::BF16, 16><<<blocks, threads>>>(da, db, dots, k, dout); break;
    case Format::TF32: chain_kernel<Kind::TF32, 8><<<blocks, threads>>>(da, db, dots, k, dout); break;
    case Format::E4M3: chain_kernel<Kind::E4M3, 32><<<blocks, threads>>>(da, db, dots, k, dout); break;
    case Format::E5M2: chain_kernel<Kind::E5M2, 32><<<blocks, threads>>>(da, db, dots, k, dout); break;
    default: throw std::logic_error("mma_dots: no instruction for this input format");
  }
  check(cudaGetLastError(), "launch");
  check(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost), "download");
  return out;
}

}  // namespace ulpgate
