#include <gtest/gtest.h>

#include "check/runner.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "tests/kernels/gemm_cases.hpp"

using namespace ulpgate;
using test_support::Fill;

namespace {

// Planted-bug host kernels: each misbehaves in one way the runner must see.
class Planted final : public Kernel {
 public:
  enum Bug { SkipFirst, WritePadding, WriteInput, Throw, Unsupported };
  explicit Planted(Bug b) : bug_(b) {}
  std::string name() const override { return "planted"; }
  std::string description() const override { return "planted bug"; }
  KernelTraits traits() const override { return {Memory::Host, true}; }
  std::optional<std::string> unsupported(const Case&) const override {
    if (bug_ == Unsupported) return std::string("never");
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const MatrixView d = gemm_view(c, "D");
    const Format f = c.types.at("D");
    for (std::int64_t b = 0; b < d.batch; ++b)
      for (std::int64_t i = 0; i < d.rows; ++i)
        for (std::int64_t j = 0; j < d.cols; ++j)
          if (!(bug_ == SkipFirst && b == 0 && i == 0 && j == 0)) store_code(f, io.out.at("D"), d.offset(b, i, j), 0);
    if (bug_ == WritePadding) store_code(f, io.out.at("D"), d.cols, 0);  // first padding slot of row 0
    if (bug_ == WriteInput) store_code(c.types.at("A"), const_cast<void*>(io.in.at("A")), 0, 0);
    if (bug_ == Throw) throw KernelError("cudaLaunchKernel failed: illegal address");
  }

 private:
  Bug bug_;
};

}  // namespace

TEST(Runner, SeesWhatKernelsDoToMemory) {
  Case c = test_support::gemm_case(5, 7, 3, Format::FP32, Format::FP32);
  c.gemm.ldd = 9;  // two padding columns per row
  const auto in = test_support::fill(c, Fill::SmallIntegers);
  struct Expect { Planted::Bug bug; Disposition status; std::int64_t unwritten, padding; bool input; };
  for (const Expect& e : {Expect{Planted::SkipFirst, Disposition::Ok, 1, 0, false},
                          Expect{Planted::WritePadding, Disposition::Ok, 0, 1, false},
                          Expect{Planted::WriteInput, Disposition::Ok, 0, 0, true},
                          Expect{Planted::Throw, Disposition::Failed, 0, 0, false},
                          Expect{Planted::Unsupported, Disposition::NotSupported, 0, 0, false}}) {
    Planted k(e.bug);
    const RunOutcome r = run_kernel(k, c, in);
    EXPECT_EQ(r.status, e.status) << e.bug;
    EXPECT_EQ(r.unwritten, e.unwritten) << e.bug;
    EXPECT_EQ(r.padding_written, e.padding) << e.bug;
    EXPECT_EQ(!r.inputs_modified.empty(), e.input) << e.bug;
    if (e.bug == Planted::Throw) { EXPECT_EQ(r.message, "cudaLaunchKernel failed: illegal address"); }
    if (e.bug == Planted::Unsupported) { EXPECT_EQ(r.message, "never"); }
  }
}

TEST(Runner, PoisonIsANaNNoArithmeticProduces) {
  for (Format f : kAllFormats) {
    EXPECT_TRUE(is_nan(f, poison_code(f))) << name(f);
    EXPECT_NE(poison_code(f), canonical_nan(f)) << name(f);
    EXPECT_TRUE(is_negative(f, poison_code(f))) << name(f);
  }
  EXPECT_EQ(code_to_storage(Format::TF32, poison_code(Format::TF32)), 0xFFD5A000u);
}

// The memory contract end to end: every layout, transpose, padding and batch gives the
// exact product on exact data (the CPU model and a direct triple loop must agree).
TEST(Runner, LayoutsTransposesPaddingBatch) {
  auto model = make_emulated_gemm(default_models()[0]);
  int checked = 0;
  for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (std::int64_t pad : {0, 3}) {
          Case c = test_support::gemm_case(6, 5, 7, Format::BF16, Format::FP32);
          c.gemm.layout = layout, c.gemm.trans_a = ta, c.gemm.trans_b = tb, c.gemm.batch = 2;
          c.beta = 2.0;
          c.types["C"] = Format::FP16;
          if (pad) {
            c.gemm.lda = c.gemm.packed_ld(c.gemm.a_rows(), c.gemm.a_cols()) + pad;
            c.gemm.ldb = c.gemm.packed_ld(c.gemm.b_rows(), c.gemm.b_cols()) + pad;
            c.gemm.ldc = c.gemm.packed_ld(6, 5) + pad;
            c.gemm.ldd = c.gemm.packed_ld(6, 5) + pad + 1;
          }
          validate(c);
          const auto in = test_support::fill(c, Fill::SmallIntegers, 7);
          const RunOutcome r = run_kernel(*model, c, in);
          ASSERT_EQ(r.status, Disposition::Ok) << r.message;
          EXPECT_EQ(r.unwritten, 0);
          EXPECT_EQ(r.padding_written, 0);
          const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), cv = gemm_view(c, "C"), dv = gemm_view(c, "D");
          for (std::int64_t b = 0; b < 2; ++b)
            for (std::int64_t i = 0; i < 6; ++i)
              for (std::int64_t j = 0; j < 5; ++j) {
                double s = 0;
                for (std::int64_t k = 0; k < 7; ++k)
                  s += in.at("A").value(op_a_offset(c, av, b, i, k)) * in.at("B").value(op_b_offset(c, bv, b, k, j));
                s += 2.0 * in.at("C").value(cv.offset(b, i, j));
                ASSERT_EQ(r.outputs.at("D").value(dv.offset(b, i, j)), s) << "b" << b << " i" << i << " j" << j;
              }
          ++checked;
        }
  EXPECT_EQ(checked, 16);
}
