// Coverage of the index-mapping space: kernels with one wrong index mapping each (GEMM
// transposes, layouts, leading dimensions, batch strides, bias; attention layouts, GQA,
// batch and head, sequence and head-dim strides, kv_lengths, LSE), against the case stream
// of the default campaign (`ulpgate fuzz` without flags). Every seed must catch every bug:
// the generators have to draw, in ten cases of one target, a case where each wrong mapping
// reads or writes other elements than the right one.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/parallel.hpp"
#include "check/check.hpp"
#include "campaign/fuzz.hpp"
#include "kernels/emulated/attention_models.hpp"
#include "kernels/emulated/gemm_models.hpp"

using namespace ulpgate;

namespace {

// Wrong offsets may point past a buffer: the planted kernels wrap them into it (reading
// another element is the bug; reading out of bounds would be the test's).
std::int64_t wrapped(std::int64_t offset, std::int64_t elements) { return ((offset % elements) + elements) % elements; }

// ---- GEMM ----

enum class GemmBug {
  None,
  TransAIgnored,       // A read as stored, op() = identity
  TransBIgnored,
  LayoutIgnored,       // column-major operands read as row-major
  LdaPacked,           // A's leading dimension taken as packed (padding ignored)
  LdaForLdb,           // B read with A's leading dimension
  LddForLdc,           // C read with D's leading dimension
  LddPacked,           // D written packed
  BatchStrideOfAForB,  // B's batches found at A's batch stride
  BatchIgnored,        // every batch reads batch 0 of A and B
  BiasPerRow,          // bias indexed by the row of D, not its column
};
const std::vector<std::string> kGemmBugNames = {"none", "trans_a_ignored", "trans_b_ignored", "layout_ignored",
                                                "lda_packed", "lda_for_ldb", "ldd_for_ldc", "ldd_packed",
                                                "batch_stride_of_a_for_b", "batch_ignored", "bias_per_row"};

// The sequential FP32 model (kernels/emulated) with its operands located through a wrong mapping.
class MappedGemm final : public Kernel {
 public:
  explicit MappedGemm(GemmBug bug) : bug_(bug) {}
  std::string name() const override { return "planted.gemm." + kGemmBugNames[static_cast<int>(bug_)]; }
  std::string description() const override { return name(); }
  KernelTraits traits() const override { return model_->traits(); }
  std::optional<std::string> unsupported(const Case& c) const override { return model_->unsupported(c); }

  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    const GemmShape& g = c.gemm;
    const MatrixView av = view(c, "A"), bv = view(c, "B"), dv = view(c, "D");
    const std::int64_t na = gemm_view(c, "A").elements(), nb = gemm_view(c, "B").elements(),
                       nd = gemm_view(c, "D").elements();
    const bool with_c = c.beta != 0.0, with_bias = has_bias(c.epilogue);
    const MatrixView cv = with_c ? view(c, "C") : MatrixView{};
    const std::int64_t nc = with_c ? gemm_view(c, "C").elements() : 1;
    const auto value = [&](const char* op, std::int64_t off, std::int64_t n) {
      return decode(c.types.at(op), load_code(c.types.at(op), io.in.at(op), wrapped(off, n)));
    };
    const AccumulationModel model;
    parallel_for(g.batch * g.m, [&](std::int64_t row) {
      const std::int64_t b = row / g.m, i = row % g.m, ba = bug_ == GemmBug::BatchIgnored ? 0 : b;
      std::vector<double> x(g.k), y(g.k);
      for (std::int64_t k = 0; k < g.k; ++k) x[k] = value("A", a_offset(c, av, ba, i, k), na);
      for (std::int64_t j = 0; j < g.n; ++j) {
        for (std::int64_t k = 0; k < g.k; ++k) y[k] = value("B", b_offset(c, av, bv, ba, k, j), nb);
        const double cval = with_c ? value("C", cv.offset(b, i, j), nc) : 0.0;
        const double bias = with_bias ? value("bias", bug_ == GemmBug::BiasPerRow ? i : j, g.n) : 0.0;
        store_code(c.types.at("D"), io.out.at("D"), wrapped(dv.offset(b, i, j), nd),
                   model_epilogue(c, model_dot(model, x.data(), y.data(), g.k), cval, bias));
      }
    });
  }

