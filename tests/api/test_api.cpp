// The C++ API (include/ulpgate/ulpgate.hpp) in this tree; tests/install builds the manual's
// example against an installed copy.
#include <cmath>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "core/error.hpp"
#include "ulpgate/ulpgate.hpp"

namespace ulpgate {
namespace {

// D = op(A) op(B) with FP32 FMAs in k order (as a CUDA C kernel would), every batch;
// `unwritten`: that D element (logical index) is left alone.
HostFunction fp32_gemm(std::int64_t unwritten = -1) {
  return [=](const Case& c, const Values& in, Values& out) {
    const std::vector<double>&a = in.at("A"), &b = in.at("B");
    const std::int64_t m = c.gemm.m, n = c.gemm.n, k = c.gemm.k;
    for (std::int64_t bi = 0; bi < c.gemm.batch; ++bi)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          float sum = 0;
          for (std::int64_t p = 0; p < k; ++p)
            sum = std::fma(float(a[(bi * m + i) * k + p]), float(b[(bi * k + p) * n + j]), sum);
          const std::int64_t e = (bi * m + i) * n + j;
          if (e != unwritten) out["D"][e] = sum;
        }
  };
}

TEST(Api, GemmCaseHasPythonsDefaults) {
  const Case c = gemm_case({.m = 3, .n = 4, .k = 5, .dtype = "bf16"});
  EXPECT_EQ(c.op, Op::Gemm);
  EXPECT_EQ(c.gemm.m * 100 + c.gemm.n * 10 + c.gemm.k, 345);
  EXPECT_EQ(c.types, (std::map<std::string, Format>{
                         {"A", Format::BF16}, {"B", Format::BF16}, {"D", Format::FP32}, {"compute", Format::FP32}}));
  EXPECT_EQ(c.dist, (std::map<std::string, std::string>{{"A", "normal(0,1)"}, {"B", "normal(0,1)"}}));
  EXPECT_EQ(c.seed, 1u);

  const Case d = gemm_case({.dtype = "fp64", .beta = 0.5, .epilogue = "bias_relu", .dist = "uniform(-1,1)"});
  EXPECT_EQ(d.types.at("D"), Format::FP64);
  EXPECT_EQ(d.types.at("compute"), Format::FP64);
  EXPECT_EQ(d.types.at("C"), Format::FP64);
  EXPECT_EQ(d.types.at("bias"), Format::FP64);
  EXPECT_EQ(d.dist.at("bias"), "uniform(-1,1)");
  EXPECT_EQ(d.epilogue, Epilogue::BiasRelu);

  EXPECT_THROW(gemm_case({.layout = "diagonal"}), InputError);
  EXPECT_THROW(gemm_case({.m = 0}), InputError);
}

TEST(Api, AttentionCaseHasPythonsDefaults) {
  const Case c = attention_case({.seq_q = 5, .seq_kv = 7, .head_dim = 16, .causal = true});
  EXPECT_EQ(c.op, Op::Attention);
  EXPECT_EQ(c.types.at("O"), Format::FP16);
  EXPECT_EQ(c.types.at("compute"), Format::FP32);
  EXPECT_TRUE(c.attention.causal);
  EXPECT_FALSE(c.attention.softmax_scale);
  EXPECT_EQ(attention_case({.dtype = "bf16", .softmax_scale = 0.5}).attention.softmax_scale, 0.5);
}

// Values are logical: the same case stored transposed, column-major and padded has the
// same values (fill.hpp draws by logical coordinates), and outputs land where they belong.
TEST(Api, ValuesAreLogicalWhateverTheLayout) {
  Case packed = gemm_case({.m = 5, .n = 3, .k = 7, .batch = 2, .dtype = "fp16", .seed = 11});
  Case stored = packed;
  stored.gemm.layout = Layout::ColMajor;
  stored.gemm.trans_a = stored.gemm.trans_b = true;
  stored.gemm.lda = stored.gemm.ldb = stored.gemm.ldd = 70;
  validate(stored);
  const Values a = inputs(packed), b = inputs(stored);
  EXPECT_EQ(a.at("A").size(), 2u * 5 * 7);
  EXPECT_EQ(a.at("B").size(), 2u * 7 * 3);
  EXPECT_EQ(a, b);
  const Result r = run(fp32_gemm(), stored);
  EXPECT_TRUE(r.passed) << r;
  EXPECT_EQ(r.metrics.at(0).compared, 2 * 5 * 3);
}

TEST(Api, HostFunctionPassesAndFailsWithItsNumbers) {
  const Case c = gemm_case({.m = 17, .n = 9, .k = 300, .dtype = "bf16", .out = "bf16", .seed = 3});
  const Result good = run(fp32_gemm(), c);
  EXPECT_TRUE(good.passed) << good;
  EXPECT_TRUE(good.reasons.empty());
  ASSERT_EQ(good.metrics.size(), 1u);
  EXPECT_EQ(good.metrics[0].output, "D");
  EXPECT_LE(good.metrics[0].max_ulp, 1.0);
  EXPECT_EQ(good.record.kernel, "host");
  EXPECT_NE(good.summary().find("PASS host on gemm bf16->bf16"), std::string::npos) << good;

  // An element left alone keeps the runner's poison: reported unwritten, not as a NaN.
  const Result hole = run(fp32_gemm(40), c);
  EXPECT_FALSE(hole.passed);
  EXPECT_EQ(hole.metrics.at(0).unwritten, 1) << hole;
  EXPECT_EQ(hole.metrics.at(0).unexpected_nan, 0) << hole;

  const Result wrong_size = run([](const Case&, const Values&, Values& out) { out["D"].pop_back(); }, c);
  EXPECT_FALSE(wrong_size.passed);
  EXPECT_NE(wrong_size.summary().find("output D: 152 values given, the case has 153"), std::string::npos)
      << wrong_size;

  const Result threw = run([](const Case&, const Values&, Values&) { throw KernelError("no luck"); }, c);
  EXPECT_FALSE(threw.passed);
  EXPECT_NE(threw.summary().find("no luck"), std::string::npos) << threw;
}

TEST(Api, KernelsAskedWhatTheySupport) {
  const auto k = host_kernel(fp32_gemm(), "plain_gemm");
  const Case c = gemm_case({.m = 4, .n = 4, .k = 4, .beta = 1});
  const Result r = run(*k, c);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.record.status, Disposition::NotSupported);
  EXPECT_EQ(r.reasons, std::vector<std::string>{"not supported: plain GEMM only (alpha 1, beta 0, no epilogue)"});
  EXPECT_TRUE(plain(gemm_case({})) == std::nullopt);
  EXPECT_TRUE(plain(attention_case({.heads = 1, .kv_heads = 1})) == std::nullopt);
  EXPECT_TRUE(plain(attention_case({.heads = 2, .kv_heads = 1})).has_value());
}

