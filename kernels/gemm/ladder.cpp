// The ladder's kernels as registered kernels: each case becomes simt_fp32.hpp's row-major
// problem and runs on KernelIo::stream.
#include "kernels/gemm/ladder.hpp"

#include <fmt/format.h>

#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"
#include "kernels/gemm/tensor_core.hpp"
#include "kernels/probe/mma_unit.hpp"

namespace ulpgate {

simt::Problem simt_problem(const Case& c, const KernelIo& io) {
  const GemmShape& g = c.gemm;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
  const auto* a = static_cast<const float*>(io.in.at("A"));
  const auto* b = static_cast<const float*>(io.in.at("B"));
  const bool row = g.layout == Layout::RowMajor;
  simt::Problem p;
  p.m = row ? g.m : g.n, p.n = row ? g.n : g.m, p.k = g.k, p.batch = g.batch;
  // Row-major: A(i, k) is stored along k unless trans_a; B(k, j), read as (j, k), is stored
  // along k only when trans_b. Column-major: the problem's A is op(B)^T and its B is op(A),
  // each stored along k exactly when the row-major reading is not.
  const simt::Panel a_panel{a, av.ld, av.batch_stride(), row != g.trans_a};
  const simt::Panel b_panel{b, bv.ld, bv.batch_stride(), row == g.trans_b};
  p.a = row ? a_panel : b_panel;
  p.b = row ? b_panel : a_panel;
  if (c.beta != 0.0) {
    const MatrixView cv = gemm_view(c, "C");
    p.c = static_cast<const float*>(io.in.at("C")), p.ldc = cv.ld, p.stride_c = cv.batch_stride();
  }
  p.d = static_cast<float*>(io.out.at("D")), p.ldd = dv.ld, p.stride_d = dv.batch_stride();
  p.alpha = static_cast<float>(c.alpha), p.beta = static_cast<float>(c.beta);
  return p;
}

namespace {

struct LadderStep {
  simt::Step step;
  const char* name;
  const char* description;
  const char* tiles;  // the launch shape, for the run notes
};

// The FP32 SIMT steps (kernels/gemm/simt_fp32.cu).
class SimtGemm final : public Kernel {
 public:
  explicit SimtGemm(LadderStep s) : s_(s) {}
  std::string name() const override { return s_.name; }
  std::string description() const override { return s_.description; }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, s_.step != simt::Step::SplitKAtomic};
    t.thread_safe = true;        // no state; all work on io.stream
    t.rounds_to_nearest = true;  // FP32 FMA, add and atomicAdd round to nearest even
    // atomicAdd on FP32 (red.global.add.f32) flushes subnormal inputs and results to zero
    // (PTX ISA; seen on the H200: a D of 2^-127 came back +0, docs/results/probe_h200.md)
    t.flushes_subnormals = s_.step == simt::Step::SplitKAtomic;
    return t;
  }

  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Gemm) return std::string("GEMM only");
    for (const char* op : {"A", "B", "D"})
      if (c.types.at(op) != Format::FP32)
        return fmt::format("FP32 SIMT kernel: {} must be fp32, got {}", op, ulpgate::name(c.types.at(op)));
    if (c.types.at("compute") != Format::FP32)
      return fmt::format("FP32 SIMT kernel: compute must be fp32, got {}", ulpgate::name(c.types.at("compute")));
    if (c.beta != 0.0 && c.types.at("C") != Format::FP32)
      return fmt::format("FP32 SIMT kernel: C must be fp32, got {}", ulpgate::name(c.types.at("C")));
    if (c.epilogue != Epilogue::None) return std::string("no epilogue (bias, ReLU, GELU): cublaslt.* has them");
    if (!c.scales.empty()) return std::string("no operand scales (FP8 only)");
    if (!cuda_device_available()) return std::string(kNeedsCudaDevice);
    return std::nullopt;
  }

  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const simt::Problem p = simt_problem(c, io);
    simt::Plan plan;
    ULPGATE_CHECK(simt::plan(s_.step, p, &plan));
    const DeviceBuffer workspace(plan.workspace_bytes, io.stream);  // freed in the stream's order
    ULPGATE_CHECK(simt::launch(s_.step, p, plan, workspace.get(), static_cast<cudaStream_t>(io.stream)));
    if (p.alpha == 0.0f) {
      notes["algorithm"] = "alpha = 0: D = beta C, A and B not read (BLAS)";
      return;
    }
    notes["algorithm"] = s_.tiles;
    if (s_.step >= simt::Step::VecDb) {
      std::string vec;
      for (auto [taken, op] : {std::pair{plan.vec_a, "A"}, {plan.vec_b, "B"}, {plan.vec_d, c.beta != 0 ? "C D" : "D"}})
        if (taken) vec += vec.empty() ? op : fmt::format(" {}", op);
      notes["vector_access"] = vec.empty() ? "none (alignment or leading dimensions)" : vec;
    }
    if (s_.step == simt::Step::SplitK || s_.step == simt::Step::SplitKAtomic)
      notes["split_k"] = fmt::format("{} splits of K {}", plan.splits, plan.k_chunk);
  }

 private:
  LadderStep s_;
};

