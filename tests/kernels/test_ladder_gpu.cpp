// The GEMM ladder's kernels (ladder.*) on the GPU (label gpu; skipped without a device):
// every step through the one check path (check/check: run and write audit, repeatability,
// relations, exact reference, verdict) on shapes with tails, both layouts, transposes,
// padding, batches, alpha/beta and K = 4096; steps 1-7 bit for bit equal to cpu.fp32_seq
// (they add in k order with one FMA each); misaligned buffers take the scalar path.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "check/check.hpp"
#include "kernels/device.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "kernels/gemm/ladder.hpp"
#include "kernels/probe/mma_unit.hpp"
#include "tests/kernels/gemm_cases.hpp"

using namespace ulpgate;

namespace {

struct Shape {
  std::int64_t m, n, k;
};

// Tails on every tile size (1, primes, one past and one short of 128), a full 128 x 128 tile
// with one BK 16 step, and K = 4096 (16 splits of step 8 and 9 on this M N).
const Shape kShapes[] = {{1, 1, 1},       {7, 7, 7},       {1, 129, 127}, {129, 1, 7},
                         {127, 129, 131}, {128, 128, 16},  {67, 131, 4096}};

// Case `index` of the list every kernel gets: each shape in both layouts and all four
// transposes, with one of six memory variants and one of six alpha/beta pairs (drawn
// independently) and one of five input distributions (ill-conditioned where K allows it).
// in, out, compute: the types of the case (the tensor-core steps: FP16, BF16, TF32).
Case ladder_case(const Shape& s, Layout layout, int trans, int index, Format in = Format::FP32, Format out = Format::FP32,
                 Format compute = Format::FP32) {
  Case c = test_support::gemm_case(s.m, s.n, s.k, in, out, compute);
  auto& g = c.gemm;
  g.layout = layout, g.trans_a = trans & 1, g.trans_b = trans & 2;
  const std::pair<double, double> scalars[] = {{1, 0}, {0.5, 2}, {-1, -0.5}, {0.1, 1}, {0, 1}, {0, 0}};
  std::tie(c.alpha, c.beta) = scalars[(index / 6 + index / 36) % 6];
  if (c.beta != 0) c.types["C"] = out;
  const auto packed = [&](const char* op) { return gemm_view(c, op).ld; };
  const std::int64_t la = packed("A"), lb = packed("B"), lc = packed("D");
  switch (index % 6) {
    case 1: g.lda = la + 1, g.ldb = lb + 3, g.ldc = lc + 1, g.ldd = lc + 3; break;  // no 16-byte access
    case 2: g.batch = 3; break;
    case 3: g.lda = la + 1, g.ldb = lb + 3, g.ldc = lc + 1, g.ldd = lc + 3, g.batch = 2; break;
    case 4: g.lda = la + 16, g.ldb = lb + 64, g.ldc = lc + 4, g.ldd = lc + 8, g.batch = 2; break;
    case 5:  // leading dimensions rounded up to multiples of 4: 16-byte access everywhere
      g.lda = (la + 3) / 4 * 4, g.ldb = (lb + 3) / 4 * 4, g.ldc = g.ldd = (lc + 3) / 4 * 4;
      break;
    default: break;
  }
  if (c.beta == 0) g.ldc = 0;
  const char* dists[] = {"normal(0,1)", "uniform(0,1)", "specials(nan=0.001,inf=0.001,negzero=0.05)",
                         "gendot(cond=1e6)", "sparse(density=0.3)"};
  std::string dist = dists[index % 5];
  if (dist.rfind("gendot", 0) == 0 && s.k < 100) dist = "lognormal(0,2)";  // short dot products reach no 1e6
  c.dist["A"] = dist;
  if (dist.rfind("gendot", 0) != 0) c.dist["B"] = dist;  // gendot draws A and B together
  if (c.beta != 0) c.dist["C"] = "normal(0,1)";
  c.seed = 1000 + index;
  validate(c);
  return c;
}

std::string describe(const Case& c) {
  const auto& g = c.gemm;
  return fmt::format("{}x{}x{} batch {} {} ta {} tb {} ld {}/{}/{}/{} alpha {} beta {} A {}", g.m, g.n, g.k, g.batch,
                     name(g.layout), g.trans_a, g.trans_b, g.lda, g.ldb, g.ldc, g.ldd, c.alpha, c.beta,
                     c.dist.count("A") ? c.dist.at("A") : "");
}

// The FP32 SIMT steps (1-9) or the tensor-core steps (10-12).
std::vector<std::unique_ptr<Kernel>> ladder_kernels(bool tensor_core) {
  std::vector<std::unique_ptr<Kernel>> out;
  for (auto& k : make_ladder_kernels())
    if ((k->name().rfind("ladder.fp32_", 0) != 0) == tensor_core) out.push_back(std::move(k));
  return out;
}

// A tensor-core step's case: its input type, D in FP32 or (every other case) the input type.
Case tensor_core_case(const Kernel& k, const Shape& s, Layout layout, int trans, int index) {
  const bool tf32 = k.name().find("tf32") != std::string::npos;
  const Format in = tf32 ? Format::FP32 : k.name().find("bf16") != std::string::npos ? Format::BF16 : Format::FP16;
  const Format out = tf32 || index % 2 == 0 ? Format::FP32 : in;
  return ladder_case(s, layout, trans, index, in, out, tf32 ? Format::TF32 : Format::FP32);
}

// One case through the check path, every finding a test failure; the run's notes, or
// nullopt when the kernel did not run.
std::optional<RunNotes> expect_passes(Kernel& k, Case c, const std::string& what) {
  const Evaluation ev = evaluate(k, c, {});
  if (ev.run.status != Disposition::Ok) {
    ADD_FAILURE() << what << ": " << name(ev.run.status) << ": " << ev.run.message;
    return std::nullopt;
  }
  EXPECT_EQ(ev.run.unwritten, 0) << what;
  EXPECT_EQ(ev.run.padding_written, 0) << what;
  EXPECT_TRUE(ev.run.inputs_modified.empty()) << what;
  for (const auto& r : ev.relations) ADD_FAILURE() << what << ": relation " << r.relation << ": " << r.problem;
  EXPECT_TRUE(ev.verdict.passed) << what << ": " << (ev.verdict.reasons.empty() ? "" : ev.verdict.reasons[0]);
  if (!ev.verdict.passed) return std::nullopt;
  return ev.run.notes;
}

}  // namespace

