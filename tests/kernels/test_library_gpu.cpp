// Every cuBLAS / cuBLASLt backend and the example device plugin through the runner, on the
// GPU (label gpu). On exact data (small integers) every correct backend must give the
// exact result, correctly rounded once to D's format: a layout, transpose, leading-
// dimension, batch, beta, bias, ReLU or scale bug shows as a bit mismatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <set>

#include <fmt/format.h>

#include "core/format_mpfr.hpp"
#include "core/parallel.hpp"
#include "check/runner.hpp"
#include "references/exact_dot.hpp"
#include "kernels/device.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "kernels/gemm/library.hpp"
#include "kernels/plugin/loader.hpp"
#include "tests/kernels/gemm_cases.hpp"
#include "kernels/builtin.hpp"

using namespace ulpgate;

namespace {

// The exact result of the case on its (exact, small) inputs, in double: exact for this data.
double exact_element(const Case& c, const std::map<std::string, Tensor>& in, std::int64_t b, std::int64_t i,
                     std::int64_t j) {
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B");
  auto sc = [&](const char* op) { return c.scales.count(op) ? c.scales.at(op) : 1.0; };
  double s = 0;
  for (std::int64_t k = 0; k < c.gemm.k; ++k)
    s += in.at("A").value(op_a_offset(c, av, b, i, k)) * in.at("B").value(op_b_offset(c, bv, b, k, j));
  s *= c.alpha * sc("A") * sc("B");
  if (c.beta != 0) s += c.beta * in.at("C").value(gemm_view(c, "C").offset(b, i, j));
  if (has_bias(c.epilogue)) s += in.at("bias").value(j);
  if (c.epilogue == Epilogue::Relu || c.epilogue == Epilogue::BiasRelu) s = std::max(s, 0.0);
  return s;
}

struct ErrorSummary {
  double max_normalised = 0;  // max |d - exact| / sum |a_k b_k|
  double max_ulp = 0;         // max |ulp_error| in D's format
};

// Errors of D against the exact product (alpha = 1, beta = 0, no epilogue).
ErrorSummary gemm_errors(const Case& c, const std::map<std::string, Tensor>& in, const Tensor& d) {
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
  const Format fd = c.types.at("D");
  const bool fp64 = c.types.at("A") == Format::FP64;
  const std::int64_t M = c.gemm.m, N = c.gemm.n, K = c.gemm.k;
  // op(A) rows and op(B) columns, contiguous, decoded once.
  std::vector<double> a(M * K), b(N * K);
  parallel_for(M, [&](std::int64_t i) {
    for (std::int64_t k = 0; k < K; ++k) a[i * K + k] = in.at("A").value(op_a_offset(c, av, 0, i, k));
  });
  parallel_for(N, [&](std::int64_t j) {
    for (std::int64_t k = 0; k < K; ++k) b[j * K + k] = in.at("B").value(op_b_offset(c, bv, 0, k, j));
  });
  std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());  // exact: inputs are FP32 or narrower
  std::vector<double> norm(M * N), ulp(M * N);
  parallel_for(M, [&](std::int64_t i) {
    ExactAccumulator acc;
    MpfrOracle oracle;
    Mpfr exact(64), diff(256);
    for (std::int64_t j = 0; j < N; ++j) {
      const std::span<const double> ar(&a[i * K], K), bc(&b[j * K], K);
      double cond = 0;  // sum |a_k b_k|, a normaliser: FP64 accuracy is plenty
      for (std::int64_t k = 0; k < K; ++k) cond += std::fabs(ar[k] * bc[k]);
      if (fp64) {
        oracle.dot(exact, ar, bc);
      } else {
        acc.clear();
        acc.add_products(std::span<const float>(&af[i * K], K), std::span<const float>(&bf[j * K], K));
        acc.exact_value(exact);
      }
      const Code got = d.code(dv.offset(0, i, j));
      mpfr_sub_d(diff, exact, decode(fd, got), MPFR_RNDN);
      norm[i * N + j] = std::fabs(mpfr_get_d(diff, MPFR_RNDN)) / cond;
      ulp[i * N + j] = std::fabs(ulp_error(fd, got, exact.get()));
    }
  });
  ErrorSummary s;
  for (std::size_t e = 0; e < norm.size(); ++e) {
    s.max_normalised = std::max(s.max_normalised, norm[e]);
    s.max_ulp = std::max(s.max_ulp, ulp[e]);
  }
  return s;
}

