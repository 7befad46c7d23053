// cuBLASLt GEMM backends: FP32, TF32, FP16, BF16 and FP8 (E4M3/E5M2 with A/B scales, fast
// accumulation off and on), with the bias, ReLU and GELU epilogues. The algorithm the
// heuristic picked, the workspace and the library version go into the run notes.
#include <algorithm>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "core/tensor.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"
#include "kernels/gemm/library.hpp"

namespace ulpgate {
namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;

template <class T, cublasStatus_t (*Destroy)(T)>
struct LtDeleter {
  void operator()(T p) const { Destroy(p); }
};
using LtHandle = std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, LtDeleter<cublasLtHandle_t, cublasLtDestroy>>;
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                   LtDeleter<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
using LtLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                               LtDeleter<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
using Preference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                                   LtDeleter<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

LtLayout make_layout(Format f, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                   std::int64_t stride) {
  cublasLtMatrixLayout_t l;
  ULPGATE_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_data_type(f), rows, cols, ld));
  LtLayout owned(l);
  if (batch > 1) {
    const std::int32_t count = static_cast<std::int32_t>(batch);
    ULPGATE_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    ULPGATE_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return owned;
}

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  ULPGATE_CHECK(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof v));
}

struct LtVariant {
  const char* name;
  const char* description;
  std::vector<Format> inputs;
  Format compute;
  bool fast_accum = false;
};