TEST(Api, RegisteredKernelsByName) {
  const Case c = gemm_case({.m = 8, .n = 8, .k = 64, .dtype = "fp16"});
  const Result r = run("cpu.fp32_seq", c);
  EXPECT_TRUE(r.passed) << r;
  EXPECT_EQ(r.record.kernel, "cpu.fp32_seq");
  EXPECT_THROW(run("no.such.kernel", c), InputError);
}

TEST(Api, CheckJudgesGivenOutputs) {
  for (const Case& c : {gemm_case({.m = 6, .n = 5, .k = 40, .dtype = "bf16", .out = "bf16"}),
                        attention_case({.seq_q = 3, .seq_kv = 9, .head_dim = 8, .heads = 2})}) {
    Values out = reference(c);  // the exact output, rounded to nearest once: right
    const std::string o = c.op == Op::Gemm ? "D" : "O";
    ASSERT_EQ(out.size(), 1u);
    const Result right = check(c, out);
    EXPECT_TRUE(right.passed) << right;
    EXPECT_EQ(right.record.kernel, "external:c++");
    out.at(o)[2] = out.at(o)[2] * 1.5 + 1;
    const Result wrong = check(c, out, "mine");
    EXPECT_FALSE(wrong.passed) << wrong;
    EXPECT_EQ(wrong.record.kernel, "mine");
    out.at(o).pop_back();
    EXPECT_THROW(check(c, out), InputError);
    EXPECT_THROW(check(c, {{"A", {}}}), InputError);
  }
}

// Every output the case has is the host function's to write: attention's LSE too. (These
// functions ignore their inputs, so no relations: they run the function on other inputs.)
TEST(Api, HostFunctionWritesLse) {
  const Case c = attention_case({.seq_q = 4, .seq_kv = 6, .head_dim = 8, .batch = 2, .heads = 2, .lse = true});
  ASSERT_EQ(reference(c).at("LSE").size(), 2u * 2 * 4);
  EvaluationOptions options;
  options.relations = false;
  const Result r = run([](const Case& k, const Values&, Values& out) { out = reference(k); }, c, options);
  EXPECT_TRUE(r.passed) << r;
  ASSERT_EQ(r.metrics.size(), 2u);
  EXPECT_EQ(r.metrics[1].output, "LSE");
  const Result no_lse =
      run([](const Case& k, const Values&, Values& out) { out["O"] = reference(k).at("O"); }, c, options);
  EXPECT_FALSE(no_lse.passed);
  EXPECT_EQ(no_lse.metrics.at(1).unwritten, 2 * 2 * 4) << no_lse;
}

// Cases from the fuzz campaign's generator, as a user's RapidCheck property draws them.
RC_GTEST_PROP(Api, GeneratedBf16CasesPassAnFp32Gemm, ()) {
  static const std::unique_ptr<Kernel> kernel = host_kernel(fp32_gemm(), "fp32_gemm");
  const Case c = *gen_case(Op::Gemm, "bf16", kernel.get(), GenLimits{.max_reduction = 256});
  RC_ASSERT(!plain(c));
  const Result r = run(*kernel, c);
  RC_LOG() << r << "\n";
  RC_ASSERT(r.passed);
}

}  // namespace
}  // namespace ulpgate
