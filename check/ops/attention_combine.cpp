#include "check/ops/attention_combine.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
#include "distributions/case_gen.hpp"
#include "references/attention_combine.hpp"

namespace ulpgate {
namespace {

const std::vector<std::string> kCombineDtypes{"fp32", "fp16", "bf16"};

// What the generator keeps a case within: rows x splits x head_dim partial values (the
// exact reference's cost), small and large regime.
constexpr std::int64_t kSmallTerms = std::int64_t{1} << 16;
constexpr std::int64_t kLargeTerms = std::int64_t{1} << 21;

// The rows (logical order) that meet a NaN or Inf in a non-empty split's O_s, or a NaN or +inf
// LSE_s. The merge has no exact value there: `sanitized` gets the inputs with those O values 0
// and those LSEs -inf (empty), for a finite reference, and any output of the row is accepted
// (its accumulated bound is +Inf). Empty when no row is.
std::vector<char> poisoned_rows(const Case& c, const Inputs& given, Inputs& sanitized) {
  const AttentionShape& a = c.attention;
  const Tensor &o = given.at("O_part"), &l = given.at("LSE_part");
  const AttentionView ov = attention_view(c, "O_part"), lv = attention_view(c, "LSE_part");
  std::vector<char> poisoned;
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i)
        for (std::int64_t s = 0; s < a.splits; ++s) {
          const auto lo = static_cast<std::size_t>(lv.offset(s * a.batch + b, h, i, 0));
          const double lse = l.value(lo);
          if (lse == -INFINITY) continue;
          bool bad = !std::isfinite(lse);
          for (std::int64_t d = 0; d < a.head_dim; ++d) {
            const auto e = static_cast<std::size_t>(ov.offset(s * a.batch + b, h, i, d));
            if (std::isfinite(o.value(e))) continue;
            if (sanitized.empty()) sanitized = given;
            sanitized.at("O_part").set_value(e, 0.0);
            bad = true;
          }
          if (!bad) continue;
          if (sanitized.empty()) sanitized = given;
          if (!std::isfinite(lse)) sanitized.at("LSE_part").set_value(lo, -INFINITY);
          if (poisoned.empty()) poisoned.assign(static_cast<std::size_t>(a.batch * a.heads * a.seq_q), 0);
          poisoned[static_cast<std::size_t>((b * a.heads + h) * a.seq_q + i)] = 1;
        }
  return poisoned;
}

// The bound of an FP32 combine (docs/concepts/split-kv.md, "The tolerance"): with m the
// largest LSE_s of a row and M the largest |LSE_s|, each weight's exponent LSE_s - m (or its
// base-2 form) is within eps = 2 u (1 + 2 M) of the exact one (the difference's and a scaling
// product's roundings, exp's own error), so each weight is within e^(+-eps) of its value
// relative to the others; the n-term sums and the division add 3 gamma(n + 2).
class CombineBound {
 public:
  CombineBound(const Case& c, const Inputs& inputs, const ToleranceModel& tol, const std::vector<char>& poisoned)
      : a_(c.attention), tol_(tol), poisoned_(poisoned), o_(inputs.at("O_part")), lse_(inputs.at("LSE_part")),
        ov_(attention_view(c, "O_part")), lv_(attention_view(c, "LSE_part")),
        u_(std::ldexp(1.0, 1 - tol.accumulator_bits)) {}

