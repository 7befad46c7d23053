// The accumulation probe (campaign/probe.hpp) run against the CPU models, whose parameters
// are known: every block-FMA model is recovered exactly where the experiments reach the
// parameter (widths up to 60, or 47 with one product per step; roundings from a width of 23
// bits), said to be unknown elsewhere, and validated on random dot products where known.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "campaign/probe.hpp"
#include "kernels/emulated/gemm_models.hpp"

using namespace ulpgate;

namespace {

ProbeDot model_unit(const AccumulationModel& m) {
  return [m](std::span<const double> p) {
    const std::vector<double> ones(p.size(), 1.0);
    return model_dot(m, p.data(), ones.data(), static_cast<std::int64_t>(p.size()));
  };
}

}  // namespace

TEST(Probe, RecoversEveryBlockFmaModel) {
  int models = 0;
  for (const int block : {1, 2, 3, 4, 5, 8, 16, 32, 64, 512})
    for (const int frac : {3, 10, 13, 22, 23, 24, 25, 30, 52})
      for (const Rounding rounding :
           {Rounding::NearestEven, Rounding::NearestAway, Rounding::TowardZero, Rounding::Up, Rounding::Down}) {
        AccumulationModel m;
        m.order = AccumulationModel::Order::BlockFma, m.block = block, m.frac_bits = frac, m.rounding = rounding;
        const ProbedAccumulation got = probe_accumulation(model_unit(m));
        const std::string what = fmt::format("{}: probed {}", m.name(), got.describe());
        // The rounding is observable where 2^(24 - frac) fits in the terms of one step or two
        // (each below 2).
        const bool observable = frac >= 23 || (std::int64_t{1} << (23 - frac)) < block + 1;
        // Where it is not, it may be moot: no step's sum passes 24 bits (then toward zero,
        // validated: the model's rounding never acts).
        const bool moot = !observable && frac + 2 + static_cast<int>(std::ceil(std::log2(block + 1.0))) <= 24;
        EXPECT_EQ(got.block, block) << what;
        if (block >= 2 || frac < 23 || (frac <= 47 && rounding != Rounding::NearestAway)) {
          EXPECT_EQ(got.frac, frac) << what;
          EXPECT_EQ(got.validated, observable || moot ? 1000 : 0) << what;
        } else {
          EXPECT_EQ(got.frac, std::nullopt) << what;
          EXPECT_EQ(got.frac_at_least, rounding == Rounding::NearestAway ? 23 : 48) << what;
        }
        EXPECT_EQ(got.rounding_moot, moot) << what;
        if (observable) EXPECT_EQ(got.rounding, rounding) << what;
        else if (moot) EXPECT_EQ(got.rounding, Rounding::TowardZero) << what;
        else EXPECT_EQ(got.rounding, std::nullopt) << what;
        ++models;
      }
  EXPECT_EQ(models, 450);
}

// FP8-tensor-core-like models: a narrow block accumulator promoted to FP32 every N
// products; the probe finds N with the block and width (and no promotion where there is none).
TEST(Probe, RecoversThePromotionLength) {
  for (const int block : {1, 4, 16, 32})
    for (const int frac : {10, 13, 22})
      for (const int chunks : {0, 1, 2, 4, 8}) {
        AccumulationModel m;
        m.order = AccumulationModel::Order::BlockFma, m.block = block, m.frac_bits = frac;
        m.rounding = Rounding::TowardZero, m.promote = block * chunks;
        const ProbedAccumulation got = probe_accumulation(model_unit(m));
        const std::string what = fmt::format("{}: probed {}", m.name(), got.describe());
        // One product per step, promoted every two: each pair is truncated to the larger's
        // grid either way (truncating twice, finer then coarser, is truncating once), so the
        // unit is a block of two, and the probe says so.
        EXPECT_EQ(got.block, block == 1 && m.promote == 2 ? 2 : block) << what;
        EXPECT_EQ(got.frac, frac) << what;
        EXPECT_EQ(got.promote, m.promote) << what;
      }
}

// The sequential FMA model (exact product, one FP32 rounding per step) is a block of one
// with every fraction bit the experiments can show; the pairwise model's tree is no block
// FMA, and the validation says so.
TEST(Probe, SequentialFmaIsABlockOfOneRoundingToNearest) {
  for (const Rounding rounding : {Rounding::NearestEven, Rounding::TowardZero}) {
    AccumulationModel m;
    m.rounding = rounding;
    const ProbedAccumulation got = probe_accumulation(model_unit(m));
    EXPECT_EQ(got.block, 1) << got.describe();
    EXPECT_EQ(got.frac, std::nullopt) << got.describe();
    EXPECT_EQ(got.frac_at_least, 48) << got.describe();
    EXPECT_EQ(got.rounding, rounding) << got.describe();
    EXPECT_EQ(got.validated, 1000) << got.describe();
  }
}