std::vector<Format> outputs_for(Format in) {
  switch (in) {
    case Format::FP64: return {Format::FP64};
    case Format::FP32: return {Format::FP32};
    case Format::FP16: return {Format::FP16, Format::FP32};
    case Format::BF16: return {Format::BF16, Format::FP32};
    default: return {Format::FP32, Format::BF16, Format::FP16};  // FP8
  }
}

}  // namespace

TEST(LibraryGpu, EveryBackendExactOnExactData) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::printf("[ device ] %s\n", device_description().c_str());
  auto kernels = make_library_kernels();
  const std::pair<Format, Format> inputs[] = {{Format::FP64, Format::FP64}, {Format::FP32, Format::FP32},
                                              {Format::FP16, Format::FP16}, {Format::BF16, Format::BF16},
                                              {Format::E4M3, Format::E4M3}, {Format::E4M3, Format::E5M2},
                                              {Format::E5M2, Format::E4M3}};
  for (auto& k : kernels) {
    int ran = 0, unsupported = 0;
    std::set<std::string> notes_seen;
    for (auto [fa, fb] : inputs)
      for (Format fd : outputs_for(fa))
        for (Format compute : {Format::FP64, Format::FP32, Format::TF32})
          for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
            for (int variant = 0; variant < 4; ++variant) {
              Case c = test_support::gemm_case(24, 40, 64, fa, fd, compute);
              c.types["B"] = fb;
              c.gemm.layout = layout;
              // variant 0: plain; 1: transposes + padding + batch; 2: beta and C; 3: epilogue/scales
              const bool fp8 = fa == Format::E4M3 || fa == Format::E5M2;
              c.gemm.trans_a = variant == 1 ? !fp8 || layout == Layout::ColMajor : layout == Layout::ColMajor && fp8;
              c.gemm.trans_b = variant == 1 ? !fp8 || layout == Layout::RowMajor : layout == Layout::RowMajor && fp8;
              if (variant == 1) {
                c.gemm.batch = 3;
                c.gemm.lda = c.gemm.packed_ld(c.gemm.a_rows(), c.gemm.a_cols()) + 16;
                c.gemm.ldd = c.gemm.packed_ld(24, 40) + 8;
              }
              if (variant == 2) {
                c.beta = 2.0;
                c.types["C"] = fd;
              }
              if (variant == 3) {
                c.epilogue = Epilogue::BiasRelu;
                c.types["bias"] = fp8 ? (fd == Format::FP16 ? Format::FP16 : Format::BF16) : fd;
                if (fp8) c.scales = {{"A", 0.5}, {"B", 4.0}};
              }
              if (k->unsupported(c)) continue;
              const auto in = test_support::fill(c, test_support::Fill::SmallIntegers, 1000 + variant);
              const RunOutcome r = run_kernel(*k, c, in);
              if (r.status == Disposition::NotSupported) {
                ++unsupported;
                continue;
              }
              const std::string what = fmt::format("{} {}x{}->{} compute {} {} variant {}", k->name(), name(fa),
                                                   name(fb), name(fd), name(compute), name(layout), variant);
              if (r.status != Disposition::Ok) {
                ADD_FAILURE() << what << ": " << name(r.status) << ": " << r.message;
                continue;
              }
              EXPECT_EQ(r.unwritten, 0) << what;
              EXPECT_EQ(r.padding_written, 0) << what;
              EXPECT_TRUE(r.inputs_modified.empty()) << what;
              const MatrixView dv = gemm_view(c, "D");
              std::int64_t mismatches = 0;
              for (std::int64_t b = 0; b < c.gemm.batch; ++b)
                for (std::int64_t i = 0; i < c.gemm.m; ++i)
                  for (std::int64_t j = 0; j < c.gemm.n; ++j) {
                    const Code want = encode(fd, exact_element(c, in, b, i, j));
                    const Code got = r.outputs.at("D").code(dv.offset(b, i, j));
                    if (got != want && mismatches++ < 3)
                      ADD_FAILURE() << what << " [" << b << "," << i << "," << j << "]: got "
                                    << hex_code(fd, got) << " want " << hex_code(fd, want);
                  }
              EXPECT_EQ(mismatches, 0) << what;
              notes_seen.insert(r.notes.count("algorithm") ? r.notes.at("algorithm") : "");
              ++ran;
            }
    std::printf("[ backend ] %-18s exact on %d cases (%d declined by the library); e.g. %s\n", k->name().c_str(),
                ran, unsupported, notes_seen.empty() ? "" : notes_seen.begin()->c_str());
    EXPECT_GT(ran, 0) << k->name() << " never ran";
  }
}