  void row(const CombineReference& ref, std::int64_t b, std::int64_t h, std::int64_t i, OutputComparison& o,
           OutputComparison* lse) const {
    std::vector<std::int64_t> filled;  // the row's non-empty splits, as batches of the views
    for (std::int64_t s = 0; s < a_.splits; ++s)
      if (lse_.value(lv_.offset(s * a_.batch + b, h, i, 0)) != -INFINITY) filled.push_back(s * a_.batch + b);
    const auto used = static_cast<std::int64_t>(filled.size());
    const bool poisoned = !poisoned_.empty() && poisoned_[static_cast<std::size_t>(ref.row(b, h, i))];
    const double spread = ref.lse_spread[static_cast<std::size_t>(ref.row(b, h, i))];
    const double eps = 2 * u_ * (1 + 2 * spread);
    const double rel = 2 * (std::exp(2 * eps) - std::exp(eps)) + 3 * tol_.gamma(used + 2);
    const double eta = tol_.accumulator_eta;
    for (std::int64_t d = 0; d < a_.head_dim; ++d) {
      const std::int64_t e = ref.index(b, h, i, d);
      double vmax = 0;  // the largest partial value of a non-empty split: the sums stay within n of it
      for (std::int64_t sb : filled) vmax = std::max(vmax, std::fabs(o_.value(ov_.offset(sb, h, i, d))));
      o.allowed[e] = rel * o.condition[e] + static_cast<double>(used) * eta * vmax + 4 * eta;
      o.accumulated[e] = poisoned ? INFINITY : static_cast<double>(used) * vmax;
    }
    if (!lse) return;
    const auto r = static_cast<std::size_t>(ref.row(b, h, i));
    lse->accumulated[r] = poisoned ? INFINITY : spread;
    if (poisoned) return;
    if (used == 0) {
      // No non-empty split: ln 0 = -inf. +inf is FlashAttention's convention (its combine
      // writes it where the weight sum is 0) and is accepted too; nothing finite is.
      if (decode(lse->format, lse->got[r]) == INFINITY) lse->exact[r] = RefValue::infinity(false);
      return;
    }
    // |LSE~ - LSE| <= eps + the sum's relative error after the log (2 gamma(n + 2), times
    // 1/ln 2 in base 2) + m + log(l) and its roundings, 4 u (M + ln n + 1).
    const double e_sum = (a_.lse_base2 ? 1.5 : 1.0) * 2 * tol_.gamma(used + 2);
    lse->allowed[r] = e_sum < 1 ? eps + e_sum + 4 * u_ * (spread + std::log(static_cast<double>(used)) + 1) : INFINITY;
    lse->condition[r] = 1 + spread;
  }

 private:
  const AttentionShape& a_;
  const ToleranceModel& tol_;
  const std::vector<char>& poisoned_;
  const Tensor &o_, &lse_;
  const AttentionView ov_, lv_;
  const double u_;
};

class AttentionCombineModule final : public OpModule {
 public:
  Op op() const override { return Op::AttentionCombine; }
  std::vector<std::string> dtypes() const override { return kCombineDtypes; }
  Case basic_case(std::string_view dtype) const override { return dtype_attention_combine_case(dtype); }
  std::vector<Format> output_formats(std::string_view dtype) const override {
    const Format in = basic_case(dtype).types.at("O_part");
    // FP32 partials into a 16-bit O (FlashAttention-3, FlashInfer); 16-bit partials merged
    // into their own format (vLLM's merge_attn_states) or FP32.
    if (in == Format::FP32) return {Format::FP32, Format::BF16, Format::FP16};
    return {in, Format::FP32};
  }

