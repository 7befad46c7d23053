// The GEMM ladder's host side, without a GPU: the kernels' names and traits, what they refuse,
// and the row-major problem every case becomes (simt_problem), element by element against
// the memory contract (case.hpp's gemm_view). The kernels themselves: test_ladder_gpu.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/case.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "kernels/gemm/ladder.hpp"
#include "tests/kernels/gemm_cases.hpp"

using namespace ulpgate;

TEST(Ladder, NamesAndTraits) {
  const auto kernels = make_ladder_kernels();
  const char* names[] = {"ladder.fp32_naive",    "ladder.fp32_coalesced", "ladder.fp32_smem",
                         "ladder.fp32_reg1d",    "ladder.fp32_reg2d",     "ladder.fp32_vec_db",
                         "ladder.fp32_warptile", "ladder.fp32_splitk",    "ladder.fp32_splitk_atomic",
                         "ladder.wmma_fp16",     "ladder.wmma_bf16",      "ladder.mma_fp16",
                         "ladder.mma_bf16",      "ladder.mma_tf32",       "ladder.wgmma_fp16",
                         "ladder.wgmma_bf16"};
  ASSERT_EQ(kernels.size(), std::size(names));
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    const Kernel& k = *kernels[i];
    EXPECT_EQ(k.name(), names[i]);
    const KernelTraits t = k.traits();
    const bool simt = i < 9;
    EXPECT_EQ(t.memory, Memory::Device);
    EXPECT_TRUE(t.thread_safe);
    EXPECT_EQ(t.rounds_to_nearest, simt) << k.name() << ": tensor cores truncate";
    EXPECT_EQ(t.accumulator_bits, 0);
    EXPECT_EQ(t.deterministic, k.name() != "ladder.fp32_splitk_atomic") << k.name();
    // FP16 and BF16 steps (mma.sync, WMMA and wgmma) declare the probe's model of their unit
    // (the model rule applies)
    const char* model = k.name().find("fp16") != std::string::npos ? "cpu.blockfma:block=16,frac=25,round=rz,align=fp16"
                        : k.name().find("bf16") != std::string::npos ? "cpu.blockfma:block=16,frac=25,round=rz,align=bf16"
                                                                      : "";
    EXPECT_EQ(t.accumulation_model, model) << k.name();
    if (*model) { EXPECT_TRUE(AccumulationModel::parse(model)) << model; }
  }
}

TEST(Ladder, RefusesWhatItDoesNotCompute) {
  for (const auto& k : make_ladder_kernels()) {
    if (k->name().rfind("ladder.fp32_", 0) != 0) continue;  // the tensor-core steps: below
    const auto why = [&](const Case& c) { return k->unsupported(c).value_or(""); };
    Case c = test_support::gemm_case(8, 8, 8, Format::FP16, Format::FP32);
    EXPECT_EQ(why(c), "FP32 SIMT kernel: A must be fp32, got fp16");
    c = test_support::gemm_case(8, 8, 8, Format::FP32, Format::BF16);
    EXPECT_EQ(why(c), "FP32 SIMT kernel: D must be fp32, got bf16");
    c = test_support::gemm_case(8, 8, 8, Format::FP32, Format::FP32, Format::TF32);
    EXPECT_EQ(why(c), "FP32 SIMT kernel: compute must be fp32, got tf32");
    c = test_support::gemm_case(8, 8, 8, Format::FP32, Format::FP32);
    c.beta = 1, c.types["C"] = Format::FP16;
    EXPECT_EQ(why(c), "FP32 SIMT kernel: C must be fp32, got fp16");
    c = test_support::gemm_case(8, 8, 8, Format::FP32, Format::FP32);
    c.epilogue = Epilogue::Relu;
    EXPECT_EQ(why(c), "no epilogue (bias, ReLU, GELU): cublaslt.* has them");
    c = test_support::gemm_case(8, 8, 8, Format::FP32, Format::FP32);
    c.op = Op::Attention;
    EXPECT_EQ(why(c), "GEMM only");
    // An FP32 case: the kernel's to run wherever there is a device.
    c = test_support::gemm_case(8, 8, 8, Format::FP32, Format::FP32);
    c.beta = 2, c.types["C"] = Format::FP32, c.gemm.layout = Layout::ColMajor, c.gemm.trans_a = true;
    EXPECT_EQ(why(c), cuda_device_available() ? "" : kNeedsCudaDevice);
  }
}

