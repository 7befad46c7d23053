// The sliced exact GEMM on the GPU (references/sliced_gemm_gpu.hpp): slicing kernels, int8
// tensor-core GEMMs through cuBLAS (int32 accumulation, exact per K chunk), and a fused
// combination kernel; the arithmetic is sliced_digits.hpp's, the same the CPU emulation
// runs. Kept free of the project's C++20 headers: this file compiles as CUDA C++17.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/staged_copy.hpp"
#include "references/sliced_digits.hpp"

namespace ulpgate {
namespace {

using slicing::RowPlan;

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("GPU exact reference: ") + call + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("GPU exact reference: ") + call + ": " + cublasGetStatusString(s));
}
#define SLICED_CHECK(call) check((call), #call)

// A grow-only device buffer.
struct Buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { cudaFree(p); }
  template <class T>
  T* get(std::size_t count) {
    const std::size_t want = std::max<std::size_t>(count * sizeof(T), 1);
    if (want > bytes) {
      cudaFree(p);
      p = nullptr, bytes = 0;
      SLICED_CHECK(cudaMalloc(&p, want));
      bytes = want;
    }
    return static_cast<T*>(p);
  }
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { SLICED_CHECK(cudaEventCreate(&e)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { cudaEventDestroy(e); }
};

// One per process: the cuBLAS handle, the stream and the buffers, reused across calls.
struct Context {
  std::mutex mutex;
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  Buffer bits, plans, offsets, digits_value, digits_magnitude, products, limbs, condition, certified;
  Context() {
    SLICED_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    SLICED_CHECK(cublasCreate(&handle));
    SLICED_CHECK(cublasSetStream(handle, stream));
  }
  ~Context() {
    cublasDestroy(handle);
    cudaStreamDestroy(stream);
  }
};

Context& context() {
  static Context c;
  return c;
}

constexpr int kThreads = 256;

// Block r scans row r (rows of length k): the largest |v|, the lowest set bit, specials.
__global__ void plan_rows(const std::uint32_t* bits, long long rows, long long k, int max_digits, RowPlan* plans) {
  __shared__ slicing::RowScan part[kThreads / 32];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    slicing::RowScan s;
    for (long long q = threadIdx.x; q < k; q += blockDim.x) slicing::scan(s, bits[r * k + q]);
    for (int d = 16; d > 0; d /= 2) {
      slicing::RowScan o;
      o.max_bits = __shfl_down_sync(0xFFFFFFFFu, s.max_bits, d);
      o.lowest = __shfl_down_sync(0xFFFFFFFFu, s.lowest, d);
      o.special = __shfl_down_sync(0xFFFFFFFFu, s.special, d);
      s = slicing::merge(s, o);
    }
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w) s = slicing::merge(s, part[w]);
      plans[r] = slicing::plan_row(s, max_digits);
    }
    __syncthreads();
  }
}

// Block r writes row r's digits of N and of |N| into its stacked rows.
__global__ void write_digits(const std::uint32_t* bits, long long rows, long long k, long long pitch,
                             const RowPlan* plans, const long long* offsets, std::int8_t* value,
                             std::int8_t* magnitude) {
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const RowPlan p = plans[r];
    if (p.digits == 0) continue;
    const long long base = offsets[r] * pitch;
    for (long long q = threadIdx.x; q < k; q += blockDim.x) {
      const std::int64_t n = slicing::scaled_integer(bits[r * k + q], p.lowest);
      slicing::balanced_digits(n, p.digits, value + base + q, pitch);
      slicing::balanced_digits(n < 0 ? -n : n, p.digits, magnitude + base + q, pitch);
    }
  }
}