  rc::Gen<Case> generate(std::string_view dtype_in, const Kernel* k, const GenLimits& limits) const override {
    return rc::gen::exec([this, dtype_in = std::string(dtype_in), k, limits]() {
      const std::string dtype = dtype_in.empty() ? *gen::pick(kCombineDtypes) : dtype_in;
      Case c = dtype_attention_combine_case(dtype, k ? supported_output(*k, dtype) : std::nullopt);
      if (k) c.kernel = k->name();
      const auto keep_if_supported = [&](auto apply, auto revert) {
        apply();
        if (k && k->unsupported(c)) revert();
      };
      const Format out = *gen::pick(output_formats(dtype));
      keep_if_supported([&] { c.types["O"] = out; }, [&, was = c.types.at("O")] { c.types["O"] = was; });
      AttentionShape& a = c.attention;
      // Splits: one (nothing to merge), a few, past a warp (33) and a block of 128 (129).
      a.splits = *gen::pick(std::vector<std::int64_t>{1, 2, 2, 3, 4, 5, 8, 16, 17, 33, 64, 129});
      // Rows: decode (one query), speculative decoding (up to 16), several batches and heads.
      a.seq_q = *gen::pick(std::vector<std::int64_t>{1, 1, 1, 2, 4, 7, 16});
      a.head_dim = *gen::pick(std::vector<std::int64_t>{64, 128, 256, 32, 80, 96, 111, 1, 512});
      if (limits.mapping) {
        a.batch = *rc::gen::inRange<std::int64_t>(2, 4);
        a.heads = *gen::pick(std::vector<std::int64_t>{3, 4, 8});
        if (a.seq_q == 1) a.seq_q = *gen::pick(std::vector<std::int64_t>{2, 5});
      } else if (limits.large) {
        a.batch = *gen::pick(std::vector<std::int64_t>{16, 64, 33});
        a.heads = *gen::pick(std::vector<std::int64_t>{32, 8, 40});
      } else {
        a.batch = *gen::dim(3);
        a.heads = *gen::dim(4);
      }
      fit_budget(a, limits.large ? kLargeTerms : kSmallTerms);
      const auto layout = *gen::pick(std::vector<AttentionLayout>{AttentionLayout::BHSD, AttentionLayout::BSHD});
      keep_if_supported([&] { a.layout = layout; }, [&] { a.layout = AttentionLayout::BHSD; });
      if (*gen::pick(std::vector<bool>{false, true})) keep_if_supported([&] { a.lse_base2 = true; }, [&] { a.lse_base2 = false; });
      if (*gen::pick(std::vector<int>{0, 1, 1, 1}) && (!k || k->traits().writes_lse))
        keep_if_supported([&] { c.types["LSE"] = Format::FP32; }, [&] { c.types.erase("LSE"); });
      // The partial LSEs from the lse family or normal (which families_for always offers): no
      // family that draws NaN or +inf, which no partial state holds.
      c.dist["LSE_part"] = *gen::dist_spec(c, "LSE_part", false, non_lse_families());
      c.dist["O_part"] = *gen::dist_spec(c, "O_part", false, {"near_overflow"});
      c.seed = *rc::gen::arbitrary<std::uint64_t>();
      validate(c);
      return c;
    });
  }

  std::string family(const Case& c) const override {
    return op_family(c, "attention_combine", "O_part", "O") +
           fmt::format(" lse {}", c.dist.count("LSE_part") ? c.dist.at("LSE_part") : std::string(kDefaultDist));
  }
  std::int64_t reduction_length(const Case& c) const override { return c.attention.splits; }

  ToleranceModel tolerance(const Case& c, const KernelTraits& traits) const override {
    ToleranceModel t = precision_terms(c, traits);
    t.rule += c.attention.lse_base2 ? ", weights 2^(LSE_s - max) (exp2 and log2 of FP32 accuracy)"
                                    : ", weights e^(LSE_s - max) (exp and log of FP32 accuracy)";
    return t;
  }

  std::vector<AdmittedArithmetic> admitted(std::string_view) const override {
    return {{"FP32: the largest LSE subtracted, exp (exp2 in base 2), sums and one division in FP32", "cpu.attn_combine"}};
  }