TEST(Probe, PairwiseTreeIsNotABlockFmaUnit) {
  AccumulationModel m;
  m.order = AccumulationModel::Order::Pairwise;
  EXPECT_THROW(probe_accumulation(model_unit(m)), std::runtime_error);
}

// A unit that keeps nothing of 2^-100 anywhere is no block-FMA unit: the probe says so.
TEST(Probe, RefusesAUnitOutsideTheModel) {
  const ProbeDot flush = [](std::span<const double> p) {
    double s = 0;
    for (double v : p) s += std::fabs(v) < 0x1p-60 ? 0.0 : v;
    return static_cast<float>(s);
  };
  EXPECT_THROW(probe_accumulation(flush, 64), std::runtime_error);
}

// Products of two normal values of a narrow format (the probe's inputs for BF16, FP16,
// TF32 and FP8 kernels): found where they exist, refused where they do not.
TEST(Probe, SplitsProductsIntoTwoValuesOfTheInputFormat) {
  const auto check = [](double p, Format f) {
    const auto ab = split_product(p, f);
    if (!ab) return false;
    EXPECT_EQ(ab->first * ab->second, p) << p;
    for (const double v : {ab->first, ab->second}) EXPECT_EQ(decode(f, encode(f, v)), v) << p << " " << name(f);
    return true;
  };
  EXPECT_TRUE(check(0x1p-100, Format::BF16));
  EXPECT_TRUE(check(0x1p-28, Format::FP16));       // 2^-14 2^-14, both normal
  EXPECT_FALSE(check(0x1p-29, Format::FP16));      // would need a subnormal
  EXPECT_TRUE(check(1.0 + 0x1p-10, Format::FP16)); // one value
  EXPECT_TRUE(check(1.0 + 0x1p-11, Format::FP16)); // 2049 = 3 x 683
  EXPECT_FALSE(check(2.0 - 0x1p-23, Format::FP16)); // 2^24 - 1 = 4095 x 4097: 4097 needs 13 bits
  EXPECT_TRUE(check(-(2.0 - 0x1p-7), Format::BF16));
  EXPECT_TRUE(check(0x1p-12, Format::E4M3));
  EXPECT_FALSE(check(0x1p-13, Format::E4M3));
  EXPECT_TRUE(check(0.0, Format::E5M2));
}

// The probe through a kernel with BF16 or FP16 inputs (every product split into two
// values of the format) recovers the CPU models' block and width; the rounding wherever a
// step's terms can reach FP32's 24 bits (from ones and a remainder where the format cannot
// make 2 - 2^-w), else it says it is not observable, never a wrong one; validated on
// products of the format's values.
TEST(Probe, RecoversModelsThroughNarrowInputFormats) {
  int models = 0, rounding_known = 0;
  for (const Format input : {Format::BF16, Format::FP16})
    for (const int block : {4, 8, 16})
      for (const int frac : {5, 10, 13, 21, 22, 23, 24})
        for (const Rounding rounding : {Rounding::NearestEven, Rounding::TowardZero}) {
          AccumulationModel m;
          m.order = AccumulationModel::Order::BlockFma, m.block = block, m.frac_bits = frac, m.rounding = rounding;
          const auto kernel = make_emulated_gemm(m);
          const ProbedAccumulation got = probe_accumulation(kernel_unit(*kernel, input), 64, 256, 200, input);
          const std::string what = fmt::format("{} through {}: probed {}", m.name(), name(input), got.describe());
          EXPECT_EQ(got.block, block) << what;
          EXPECT_EQ(got.frac, frac) << what;
          if (got.rounding && !got.rounding_moot) {
            EXPECT_EQ(*got.rounding, rounding) << what;
            EXPECT_EQ(got.validated, 200) << what;
            ++rounding_known;
          } else if (got.rounding_moot) {
            EXPECT_EQ(got.validated, 200) << what;  // toward zero gives the unit's bits: no sum rounds
            EXPECT_LE(frac + 2 + static_cast<int>(std::ceil(std::log2(block + 1.0))), 24) << what;
          }
          ++models;
        }
  EXPECT_EQ(models, 84);
  // widths of 23 and more (1, 1, 3 2^-23) on every block; 22 (four ones and the rest, in
  // two steps) on every block; 21 (eight ones) from a block of 8
  EXPECT_EQ(rounding_known, 2 * 2 * (3 + 3 + 3 + 2));
}