// Element (i, j) for j in [j0, j1): its digit products combined, certified or not.
__global__ void combine_elements(const std::int32_t* pv, const std::int32_t* pm, long long ld, long long chunk_stride,
                                 int chunks, long long m, long long j0, long long j1, long long row_start,
                                 const RowPlan* a_plans, const long long* a_offsets, const RowPlan* b_plans,
                                 const long long* b_offsets, std::uint64_t* limb0, std::uint64_t* limb1,
                                 std::uint64_t* limb2, double* condition, std::uint8_t* certified) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i >= m) return;
  for (long long j = j0 + blockIdx.y; j < j1; j += gridDim.y) {
    const RowPlan pa = a_plans[i], pb = b_plans[j];
    slicing::Wide v, mag;
    if (pa.digits > 0 && pb.digits > 0) {
      const long long ra = a_offsets[i], rb = b_offsets[j] - row_start;
      slicing::combine(pv, ld, chunk_stride, chunks, ra, pa.digits, rb, pb.digits, v);
      slicing::combine(pm, ld, chunk_stride, chunks, ra, pa.digits, rb, pb.digits, mag);
    }
    const long long e = j * m + i;
    const bool ok = pa.captured && pb.captured && !slicing::is_zero(v);
    limb0[e] = ok ? v.w[0] : 0, limb1[e] = ok ? v.w[1] : 0, limb2[e] = ok ? v.w[2] : 0;
    condition[e] = ok ? slicing::round_to_double(mag, pa.lowest + pb.lowest) : 0.0;
    certified[e] = ok ? 1 : 0;
  }
}

float elapsed(const Event& a, const Event& b) {
  float ms = 0;
  SLICED_CHECK(cudaEventElapsedTime(&ms, a.e, b.e));
  return ms;
}

long long round_up(long long x, long long to) { return (x + to - 1) / to * to; }

// out sized for m x n elements, its plans and counters cleared.
void reset(slicing::SlicedElements& out, long long m, long long n) {
  out.m = m, out.n = n;
  const std::size_t mn = static_cast<std::size_t>(m * n);
  for (auto& l : out.limb) l.resize(mn);  // written in full by the download (or zeroed)
  out.condition.resize(mn);
  out.certified.resize(mn);
  out.a_plan.assign(static_cast<std::size_t>(m), RowPlan{});
  out.b_plan.assign(static_cast<std::size_t>(n), RowPlan{});
  out.stacked_a = out.stacked_b = 0, out.products = 0;
  out.ms_upload = out.ms_slice = out.ms_products = out.ms_combine = out.ms_download = 0;
}

// The m + n rows sliced on the device: their plans, where each row's digits are stacked,
// and the digit rows of N and of |N|.
struct Digits {
  long long pitch = 0, rows_a = 0, stacked_a = 0, stacked_b = 0;
  RowPlan* plans = nullptr;           // device: A's rows, then B's
  long long* dev_offsets = nullptr;   // device: stacked row of each row's first digit
  std::vector<RowPlan> host_plans;
  std::vector<long long> offsets;     // host copy of dev_offsets
  std::int8_t* value = nullptr;       // device: (rows_a + B's stacked rows + 16) x pitch
  std::int8_t* magnitude = nullptr;
};

// Slicing: plans, stacked offsets (on the host: the sizes of the GEMMs), digits.
Digits slice(Context& cx, const std::uint32_t* bits, long long m, long long n, long long k, int max_digits,
             slicing::SlicedElements& out) {
  cudaStream_t st = cx.stream;
  const long long rows = m + n;
  Digits d;
  d.pitch = round_up(k, slicing::kPitch);
  d.plans = cx.plans.get<RowPlan>(static_cast<std::size_t>(rows));
  const unsigned grid = static_cast<unsigned>(std::min<long long>(rows, 65535));
  plan_rows<<<grid, kThreads, 0, st>>>(bits, rows, k, max_digits, d.plans);
  SLICED_CHECK(cudaGetLastError());
  d.host_plans.resize(static_cast<std::size_t>(rows));
  SLICED_CHECK(cudaMemcpyAsync(d.host_plans.data(), d.plans, d.host_plans.size() * sizeof(RowPlan), cudaMemcpyDeviceToHost, st));
  SLICED_CHECK(cudaStreamSynchronize(st));
  d.offsets.resize(static_cast<std::size_t>(rows));
  for (long long r = 0; r < rows; ++r) {
    long long& total = r < m ? d.stacked_a : d.stacked_b;
    d.offsets[r] = total;
    total += d.host_plans[r].digits;
  }
  std::copy(d.host_plans.begin(), d.host_plans.begin() + m, out.a_plan.begin());
  std::copy(d.host_plans.begin() + m, d.host_plans.end(), out.b_plan.begin());
  out.stacked_a = d.stacked_a, out.stacked_b = d.stacked_b;
  // A's stacked rows padded to 16 (the GEMM's m), B's with 16 spare zero rows (a block's n
  // is padded likewise); digit rows of A first, then B's.
  d.rows_a = round_up(d.stacked_a, 16);
  const long long rows_b = d.stacked_b + 16;
  d.dev_offsets = cx.offsets.get<long long>(static_cast<std::size_t>(rows));
  for (long long r = m; r < rows; ++r) d.offsets[r] += d.rows_a;
  SLICED_CHECK(cudaMemcpyAsync(d.dev_offsets, d.offsets.data(), d.offsets.size() * sizeof(long long), cudaMemcpyHostToDevice, st));
  const std::size_t digit_bytes = static_cast<std::size_t>((d.rows_a + rows_b) * d.pitch);
  d.value = cx.digits_value.get<std::int8_t>(digit_bytes);
  d.magnitude = cx.digits_magnitude.get<std::int8_t>(digit_bytes);
  SLICED_CHECK(cudaMemsetAsync(d.value, 0, digit_bytes, st));
  SLICED_CHECK(cudaMemsetAsync(d.magnitude, 0, digit_bytes, st));
  write_digits<<<grid, kThreads, 0, st>>>(bits, rows, k, d.pitch, d.plans, d.dev_offsets, d.value, d.magnitude);
  SLICED_CHECK(cudaGetLastError());
  return d;
}