TEST(LadderGpu, EveryStepPassesTheCheckPath) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::printf("[ device ] %s\n", device_description().c_str());
  for (auto& k : ladder_kernels(false)) {
    int index = 0, passed = 0;
    std::set<std::string> splits;
    for (const Shape& s : kShapes)
      for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
        for (int trans = 0; trans < 4; ++trans) {
          Case c = ladder_case(s, layout, trans, index++);
          c.kernel = k->name();
          ASSERT_FALSE(k->unsupported(c)) << k->name() << " " << describe(c) << ": " << *k->unsupported(c);
          const std::string what = k->name() + " " + describe(c);
          const std::optional<RunNotes> notes = expect_passes(*k, c, what);
          if (!notes) continue;
          ++passed;
          if (notes->count("split_k")) splits.insert(notes->at("split_k"));
          if (s.k == 4096 && c.alpha != 0 && notes->count("split_k")) {
            EXPECT_NE(notes->at("split_k").rfind("1 splits", 0), 0u) << what << ": K = 4096 was not split";
          }
        }
    const std::string split_note = splits.empty() ? "" : fmt::format("; split_k: {}", fmt::join(splits, ", "));
    std::printf("[ ladder ] %-26s %d of %d cases passed%s\n", k->name().c_str(), passed, index, split_note.c_str());
  }
}