// The tensor-core steps (kernels/gemm/tensor_core.cu).
struct TensorCoreStep {
  tc::Step step;
  const char* name;
  const char* description;
  const char* tiles;
  Format input;  // FP16, BF16, or FP32 (read as TF32)
};

class TensorCoreGemm final : public Kernel {
 public:
  explicit TensorCoreGemm(TensorCoreStep s) : s_(s) {}
  std::string name() const override { return s_.name; }
  std::string description() const override { return s_.description; }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, true};
    t.thread_safe = true;  // no state; all work on io.stream
    // Each element is one accumulator walked along K in order: the probe's model of the
    // instruction is the kernel's arithmetic (docs/results/probe_h200.md), so the model rule
    // applies. wgmma's FP16/BF16 unit measured the same as mma.sync m16n8k16 (run 9). TF32
    // has no such model here (the CPU models accumulate FP32 inputs).
    if (s_.input != Format::FP32) {
      t.accumulation_model = fmt::format("cpu.blockfma:block=16,frac=25,round=rz,align={}", ulpgate::name(s_.input));
      t.arithmetic_source = wgmma() ? "probe, NVIDIA H200, 2026-12-03: wgmma m64nNk16 adds 16 products per step, truncated"
                                    : "probe, NVIDIA H200, 2026-12-02: mma.sync m16n8k16 adds 16 products per step, truncated";
    }
    return t;
  }

  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Gemm) return std::string("GEMM only");
    const Format a = c.types.at("A"), b = c.types.at("B"), d = c.types.at("D");
    const bool tf32 = s_.input == Format::FP32;
    const auto input_ok = [&](Format f) { return f == s_.input || (tf32 && f == Format::TF32); };
    if (!input_ok(a) || !input_ok(b))
      return fmt::format("{} takes {} inputs, got A {} and B {}", s_.name, tf32 ? "fp32 or tf32" : ulpgate::name(s_.input),
                         ulpgate::name(a), ulpgate::name(b));
    const Format compute = tf32 ? Format::TF32 : Format::FP32;
    if (c.types.at("compute") != compute)
      return fmt::format("compute must be {}, got {}", ulpgate::name(compute), ulpgate::name(c.types.at("compute")));
    if (d != Format::FP32 && (tf32 || d != s_.input))
      return fmt::format("D must be fp32{}, got {}", tf32 ? "" : fmt::format(" or {}", ulpgate::name(s_.input)), ulpgate::name(d));
    if (c.beta != 0.0 && c.types.at("C") != d) return fmt::format("C must have D's format ({})", ulpgate::name(d));
    if (c.epilogue != Epilogue::None) return std::string("no epilogue (bias, ReLU, GELU): cublaslt.* has them");
    if (!c.scales.empty()) return std::string("no operand scales (FP8 only)");
    if (c.gemm.batch > 65535) return std::string("batch > 65535");
    if (!cuda_device_available()) return std::string(kNeedsCudaDevice);
    if (wgmma() && !wgmma_available()) return std::string("wgmma and TMA need compute capability 9.0 (sm_90a)");
    return std::nullopt;
  }

  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const simt::Problem sp = simt_problem(c, io);  // the same mapping, read untyped
    const auto panel = [&](const simt::Panel& p) { return tc::Panel{p.p, p.ld, p.batch_stride, p.along_k}; };
    tc::Problem p;
    p.m = sp.m, p.n = sp.n, p.k = sp.k, p.batch = sp.batch;
    p.a = panel(sp.a), p.b = panel(sp.b);
    p.c = sp.c, p.ldc = sp.ldc, p.stride_c = sp.stride_c;
    p.d = sp.d, p.ldd = sp.ldd, p.stride_d = sp.stride_d;
    const Format d = c.types.at("D");
    p.out = d == Format::FP16 ? tc::Out::F16 : d == Format::BF16 ? tc::Out::BF16 : tc::Out::F32;
    p.alpha = sp.alpha, p.beta = sp.beta;
    tc::Plan plan;
    ULPGATE_CHECK(tc::plan(s_.step, p, &plan));
    const DeviceBuffer workspace(plan.workspace_bytes, io.stream);
    ULPGATE_CHECK(tc::launch(s_.step, p, plan, workspace.get(), static_cast<cudaStream_t>(io.stream)));
    if (p.alpha == 0.0f) {
      notes["algorithm"] = "alpha = 0: D = beta C, A and B not read (BLAS)";
      return;
    }
    notes["algorithm"] = s_.tiles;
    std::string repacked = plan.repack_a ? "A" : "";
    if (plan.repack_b) repacked += repacked.empty() ? "B" : " B";
    notes["repacked"] = repacked.empty() ? "none" : repacked + " (not along K or not 16-byte aligned)";
  }

 private:
  bool wgmma() const { return s_.step == tc::Step::WgmmaFp16 || s_.step == tc::Step::WgmmaBf16; }
  TensorCoreStep s_;
};

}  // namespace