class CublasLtGemm final : public Kernel {
 public:
  explicit CublasLtGemm(LtVariant v) : v_(std::move(v)) {}
  std::string name() const override { return v_.name; }
  std::string description() const override { return v_.description; }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, true};
    // TF32 compute rounds FP32 inputs to nearest, ties to even (measured on the H200:
    // LibraryGpu.Tf32KernelsRoundTheirInputsAsDeclared), where cvt.rna ties away.
    t.input_rounding = Rounding::NearestEven;
    t.thread_safe = true;  // a handle and workspace per thread; all work on io.stream
    // The GELU epilogue's tanh is not correctly rounded: on the H200 its error reaches
    // 2^-16.98 (LibraryGpu.GeluEpilogueWithinItsDeclaredError: 2^20 arguments in [-6, 6],
    // the same on the FP32, TF32, FP16 and BF16 kernels; a D near 1 off by 47 FP32 ulp
    // failed the default campaign before this was declared). Declared with a factor 2.
    t.activation_error = 0x1.0p-16;
    if (is_fp8(v_.inputs.front())) {
      // Measured, not designed (`ulpgate probe --kernel cublaslt.fp8[_fast] --mn 256`, H200,
      // docs/results/probe_h200.md): each wgmma k-step aligns its 32 products and the
      // accumulator to 13 fraction bits below the largest factors' exponent sum (truncating)
      // and keeps the sum to 13 fraction bits (e8m13, toward zero); without fast
      // accumulation cuBLASLt adds that partial sum to an FP32 accumulator every 128
      // products. The model reproduces the H200 bit for bit on 20,000 random dot products
      // of each kernel (normal, cancelling, subnormal inputs), so the model rule applies.
      t.accumulator_bits = 14;
      t.promote = v_.fast_accum ? 0 : 128;
      t.arithmetic_source = "probe, NVIDIA H200, 2026-12-03; block 32, truncated";
      t.accumulation_model = v_.fast_accum ? "cpu.blockfma:block=32,frac=13,round=rz,align=e4m3,out=13"
                                           : "cpu.blockfma:block=32,frac=13,round=rz,promote=128,align=e4m3,out=13";
    }
    return t;
  }

  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Gemm) return std::string("GEMM only");
    const Format a = c.types.at("A"), b = c.types.at("B"), d = c.types.at("D");
    const bool fp8 = is_fp8(a);
    if (std::find(v_.inputs.begin(), v_.inputs.end(), a) == v_.inputs.end() ||
        std::find(v_.inputs.begin(), v_.inputs.end(), b) == v_.inputs.end())
      return fmt::format("input formats {}/{} not handled by {}", ulpgate::name(a), ulpgate::name(b), v_.name);
    if (!fp8 && a != b) return std::string("A and B must have one format");
    if (fp8 && a == Format::E5M2 && b == Format::E5M2) return std::string("cuBLASLt has no E5M2 x E5M2 GEMM");
    if (c.types.at("compute") != v_.compute) return fmt::format("compute must be {}", ulpgate::name(v_.compute));
    const bool out_ok = fp8 ? (d == Format::FP32 || d == Format::BF16 || d == Format::FP16)
                        : (a == Format::FP16 || a == Format::BF16) ? (d == a || d == Format::FP32)
                                                                    : d == Format::FP32;
    if (!out_ok) return fmt::format("output format {} not supported with {} inputs", ulpgate::name(d), ulpgate::name(a));
    if (c.beta != 0.0 && c.types.at("C") != d) return std::string("C must have D's format");
    if (has_bias(c.epilogue)) {
      const Format want = fp8 ? (d == Format::FP16 ? Format::FP16 : Format::BF16) : d;
      if (c.types.at("bias") != want) return fmt::format("bias must be {} here", ulpgate::name(want));
      if (c.gemm.layout == Layout::ColMajor)
        return std::string("cuBLASLt's bias runs along M of a column-major D, not along N: use layout row");
    }
    if (c.epilogue == Epilogue::Gelu || c.epilogue == Epilogue::BiasGelu)
      return std::string("cuBLASLt's GELU is the tanh form: use gelu_tanh");
    for (const auto& [op, s] : c.scales)
      if ((op == "C" || op == "D") && s != 1.0) return fmt::format("scale {} is not applied to a non-FP8 output", op);
    if (!fp8 && !c.scales.empty()) return std::string("scales apply to FP8 inputs only");
    if (fp8) {
      // FP8 needs the "TN" form: X transposed, Y not (see the mapping in docs/kernels/cublas.md).
      const ColumnMajorGemm g = to_column_major(c);
      if (g.op1 != CUBLAS_OP_T || g.op2 != CUBLAS_OP_N)
        return std::string(c.gemm.layout == Layout::RowMajor ? "FP8 needs trans_a=false, trans_b=true in row layout"
                                                              : "FP8 needs trans_a=true, trans_b=false in col layout");
      if (c.gemm.k % 16 != 0) return std::string("FP8 needs K % 16 == 0");
      // cuBLASLt's FP8 kernels need 16-byte aligned matrices: every leading dimension a
      // multiple of 16 bytes (a fuzz campaign on the H200, seed 1, had 39 of 40 FP8 cases
      // refused by the heuristic at run time, most with odd paddings or narrow outputs).
      for (const char* op : {"A", "B", "C", "D"}) {
        if (std::string_view(op) == "C" && c.beta == 0.0) continue;
        const MatrixView v = gemm_view(c, op);
        if (v.ld * static_cast<std::int64_t>(storage_bytes(c.types.at(op))) % 16 != 0)
          return fmt::format("FP8 needs {}'s leading dimension to be a multiple of 16 bytes ({} x {} bytes)", op, v.ld,
                             storage_bytes(c.types.at(op)));
      }
    }
    return std::nullopt;
  }

  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    ThreadState& state = thread_state();
    const ColumnMajorGemm g = to_column_major(c);
    const Format fx = c.types.at(g.x), fy = c.types.at(g.y), fd = c.types.at("D");
    const Format fc = c.beta != 0.0 ? c.types.at("C") : fd;
    DeviceBuffer scales;  // FP8: alive until the call is done
    const MatmulDesc desc = make_desc(c, g, io, scales);
    const LtLayout lx = make_layout(fx, g.x_rows(), g.x_cols(), g.ld_x, g.batch, g.stride_x);
    const LtLayout ly = make_layout(fy, g.y_rows(), g.y_cols(), g.ld_y, g.batch, g.stride_y);
    const LtLayout lc = make_layout(fc, g.m, g.n, c.beta != 0.0 ? g.ld_c : g.ld_d, g.batch,
                                  c.beta != 0.0 ? g.stride_c : g.stride_d);
    const LtLayout ld = make_layout(fd, g.m, g.n, g.ld_d, g.batch, g.stride_d);
    const Preference pref = make_preference(fd);
    // Ask for several algorithms and take the first that runs: the heuristic can offer one
    // that the matmul call then declines (cuBLASLt's own samples do the same).
    constexpr int kTry = 8;
    cublasLtMatmulHeuristicResult_t heur[kTry] = {};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(state.handle.get(), desc.get(), lx.get(), ly.get(), lc.get(),
                                                             ld.get(), pref.get(), kTry, heur, &found);
    // cuBLASLt's own word that it does not do this configuration (FP8 with some layouts
    // and shapes, for one): the case is not supported, not a failure.
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found == 0))
      throw KernelUnsupported(fmt::format("cublasLtMatmulAlgoGetHeuristic: {}", hs == CUBLAS_STATUS_SUCCESS
                                                                                  ? "no algorithm for this case"
                                                                                  : cublasGetStatusString(hs)));
    ULPGATE_CHECK(hs);
    const float alpha = static_cast<float>(c.alpha), beta = static_cast<float>(c.beta);
    void* d = io.out.at("D");
    const void* cptr = c.beta != 0.0 ? io.in.at("C") : d;
    int used = -1;
    cublasStatus_t last = CUBLAS_STATUS_SUCCESS;
    for (int a = 0; a < found && used < 0; ++a) {
      if (heur[a].state != CUBLAS_STATUS_SUCCESS) continue;
      last = cublasLtMatmul(state.handle.get(), desc.get(), &alpha, io.in.at(g.x), lx.get(), io.in.at(g.y), ly.get(), &beta,
                            cptr, lc.get(), d, ld.get(), &heur[a].algo, state.workspace.get(), kWorkspaceBytes,
                            static_cast<cudaStream_t>(io.stream));
      if (last == CUBLAS_STATUS_SUCCESS) used = a;
      else if (last != CUBLAS_STATUS_NOT_SUPPORTED) ULPGATE_CHECK(last);
    }
    if (used < 0)
      throw KernelUnsupported(fmt::format("cublasLtMatmul declined all {} algorithms the heuristic offered ({})", found,
                                          cublasGetStatusString(last)));
    describe_call(c, g, heur[used], used, notes);
  }

 private:
  struct ThreadState {
    LtHandle handle;
    DeviceBuffer workspace;
  };

  ThreadState& thread_state() {
    return states_.get([] {
      cublasLtHandle_t h;
      ULPGATE_CHECK(cublasLtCreate(&h));
      ThreadState s;
      s.handle.reset(h);
      s.workspace = DeviceBuffer(kWorkspaceBytes);
      return s;
    });
  }

  // The operation: transposes, compute type, epilogue and bias, and for FP8 the scales (in
  // `scales`, which must outlive the call) and fast accumulation.
  MatmulDesc make_desc(const Case& c, const ColumnMajorGemm& g, const KernelIo& io, DeviceBuffer& scales) const {
    const cublasComputeType_t compute = v_.compute == Format::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t raw;
    ULPGATE_CHECK(cublasLtMatmulDescCreate(&raw, compute, CUDA_R_32F));
    MatmulDesc desc(raw);
    set_desc(raw, CUBLASLT_MATMUL_DESC_TRANSA, g.op1);
    set_desc(raw, CUBLASLT_MATMUL_DESC_TRANSB, g.op2);
    // FP8 scales: D = alpha * (scale_A scale_B) op(A) op(B) + beta C (+ bias, act).
    if (is_fp8(c.types.at(g.x))) {
      // Each scale on its own 256-byte line: cuBLASLt may load scales as aligned vectors.
      float host_scales[128] = {};
      host_scales[0] = static_cast<float>(scale_of(c, g.x));
      host_scales[64] = static_cast<float>(scale_of(c, g.y));
      scales = DeviceBuffer(sizeof host_scales, io.stream);
      ULPGATE_CHECK(cudaMemcpyAsync(scales.get(), host_scales, sizeof host_scales, cudaMemcpyHostToDevice,
                                    static_cast<cudaStream_t>(io.stream)));
      const void* sx = scales.get();
      const void* sy = static_cast<const float*>(scales.get()) + 64;
      set_desc(raw, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sx);
      set_desc(raw, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sy);
      const std::int8_t fast = v_.fast_accum ? 1 : 0;
      set_desc(raw, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    }
    const cublasLtEpilogue_t epi = epilogue_of(c.epilogue);
    set_desc(raw, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    if (has_bias(c.epilogue)) {
      const void* bias = io.in.at("bias");
      set_desc(raw, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
      const cudaDataType_t bt = cuda_data_type(c.types.at("bias"));
      set_desc(raw, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bt);
    }
    return desc;
  }

  static Preference make_preference(Format fd) {
    cublasLtMatmulPreference_t raw;
    ULPGATE_CHECK(cublasLtMatmulPreferenceCreate(&raw));
    Preference pref(raw);
    const std::size_t ws = kWorkspaceBytes;
    ULPGATE_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    // A split-K algorithm may reduce its partial sums in D's type (in place in D, or through
    // the workspace): with a D narrower than FP32 that rounds every partial sum to FP16 or
    // BF16, which is not the FP32 accumulation these backends declare. Only reductions in
    // the compute type then (cuBLAS's CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION).
    if (fd != Format::FP32) {
      const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      ULPGATE_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                         sizeof schemes));
    }
    return pref;
  }

  void describe_call(const Case& c, const ColumnMajorGemm& g, const cublasLtMatmulHeuristicResult_t& chosen, int used,
                     RunNotes& notes) const {
    notes["library"] = fmt::format("cuBLASLt {}", cublasLtGetVersion());
    notes["algorithm"] = describe_algo(chosen.algo) + (used ? fmt::format(" (heuristic choice {})", used + 1) : "");
    notes["workspace_bytes"] = std::to_string(chosen.workspaceSize);
    notes["call"] = fmt::format("cublasLtMatmul(op1={}, op2={}, m={}, n={}, k={}, batch={}, fast_accum={})",
                                g.op1 == CUBLAS_OP_T ? "T" : "N", g.op2 == CUBLAS_OP_T ? "T" : "N", g.m, g.n, g.k,
                                g.batch, is_fp8(c.types.at(g.x)) ? (v_.fast_accum ? "on" : "off") : "n/a");
  }

  static double scale_of(const Case& c, const std::string& op) {
    auto it = c.scales.find(op);
    return it == c.scales.end() ? 1.0 : it->second;
  }
  static cublasLtEpilogue_t epilogue_of(Epilogue e) {
    switch (e) {
      case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
      case Epilogue::Relu: return CUBLASLT_EPILOGUE_RELU;
      case Epilogue::BiasRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
      case Epilogue::GeluTanh: return CUBLASLT_EPILOGUE_GELU;
      case Epilogue::BiasGeluTanh: return CUBLASLT_EPILOGUE_GELU_BIAS;
      default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
  }
  static std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
    auto get = [&](cublasLtMatmulAlgoConfigAttributes_t a) {
      std::uint32_t v = 0;
      std::size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v, sizeof v, &written);
      return v;
    };
    return fmt::format("id={} tile={} stages={} splitk={} reduction={} swizzle={}", get(CUBLASLT_ALGO_CONFIG_ID),
                       get(CUBLASLT_ALGO_CONFIG_TILE_ID), get(CUBLASLT_ALGO_CONFIG_STAGES_ID),
                       get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM), get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                       get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
  }
  LtVariant v_;
  PerThread<ThreadState> states_;
};

}  // namespace