TEST(LibraryGpu, ExampleDevicePluginMatchesSequentialModel) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Registry reg;
  load_plugin(EXAMPLE_PLUGIN, reg);
  Kernel* k = reg.find("example.device_sgemm");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->traits().memory, Memory::Device);
  auto model = make_emulated_gemm(default_models()[0]);
  for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
    for (bool t : {false, true}) {
      Case c = test_support::gemm_case(33, 17, 129, Format::FP32, Format::FP32);
      c.gemm.layout = layout, c.gemm.trans_a = t, c.gemm.trans_b = !t, c.gemm.batch = 2;
      c.alpha = 1.25, c.beta = 0.5;
      c.types["C"] = Format::FP32;
      const auto in = test_support::fill(c, test_support::Fill::Normal, 5);
      const RunOutcome g = run_kernel(*k, c, in), m = run_kernel(*model, c, in);
      ASSERT_EQ(g.status, Disposition::Ok) << g.message;
      EXPECT_EQ(g.unwritten, 0);
      EXPECT_EQ(std::memcmp(g.outputs.at("D").data(), m.outputs.at("D").data(), g.outputs.at("D").size_bytes()), 0)
          << "device plugin differs from cpu.fp32_seq";
    }
}

// The backend error table: max error normalised by sum|a_i b_i| and max ULP
// error in D's format, per backend x format, K = 4096 and 65536, normal(0,1) and
// uniform(0,1) (all-positive) inputs, against the exact reference (references/). Printed,
// and written as Markdown to $ULPGATE_RESULTS_DIR/backend_errors.md when that is set.
TEST(LibraryGpu, BackendErrorTable) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  struct Row { const char* kernel; Format in, out, compute; };
  const Row rows[] = {
      {"cublas.fp64", Format::FP64, Format::FP64, Format::FP64},
      {"cublas.fp32", Format::FP32, Format::FP32, Format::FP32},
      {"cublas.tf32", Format::FP32, Format::FP32, Format::TF32},
      {"cublas.fp16", Format::FP16, Format::FP32, Format::FP32},
      {"cublas.bf16", Format::BF16, Format::FP32, Format::FP32},
      {"cublaslt.fp32", Format::FP32, Format::FP32, Format::FP32},
      {"cublaslt.tf32", Format::FP32, Format::FP32, Format::TF32},
      {"cublaslt.fp16", Format::FP16, Format::FP32, Format::FP32},
      {"cublaslt.bf16", Format::BF16, Format::FP32, Format::FP32},
      {"cublaslt.fp8", Format::E4M3, Format::FP32, Format::FP32},
      {"cublaslt.fp8_fast", Format::E4M3, Format::FP32, Format::FP32},
  };
  auto kernels = make_library_kernels();
  std::string md = "| backend | inputs | D | K | inputs drawn from | max err / Σ\\|a b\\| | max ULP error (D) | algorithm |\n"
                   "|---|---|---|---|---|---|---|---|\n";
  for (const Row& row : rows) {
    Kernel* k = nullptr;
    for (auto& kk : kernels)
      if (kk->name() == row.kernel) k = kk.get();
    ASSERT_NE(k, nullptr) << row.kernel;
    for (std::int64_t K : {4096, 65536})
      for (auto fill : {test_support::Fill::Normal, test_support::Fill::Positive}) {
        const std::int64_t mn = row.in == Format::FP64 ? 32 : 256;  // FP64 goes through MPFR
        Case c = test_support::gemm_case(mn, mn, K, row.in, row.out, row.compute);
        c.gemm.trans_b = true;  // B stored N x K (the FP8 "TN" form; any layout works for the others)
        const auto in = test_support::fill(c, fill, 77);
        const RunOutcome r = run_kernel(*k, c, in);
        if (r.status != Disposition::Ok || r.unwritten != 0) {
          ADD_FAILURE() << row.kernel << ": " << name(r.status) << " " << r.message << ", unwritten " << r.unwritten;
          md += fmt::format("| {} | {} | {} | {} | | {} | | |\n", row.kernel, name(row.in), name(row.out), K, name(r.status));
          continue;
        }
        const ErrorSummary e = gemm_errors(c, in, r.outputs.at("D"));
        const char* dist = fill == test_support::Fill::Normal ? "normal(0,1)" : "uniform(0,1)";
        md += fmt::format("| {} | {} | {} | {} | {} | {:.3g} | {:.4g} | {} |\n", row.kernel, name(row.in), name(row.out),
                          K, dist, e.max_normalised, e.max_ulp, r.notes.count("algorithm") ? r.notes.at("algorithm") : "");
      }
  }
  std::printf("[ table ] %s\n%s", device_description().c_str(), md.c_str());
  if (const char* dir = std::getenv("ULPGATE_RESULTS_DIR")) {
    std::FILE* f = std::fopen((std::string(dir) + "/backend_errors.md").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "Device: %s\n\n%s", device_description().c_str(), md.c_str());
    std::fclose(f);
  }
}