namespace {

// A unit that takes one layout only and K a multiple of 16, as cuBLASLt's FP8 GEMMs (TN,
// row-major here), around a CPU model.
class Picky final : public Kernel {
 public:
  explicit Picky(std::unique_ptr<Kernel> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "test.picky"; }
  std::string description() const override { return "TN only, K a multiple of 16"; }
  KernelTraits traits() const override { return inner_->traits(); }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.gemm.trans_a || !c.gemm.trans_b || c.gemm.layout != Layout::RowMajor) return std::string("TN only");
    if (c.gemm.k % 16) return std::string("K must be a multiple of 16");
    return inner_->unsupported(c);
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override { inner_->run(c, io, notes); }

 private:
  std::unique_ptr<Kernel> inner_;
};

}  // namespace

// The probe's 1 x 1 x K GEMM goes in whatever layout the kernel takes (op(A) and op(B) are
// contiguous vectors in all of them), padded with zero products to a K it takes: the model
// behind a TN-only, K % 16 unit is still recovered (cublaslt.fp8 refused the probe before).
TEST(Probe, FindsALayoutAndKTheKernelTakes) {
  AccumulationModel m;
  m.order = AccumulationModel::Order::BlockFma, m.block = 16, m.frac_bits = 13, m.rounding = Rounding::TowardZero;
  Picky kernel(make_emulated_gemm(m));
  for (const std::int64_t mn : {1, 37}) {  // 37: D[0][0] of a larger GEMM, every other input zero
    const ProbedAccumulation got = probe_accumulation(kernel_unit(kernel, Format::BF16, mn), 64, 256, 100, Format::BF16);
    EXPECT_EQ(got.block, 16) << mn << ": " << got.describe();
    EXPECT_EQ(got.frac, 13) << mn << ": " << got.describe();
    if (got.rounding) { EXPECT_EQ(got.validated, 100) << mn << ": " << got.describe(); }
  }
  // Every layout and transpose puts the dot product in D[0][0] (a kernel taking them all).
  AccumulationModel seq;
  const auto any = make_emulated_gemm(seq);
  const ProbedAccumulation s = probe_accumulation(kernel_unit(*any, Format::FP32, 5), 64, 256, 100, Format::FP32);
  EXPECT_EQ(s.block, 1) << s.describe();
  EXPECT_EQ(s.validated, 100) << s.describe();
}

// The batched validation (the instructions' million dot products) against units that are
// CPU models: the probed model reproduces itself on every class (normal, cancelling,
// subnormal inputs), in every narrow format, padded to the unit's step; a unit one fraction
// bit wider, or promoting, is caught.
TEST(Probe, BatchedValidationAcceptsTheModelAndCatchesAnyOther) {
  const auto batch_of = [](const AccumulationModel& m, Format input, int step) {
    ProbeBatch b;
    b.input = input, b.step = step;
    b.run = [m](const std::vector<double>& a, const std::vector<double>& x, std::int64_t dots, std::int64_t k) {
      std::vector<float> out(static_cast<std::size_t>(dots));
      for (std::int64_t d = 0; d < dots; ++d) out[static_cast<std::size_t>(d)] = model_dot(m, a.data() + d * k, x.data() + d * k, k);
      return out;
    };
    return b;
  };
  for (const Format input : {Format::FP16, Format::BF16, Format::TF32, Format::E4M3, Format::E5M2}) {
    AccumulationModel m;
    m.order = AccumulationModel::Order::BlockFma, m.block = 16, m.frac_bits = 13, m.rounding = Rounding::TowardZero;
    ProbedAccumulation p;
    p.block = 16, p.frac = 13, p.rounding = Rounding::TowardZero;
    const BatchValidation v = validate_batched(p, batch_of(m, input, 32), input, 3000, 7);
    EXPECT_EQ(v.total(), 3000) << name(input);
    EXPECT_GT(v.normal, 800) << name(input);
    EXPECT_GT(v.cancelling, 800) << name(input);
    EXPECT_GT(v.subnormal, 800) << name(input);
    AccumulationModel wider = m;
    wider.frac_bits = 14;
    EXPECT_THROW(validate_batched(p, batch_of(wider, input, 32), input, 3000, 7), std::runtime_error) << name(input);
    AccumulationModel promoting = m;
    promoting.promote = 64;
    p.promote = 0;
    EXPECT_THROW(validate_batched(p, batch_of(promoting, input, 32), input, 3000, 7), std::runtime_error) << name(input);
  }
  ProbedAccumulation unknown;
  unknown.block = 4, unknown.frac_at_least = 12;
  EXPECT_THROW(validate_batched(unknown, batch_of(AccumulationModel{}, Format::FP16, 16), Format::FP16, 10), std::logic_error);
}