TEST(Ladder, TensorCoreStepsRefuseWhatTheyDoNotCompute) {
  Registry reg;
  for (auto& k : make_ladder_kernels()) reg.add(std::move(k));
  const auto why = [&](const char* kernel, const Case& c) { return reg.find(kernel)->unsupported(c).value_or(""); };
  using test_support::gemm_case;
  EXPECT_EQ(why("ladder.mma_fp16", gemm_case(8, 8, 8, Format::BF16, Format::FP32)),
            "ladder.mma_fp16 takes fp16 inputs, got A bf16 and B bf16");
  EXPECT_EQ(why("ladder.mma_bf16", gemm_case(8, 8, 8, Format::BF16, Format::FP16)), "D must be fp32 or bf16, got fp16");
  EXPECT_EQ(why("ladder.wmma_fp16", gemm_case(8, 8, 8, Format::FP16, Format::FP32, Format::FP16)),
            "compute must be fp32, got fp16");
  EXPECT_EQ(why("ladder.mma_tf32", gemm_case(8, 8, 8, Format::FP32, Format::FP32)), "compute must be tf32, got fp32");
  EXPECT_EQ(why("ladder.mma_tf32", gemm_case(8, 8, 8, Format::FP32, Format::BF16, Format::TF32)),
            "D must be fp32, got bf16");
  Case c = gemm_case(8, 8, 8, Format::FP16, Format::FP16);
  c.beta = 1, c.types["C"] = Format::FP32;
  EXPECT_EQ(why("ladder.mma_fp16", c), "C must have D's format (fp16)");
  c = gemm_case(8, 8, 8, Format::FP16, Format::FP32);
  c.epilogue = Epilogue::Relu;
  EXPECT_EQ(why("ladder.mma_fp16", c), "no epilogue (bias, ReLU, GELU): cublaslt.* has them");
  c = gemm_case(8, 8, 8, Format::FP16, Format::FP16);
  c.gemm.batch = 65536;
  EXPECT_EQ(why("ladder.mma_fp16", c), "batch > 65535");
  // What they take: the run needs only a device.
  const std::string device = cuda_device_available() ? "" : kNeedsCudaDevice;
  EXPECT_EQ(why("ladder.mma_tf32", gemm_case(8, 8, 8, Format::TF32, Format::FP32, Format::TF32)), device);
  c = gemm_case(8, 8, 8, Format::BF16, Format::BF16);
  c.beta = 2, c.types["C"] = Format::BF16, c.gemm.layout = Layout::ColMajor, c.gemm.trans_b = true;
  EXPECT_EQ(why("ladder.wmma_bf16", c), device);
}

// Every element the kernels address -- A(i, k), B(j, k), C(i, j), D(i, j) of the row-major
// problem -- is the element of the case that case.hpp says, for both layouts, all transposes,
// padded leading dimensions and batches; a column-major case is its transpose (i and j swap).
TEST(Ladder, RowMajorProblemAddressesTheCasesElements) {
  int cases = 0;
  for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
    for (int trans = 0; trans < 4; ++trans)
      for (int pad = 0; pad < 2; ++pad) {
        Case c = test_support::gemm_case(5, 3, 4, Format::FP32, Format::FP32);
        auto& g = c.gemm;
        g.layout = layout, g.trans_a = trans & 1, g.trans_b = trans & 2, g.batch = 2;
        c.alpha = 0.75, c.beta = -2, c.types["C"] = Format::FP32;
        if (pad) {
          g.lda = g.packed_ld(g.a_rows(), g.a_cols()) + 1, g.ldb = g.packed_ld(g.b_rows(), g.b_cols()) + 2;
          g.ldc = g.packed_ld(g.m, g.n) + 3, g.ldd = g.packed_ld(g.m, g.n) + 4;
        }
        validate(c);
        float a = 0, b = 0, cc = 0, d = 0;  // stand-ins for the buffers: only the offsets matter
        KernelIo io;
        io.in = {{"A", &a}, {"B", &b}, {"C", &cc}};
        io.out = {{"D", &d}};
        const simt::Problem p = simt_problem(c, io);
        const bool row = layout == Layout::RowMajor;
        const std::string what = fmt::format("{} ta {} tb {} pad {}", name(layout), g.trans_a, g.trans_b, pad);
        ASSERT_EQ(p.m, row ? g.m : g.n) << what;
        ASSERT_EQ(p.n, row ? g.n : g.m) << what;
        ASSERT_EQ(p.k, g.k);
        ASSERT_EQ(p.batch, g.batch);
        EXPECT_EQ(p.alpha, 0.75f);
        EXPECT_EQ(p.beta, -2.0f);
        // The panel holding op(A) (its mn is i) and the one holding op(B) (its mn is j).
        const simt::Panel& pa = row ? p.a : p.b;
        const simt::Panel& pb = row ? p.b : p.a;
        ASSERT_EQ(pa.p, &a) << what;
        ASSERT_EQ(pb.p, &b) << what;
        ASSERT_EQ(p.c, &cc) << what;
        ASSERT_EQ(p.d, &d) << what;
        const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), cv = gemm_view(c, "C"), dv = gemm_view(c, "D");
        for (std::int64_t bt = 0; bt < g.batch; ++bt)
          for (std::int64_t i = 0; i < g.m; ++i)
            for (std::int64_t j = 0; j < g.n; ++j) {
              const std::int64_t pi = row ? i : j, pj = row ? j : i;  // D(i, j) in the problem
              EXPECT_EQ(bt * p.stride_d + pi * p.ldd + pj, dv.offset(bt, i, j)) << what;
              EXPECT_EQ(bt * p.stride_c + pi * p.ldc + pj, cv.offset(bt, i, j)) << what;
              for (std::int64_t k = 0; k < g.k; ++k) {
                EXPECT_EQ(simt::offset(pa, bt, i, k), op_a_offset(c, av, bt, i, k)) << what << " A " << i << "," << k;
                EXPECT_EQ(simt::offset(pb, bt, j, k), op_b_offset(c, bv, bt, k, j)) << what << " B " << k << "," << j;
              }
            }
        ++cases;
      }
  EXPECT_EQ(cases, 16);
}