// A GELU epilogue's own evaluation error, measured: K = 1 GEMMs with BF16 inputs (their
// products exact in FP32) give D = gelu_tanh(a_i b_j) on 2^20 arguments in [-6, 6]; the
// largest |D - gelu_tanh(v)| / (|v| / 2) (the tanh's absolute error, plus D's rounding) must
// stay within the kernel's declared activation_error (0: at most 4 ulp of FP32 near 1).
TEST(LibraryGpu, GeluEpilogueWithinItsDeclaredError) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  int kernels_run = 0;
  for (auto& k : make_library_kernels()) {
    for (const Format in : {Format::BF16, Format::FP16, Format::FP32}) {
      Case c = test_support::gemm_case(1024, 1024, 1, in, Format::FP32, Format::FP32);
      c.epilogue = Epilogue::GeluTanh;
      if (k->unsupported(c)) {
        c.types["compute"] = Format::TF32;
        if (k->unsupported(c)) continue;
      }
      auto in_tensors = test_support::fill(c, test_support::Fill::SmallIntegers, 7);
      for (const char* op : {"A", "B"}) {
        Tensor& t = in_tensors.at(op);
        for (std::size_t e = 0; e < t.size(); ++e) {  // a in [-6, 6], b in [0.5, 1]: BF16 values
          const RandomBlock r = random_block(11, op[0] == 'A' ? 1 : 2, e);
          const double u = static_cast<double>(r.w[0]) * 0x1p-32;
          t.set_value(e, decode(Format::BF16, encode(Format::BF16, op[0] == 'A' ? -6.0 + 12.0 * u : 0.5 + 0.5 * u)));
        }
      }
      const RunOutcome r = run_kernel(*k, c, in_tensors);
      if (r.status == Disposition::NotSupported) continue;
      ASSERT_EQ(r.status, Disposition::Ok) << k->name() << ": " << r.message;
      const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
      double worst = 0, worst_v = 0;
      for (std::int64_t i = 0; i < c.gemm.m; ++i)
        for (std::int64_t j = 0; j < c.gemm.n; ++j) {
          const double v = in_tensors.at("A").value(op_a_offset(c, av, 0, i, 0)) * in_tensors.at("B").value(op_b_offset(c, bv, 0, 0, j));
          if (v == 0) continue;
          const double want = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
          const double ratio = std::fabs(r.outputs.at("D").value(dv.offset(0, i, j)) - want) / (std::fabs(v) / 2);
          if (ratio > worst) worst = ratio, worst_v = v;
        }
      const double declared = k->traits().activation_error;
      std::printf("[ gelu ] %-18s %s inputs: largest tanh error %.3g = 2^%.2f (at v = %.6g); declared %.3g\n",
                  k->name().c_str(), std::string(name(in)).c_str(), worst, std::log2(worst), worst_v, declared);
      EXPECT_LE(worst, declared > 0 ? declared : 0x1p-21) << k->name() << " " << name(in);
      ++kernels_run;
      break;  // one input format per kernel
    }
  }
  EXPECT_GT(kernels_run, 0);
}