// The instructions' formats: FP8 products reach 2^-12 (E4M3) below 1, so the experiments run
// at the scale of the largest power-of-two product; models aligned by the factors'
// exponents (align=inputs, the H200's mma.sync) are told from models aligned by each
// product, and every recovered model reproduces its unit on the batched classes.
TEST(Probe, RecoversNarrowFp8AndInputAlignedModels) {
  int models = 0;
  for (const Format input : {Format::E4M3, Format::E5M2, Format::FP16, Format::BF16})
    for (const char* text : {"cpu.blockfma:block=16,frac=13,round=rz", "cpu.blockfma:block=32,frac=13,round=rz,align=INPUT",
                             "cpu.blockfma:block=16,frac=25,round=rz,align=INPUT", "cpu.blockfma:block=8,frac=25,round=rz",
                             "cpu.blockfma:block=32,frac=13,round=rz,promote=128,align=INPUT"}) {
      std::string spec = text;  // align=INPUT: aligned by this input format's exponent fields
      if (const auto at = spec.find("INPUT"); at != std::string::npos) spec.replace(at, 5, std::string(name(input)));
      const AccumulationModel m = *AccumulationModel::parse(spec);
      const auto kernel = make_emulated_gemm(m);
      ProbedAccumulation got = probe_accumulation(kernel_unit(*kernel, input), 64, 1024, 0, input);
      const std::string what = fmt::format("{} through {}: probed {}", text, name(input), got.describe());
      EXPECT_EQ(got.block, m.block) << what;
      EXPECT_EQ(got.frac, m.frac_bits) << what;
      EXPECT_EQ(got.promote, m.promote) << what;
      const ProbeBatch batch = kernel_batch(*kernel, input, 24);  // 24 dot products per GEMM, on D's diagonal
      got.align_inputs = probe_alignment(got, batch);
      ASSERT_TRUE(got.align_inputs.has_value()) << what;
      EXPECT_EQ(*got.align_inputs, m.align_inputs) << what;
      if (!got.rounding) continue;  // FP32's rounding unseen through these formats (frac 25)
      EXPECT_EQ(validate_batched(got, batch, input, 2000, 11).total(), 2000) << what;
      ++models;
    }
  EXPECT_GE(models, 8);
}

// A dump of a unit's results reads back as written: every dot's factors and class, and the
// result the model gives on the same factors; a truncated or foreign file is refused.
TEST(Probe, DumpReadsBackWhatTheUnitGave) {
  const AccumulationModel m = *AccumulationModel::parse("cpu.blockfma:block=16,frac=13,round=rz,align=e4m3");
  const auto kernel = make_emulated_gemm(m);
  const ProbeBatch batch = kernel_batch(*kernel, Format::E4M3, 24);
  const std::string path = ::testing::TempDir() + "probe_dump_test.dots";
  ASSERT_EQ(dump_batched(batch, "cpu.model", 500, 70, path, 3), 500);
  const DotDump d = read_dots(path);
  EXPECT_EQ(d.unit, "cpu.model");
  EXPECT_EQ(d.input, Format::E4M3);
  EXPECT_EQ(d.step, batch.step);
  ASSERT_EQ(d.dots.size(), 500u);
  int classes[3] = {0, 0, 0}, nonzero = 0;
  std::size_t longest = 0;
  for (const DumpedDot& dot : d.dots) {
    ASSERT_EQ(dot.a.size(), dot.b.size());
    ASSERT_GE(dot.a.size(), 1u);
    longest = std::max(longest, dot.a.size());
    ++classes[dot.cls];
    nonzero += dot.result != 0.0f;
    const float want = model_dot(m, dot.a.data(), dot.b.data(), static_cast<std::int64_t>(dot.a.size()));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(want), std::bit_cast<std::uint32_t>(dot.result));
  }
  EXPECT_EQ(longest, 70u);
  for (const int c : classes) EXPECT_GT(c, 100);
  EXPECT_GT(nonzero, 400);
  // A file cut short, and one that is not a dump.
  const std::string text = read_whole_file(path);
  write_text_file_atomically(path, text.substr(0, text.size() - 3));
  EXPECT_THROW(read_dots(path), InputError);
  write_text_file_atomically(path, "hello\n");
  EXPECT_THROW(read_dots(path), InputError);
  // A format wider than a dump's words (fuzz_dots found the 8-byte read shifting past 32
  // bits): refused.
  std::string one_dot(28, '\0');  // length 1, class 0, result 0, one 8-byte factor each
  one_dot[0] = '\1';
  write_text_file_atomically(path, "ulpgate-dots 1 unit=u input=fp64 step=1\n" + one_dot);
  EXPECT_THROW(read_dots(path), InputError);
}

