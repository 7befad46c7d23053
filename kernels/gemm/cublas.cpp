// cuBLAS GEMM backends: cublasGemmStridedBatchedEx in FP64, FP32, FP32 with TF32 tensor
// cores, FP16 and BF16 (FP32 compute, or FP16 compute for an all-FP16 case).
#include <algorithm>

#include <cuda_fp16.h>
#include <fmt/format.h>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/gemm/library.hpp"

namespace ulpgate {

ColumnMajorGemm to_column_major(const Case& c) {
  const auto& g = c.gemm;
  const MatrixView a = gemm_view(c, "A"), b = gemm_view(c, "B"), d = gemm_view(c, "D");
  const MatrixView cv = c.types.count("C") ? gemm_view(c, "C") : d;
  ColumnMajorGemm r;
  r.k = g.k;
  r.batch = g.batch;
  r.ld_c = cv.ld, r.stride_c = cv.batch_stride();
  r.ld_d = d.ld, r.stride_d = d.batch_stride();
  if (g.layout == Layout::RowMajor) {
    r.m = g.n, r.n = g.m;
    r.x = "B", r.y = "A";
    r.op1 = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    r.op2 = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    r.ld_x = b.ld, r.stride_x = b.batch_stride();
    r.ld_y = a.ld, r.stride_y = a.batch_stride();
  } else {
    r.m = g.m, r.n = g.n;
    r.x = "A", r.y = "B";
    r.op1 = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    r.op2 = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    r.ld_x = a.ld, r.stride_x = a.batch_stride();
    r.ld_y = b.ld, r.stride_y = b.batch_stride();
  }
  return r;
}

cudaDataType_t cuda_data_type(Format f) {
  switch (f) {
    case Format::FP64: return CUDA_R_64F;
    case Format::FP32:
    case Format::TF32: return CUDA_R_32F;
    case Format::FP16: return CUDA_R_16F;
    case Format::BF16: return CUDA_R_16BF;
    case Format::E4M3: return CUDA_R_8F_E4M3;
    case Format::E5M2: return CUDA_R_8F_E5M2;
  }
  throw InputError("no CUDA data type for this format");
}

namespace {

struct HandleDeleter {
  void operator()(cublasContext* h) const { cublasDestroy(h); }
};

std::string cublas_version() {
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  return fmt::format("cuBLAS {}.{}.{}", major, minor, patch);
}

// One cuBLAS variant: which input formats it takes and how it computes.
struct CublasVariant {
  const char* name;
  const char* description;
  std::vector<Format> inputs;  // accepted A/B formats
  Format compute;              // case.types["compute"]
};

class CublasGemm final : public Kernel {
 public:
  explicit CublasGemm(CublasVariant v) : v_(std::move(v)) {}
  std::string name() const override { return v_.name; }
  std::string description() const override { return v_.description; }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, true};
    // TF32 compute rounds FP32 inputs to nearest, ties to even (measured on the H200:
    // LibraryGpu.Tf32KernelsRoundTheirInputsAsDeclared), where cvt.rna ties away.
    t.input_rounding = Rounding::NearestEven;
    t.thread_safe = true;  // a handle per thread; all work on io.stream
    return t;
  }

  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Gemm) return std::string("GEMM only");
    const Format a = c.types.at("A"), b = c.types.at("B"), d = c.types.at("D");
    if (a != b) return fmt::format("A and B must have one format (A {}, B {})", ulpgate::name(a), ulpgate::name(b));
    if (std::find(v_.inputs.begin(), v_.inputs.end(), a) == v_.inputs.end())
      return fmt::format("input format {} not handled by {}", ulpgate::name(a), v_.name);
    if (c.types.at("compute") != v_.compute && !fp16_compute(c))
      return fmt::format("compute must be {}", ulpgate::name(v_.compute));
    if (!output_ok(a, d)) return fmt::format("output format {} not supported with {} inputs", ulpgate::name(d), ulpgate::name(a));
    if (c.beta != 0.0 && (c.types.at("C") != d || c.gemm.eff_ldc() != c.gemm.eff_ldd()))
      return std::string("cuBLAS reads C in place of D: C must have D's format and leading dimension");
    if (c.epilogue != Epilogue::None) return std::string("cuBLAS has no epilogues (use cublaslt.*)");
    if (!c.scales.empty()) return std::string("FP8 scales need cublaslt.fp8");
    return std::nullopt;
  }

  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    cublasHandle_t handle = handles_.get([] {
      cublasHandle_t h;
      ULPGATE_CHECK(cublasCreate(&h));
      // The default math mode lets a split-K GEMM with an FP16 or BF16 D reduce its partial
      // sums in D's type (PyTorch's allow_fp16_reduced_precision_reduction, on by default):
      // on the H200, cublas.fp16 with D = FP16 then missed FP32 accumulation by up to 40x
      // (fuzz seed 1: 574 of 2162 elements misrounded at K = 487). These backends declare
      // FP32 accumulation, so they forbid it.
      ULPGATE_CHECK(cublasSetMathMode(h, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
      return Handle(h);
    }).get();
    const ColumnMajorGemm g = to_column_major(c);
    const Format fa = c.types.at("A"), fd = c.types.at("D");
    auto stream = static_cast<cudaStream_t>(io.stream);
    ULPGATE_CHECK(cublasSetStream(handle, stream));
    void* d = io.out.at("D");
    if (c.beta != 0.0) {  // cuBLAS updates C in place: start D as a copy of C
      const std::int64_t bytes = gemm_view(c, "D").elements() * static_cast<std::int64_t>(storage_bytes(fd));
      ULPGATE_CHECK(cudaMemcpyAsync(d, io.in.at("C"), bytes, cudaMemcpyDeviceToDevice, stream));
    }
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (v_.compute == Format::FP64) compute = CUBLAS_COMPUTE_64F;
    if (v_.compute == Format::TF32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    if (fp16_compute(c)) compute = CUBLAS_COMPUTE_16F;
    // Scalars in the compute type's scale type.
    const double alpha64 = c.alpha, beta64 = c.beta;
    const float alpha32 = static_cast<float>(c.alpha), beta32 = static_cast<float>(c.beta);
    const __half alpha16 = __double2half(c.alpha), beta16 = __double2half(c.beta);
    const void* alpha = compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&alpha64)
                        : compute == CUBLAS_COMPUTE_16F ? static_cast<const void*>(&alpha16)
                                                        : static_cast<const void*>(&alpha32);
    const void* beta = compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&beta64)
                       : compute == CUBLAS_COMPUTE_16F ? static_cast<const void*>(&beta16)
                                                       : static_cast<const void*>(&beta32);
    ULPGATE_CHECK(cublasGemmStridedBatchedEx(
        handle, g.op1, g.op2, static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), alpha,
        io.in.at(g.x), cuda_data_type(fa), static_cast<int>(g.ld_x), g.stride_x, io.in.at(g.y), cuda_data_type(fa),
        static_cast<int>(g.ld_y), g.stride_y, beta, d, cuda_data_type(fd), static_cast<int>(g.ld_d), g.stride_d,
        static_cast<int>(g.batch), compute, CUBLAS_GEMM_DEFAULT));
    notes["library"] = cublas_version();
    notes["call"] = fmt::format("cublasGemmStridedBatchedEx(op1={}, op2={}, m={}, n={}, k={}, compute={})",
                                g.op1 == CUBLAS_OP_T ? "T" : "N", g.op2 == CUBLAS_OP_T ? "T" : "N", g.m, g.n, g.k,
                                compute_name(compute));
    notes["algorithm"] = "CUBLAS_GEMM_DEFAULT";
  }

 private:
  static const char* compute_name(cublasComputeType_t t) {
    switch (t) {
      case CUBLAS_COMPUTE_64F: return "64F";
      case CUBLAS_COMPUTE_32F_FAST_TF32: return "32F_FAST_TF32";
      case CUBLAS_COMPUTE_16F: return "16F";
      default: return "32F";
    }
  }
  // An all-FP16 case with compute fp16 runs with FP16 accumulation.
  bool fp16_compute(const Case& c) const {
    return v_.compute == Format::FP32 && c.types.at("A") == Format::FP16 && c.types.at("compute") == Format::FP16 &&
           c.types.at("D") == Format::FP16;
  }
  bool output_ok(Format in, Format d) const {
    switch (in) {
      case Format::FP64: return d == Format::FP64;
      case Format::FP32:
      case Format::TF32: return d == Format::FP32;
      case Format::FP16: return d == Format::FP16 || d == Format::FP32;
      case Format::BF16: return d == Format::BF16 || d == Format::FP32;
      default: return false;
    }
  }
  using Handle = std::unique_ptr<cublasContext, HandleDeleter>;
  CublasVariant v_;
  PerThread<Handle> handles_;
};

}  // namespace