// GELU of values near the top of FP32's range: GEMMs with A = 0 give D = gelu_tanh(bias_j)
// for every positive and negative BF16 bias from 2^125 to its largest finite value. For
// large |x| gelu_tanh(x) is x or -0, so every element below 2^127 in magnitude must come
// out exactly so: Inf or NaN there is an overflow inside the epilogue. The test prints how
// the kernels do from 2^127 on, where 2x no longer fits in FP32 (the harness reports an
// Inf there as `unexpected_inf`: the exact value is finite).
TEST(LibraryGpu, GeluOfValuesNearTheFp32Maximum) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<double> xs;
  for (std::uint32_t code = 0x7E00; code <= 0x7F7F; ++code) xs.push_back(decode(Format::BF16, code));
  const std::size_t positives = xs.size();
  for (std::size_t e = 0; e < positives; ++e) xs.push_back(-xs[e]);
  int configs = 0;
  for (auto& k : make_library_kernels()) {
    for (const Format in : {Format::FP32, Format::BF16, Format::E4M3}) {
      Case c = test_support::gemm_case(16, static_cast<std::int64_t>(xs.size()), 16, in, Format::FP32, Format::FP32);
      c.epilogue = Epilogue::BiasGeluTanh;
      bool supported = false;  // the first of the layouts, bias formats and compute types the kernel takes
      for (const bool trans_a : {false, true})
        for (const Format bias : {Format::FP32, Format::BF16})
          for (const Format compute : {Format::FP32, Format::TF32}) {
            if (supported) continue;
            c.gemm.trans_a = trans_a, c.types["bias"] = bias, c.types["compute"] = compute;
            supported = !k->unsupported(c);
          }
      if (!supported) continue;
      auto tensors = test_support::fill(c, test_support::Fill::SmallIntegers, 5);
      Tensor& a = tensors.at("A");
      for (std::size_t e = 0; e < a.size(); ++e) a.set_value(e, 0.0);
      for (std::size_t j = 0; j < xs.size(); ++j) tensors.at("bias").set_value(j, xs[j]);
      const RunOutcome r = run_kernel(*k, c, tensors);
      if (r.status == Disposition::NotSupported) continue;
      ASSERT_EQ(r.status, Disposition::Ok) << k->name() << ": " << r.message;
      ++configs;
      const MatrixView dv = gemm_view(c, "D");
      std::int64_t below_wrong = 0, above = 0, above_inf = 0, above_nan = 0;
      double first_wrong = 0;
      for (std::int64_t i = 0; i < c.gemm.m; ++i)
        for (std::size_t j = 0; j < xs.size(); ++j) {
          const double x = xs[j], got = r.outputs.at("D").value(static_cast<std::size_t>(dv.offset(0, i, static_cast<std::int64_t>(j))));
          if (std::fabs(x) < 0x1p127) {
            const bool right = x > 0 ? got == x : got == 0.0;
            if (!right && below_wrong++ == 0) first_wrong = x;
          } else {
            ++above;
            above_inf += std::isinf(got);
            above_nan += std::isnan(got);
          }
        }
      std::printf("[ gelu-max ] %-18s %s inputs: |x| < 2^127: %lld wrong; |x| >= 2^127: %lld of %lld Inf, %lld NaN\n",
                  k->name().c_str(), std::string(name(in)).c_str(), static_cast<long long>(below_wrong),
                  static_cast<long long>(above_inf), static_cast<long long>(above), static_cast<long long>(above_nan));
      EXPECT_EQ(below_wrong, 0) << k->name() << ": gelu_tanh(" << first_wrong << ") is not x or -0";
      break;  // one input format per kernel
    }
  }
  EXPECT_GT(configs, 0);
}