  std::vector<OutputComparison> compare(const Case& c, const Inputs& given, const std::map<std::string, Tensor>& outputs,
                                        const ToleranceModel& tol) const override {
    const AttentionShape& a = c.attention;
    Inputs sanitized;
    const std::vector<char> poisoned = poisoned_rows(c, given, sanitized);
    const Inputs& inputs = sanitized.empty() ? given : sanitized;
    const CombineReference ref = combine_reference(c, inputs);
    const auto rows = static_cast<std::size_t>(a.batch * a.heads * a.seq_q);
    OutputComparison o;
    o.format = c.types.at("O");
    o.shape = {a.batch, a.heads, a.seq_q, a.head_dim};
    o.ulp_fair_condition = ulp_fair_condition(tol.accumulator_bits, o.format);
    o.got = logical_output(c, "O", outputs.at("O"));
    o.exact.assign(ref.values.begin(), ref.values.end());
    o.condition = ref.magnitude;
    o.allowed.assign(ref.values.size(), 0.0);
    o.accumulated.assign(ref.values.size(), 0.0);
    o.accumulator_max = info(Format::FP32).max_finite();
    const bool with_lse = outputs.count("LSE") > 0;
    OutputComparison lse;
    if (with_lse) {
      lse.format = c.types.at("LSE");
      lse.shape = {a.batch, a.heads, a.seq_q};
      lse.ulp_fair_condition = ulp_fair_condition(tol.accumulator_bits, lse.format);
      lse.got = logical_output(c, "LSE", outputs.at("LSE"));
      lse.exact.assign(ref.lse.begin(), ref.lse.end());
      lse.condition.assign(rows, 0.0);
      lse.allowed.assign(rows, 0.0);
      lse.accumulated.assign(rows, 0.0);
      lse.accumulator_max = o.accumulator_max;
    }
    const CombineBound bound(c, inputs, tol, poisoned);
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t i = 0; i < a.seq_q; ++i) bound.row(ref, b, h, i, o, with_lse ? &lse : nullptr);
    o.tolerance_note = fmt::format("accumulator {} bits, n = {} splits", tol.accumulator_bits, a.splits);
    std::vector<OutputComparison> out;
    out.push_back(std::move(o));
    if (with_lse) {
      lse.tolerance_note = fmt::format("exp and log (accumulator {} bits), a sum of n = {} splits", tol.accumulator_bits, a.splits);
      out.push_back(std::move(lse));
    }
    return out;
  }

  std::vector<std::int64_t> output_offsets(const Case& c, const std::string& output) const override {
    return attention_view(c, output).logical_offsets();
  }

  // Split order: the splits reversed give the same exact output (a kernel that weighs
  // splits by their index, or reads one split's LSE with another's O, fails). An empty split
  // appended, its partial output all NaN: the exact output is unchanged, and a kernel that
  // reads an empty split's O (0 x NaN) or takes -inf into its max fails.
  std::vector<RelationFailure> relations(const RelationContext& ctx, const Case& c, const Inputs& inputs,
                                         const RunOutcome&) const override {
    std::vector<RelationFailure> out;
    const AttentionShape& a = c.attention;
    const auto check = [&](const char* relation, const std::string& what, const Case& cc, const Inputs& in) {
      if (const std::string why = ctx.run_and_judge(cc, in); !why.empty()) out.push_back({relation, what + " fails: " + why});
    };
    if (a.splits > 1) {
      Inputs reversed = inputs;
      permute_splits(c, inputs, reversed, c, [&](std::int64_t s) { return a.splits - 1 - s; });
      check("split_order", "the splits in reverse order", c, reversed);
    }
    Case more = c;
    ++more.attention.splits;
    if (!ctx.kernel.unsupported(more)) {
      Inputs appended{{"O_part", Tensor(c.types.at("O_part"), static_cast<std::size_t>(operand_elements(more, "O_part")))},
                      {"LSE_part", Tensor(Format::FP32, static_cast<std::size_t>(operand_elements(more, "LSE_part")))}};
      permute_splits(c, inputs, appended, more, [](std::int64_t s) { return s; });
      const AttentionView ov = attention_view(more, "O_part"), lv = attention_view(more, "LSE_part");
      const Code nan = canonical_nan(c.types.at("O_part"));
      for (std::int64_t b = 0; b < a.batch; ++b)
        for (std::int64_t h = 0; h < a.heads; ++h)
          for (std::int64_t i = 0; i < a.seq_q; ++i) {
            const std::int64_t s = a.splits * a.batch + b;
            appended.at("LSE_part").set_value(static_cast<std::size_t>(lv.offset(s, h, i, 0)), -INFINITY);
            for (std::int64_t d = 0; d < a.head_dim; ++d)
              appended.at("O_part").set_code(static_cast<std::size_t>(ov.offset(s, h, i, d)), nan);
          }
      check("empty_split", "one more split, empty (LSE -inf, O all NaN)", more, appended);
    }
    return out;
  }