// The step result's width (out) and an interleaved chunk (two or more steps dealt groups of
// products in turn, the chunk added in FP32) are recovered exactly, with every other
// parameter, through FP32 and narrow inputs.
TEST(Probe, RecoversNarrowResultsAndInterleavedChunks) {
  int models = 0;
  for (const Format input : {Format::FP32, Format::E4M3, Format::FP16})
    for (const char* text : {"cpu.blockfma:block=32,frac=13,round=rz,out=13", "cpu.blockfma:block=32,frac=13,round=rz,promote=128,out=13",
                             "cpu.blockfma:block=16,frac=20,round=rz,out=12", "cpu.blockfma:block=16,frac=12,round=rz,out=14",
                             "cpu.blockfma:block=16,frac=13,round=rne,out=10",
                             "cpu.blockfma:block=16,frac=25,round=rz,promote=32,interleave=2",
                             "cpu.blockfma:block=8,frac=25,round=rz,promote=32,interleave=2",
                             "cpu.blockfma:block=16,frac=25,round=rz,promote=64,interleave=4"}) {
      const AccumulationModel m = *AccumulationModel::parse(text);
      const auto kernel = make_emulated_gemm(m);
      const ProbeBatch batch = kernel_batch(*kernel, input, 24);
      const ProbedAccumulation got = probe_unit(kernel_unit(*kernel, input), batch, 64, 1024);
      const std::string what = fmt::format("{} through {}: probed {}", text, name(input), got.describe());
      EXPECT_EQ(got.block, m.block) << what;
      EXPECT_EQ(got.frac, m.frac_bits) << what;
      EXPECT_EQ(got.out, m.out_bits) << what;
      EXPECT_EQ(got.interleave, m.interleave) << what;
      EXPECT_EQ(got.promote, m.promote) << what;
      if (!got.known()) continue;
      EXPECT_EQ(got.rounding, m.rounding) << what;
      EXPECT_EQ(validate_batched(got, batch, input, 1000, 7).total(), 1000) << what;
      ++models;
    }
  EXPECT_GE(models, 18);
}

// An FP16 accumulator (the unit says so: ProbeBatch::accumulator, as mma.f16.f16acc does):
// the rest of the model is recovered through it, and the model (acc=fp16) validates.
TEST(Probe, RecoversModelsOfAnFp16Accumulator) {
  for (const char* text : {"cpu.blockfma:block=16,frac=25,round=rz,acc=fp16", "cpu.blockfma:block=8,frac=24,round=rne,acc=fp16",
                           "cpu.blockfma:block=16,frac=25,round=rz,align=fp16,acc=fp16"}) {
    const AccumulationModel m = *AccumulationModel::parse(text);
    const auto kernel = make_emulated_gemm(m);
    ProbeBatch batch = kernel_batch(*kernel, Format::FP16, 24);
    batch.accumulator = Format::FP16;
    const ProbedAccumulation got = probe_unit(kernel_unit(*kernel, Format::FP16), batch, 64, 1024);
    const std::string what = fmt::format("{}: probed {}", text, got.describe());
    EXPECT_EQ(got.block, m.block) << what;
    EXPECT_EQ(got.accumulator, Format::FP16) << what;
    EXPECT_EQ(got.frac, m.frac_bits) << what;
    ASSERT_TRUE(got.known()) << what;
    EXPECT_EQ(got.rounding, m.rounding) << what;
    EXPECT_EQ(validate_batched(got, batch, Format::FP16, 2000, 5).total(), 2000) << what;
  }
}