std::vector<std::unique_ptr<Kernel>> make_cublas_kernels() {
  const CublasVariant variants[] = {
      {"cublas.fp64", "cuBLAS GemmEx, FP64 inputs and compute", {Format::FP64}, Format::FP64},
      {"cublas.fp32", "cuBLAS GemmEx, FP32 inputs, CUBLAS_COMPUTE_32F", {Format::FP32}, Format::FP32},
      {"cublas.tf32", "cuBLAS GemmEx, FP32 inputs on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)",
       {Format::FP32, Format::TF32}, Format::TF32},
      {"cublas.fp16", "cuBLAS GemmEx, FP16 inputs, FP32 compute (FP16 compute when compute is fp16)",
       {Format::FP16}, Format::FP32},
      {"cublas.bf16", "cuBLAS GemmEx, BF16 inputs, FP32 compute", {Format::BF16}, Format::FP32},
  };
  std::vector<std::unique_ptr<Kernel>> out;
  for (const auto& v : variants) out.push_back(std::make_unique<CublasGemm>(v));
  return out;
}

std::vector<std::unique_ptr<Kernel>> make_library_kernels() {
  auto out = make_cublas_kernels();
  for (auto& k : make_cublaslt_kernels()) out.push_back(std::move(k));
  return out;
}

}  // namespace ulpgate