// GELU (tanh form) into an FP16 D, on accumulations beyond FP16's range: D = gelu_tanh(2 a_i)
// with B = 2 in row 0, A's row i = (a_i, 0, ..., 0), a_i every FP16 value from 2^13 up, of both
// signs, at K = 1, 4 and 64. The accumulation is exact in FP32; gelu_tanh(x) is x for these
// positive x and -0 for these negative x. Correct results: x rounded to FP16 (+Inf from 65520
// up) and a zero. A kernel that rounds the accumulation to FP16 before the GELU (cuBLASLt does
// beyond K = 1, docs/results/admitted.md) meets -Inf below -65520, and 0.5 x (1 + tanh(..))
// of -Inf is -Inf times 0: NaN where the exact result is -0. The NaN are counted and
// printed; the check path's verdict on such an element is D:unexpected_nan.
TEST(LibraryGpu, GeluOfFp16AccumulationsBeyondFp16Range) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<double> as;
  for (std::uint32_t code = 0x7000; code <= 0x7BFF; ++code) as.push_back(decode(Format::FP16, code));
  const std::size_t positives = as.size();
  for (std::size_t e = 0; e < positives; ++e) as.push_back(-as[e]);
  int configs = 0;
  for (auto& k : make_library_kernels())
    for (const std::int64_t K : {1, 4, 64}) {
      Case c = test_support::gemm_case(static_cast<std::int64_t>(as.size()), 16, K, Format::FP16, Format::FP16, Format::FP32);
      c.epilogue = Epilogue::GeluTanh;
      if (k->unsupported(c)) continue;
      auto tensors = test_support::fill(c, test_support::Fill::SmallIntegers, 5);
      const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
      for (std::int64_t i = 0; i < c.gemm.m; ++i)
        for (std::int64_t kk = 0; kk < K; ++kk)
          tensors.at("A").set_value(static_cast<std::size_t>(op_a_offset(c, av, 0, i, kk)), kk == 0 ? as[static_cast<std::size_t>(i)] : 0.0);
      for (std::int64_t kk = 0; kk < K; ++kk)
        for (std::int64_t j = 0; j < c.gemm.n; ++j)
          tensors.at("B").set_value(static_cast<std::size_t>(op_b_offset(c, bv, 0, kk, j)), kk == 0 ? 2.0 : 0.0);
      const RunOutcome r = run_kernel(*k, c, tensors);
      if (r.status == Disposition::NotSupported) continue;
      ASSERT_EQ(r.status, Disposition::Ok) << k->name() << ": " << r.message;
      ++configs;
      std::int64_t inside_wrong = 0, beyond = 0, beyond_nan = 0, beyond_wrong_positive = 0;
      double first_wrong = 0, first_got = 0;
      for (std::int64_t i = 0; i < c.gemm.m; ++i)
        for (std::int64_t j = 0; j < c.gemm.n; ++j) {
          const double x = 2 * as[static_cast<std::size_t>(i)];
          const double got = r.outputs.at("D").value(static_cast<std::size_t>(dv.offset(0, i, j)));
          // +0 for -0 is no error: the ULP distance counts the zeros as one value.
          const bool right = got == (x > 0 ? round_to(Format::FP16, x) : 0.0);
          if (std::fabs(x) < 65520) {
            if (!right && inside_wrong++ == 0) first_wrong = x, first_got = got;
          } else if (x > 0) {
            beyond_wrong_positive += !right;
          } else {
            ++beyond;
            beyond_nan += std::isnan(got);
          }
        }
      std::printf("[ gelu-fp16 ] %-18s K = %2lld: |x| < 65520: %lld wrong; x >= 65520: %lld not +Inf; x <= -65520: %lld of %lld NaN\n",
                  k->name().c_str(), static_cast<long long>(K), static_cast<long long>(inside_wrong),
                  static_cast<long long>(beyond_wrong_positive), static_cast<long long>(beyond_nan), static_cast<long long>(beyond));
      EXPECT_EQ(inside_wrong, 0) << k->name() << " K = " << K << ": gelu_tanh(" << first_wrong << ") gave " << first_got
                                << ", not x rounded to FP16 or 0";
      EXPECT_EQ(beyond_wrong_positive, 0) << k->name() << " K = " << K << ": gelu_tanh(x) beyond FP16's maximum is not +Inf";
    }
  EXPECT_GT(configs, 0);
}