// Steps 1-7 change how data moves, not the arithmetic: each element is alpha (sum in k order
// of FMAs) then one FMA with beta C, which is what cpu.fp32_seq computes.
TEST(LadderGpu, InOrderStepsEqualTheSequentialModelBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  auto model = make_emulated_gemm(default_models()[0]);
  for (auto& k : ladder_kernels(false)) {
    if (!k->traits().deterministic || k->name().find("splitk") != std::string::npos) continue;
    int index = 0, compared = 0;
    for (const Shape& s : kShapes)
      for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
        for (int trans = 0; trans < 4; ++trans) {
          Case c = ladder_case(s, layout, trans, index++);
          if (c.alpha == 0) continue;  // the model multiplies by 0 (the sign of a zero may differ)
          const auto in = test_support::fill(c, test_support::Fill::Normal, c.seed);
          const RunOutcome g = run_kernel(*k, c, in), m = run_kernel(*model, c, in);
          ASSERT_EQ(g.status, Disposition::Ok) << g.message;
          ASSERT_EQ(m.status, Disposition::Ok) << m.message;
          const Tensor& gd = g.outputs.at("D");
          EXPECT_EQ(std::memcmp(gd.data(), m.outputs.at("D").data(), gd.size_bytes()), 0)
              << k->name() << " " << describe(c) << ": differs from cpu.fp32_seq";
          ++compared;
        }
    EXPECT_GT(compared, 0);
  }
}

// Buffers one float past 16-byte alignment: steps 6-9 must see it (no 16-byte access) and
// give the bits of the aligned run (the atomic split-K: an equally good sum).
TEST(LadderGpu, MisalignedBuffersTakeTheScalarPath) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  void* stream = thread_stream();
  for (auto& k : ladder_kernels(false)) {
    for (Layout layout : {Layout::RowMajor, Layout::ColMajor}) {
      Case c = test_support::gemm_case(131, 67, 300, Format::FP32, Format::FP32);
      c.gemm.layout = layout, c.gemm.batch = 2, c.alpha = 0.5, c.beta = 2, c.types["C"] = Format::FP32;
      c.gemm.lda = c.gemm.ldb = c.gemm.ldc = c.gemm.ldd = 400;  // multiples of 4
      const auto in = test_support::fill(c, test_support::Fill::SmallIntegers, 9);
      Tensor d[2] = {make_output(c, "D"), make_output(c, "D")};
      RunNotes notes[2];
      for (int shift = 0; shift < 2; ++shift) {
        std::map<std::string, DeviceBuffer> buf;
        KernelIo io;
        io.stream = stream;
        const auto place = [&](const std::string& op, const Tensor& t) {
          buf[op] = DeviceBuffer(t.size_bytes() + 16, stream);
          auto* p = static_cast<std::byte*>(buf[op].get()) + shift * sizeof(float);
          copy_to_device(p, t.data(), t.size_bytes(), stream);
          return p;
        };
        for (const auto& [op, t] : in) io.in[op] = place(op, t);
        io.out["D"] = place("D", d[shift]);
        k->run(c, io, notes[shift]);
        copy_to_host(d[shift].data(), io.out["D"], d[shift].size_bytes(), stream);
      }
      const std::string what = fmt::format("{} {}", k->name(), name(layout));
      // Small integers: every partial sum is exact, so even the atomic order gives these bits.
      EXPECT_EQ(std::memcmp(d[0].data(), d[1].data(), d[0].size_bytes()), 0) << what;
      if (notes[0].count("vector_access")) {
        EXPECT_EQ(notes[0].at("vector_access"), k->name().find("splitk") == std::string::npos ? "A B C D" : "A B")
            << what;
        EXPECT_EQ(notes[1].at("vector_access").rfind("none", 0), 0u) << what << ": " << notes[1].at("vector_access");
      }
    }
  }
}