std::vector<std::unique_ptr<Kernel>> make_cublaslt_kernels() {
  const std::vector<Format> fp8 = {Format::E4M3, Format::E5M2};
  const LtVariant variants[] = {
      {"cublaslt.fp32", "cuBLASLt matmul, FP32 inputs, CUBLAS_COMPUTE_32F", {Format::FP32}, Format::FP32},
      {"cublaslt.tf32", "cuBLASLt matmul, FP32 inputs on TF32 tensor cores", {Format::FP32, Format::TF32},
       Format::TF32},
      {"cublaslt.fp16", "cuBLASLt matmul, FP16 inputs, FP32 compute", {Format::FP16}, Format::FP32},
      {"cublaslt.bf16", "cuBLASLt matmul, BF16 inputs, FP32 compute", {Format::BF16}, Format::FP32},
      {"cublaslt.fp8", "cuBLASLt matmul, FP8 inputs with A/B scales, FP32 compute, fast accumulation off", fp8,
       Format::FP32, false},
      {"cublaslt.fp8_fast", "cuBLASLt matmul, FP8 inputs with A/B scales, fast accumulation on", fp8, Format::FP32,
       true},
  };
  std::vector<std::unique_ptr<Kernel>> out;
  for (const auto& v : variants) out.push_back(std::make_unique<CublasLtGemm>(v));
  return out;
}

}  // namespace ulpgate