// Where a kernel narrows FP32 inputs to TF32 (cvt.rna, cvt.rn, or dropping the low 13 bits
// as the tensor cores do with FP32 registers), it rounds them as its traits declare: the
// bias test judges it against the exact result of the declared rounding. One product per
// element, of a in each row i against 1: 1 + 3 2^-12 and its negative (toward zero or to
// nearest), 1 + 2^-11 (a tie: away or even) and 1 + 2^-12 (below half).
TEST(LibraryGpu, Tf32KernelsRoundTheirInputsAsDeclared) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Registry reg = builtin_registry();
  const double row_values[] = {1 + 0x3p-12, -(1 + 0x3p-12), 1 + 0x1p-11, 1 + 0x1p-12};
  int kernels = 0;
  for (const auto& k : reg.all()) {
    if (k->traits().memory != Memory::Device) continue;
    Case c = test_support::gemm_case(32, 32, 32, Format::FP32, Format::FP32, Format::TF32);
    if (k->unsupported(c)) continue;
    auto in = test_support::fill(c, test_support::Fill::SmallIntegers);
    const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
    for (std::int64_t i = 0; i < c.gemm.m; ++i)
      for (std::int64_t kk = 0; kk < c.gemm.k; ++kk) {
        in.at("A").set_value(static_cast<std::size_t>(op_a_offset(c, av, 0, i, kk)), kk == 0 ? row_values[i % 4] : 0.0);
        for (std::int64_t j = 0; j < c.gemm.n; ++j)
          in.at("B").set_value(static_cast<std::size_t>(op_b_offset(c, bv, 0, kk, j)), kk == 0 ? 1.0 : 0.0);
      }
    const RunOutcome r = run_kernel(*k, c, in);
    if (r.status == Disposition::NotSupported) continue;
    ASSERT_EQ(r.status, Disposition::Ok) << k->name() << ": " << r.message;
    ++kernels;
    std::vector<std::string> matches;
    for (Rounding mode : {Rounding::NearestAway, Rounding::NearestEven, Rounding::TowardZero}) {
      bool all = true;
      for (std::int64_t i = 0; i < c.gemm.m; ++i)
        for (std::int64_t j = 0; j < c.gemm.n; ++j)
          all = all && r.outputs.at("D").value(static_cast<std::size_t>(dv.offset(0, i, j))) ==
                           decode(Format::TF32, encode(Format::TF32, row_values[i % 4], mode));
      if (all) matches.emplace_back(name(mode));
    }
    std::printf("[ tf32 ] %-28s inputs rounded: %s (declared %s)\n", k->name().c_str(),
                matches.empty() ? "none of to nearest away, even, toward zero" : fmt::format("{}", fmt::join(matches, ", ")).c_str(),
                std::string(name(k->traits().input_rounding)).c_str());
    EXPECT_NE(std::find(matches.begin(), matches.end(), std::string(name(k->traits().input_rounding))), matches.end())
        << k->name() << " rounds its TF32 inputs otherwise than it declares";
  }
  EXPECT_GT(kernels, 0) << "no device kernel takes TF32 compute: the test shows nothing";
}