std::vector<std::unique_ptr<Kernel>> make_ladder_kernels() {
  using simt::Step;
  const LadderStep steps[] = {
      {Step::Naive, "ladder.fp32_naive", "GEMM ladder 1: FP32 SIMT, one thread per element down a column (uncoalesced)",
       "1 thread per element, 32 x 8 threads along columns"},
      {Step::Coalesced, "ladder.fp32_coalesced",
       "GEMM ladder 2: FP32 SIMT, one thread per element along a row (coalesced)",
       "1 thread per element, 32 x 8 threads along rows"},
      {Step::Smem, "ladder.fp32_smem", "GEMM ladder 3: FP32 SIMT, 32 x 32 tiles in shared memory",
       "32 x 32 x 32 tiles in shared memory, 1 element per thread"},
      {Step::Reg1d, "ladder.fp32_reg1d", "GEMM ladder 4: FP32 SIMT, 64 x 64 tiles, 8 elements of a column per thread",
       "64 x 64 x 8 tiles, 8 x 1 per thread"},
      {Step::Reg2d, "ladder.fp32_reg2d", "GEMM ladder 5: FP32 SIMT, 128 x 128 tiles, 8 x 8 per thread",
       "128 x 128 x 8 tiles, 8 x 8 per thread"},
      {Step::VecDb, "ladder.fp32_vec_db", "GEMM ladder 6: FP32 SIMT, float4 loads, double-buffered shared memory",
       "128 x 128 x 8 tiles, 8 x 8 per thread, float4 loads, 2 shared buffers"},
      {Step::Warptile, "ladder.fp32_warptile", "GEMM ladder 7: FP32 SIMT, warp tiles (64 x 32 per warp), BK 16",
       "128 x 128 x 16 tiles, 64 x 32 per warp, 8 x 8 per thread, float4 loads, 2 shared buffers"},
      {Step::SplitK, "ladder.fp32_splitk",
       "GEMM ladder 8: FP32 SIMT split-K, partial sums reduced in a fixed order (deterministic)",
       "step 7 on K ranges, partial sums to a workspace, summed in split order"},
      {Step::SplitKAtomic, "ladder.fp32_splitk_atomic",
       "GEMM ladder 9: FP32 SIMT split-K, atomicAdd into D (not deterministic)",
       "step 7 on K ranges, atomicAdd into D = beta C"},
  };
  const TensorCoreStep tc_steps[] = {
      {tc::Step::WmmaFp16, "ladder.wmma_fp16", "GEMM ladder 10: WMMA 16 x 16 x 16, FP16 inputs, FP32 accumulation",
       "64 x 64 x 32 tiles, 4 warps of 2 x 2 WMMA fragments, one shared buffer", Format::FP16},
      {tc::Step::WmmaBf16, "ladder.wmma_bf16", "GEMM ladder 10: WMMA 16 x 16 x 16, BF16 inputs, FP32 accumulation",
       "64 x 64 x 32 tiles, 4 warps of 2 x 2 WMMA fragments, one shared buffer", Format::BF16},
      {tc::Step::MmaFp16, "ladder.mma_fp16",
       "GEMM ladder 11: mma.sync m16n8k16 with ldmatrix and a 4-stage cp.async pipeline, FP16 inputs, FP32 accumulation",
       "128 x 128 x 32 tiles, 4 warps of 64 x 64, swizzled shared memory, 4 stages", Format::FP16},
      {tc::Step::MmaBf16, "ladder.mma_bf16",
       "GEMM ladder 11: mma.sync m16n8k16 with ldmatrix and a 4-stage cp.async pipeline, BF16 inputs, FP32 accumulation",
       "128 x 128 x 32 tiles, 4 warps of 64 x 64, swizzled shared memory, 4 stages", Format::BF16},
      {tc::Step::MmaTf32, "ladder.mma_tf32",
       "GEMM ladder 12: mma.sync m16n8k8 on TF32 (FP32 inputs rounded to nearest, ties away), FP32 accumulation",
       "128 x 128 x 16 tiles, 4 warps of 64 x 64, swizzled shared memory, 4 stages", Format::FP32},
      {tc::Step::WgmmaFp16, "ladder.wgmma_fp16",
       "GEMM ladder 13: Hopper wgmma m64n256k16 fed by TMA, warp-specialised (1 producer, 2 consumer warpgroups), FP16 "
       "inputs, FP32 accumulation",
       "128 x 256 x 64 tiles, TMA into 128-byte swizzled shared memory, 4 stages, mbarriers", Format::FP16},
      {tc::Step::WgmmaBf16, "ladder.wgmma_bf16",
       "GEMM ladder 13: Hopper wgmma m64n256k16 fed by TMA, warp-specialised (1 producer, 2 consumer warpgroups), BF16 "
       "inputs, FP32 accumulation",
       "128 x 256 x 64 tiles, TMA into 128-byte swizzled shared memory, 4 stages, mbarriers", Format::BF16},
  };
  std::vector<std::unique_ptr<Kernel>> out;
  for (const auto& s : steps) out.push_back(std::make_unique<SimtGemm>(s));
  for (const auto& s : tc_steps) out.push_back(std::make_unique<TensorCoreGemm>(s));
  return out;
}

}  // namespace ulpgate