 private:
  MatrixView view(const Case& c, const char* op) const {
    MatrixView v = gemm_view(c, op);
    const std::string o = op;
    if (bug_ == GemmBug::LayoutIgnored && (o == "A" || o == "B")) v.layout = Layout::RowMajor;
    if (bug_ == GemmBug::LdaPacked && o == "A") v.ld = c.gemm.packed_ld(v.rows, v.cols);
    if (bug_ == GemmBug::LdaForLdb && o == "B") v.ld = gemm_view(c, "A").ld;
    if (bug_ == GemmBug::LddForLdc && o == "C") v.ld = gemm_view(c, "D").ld;
    if (bug_ == GemmBug::LddPacked && o == "D") v.ld = c.gemm.packed_ld(v.rows, v.cols);
    return v;
  }
  std::int64_t a_offset(const Case& c, const MatrixView& av, std::int64_t b, std::int64_t i, std::int64_t k) const {
    return bug_ == GemmBug::TransAIgnored ? av.offset(b, i, k) : op_a_offset(c, av, b, i, k);
  }
  std::int64_t b_offset(const Case& c, const MatrixView& av, const MatrixView& bv, std::int64_t b, std::int64_t k,
                        std::int64_t j) const {
    const std::int64_t off = bug_ == GemmBug::TransBIgnored ? bv.offset(b, k, j) : op_b_offset(c, bv, b, k, j);
    return bug_ == GemmBug::BatchStrideOfAForB ? off - b * bv.batch_stride() + b * av.batch_stride() : off;
  }

  GemmBug bug_;
  std::unique_ptr<Kernel> model_ = make_emulated_gemm(AccumulationModel{});
};

// ---- Attention ----

enum class AttentionBug {
  None,
  GqaModulo,         // query head h reads K/V head h % kv_heads
  LayoutIgnored,     // BSHD read and written as BHSD
  KvHeadsOfQ,        // K/V strides computed with the query heads' count
  BatchHeadSwapped,  // [head][batch] where the layout says [batch][head]
  SeqOfQForKv,       // K/V strides computed with seq_q
  DimOfQkForV,       // V's rows taken head_dim wide
  KvLengthOfBatch0,  // every batch masked with kv_lengths[0]
  KvLengthPlusOne,   // keys 0 .. kv_lengths[b] visible (one too many)
  LseFollowsLayout,  // LSE written [batch][seq][head] in BSHD
};
const std::vector<std::string> kAttentionBugNames = {"none", "gqa_modulo", "layout_ignored", "kv_heads_of_q",
                                                     "batch_head_swapped", "seq_q_for_kv", "dim_qk_for_v",
                                                     "kv_length_of_batch0", "kv_length_plus_one", "lse_follows_layout"};