// Where the library kernels round between the accumulator and a 16-bit D: GEMMs whose
// accumulation is exact in FP32 (K = 1 on normal data, K = 878 on small integers), with
// alpha, beta C, a bias, ReLU or GELU. Each element's D is compared with the FP32 epilogue
// rounded to D's format at every subset of three points: after alpha acc (a), after + beta C
// (c), after + bias, before the activation (p). The test prints, per configuration, the
// largest |D - value| of each order over half an ulp of D plus the kernel's declared GELU
// error, and which orders explain every element (at most 1), and fails where neither order
// the harness admits does (check/ops/gemm.cpp): rounded once, or alpha acc + beta C
// rounded to D before the bias or the activation. On the H100 cuBLASLt rounds once at K = 1
// and rounds alpha acc + beta C first at K = 878 wherever there is a bias or a GELU.
TEST(LibraryGpu, EpilogueRoundingOf16BitOutputs) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Registry reg = builtin_registry();
  int configs = 0;
  for (const auto& k : reg.all()) {
    if (k->traits().memory != Memory::Device || k->name().rfind("cublas", 0) != 0) continue;
    for (const Format fd : {Format::BF16, Format::FP16})
      for (const std::int64_t K : {1, 878})
        for (const Epilogue epi : {Epilogue::None, Epilogue::Bias, Epilogue::BiasRelu, Epilogue::GeluTanh, Epilogue::BiasGeluTanh})
          for (const double beta : {0.0, 1.0, -0.5})
            for (const double alpha : {1.0, 0.5, 0.1}) {
              if (epi == Epilogue::None && beta == 0.0 && alpha != 0.1) continue;
              Case c = test_support::gemm_case(64, 64, K, fd, fd, Format::FP32);
              c.alpha = alpha, c.beta = beta, c.epilogue = epi;
              if (beta != 0.0) c.types["C"] = fd;
              if (has_bias(epi)) c.types["bias"] = fd;
              if (k->unsupported(c)) continue;
              auto in = test_support::fill(c, K == 1 ? test_support::Fill::Normal : test_support::Fill::SmallIntegers, 77);
              const auto normal = test_support::fill(c, test_support::Fill::Normal, 78);
              for (const char* op : {"C", "bias"})
                if (in.count(op)) in.at(op) = normal.at(op);
              const RunOutcome r = run_kernel(*k, c, in);
              if (r.status == Disposition::NotSupported) continue;
              const std::string what = fmt::format("{} D {} K {} {} alpha {} beta {}", k->name(), name(fd), K, name(epi), alpha, beta);
              ASSERT_EQ(r.status, Disposition::Ok) << what << ": " << r.message;
              ++configs;
              const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
              const auto rd = [&](float x) { return static_cast<float>(decode(fd, encode(fd, x))); };
              const bool gelu = has_gelu(epi);
              // A GELU's own error (the kernel's declared activation_error, of the tanh, times
              // |t| / 2) comes on top of D's half ulp.
              const double act = gelu ? std::max(k->traits().activation_error, 0x1p-21) : 0.0;
              constexpr int kOrders = 8;  // bit 0: after alpha acc; bit 1: after + beta C; bit 2: before the activation
              double worst[kOrders] = {};  // the largest |D - order's value| / (half an ulp + the GELU's error)
              for (std::int64_t i = 0; i < c.gemm.m; ++i)
                for (std::int64_t j = 0; j < c.gemm.n; ++j) {
                  double exact_acc = 0;
                  for (std::int64_t kk = 0; kk < K; ++kk)
                    exact_acc += in.at("A").value(op_a_offset(c, av, 0, i, kk)) * in.at("B").value(op_b_offset(c, bv, 0, kk, j));
                  const float acc = static_cast<float>(exact_acc);  // exact: K = 1 products or small integers
                  const float cv = beta != 0.0 ? static_cast<float>(in.at("C").value(gemm_view(c, "C").offset(0, i, j))) : 0.0f;
                  const float bias = has_bias(epi) ? static_cast<float>(in.at("bias").value(j)) : 0.0f;
                  const double got = r.outputs.at("D").value(static_cast<std::size_t>(dv.offset(0, i, j)));
                  for (int o = 0; o < kOrders; ++o) {
                    float t = static_cast<float>(alpha) * acc;
                    if (o & 1) t = rd(t);
                    t = std::fma(static_cast<float>(beta), cv, t);
                    if (o & 2) t = rd(t);
                    t += bias;
                    if (o & 4) t = rd(t);
                    double v = t;
                    if (epi == Epilogue::BiasRelu) v = std::max(v, 0.0);
                    if (gelu) v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
                    const double allowed = ulp_of(fd, v) / 2 + act * std::fabs(t) / 2;
                    const double d = std::isnan(got) || std::isnan(v) ? (std::isnan(got) && std::isnan(v) ? 0.0 : INFINITY)
                                                                      : std::fabs(got - v) / allowed;
                    worst[o] = std::max(worst[o], d);
                  }
                }
              static const char* const kNames[kOrders] = {"once", "a", "c", "a,c", "p", "a,p", "c,p", "a,c,p"};
              std::string fits, table;
              for (int o = 0; o < kOrders; ++o) {
                table += fmt::format(" {}={:.3g}", kNames[o], worst[o]);
                if (worst[o] <= 1) fits += fits.empty() ? kNames[o] : std::string(" ") + kNames[o];
              }
              std::printf("[ epilogue ] %-52s fits: %-22s worst |D - order| / allowed:%s\n", what.c_str(), fits.empty() ? "none" : fits.c_str(), table.c_str());
              EXPECT_TRUE(worst[0] <= 1 || worst[2] <= 1)
                  << what << ": no admitted rounding order explains every element";
            }
  }
  EXPECT_GT(configs, 0);
}