// The device's per-element results, zeroed: S's limbs, the condition term, certified.
struct Results {
  Results(Context& cx, std::size_t mn) {
    cudaStream_t st = cx.stream;
    limb[0] = cx.limbs.get<std::uint64_t>(3 * mn);
    limb[1] = limb[0] + mn, limb[2] = limb[1] + mn;
    cond = cx.condition.get<double>(mn);
    cert = cx.certified.get<std::uint8_t>(mn);
    SLICED_CHECK(cudaMemsetAsync(limb[0], 0, 3 * mn * sizeof(std::uint64_t), st));
    SLICED_CHECK(cudaMemsetAsync(cond, 0, mn * sizeof(double), st));
    SLICED_CHECK(cudaMemsetAsync(cert, 0, mn, st));
  }
  std::uint64_t* limb[3] = {nullptr, nullptr, nullptr};
  double* cond = nullptr;
  std::uint8_t* cert = nullptr;
};

// (start, end) of each block's products, then of its combination.
struct Phases {
  std::vector<std::pair<Event*, Event*>> spans;
  std::vector<std::unique_ptr<Event>> events;
  Event* add() {
    events.push_back(std::make_unique<Event>());
    return events.back().get();
  }
};

// The int32 products of A's digit rows with block_rows of B's from stacked row `first`, per
// K chunk, for the value digits into pv and the magnitude digits into pm.
void digit_products(Context& cx, const Digits& d, long long first, long long block_rows, long long chunks,
                    std::int32_t* pv, std::int32_t* pm, slicing::SlicedElements& out) {
  const std::int32_t one = 1, zero = 0;
  const long long chunk_stride = d.rows_a * block_rows;
  for (int which = 0; which < 2; ++which) {
    const std::int8_t* digits = which == 0 ? d.value : d.magnitude;
    std::int32_t* p = which == 0 ? pv : pm;
    for (long long c = 0; c < chunks; ++c) {
      const long long q0 = c * slicing::kChunk, len = std::min<long long>(slicing::kChunk, d.pitch - q0);
      SLICED_CHECK(cublasGemmEx(cx.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(d.rows_a),
                                static_cast<int>(block_rows), static_cast<int>(len), &one, digits + q0, CUDA_R_8I,
                                static_cast<int>(d.pitch), digits + (d.rows_a + first) * d.pitch + q0, CUDA_R_8I,
                                static_cast<int>(d.pitch), &zero, p + c * chunk_stride, CUDA_R_32I,
                                static_cast<int>(d.rows_a), CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
      ++out.products;
    }
  }
}

// Products and combination by blocks of B's columns, so that the int32 products of one
// block (value and magnitude, every K chunk) fit the budget.
void multiply_and_combine(Context& cx, const Digits& d, long long m, long long n, std::size_t product_budget,
                          const Results& res, Phases& phases, slicing::SlicedElements& out) {
  cudaStream_t st = cx.stream;
  const long long chunks = (d.pitch + slicing::kChunk - 1) / slicing::kChunk;
  const long long max_block_rows = std::max<long long>(
      16, static_cast<long long>(product_budget / (2 * static_cast<std::size_t>(chunks * std::max<long long>(d.rows_a, 16)) * 4)) / 16 * 16);
  long long j0 = 0;
  while (j0 < n) {
    // The widest block of columns from j0 whose digit rows fit.
    long long j1 = j0 + 1;
    const long long first = d.offsets[m + j0] - d.rows_a;
    while (j1 < n && d.offsets[m + j1] - d.rows_a + d.host_plans[m + j1].digits - first <= max_block_rows) ++j1;
    const long long block_rows =
        round_up(std::max<long long>(d.offsets[m + j1 - 1] - d.rows_a + d.host_plans[m + j1 - 1].digits - first, 1), 16);
    const long long chunk_stride = d.rows_a * block_rows;
    std::int32_t* pv = cx.products.get<std::int32_t>(static_cast<std::size_t>(2 * chunks * chunk_stride));
    std::int32_t* pm = pv + chunks * chunk_stride;
    Event* e0 = phases.add();
    Event* e1 = phases.add();
    Event* e2 = phases.add();
    SLICED_CHECK(cudaEventRecord(e0->e, st));
    if (d.stacked_a > 0 && first < d.stacked_b) digit_products(cx, d, first, block_rows, chunks, pv, pm, out);
    SLICED_CHECK(cudaEventRecord(e1->e, st));
    const dim3 cgrid(static_cast<unsigned>((m + 127) / 128), static_cast<unsigned>(std::min<long long>(j1 - j0, 65535)));
    combine_elements<<<cgrid, 128, 0, st>>>(pv, pm, d.rows_a, chunk_stride, static_cast<int>(chunks), m, j0, j1,
                                            d.rows_a + first, d.plans, d.dev_offsets, d.plans + m, d.dev_offsets + m,
                                            res.limb[0], res.limb[1], res.limb[2], res.cond, res.cert);
    SLICED_CHECK(cudaGetLastError());
    SLICED_CHECK(cudaEventRecord(e2->e, st));
    phases.spans.emplace_back(e0, e1);
    phases.spans.emplace_back(e1, e2);
    j0 = j1;
  }
}

}  // namespace

namespace detail {

bool gpu_sliced_available() {
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
}

void gpu_sliced_elements(const float* a, long long m, const float* b, long long n, long long k, int max_digits,
                         std::size_t product_budget, slicing::SlicedElements& out) {
  Context& cx = context();
  std::lock_guard<std::mutex> lock(cx.mutex);
  cudaStream_t st = cx.stream;
  reset(out, m, n);
  const std::size_t mn = static_cast<std::size_t>(m * n);
  if (m == 0 || n == 0 || k == 0) {  // empty sums: nothing certified
    for (auto& l : out.limb) l.assign(mn, 0);
    out.condition.assign(mn, 0.0);
    out.certified.assign(mn, 0);
    return;
  }
  Event t0, t1, t2, t3, t4;
  SLICED_CHECK(cudaEventRecord(t0.e, st));
  std::uint32_t* bits = cx.bits.get<std::uint32_t>(static_cast<std::size_t>((m + n) * k));
  SLICED_CHECK(staged_upload(bits, a, static_cast<std::size_t>(m * k) * 4, st));
  SLICED_CHECK(staged_upload(bits + m * k, b, static_cast<std::size_t>(n * k) * 4, st));
  SLICED_CHECK(cudaEventRecord(t1.e, st));
  const Digits d = slice(cx, bits, m, n, k, max_digits, out);
  SLICED_CHECK(cudaEventRecord(t2.e, st));
  Results res(cx, mn);
  Phases phases;
  multiply_and_combine(cx, d, m, n, product_budget, res, phases, out);
  SLICED_CHECK(cudaEventRecord(t3.e, st));
  for (int l = 0; l < 3; ++l) SLICED_CHECK(staged_download(out.limb[l].data(), res.limb[l], mn * sizeof(std::uint64_t), st));
  SLICED_CHECK(staged_download(out.condition.data(), res.cond, mn * sizeof(double), st));
  SLICED_CHECK(staged_download(out.certified.data(), res.cert, mn, st));
  SLICED_CHECK(cudaEventRecord(t4.e, st));
  SLICED_CHECK(cudaStreamSynchronize(st));
  out.ms_upload = elapsed(t0, t1);
  out.ms_slice = elapsed(t1, t2);
  for (std::size_t p = 0; p < phases.spans.size(); ++p)
    (p % 2 == 0 ? out.ms_products : out.ms_combine) += elapsed(*phases.spans[p].first, *phases.spans[p].second);
  out.ms_download = elapsed(t3, t4);
}

}  // namespace detail
}  // namespace ulpgate