// The naive model (kernels/emulated) run on Q, K and V gathered through a wrong mapping into
// a multi-head case (each query head its own K/V rows, so that any head mapping can be
// expressed), its O and LSE scattered back through it.
class MappedAttention final : public Kernel {
 public:
  explicit MappedAttention(AttentionBug bug) : bug_(bug) {}
  std::string name() const override { return "planted.attention." + kAttentionBugNames[static_cast<int>(bug_)]; }
  std::string description() const override { return name(); }
  KernelTraits traits() const override { return model_->traits(); }
  std::optional<std::string> unsupported(const Case& c) const override { return model_->unsupported(c); }

  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const AttentionShape& a = c.attention;
    Case mha = c;
    mha.attention.kv_heads = 0;
    mha.attention.kv_lengths = kv_lengths(a);
    for (auto& [op, scales] : mha.head_scales) {  // per-head K/V scales: one per query head now
      std::vector<double> per_query_head;
      for (std::int64_t h = 0; h < a.heads; ++h)
        per_query_head.push_back(scales[static_cast<std::size_t>(kv_head_read(a, h))]);
      scales = per_query_head;
    }
    std::map<std::string, Tensor> in, out;
    KernelIo mio;
    for (const char* op : {"Q", "K", "V"}) {
      const AttentionView to = attention_view(mha, op);
      Tensor t(c.types.at(op), static_cast<std::size_t>(to.elements()));
      for_each(to, [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
        t.set_code(static_cast<std::size_t>(to.offset(b, h, s, d)),
                   load_code(t.format(), io.in.at(op), offset(c, op, b, h, s, d)));
      });
      mio.in[op] = (in[op] = std::move(t)).data();
    }
    for (const auto& [op, ptr] : io.out) {
      out[op] = Tensor(c.types.at(op), static_cast<std::size_t>(operand_elements(mha, op)));
      mio.out[op] = out[op].data();
    }
    model_->run(mha, mio, notes);
    for (const auto& [op, t] : out) {
      const AttentionView from = attention_view(mha, op);
      for_each(from, [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
        store_code(t.format(), io.out.at(op), offset(c, op, b, h, s, d), t.code(static_cast<std::size_t>(from.offset(b, h, s, d))));
      });
    }
  }

 private:
  template <class Fn>
  static void for_each(const AttentionView& v, Fn&& fn) {
    for (std::int64_t b = 0; b < v.batch; ++b)
      for (std::int64_t h = 0; h < v.heads; ++h)
        for (std::int64_t s = 0; s < v.seq; ++s)
          for (std::int64_t d = 0; d < v.dim; ++d) fn(b, h, s, d);
  }

  std::vector<std::int64_t> kv_lengths(const AttentionShape& a) const {
    std::vector<std::int64_t> lens = a.kv_lengths;
    for (std::int64_t& n : lens) {
      if (bug_ == AttentionBug::KvLengthOfBatch0) n = a.kv_lengths.front();
      if (bug_ == AttentionBug::KvLengthPlusOne) n = std::min(n + 1, a.seq_kv);
    }
    return lens;
  }

  // The K/V head the kernel reads for query head h.
  std::int64_t kv_head_read(const AttentionShape& a, std::int64_t h) const {
    return bug_ == AttentionBug::GqaModulo ? h % a.eff_kv_heads() : a.kv_head(h);
  }

  // Where the kernel takes element [b][h][s][d] of operand op, h a query head.
  std::int64_t offset(const Case& c, const std::string& op, std::int64_t b, std::int64_t h, std::int64_t s,
                      std::int64_t d) const {
    const AttentionShape& a = c.attention;
    AttentionView v = attention_view(c, op);
    const std::int64_t n = v.elements();
    const bool kv = op == "K" || op == "V";
    if (kv) h = kv_head_read(a, h);
    if (op == "LSE")
      return bug_ == AttentionBug::LseFollowsLayout && a.layout == AttentionLayout::BSHD ? (b * a.seq_q + s) * a.heads + h
                                                                                        : v.offset(b, h, s, 0);
    if (bug_ == AttentionBug::LayoutIgnored) v.layout = AttentionLayout::BHSD;
    if (bug_ == AttentionBug::KvHeadsOfQ && kv) v.heads = a.heads;
    if (bug_ == AttentionBug::SeqOfQForKv && kv) v.seq = a.seq_q;
    if (bug_ == AttentionBug::DimOfQkForV && op == "V") v.dim = a.head_dim;
    if (bug_ == AttentionBug::BatchHeadSwapped) {
      std::swap(v.batch, v.heads);
      std::swap(b, h);
    }
    return wrapped(v.offset(b, h, s, d), n);
  }

  AttentionBug bug_;
  std::unique_ptr<Kernel> model_ = make_emulated_attention(AttentionModel{});
};

// The default campaign's case stream for target (k, fp32, op): the index of its first case
// the kernel fails (-1: none). Relations are off: they can only add failures, and the
// generators' draws are what is under test.
std::int64_t first_failing_case(Kernel& k, Op op, std::uint64_t seed) {
  FuzzOptions o;
  o.cases = kDefaultCampaignCases, o.max_k = kDefaultCampaignMaxK, o.seed = seed;  // sizes: realistic
  const FuzzTarget t{k.name(), "fp32", op};
  EvaluationOptions ev;
  ev.relations = false;
  for (std::int64_t i = 0; i < o.cases; ++i) {
    Case c = campaign_case(o, t, k, i);
    if (!check_case(k, c, ev).verdict.passed) return i;
  }
  return -1;
}

const std::vector<std::uint64_t> kSeeds = {1, 2, 3, 4, 5, 6};

template <class Bug, class Planted>
void expect_every_bug_caught(Op op, const std::vector<std::string>& names) {
  for (std::uint64_t seed : kSeeds) {
    std::string line;
    int caught = 0;
    for (std::size_t b = 0; b < names.size(); ++b) {
      Planted k(static_cast<Bug>(b));
      const std::int64_t first = first_failing_case(k, op, seed);
      if (b == 0) {
        EXPECT_EQ(first, -1) << "the planted kernel without a bug fails case " << first << " of seed " << seed;
        continue;
      }
      EXPECT_GE(first, 0) << names[b] << " survives the default campaign of seed " << seed;
      caught += first >= 0;
      line += " " + names[b] + "@" + std::to_string(first);
    }
    std::printf("[ seed %llu ] %d of %zu caught (first failing case):%s\n", static_cast<unsigned long long>(seed), caught,
                names.size() - 1, line.c_str());
  }
}

}  // namespace

TEST(MappingCoverage, DefaultCampaignCatchesEveryWrongGemmMapping) {
  expect_every_bug_caught<GemmBug, MappedGemm>(Op::Gemm, kGemmBugNames);
}

TEST(MappingCoverage, DefaultCampaignCatchesEveryWrongAttentionMapping) {
  expect_every_bug_caught<AttentionBug, MappedAttention>(Op::Attention, kAttentionBugNames);
}