  EffectiveBits effective_bits(const Case&, const Inputs&, const OutputComparison&, double, const KernelTraits&) const override {
    return {};
  }

 private:
  // Halves the longest of seq_q, heads, batch, splits (in that order of preference) until
  // rows x splits x head_dim is within `terms`.
  static void fit_budget(AttentionShape& a, std::int64_t terms) {
    while (a.batch * a.heads * a.seq_q * a.splits * a.head_dim > terms) {
      if (a.seq_q > 1) a.seq_q = (a.seq_q + 1) / 2;
      else if (a.heads > 1) a.heads = (a.heads + 1) / 2;
      else if (a.batch > 1) a.batch = (a.batch + 1) / 2;
      else if (a.splits > 1) a.splits = (a.splits + 1) / 2;
      else break;
    }
  }

  static std::vector<std::string> non_lse_families() {
    std::vector<std::string> out;
    for (const FamilyInfo& f : all_families())
      if (f.name != "lse") out.emplace_back(f.name);
    return out;
  }

  // Copies split `from(s)` of c's inputs into split s of `to` (shaped as case `into`), for
  // the splits of c.
  template <class From>
  static void permute_splits(const Case& c, const Inputs& in, Inputs& to, const Case& into, From from) {
    const AttentionShape& a = c.attention;
    const AttentionView ov = attention_view(c, "O_part"), lv = attention_view(c, "LSE_part");
    const AttentionView tov = attention_view(into, "O_part"), tlv = attention_view(into, "LSE_part");
    const Tensor &o = in.at("O_part"), &l = in.at("LSE_part");
    Tensor &to_o = to.at("O_part"), &to_l = to.at("LSE_part");
    for (std::int64_t s = 0; s < a.splits; ++s)
      for (std::int64_t b = 0; b < a.batch; ++b)
        for (std::int64_t h = 0; h < a.heads; ++h)
          for (std::int64_t i = 0; i < a.seq_q; ++i) {
            const std::int64_t src = from(s) * a.batch + b, dst = s * a.batch + b;
            to_l.set_code(static_cast<std::size_t>(tlv.offset(dst, h, i, 0)), l.code(static_cast<std::size_t>(lv.offset(src, h, i, 0))));
            for (std::int64_t d = 0; d < a.head_dim; ++d)
              to_o.set_code(static_cast<std::size_t>(tov.offset(dst, h, i, d)), o.code(static_cast<std::size_t>(ov.offset(src, h, i, d))));
          }
  }
};

}  // namespace

Case dtype_attention_combine_case(std::string_view dtype, std::optional<Format> out) {
  const auto f = parse_format(dtype);
  if (!f || !(*f == Format::FP32 || *f == Format::FP16 || *f == Format::BF16))
    throw InputError(fmt::format("--dtype '{}': attention_combine takes fp32, fp16 or bf16 partial outputs", dtype));
  Case c;
  c.op = Op::AttentionCombine;
  AttentionShape& a = c.attention;
  a.batch = a.heads = a.seq_q = 1, a.head_dim = 64, a.splits = 4;
  c.types = {{"O_part", *f}, {"LSE_part", Format::FP32}, {"O", out.value_or(*f)}, {"compute", Format::FP32}};
  validate(c);
  return c;
}

const OpModule& attention_combine_module() {
  static const AttentionCombineModule m;
  return m;
}

}  // namespace ulpgate