// Steps 10-12 through the one check path on the same shapes, layouts, transposes, memory
// variants (leading dimensions off 16 bytes take the repacked path) and alpha/beta, D in
// FP32 and in the input type. FP16 and BF16 also meet the model rule (their declared mma
// model).
TEST(LadderGpu, TensorCoreStepsPassTheCheckPath) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  for (auto& k : ladder_kernels(true)) {
    if (k->name().rfind("ladder.wgmma", 0) == 0 && !wgmma_available()) continue;
    int index = 0, passed = 0;
    std::set<std::string> repacked;
    for (const Shape& s : kShapes)
      for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
        for (int trans = 0; trans < 4; ++trans) {
          Case c = tensor_core_case(*k, s, layout, trans, index++);
          c.kernel = k->name();
          ASSERT_FALSE(k->unsupported(c)) << k->name() << " " << describe(c) << ": " << *k->unsupported(c);
          const std::string what = fmt::format("{} {} D {}", k->name(), describe(c), name(c.types.at("D")));
          const std::optional<RunNotes> notes = expect_passes(*k, c, what);
          if (!notes) continue;
          ++passed;
          if (notes->count("repacked")) repacked.insert(notes->at("repacked"));
        }
    std::printf("[ ladder ] %-26s %d of %d cases passed; repacked: %s\n", k->name().c_str(), passed, index,
                fmt::format("{}", fmt::join(repacked, ", ")).c_str());
    EXPECT_GT(repacked.size(), 1u) << k->name() << ": both the direct and the repacked path";
  }
}

// Each element is one accumulator walked along K in order, so steps 10, 11 and 13 give the
// probe's model of their unit (mma.sync m16n8k16, wgmma m64nNk16: cpu.blockfma:block=16,
// frac=25,round=rz) bit for bit,
// and step 12 gives mma.sync m16n8k8's (block 8) on the inputs rounded to TF32 (to nearest,
// ties away) first.
TEST(LadderGpu, TensorCoreStepsEqualTheirMmaModelBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  for (auto& k : ladder_kernels(true)) {
    const bool tf32 = k->name().find("tf32") != std::string::npos;
    const std::string model_name = tf32 ? "cpu.blockfma:block=8,frac=25,round=rz,align=tf32" : k->traits().accumulation_model;
    const auto parsed = AccumulationModel::parse(model_name);
    ASSERT_TRUE(parsed) << model_name;
    auto model = make_emulated_gemm(*parsed);
    int index = 0, compared = 0, equal = 0;
    for (const Shape& s : kShapes)
      for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
        for (int trans = 0; trans < 4; ++trans) {
          Case c = tensor_core_case(*k, s, layout, trans, index++);
          if (c.alpha == 0) continue;  // the model multiplies by 0 (the sign of a zero may differ)
          auto in = test_support::fill(c, test_support::Fill::Normal, c.seed);
          const RunOutcome g = run_kernel(*k, c, in);
          Case mc = c;
          if (tf32) {  // the model's case: FP32 inputs already rounded to TF32 as cvt.rna does
            mc.types["compute"] = Format::FP32;
            for (const char* op : {"A", "B"}) {
              Tensor& t = in.at(op);
              for (std::size_t i = 0; i < t.size_bytes() / 4; ++i) {
                float f;
                std::memcpy(&f, static_cast<const char*>(t.data()) + 4 * i, 4);
                f = static_cast<float>(decode(Format::TF32, encode(Format::TF32, f, Rounding::NearestAway)));
                std::memcpy(static_cast<char*>(t.data()) + 4 * i, &f, 4);
              }
            }
          }
          const RunOutcome m = run_kernel(*model, mc, in);
          ASSERT_EQ(g.status, Disposition::Ok) << g.message;
          ASSERT_EQ(m.status, Disposition::Ok) << m.message;
          const Tensor& gd = g.outputs.at("D");
          const bool same = std::memcmp(gd.data(), m.outputs.at("D").data(), gd.size_bytes()) == 0;
          EXPECT_TRUE(same) << k->name() << " " << describe(c) << ": differs from " << model_name;
          ++compared, equal += same;
        }
    std::printf("[ ladder ] %-26s equals %s on %d of %d cases\n", k->name().c_str(), model_name.c_str(), equal, compared);
    EXPECT_GT(compared, 0);
  }
}
