#include "check/ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/error.hpp"
#include "distributions/case_gen.hpp"
#include "references/attention_reference.hpp"

namespace ulpgate {
namespace {

const std::vector<std::string> kAttentionDtypes = {"fp32", "fp16", "bf16", "e4m3"};

// The precision P may be rounded to before P V without a declaration: the inputs' format
// where it is 16 bits wide (FlashAttention-2/3, cuDNN and PyTorch's fused kernels feed P to
// the tensor cores in Q's type), BF16 for FP8 inputs (P V in 16 bits), none for FP32.
int default_p_bits(const Case& c) {
  const Format q = c.types.at("Q");
  if (q == Format::FP16 || q == Format::BF16) return info(q).precision();
  return is_fp8(q) ? info(Format::BF16).precision() : 0;
}

// The smallest subnormal of the format P is rounded to (an absolute error of rounding it):
// FP16's for 11 bits, E4M3's for 4, E5M2's for 3, else one with FP32's exponent range.
double p_rounding_eta(int p_bits) {
  for (Format f : {Format::FP16, Format::BF16, Format::E4M3, Format::E5M2})
    if (info(f).precision() == p_bits) return info(f).min_subnormal();
  return std::ldexp(1.0, info(Format::FP32).emin() + 1 - p_bits);
}

// Exponentials of every (query, key) pair are what the reference pays for: the generator
// keeps batch * heads * seq_q * seq_kv below this.
constexpr std::int64_t kScoreBudget = std::int64_t{1} << 16;
// ... and batch * heads * seq_q * seq_kv * head_dim_v, its terms of P V in MPFR (~0.5 us each).
constexpr std::int64_t kOutputTermBudget = std::int64_t{1} << 20;

// The large regime (GenLimits::large) caps each case by its reference's cost. Measured here
// (one core of this machine, attention_reference on one thread, bf16 and fp32, normal and
// logits inputs, seq_kv 16384): 2.2 to 2.7 us per visible score (exact dot product, sorting,
// MPFR exp at 192 bits) plus 0.004 us per Q.K term, and 0.133 to 0.139 us per P.V term
// (MPFR product and sum). Every key is taken as visible (an upper bound).
constexpr double kRefSecondsPerScore = 2.5e-6, kRefSecondsPerQkTerm = 4e-9, kRefSecondsPerPvTerm = 1.4e-7;
/// One large case's reference at most this long (its relations add one or two more).
constexpr double kLargeReferenceSeconds = 0.3;
/// The large regime's kernel work per case, batch x heads x seq_q x seq_kv x (head_dim +
/// head_dim_v): half the GEMM regime's kLargeTermBudget, since each large attention case runs
/// the kernel four or five times (relations) and a failing one is shrunk through up to 24
/// more evaluations (a prefill keeps some 500 to 1,800 queries against as many keys).
constexpr std::int64_t kLargeAttentionTermBudget = kLargeTermBudget / 2;
/// Queries per (batch, head) the reference keeps however long the case: the sampling below
/// never goes under this (the generator keeps the cost within budget with it).
constexpr std::int64_t kMinReferencedQueries = 16;

double row_reference_seconds(const AttentionShape& a) {
  return static_cast<double>(a.seq_kv) * (kRefSecondsPerScore + kRefSecondsPerQkTerm * static_cast<double>(a.head_dim) +
                                          kRefSecondsPerPvTerm * static_cast<double>(a.eff_head_dim_v()));
}

std::int64_t affordable_queries(const AttentionShape& a) {
  const double per_head = row_reference_seconds(a) * static_cast<double>(a.batch * a.heads);
  const double afford = std::floor(kLargeReferenceSeconds / std::max(per_head, 1e-30));
  return afford >= static_cast<double>(a.seq_q) ? a.seq_q : std::max<std::int64_t>(kMinReferencedQueries, static_cast<std::int64_t>(afford));
}

// The reference's cost with referenced_queries' sampling (every key taken as visible).
double large_reference_seconds(const AttentionShape& a) {
  return static_cast<double>(std::min(a.seq_q, affordable_queries(a))) * static_cast<double>(a.batch * a.heads) *
         row_reference_seconds(a);
}

}  // namespace

// Long prefills: a kernel runs every query, the reference only as many as
// kLargeReferenceSeconds affords (at least kMinReferencedQueries per batch and head), the
// same ones in every (batch, head): the first two, the last four (a tail tile's), both sides
// of the last 64- and 128-query tile boundaries, then queries spread evenly with a
// seed-dependent offset. A kernel wrong on some queries only (a tile, a tail) is seen where
// the picks meet them; one wrong on a path is seen on every pick.
std::vector<std::int64_t> referenced_queries(const Case& c) {
  return edge_and_spread_sample(c.attention.seq_q, affordable_queries(c.attention), c.seed);
}

namespace {

// Families that put NaN, Inf or values near overflow into Q, K or V: an attention kernel's
// scores are then not finite, which the reference rejects (the case would test nothing).
const std::vector<std::string> kExcludedFamilies = {"specials", "near_overflow", "gendot"};


/// Per query row: the visible keys, S = max_j |scale| sum_d |q_id k_jd| over them, B = max_j
/// |ALiBi bias|, whether the head has a sink, and L, a bound of every |logit| (the sink's
/// included): min(S, cap) + B.
struct RowFacts {
  std::vector<std::int64_t> keys;
  double s = 0, bias = 0, logit = 0;
  bool sink = false;
};

// An FP8 K/V cache with a scale: the format the default rule lets the kernel dequantize it to.
// The query's 16-bit format (vLLM's paged attention converts the cache to Q's format, scale
// applied, before the dot products), else FP32 (the scale folded into the scores or the output).
Format kv_dequantization_format(const Case& c) {
  const Format q = c.types.at("Q");
  return q == Format::FP16 || q == Format::BF16 ? q : Format::FP32;
}

// The relative error admitted for operand op's dequantization; 0 without a scale.
double kv_dequantization_unit(const Case& c, const char* op) {
  return c.scales.count(op) || c.head_scales.count(op) ? std::ldexp(1.0, 1 - info(kv_dequantization_format(c)).precision()) : 0.0;
}

// tanh's relative error admitted under soft-capping: tanh.approx.f32's (FlashAttention-2/3
// cap with it), about 2^-11, rounded up.
constexpr double kTanhError = 0x1p-10;

RowFacts row_facts(const Case& c, const Inputs& in, std::int64_t b, std::int64_t h, std::int64_t i) {
  const AttentionShape& a = c.attention;
  const AttentionView qv = attention_view(c, "Q"), kv = attention_view(c, "K");
  const Tensor &q = in.at("Q"), &k = in.at("K");
  RowFacts f;
  const std::int64_t hk = a.kv_head(h);
  const double sigma = std::fabs(c.attention.scale()) * input_scale(c, "K", hk);
  for (std::int64_t j = 0; j < a.seq_kv; ++j) {
    if (!attention_visible(c, b, i, j)) continue;
    f.keys.push_back(j);
    double sum = 0;
    for (std::int64_t d = 0; d < a.head_dim; ++d) sum += std::fabs(q.value(qv.offset(b, h, i, d)) * k.value(kv.offset(b, hk, j, d)));
    f.s = std::max(f.s, sigma * sum * (1 + 0x1p-40));  // the double sum's own rounding, and more
    if (!a.alibi_slopes.empty())
      f.bias = std::max(f.bias, std::fabs(a.alibi_slopes[static_cast<std::size_t>(h)] * static_cast<double>(alibi_distance(a, i, j))));
  }
  f.logit = (a.softcap != 0 ? std::min(f.s, a.softcap) : f.s) + f.bias;
  if (const double sink = a.sink(h); sink != -INFINITY) {
    f.sink = true;
    f.logit = std::max(f.logit, std::fabs(sink));
  }
  return f;
}

// The formats the generator draws O from: the basic case's (o0) first.
// Long prefills: the reference for the sampled queries only (referenced_queries); rows
// marks the referenced rows (b, h, i) when not every query is.
struct Sampling {
  std::vector<std::int64_t> queries;
  std::vector<char> rows;
  bool sampled() const { return !rows.empty(); }
};

Sampling sampling_of(const Case& c) {
  const AttentionShape& a = c.attention;
  Sampling s;
  s.queries = referenced_queries(c);
  if (static_cast<std::int64_t>(s.queries.size()) < a.seq_q) {
    s.rows.assign(static_cast<std::size_t>(a.batch * a.heads * a.seq_q), 0);
    for (std::int64_t bh = 0; bh < a.batch * a.heads; ++bh)
      for (std::int64_t i : s.queries) s.rows[static_cast<std::size_t>(bh * a.seq_q + i)] = 1;
  }
  return s;
}

Format accumulator_format(const Case& c) {
  const Format compute = c.types.at("compute");
  return compute == Format::TF32 ? Format::FP32 : compute;
}

// O against the reference; its bounds are filled in row by row (RowBound).
OutputComparison o_comparison(const Case& c, const AttentionReference& ref, UninitVector<Code> got,
                              const ToleranceModel& tol, const Sampling& sampling) {
  const AttentionShape& a = c.attention;
  const std::int64_t dv = a.eff_head_dim_v();
  const std::int64_t n = a.batch * a.heads * a.seq_q * dv;
  OutputComparison cmp;
  cmp.format = c.types.at("O");
  cmp.shape = {a.batch, a.heads, a.seq_q, dv};
  cmp.ulp_fair_condition = ulp_fair_condition(tol.accumulator_bits, cmp.format);
  cmp.got = std::move(got);
  cmp.allowed.resize(n);
  cmp.accumulated.resize(n);
  cmp.exact.assign(ref.values.begin(), ref.values.end());
  cmp.condition = ref.magnitude;
  if (sampling.sampled()) {
    cmp.unreferenced.assign(static_cast<std::size_t>(n), 1);
    for (std::size_t row = 0; row < sampling.rows.size(); ++row)
      if (sampling.rows[row]) std::fill_n(cmp.unreferenced.begin() + static_cast<std::ptrdiff_t>(row) * dv, dv, 0);
  }
  cmp.accumulator_max = info(accumulator_format(c)).max_finite();
  return cmp;
}

// The log-sum-exp, where the case asks for it: per row, the exact ln sum_j exp(s_j) against
// the kernel's FP32 value; its bounds are filled in row by row (RowBound).
OutputComparison lse_comparison(const Case& c, const AttentionReference& ref, UninitVector<Code> got,
                                const ToleranceModel& tol, const Sampling& sampling) {
  const AttentionShape& a = c.attention;
  const auto n_rows = static_cast<std::size_t>(a.batch * a.heads * a.seq_q);
  OutputComparison lse;
  lse.format = c.types.at("LSE");
  lse.shape = {a.batch, a.heads, a.seq_q};
  lse.ulp_fair_condition = ulp_fair_condition(tol.accumulator_bits, lse.format);
  lse.got = std::move(got);
  lse.exact.assign(ref.lse.begin(), ref.lse.end());
  lse.condition.assign(n_rows, 0.0);
  lse.allowed.assign(n_rows, 0.0);
  lse.accumulated.assign(n_rows, 0.0);
  lse.accumulator_max = info(accumulator_format(c)).max_finite();
  if (sampling.sampled()) {
    lse.unreferenced.resize(n_rows);
    for (std::size_t r = 0; r < n_rows; ++r) lse.unreferenced[r] = !sampling.rows[r];
  }
  return lse;
}

// The tolerance of one row of O (and its LSE): the bound of the declared or admitted
// arithmetic where the row has a reference, only the NaN/Inf judgement where it has none.
class RowBound {
 public:
  RowBound(const Case& c, const Inputs& inputs, const ToleranceModel& tol, const Sampling& sampling,
           const std::vector<char>& poisoned)
      : c_(c), a_(c.attention), tol_(tol), poisoned_(poisoned), v_(inputs.at("V")), vv_(attention_view(c, "V")),
        inputs_(inputs), dv_(c.attention.eff_head_dim_v()), v_scale_(kv_head_scales(c, "V")),
        u_deq_k_(kv_dequantization_unit(c, "K")), u_deq_v_(kv_dequantization_unit(c, "V")),
        u_(std::ldexp(1.0, 1 - tol.accumulator_bits)),
        u_in_(tol.input_bits > 0 ? std::ldexp(1.0, 1 - tol.input_bits) : 0.0),
        eta_p_(tol.p_bits > 0 && tol.p_bits < 24 ? p_rounding_eta(tol.p_bits) : 0.0),
        u_p(tol.p_bits > 0 && tol.p_bits < 24 ? std::ldexp(1.0, 1 - tol.p_bits) : 0.0) {
    const auto& fo = info(c.types.at("O"));
    o_overflow_ = fo.max_finite() + ulp_of(c.types.at("O"), fo.max_finite()) / 2;
    if (sampling.sampled()) v_head_max_ = v_head_max();
  }

  // No reference: only a NaN or Inf is judged, unless the row met one in the inputs, or O
  // may round past its format's range (|O_d| <= max_j |v_jd|). Its LSE may be -inf (or
  // +inf) where the row sees no key, anything non-finite where it is poisoned.
  void unreferenced_row(const AttentionReference& ref, std::int64_t b, std::int64_t h, std::int64_t i,
                        OutputComparison& o, OutputComparison* lse) const {
    const bool row_poisoned = poisoned(ref, b, h, i);
    if (lse)
      lse->accumulated[static_cast<std::size_t>(ref.row(b, h, i))] =
          (attention_visible_count(c_, b, i) == 0 && a_.sink(h) == -INFINITY) || row_poisoned ? INFINITY : 0.0;
    for (std::int64_t d = 0; d < dv_; ++d)
      o.accumulated[ref.index(b, h, i, d)] =
          row_poisoned || v_head_max_[static_cast<std::size_t>((b * a_.eff_kv_heads() + a_.kv_head(h)) * dv_ + d)] >= o_overflow_
              ? INFINITY : 0.0;
  }

  void referenced_row(const AttentionReference& ref, std::int64_t b, std::int64_t h, std::int64_t i,
                      OutputComparison& o, OutputComparison* lse) const {
    const RowFacts f = row_facts(c_, inputs_, b, h, i);
    // The sink is one more term of the sum, and one more rescale.
    const auto nk = static_cast<std::int64_t>(f.keys.size()) + (f.sink ? 2 : 0);
    // eps: the logits' and exp's relative error: the scores' (tanh's slope is at most 1), the
    // exp of a difference of logits up to L, tanh's own error and the cap's product, and the
    // ALiBi bias (its slope, distance, product and sum).
    const double capped = a_.softcap != 0 ? std::min(f.s, a_.softcap) : 0.0;
    const double eps = 2 * (2 * u_in_ + u_deq_k_ + tol_.gamma(a_.head_dim + 2)) * f.s +
                       2 * u_ * (1 + 2 * std::max(f.s, f.logit)) + 2 * (kTanhError + 2 * u_) * capped + 8 * u_ * f.bias;
    // eps bounds each exponent's absolute error, so each weight is within a factor e^(+-eps)
    // of its exact value: O moves by at most 2 (e^(2 eps) - e^eps) c, about 2 eps c when
    // eps is small and finite however large (far-negative logits at 16-bit inputs).
    const double rel = 2 * (std::exp(2 * eps) - std::exp(eps)) + u_p + u_in_ + u_deq_v_ + 3 * tol_.gamma(nk + 2);
    const double eta = tol_.accumulator_eta;
    for (std::int64_t d = 0; d < dv_; ++d) {
      const std::int64_t e = ref.index(b, h, i, d);
      double vmax = 0;
      const std::int64_t hk = a_.kv_head(h);
      for (std::int64_t j : f.keys) vmax = std::max(vmax, std::fabs(v_.value(vv_.offset(b, hk, j, d))) * v_scale(hk));
      o.allowed[e] = rel * o.condition[e] + static_cast<double>(nk) * (eta_p_ + eta) * vmax + 4 * eta;
      // The scores (before and after the scale) are what can overflow the accumulator.
      o.accumulated[e] = std::max(f.s, f.s / std::max(std::fabs(c_.attention.scale()), 0x1p-1000)) + f.bias;
      if (poisoned(ref, b, h, i)) o.accumulated[e] = INFINITY;
    }
    if (lse) lse_row(ref, b, h, i, f, eps, o, *lse);
  }

 private:
  bool poisoned(const AttentionReference& ref, std::int64_t b, std::int64_t h, std::int64_t i) const {
    return !poisoned_.empty() && poisoned_[ref.row(b, h, i)];
  }

  // Condition term 1 + S (S the row's largest |scale| sum_d |q_d k_jd|, what the scores'
  // errors scale with).
  void lse_row(const AttentionReference& ref, std::int64_t b, std::int64_t h, std::int64_t i, const RowFacts& f,
               double eps, const OutputComparison& o, OutputComparison& lse) const {
    const auto r = static_cast<std::size_t>(ref.row(b, h, i));
    const auto nk = static_cast<std::int64_t>(f.keys.size()) + (f.sink ? 2 : 0);
    if (nk == 0) {
      // No visible key: ln 0 = -inf; +inf is FlashAttention's convention (its backward pass
      // then gets exp(s - lse) = 0) and is accepted too. Nothing finite is.
      if (decode(lse.format, lse.got[r]) == INFINITY) lse.exact[r] = RefValue::infinity(false);
      return;
    }
    // |LSE~ - LSE| <= max_j |ln p~_j - ln p_j| (eps) + the sum's relative error (at most
    // 2 gamma(nk + 2) after the log) + the final m + ln l and its unit conversions,
    // 4 u (|m| + ln l + 1) with |m| <= max(S, L), l <= nk.
    const double e_sum = 2 * tol_.gamma(nk + 2), m = std::max(f.s, f.logit);
    lse.allowed[r] = e_sum < 1 ? eps + e_sum + 4 * u_ * (m + std::log(static_cast<double>(nk)) + 1) : INFINITY;
    lse.condition[r] = 1 + m;
    lse.accumulated[r] = o.accumulated[ref.index(b, h, i, 0)];  // the scores' bound, or +Inf (poisoned)
  }

  // Per batch, K/V head and column, max_j |v_jd| over every key: a bound of |O_d| for the
  // queries without a reference.
  std::vector<double> v_head_max() const {
    std::vector<double> m(static_cast<std::size_t>(a_.batch * a_.eff_kv_heads() * dv_), 0.0);
    for (std::int64_t b = 0; b < a_.batch; ++b)
      for (std::int64_t hk = 0; hk < a_.eff_kv_heads(); ++hk)
        for (std::int64_t j = 0; j < a_.seq_kv; ++j)
          for (std::int64_t d = 0; d < dv_; ++d) {
            double& x = m[static_cast<std::size_t>((b * a_.eff_kv_heads() + hk) * dv_ + d)];
            x = std::max(x, std::fabs(v_.value(vv_.offset(b, hk, j, d))) * v_scale(hk));
          }
    return m;
  }

  const Case& c_;
  const AttentionShape& a_;
  const ToleranceModel& tol_;
  const std::vector<char>& poisoned_;
  const Tensor& v_;
  const AttentionView vv_;
  const Inputs& inputs_;
  const std::int64_t dv_;
  double v_scale(std::int64_t hk) const { return v_scale_[static_cast<std::size_t>(hk)]; }

  const std::vector<double> v_scale_;  // V's scale per K/V head (an FP8 K/V cache; 1 without)
  const double u_deq_k_, u_deq_v_;
  const double u_, u_in_, eta_p_;
  double o_overflow_ = 0;
  std::vector<double> v_head_max_;

 public:
  const double u_p;  ///< P's rounding unit (0: P in FP32)
};

std::vector<Format> attention_outputs(Format o0) { return {o0, Format::FP32, Format::BF16, Format::FP16}; }

class AttentionModule final : public OpModule {
 public:
  Op op() const override { return Op::Attention; }
  std::vector<std::string> dtypes() const override { return kAttentionDtypes; }
  Case basic_case(std::string_view dtype) const override { return dtype_attention_case(dtype); }
  std::vector<Format> output_formats(std::string_view dtype) const override {
    return distinct_formats(attention_outputs(basic_case(dtype).types.at("O")));
  }

  rc::Gen<Case> generate(std::string_view dtype_in, const Kernel* k, const GenLimits& limits) const override {
    return rc::gen::exec([this, dtype_in = std::string(dtype_in), k, limits]() {
      const std::string dtype = dtype_in.empty() ? *gen::pick(kAttentionDtypes) : dtype_in;
      // From an output the kernel takes (the default is the input format, or BF16 for FP8).
      Case c = dtype_attention_case(dtype, k ? supported_output(*k, dtype) : std::nullopt);
      if (k) c.kernel = k->name();
      auto keep_if_supported = [&](auto apply, auto revert) {
        apply();
        if (k && k->unsupported(c)) revert();
      };
      AttentionShape& a = c.attention;
      const std::vector<std::int64_t> dims{16, 32, 48, 64, 80, 96, 111, 128, 160, 192, 256};
      const std::int64_t hd = *gen::dim(256, dims, false);
      const bool other_dv = *gen::pick(std::vector<bool>{false, true});
      const std::int64_t dv = other_dv ? *gen::dim(256, dims, false) : 0;
      const std::int64_t hd0 = a.head_dim;
      keep_if_supported([&] { a.head_dim = hd, a.head_dim_v = dv == hd ? 0 : dv; }, [&] { a.head_dim = hd0, a.head_dim_v = 0; });
      if (limits.large) {
        draw_large_shape(a, keep_if_supported);
      } else {
        const std::vector<std::int64_t> seqs{1, 17, 63, 64, 65, 127, 128, 129, 200, 257, 1000, 1024, 4096};
        const std::int64_t max_seq = std::max<std::int64_t>(1, limits.max_reduction);
        a.seq_kv = *gen::dim(max_seq, seqs);
        a.seq_q = *pick_seq_q(a.seq_kv, max_seq, seqs);
        if (limits.mapping) {
          draw_mapping_shape(a, keep_if_supported);
        } else {
          a.batch = *gen::dim(3);
          a.heads = *gen::dim(4);
        }
        fit_small_budget(a);
      }
      const auto layout = *gen::pick(std::vector<AttentionLayout>{AttentionLayout::BHSD, AttentionLayout::BSHD});
      keep_if_supported([&] { a.layout = limits.mapping ? AttentionLayout::BSHD : layout; }, [&] { a.layout = AttentionLayout::BHSD; });
      const bool causal = *gen::pick(std::vector<bool>{false, true});
      keep_if_supported([&] { a.causal = causal; }, [&] { a.causal = false; });
      if (limits.mapping) {
        // Unequal per batch, batch 0's last key hidden.
        std::vector<std::int64_t> lens{a.seq_kv - 1, a.seq_kv, a.seq_kv / 2};
        lens.resize(static_cast<std::size_t>(a.batch), a.seq_kv);
        keep_if_supported([&] { a.kv_lengths = lens; }, [&] { a.kv_lengths.clear(); });
      } else if (*gen::pick(std::vector<bool>{false, true})) {
        std::vector<std::int64_t> lens;
        for (std::int64_t b = 0; b < a.batch; ++b) lens.push_back(*gen::pick(std::vector<std::int64_t>{a.seq_kv, 0, 1, a.seq_kv / 2, a.seq_kv - 1}));
        keep_if_supported([&] { a.kv_lengths = lens; }, [&] { a.kv_lengths.clear(); });
      }
      const double scale = *gen::pick(std::vector<double>{0, 0.125, 1.0, 0.05, 0.5});
      if (scale != 0) keep_if_supported([&] { a.softmax_scale = scale; }, [&] { a.softmax_scale.reset(); });
      const Format o0 = c.types.at("O");
      const Format o = *gen::pick(attention_outputs(o0));
      keep_if_supported([&] { c.types["O"] = o; }, [&] { c.types["O"] = o0; });
      c.dist["Q"] = *gen::dist_spec(c, "Q", true, kExcludedFamilies);
      if (k && parse_dist(c.dist["Q"]).family == "masked") {
        // masked() makes filling set kv_lengths (some batches 0), which the kernel sees only
        // then: ask it now with such lengths, and draw again without masked() if it refuses.
        Case probe = c;
        probe.attention.kv_lengths.assign(static_cast<std::size_t>(a.batch), a.seq_kv);
        probe.attention.kv_lengths.front() = 0;
        if (k->unsupported(probe)) {
          std::vector<std::string> excluded = kExcludedFamilies;
          excluded.push_back("masked");
          c.dist["Q"] = *gen::dist_spec(c, "Q", true, excluded);
        }
      }
      if (find_family(parse_dist(c.dist["Q"]).family)->scope != Scope::AttnQK)
        c.dist["K"] = *gen::dist_spec(c, "K", false, kExcludedFamilies);
      c.dist["V"] = *gen::dist_spec(c, "V", false, kExcludedFamilies);
      c.seed = *rc::gen::arbitrary<std::uint64_t>();
      // Grouped-query and multi-query attention in the small regime, drawn last so that the
      // rest of the stream is the one drawn before GQA existed (fewer K/V heads cost less).
      if (!limits.large && !limits.mapping && a.heads > 1) {
        const std::int64_t kv_heads = *gen::pick(kv_head_choices(a.heads));
        keep_if_supported([&] { a.kv_heads = kv_heads; }, [&] { a.kv_heads = 0; });
      }
      // The log-sum-exp output in one case of three, drawn after everything else.
      if ((limits.mapping || *gen::pick(std::vector<int>{0, 0, 1})) && (!k || k->traits().writes_lse))
        keep_if_supported([&] { c.types["LSE"] = Format::FP32; }, [&] { c.types.erase("LSE"); });
      draw_window(c, k);  // last: kernels without windows draw the stream they drew before
      draw_served_variants(c, k, limits);  // and without these variants, likewise
      draw_kv_scales(c, k);  // before the far-negative logits, which FP8 K leaves out
      draw_far_negative_logits(c, k);
      if (!limits.large && !limits.mapping) draw_paged(c, k, limits);
      validate(c);
      return c;
    });
  }

  std::vector<AdmittedArithmetic> admitted(std::string_view dtype) const override {
    std::vector<AdmittedArithmetic> out = {
        {"three-pass softmax in FP32, P in FP32", "cpu.attn_naive"},
        {"online softmax over blocks of 64 keys, rescaled as the max grows, P in FP32", "cpu.attn_online:block=64"},
        {"FlashAttention-2's exponentials: exp2 with log2 e folded into the scale", "cpu.attn_online:block=128,exp2"},
        {"FP32 results below the smallest normal flushed to zero (--use_fast_math, cuDNN)", "cpu.attn_online:block=64,ftz"},
    };
    const std::string p = dtype == "fp16" ? "fp16" : dtype == "fp32" ? "" : "bf16";
    if (!p.empty()) {
      out.push_back({"FlashAttention-2/3, cuDNN: P rounded to " + p + " before P V", "cpu.attn_flash:block=64,p=" + p});
      out.push_back({"the same with exp2, blocks of 128 keys and subnormals flushed to zero",
                     "cpu.attn_flash:block=128,p=" + p + ",exp2,ftz"});
    }
    return out;
  }

  std::string family(const Case& c) const override { return op_family(c, "attention", "Q", "O"); }

  std::int64_t reduction_length(const Case& c) const override { return c.attention.seq_kv; }

  ToleranceModel tolerance(const Case& c, const KernelTraits& traits) const override {
    ToleranceModel t = precision_terms(c, traits);
    // Subnormals flushed to zero are admitted without a declaration: FlashAttention builds
    // with --use_fast_math and cuDNN's fused engine flushes (measured on the H200).
    const Format compute = c.types.at("compute");
    t.accumulator_eta = info(compute == Format::TF32 ? Format::FP32 : compute).min_normal();
    t.rule += ", subnormals may flush to zero";
    t.p_bits = traits.p_bits > 0 ? traits.p_bits : default_p_bits(c);
    if (t.p_bits > 0 && t.p_bits < 24)
      t.rule += fmt::format(", P rounded to {} bits before P V{}", t.p_bits, traits.p_bits ? "" : " (the inputs' 16-bit format)");
    else
      t.rule += ", P in FP32";
    if (c.attention.softcap != 0) t.rule += ", tanh within 2^-10 relative (soft cap: tanh.approx.f32)";
    if (c.scales.count("K") || c.scales.count("V"))
      t.rule += fmt::format(", K/V scaled and dequantized to {}", name(kv_dequantization_format(c)));
    return t;
  }

  std::vector<OutputComparison> compare(const Case& c, const Inputs& given, const std::map<std::string, Tensor>& outputs,
                                        const ToleranceModel& tol) const override {
    // NaN or Inf inputs (a narrow format's overflow, FP8 NaN codes): softmax has no exact
    // value there. The reference takes them as 0, and every row they reach is marked as
    // possibly overflowed (accumulated +Inf: any NaN or Inf accepted, no tolerance); a
    // non-finite V at a key a row does not see allows a NaN in that row's column only
    // (masked_nonfinite_v).
    Inputs sanitized;
    const std::vector<char> poisoned = poisoned_rows(c, given, sanitized);
    const Inputs& inputs = sanitized.empty() ? given : sanitized;
    const Sampling sampling = sampling_of(c);
    const AttentionReference ref =
        attention_reference(c, inputs, default_threads(), sampling.sampled() ? &sampling.rows : nullptr);
    OutputComparison cmp = o_comparison(c, ref, logical_output(c, "O", outputs.at("O")), tol, sampling);
    const bool with_lse = outputs.count("LSE") > 0;
    OutputComparison lse =
        with_lse ? lse_comparison(c, ref, logical_output(c, "LSE", outputs.at("LSE")), tol, sampling) : OutputComparison{};
    const RowBound bound(c, inputs, tol, sampling, poisoned);
    const AttentionShape& a = c.attention;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t i = 0; i < a.seq_q; ++i) {
          if (sampling.sampled() && !sampling.rows[static_cast<std::size_t>(ref.row(b, h, i))])
            bound.unreferenced_row(ref, b, h, i, cmp, with_lse ? &lse : nullptr);
          else
            bound.referenced_row(ref, b, h, i, cmp, with_lse ? &lse : nullptr);
        }
    cmp.nan_allowed = masked_nonfinite_v(c, given);
    const std::string referenced =
        sampling.sampled() ? fmt::format(", {} of {} queries referenced", sampling.queries.size(), a.seq_q) : "";
    cmp.tolerance_note = fmt::format("accumulator {} bits{}, n = {} keys{}", tol.accumulator_bits,
                                     bound.u_p > 0 ? fmt::format(", P {} bits", tol.p_bits) : "", a.seq_kv, referenced);
    std::vector<OutputComparison> out;
    out.push_back(std::move(cmp));
    if (with_lse) {
      lse.tolerance_note = fmt::format("scores and exp (accumulator {} bits), a sum of n = {} keys{}", tol.accumulator_bits,
                                       a.seq_kv, referenced);
      out.push_back(std::move(lse));
    }
    return out;
  }

  std::vector<std::int64_t> output_offsets(const Case& c, const std::string& output) const override {
    return attention_view(c, output).logical_offsets();  // LSE: packed [batch][heads][seq_q]
  }

  std::vector<RelationFailure> relations(const RelationContext& ctx, const Case& c, const Inputs& inputs,
                                         const RunOutcome& first) const override {
    std::vector<RelationFailure> out;
    const AttentionShape& a = c.attention;
    const Tensor& o = first.outputs.at("O");
    if (auto why = v_scaling(ctx, c, inputs, o); !why.empty()) out.push_back({"v_scaling", why});
    // Paged K/V: the contiguous twin, K and V gathered from the pool, has the same exact output
    // (bit for bit from a deterministic kernel). Key shifts and permutations change the keys
    // of one batch at a time: not where a page is shared between rows.
    if (a.paged()) paged_contiguous(ctx, c, inputs, first, out);
    const bool shared_pages = shares_pages(a);
    if (!shared_pages) {  // key shift: every score of query i grows by q_i . shift
      Inputs shifted = inputs;
      if (shift_keys(c, shifted)) {
        const std::string why = ctx.run_and_judge(c, shifted);
        if (!why.empty())
          out.push_back({"key_shift", "the same vector added to every key (scores up by about 100) fails: " + why});
      }
    }
    // Identities of the variants, for a kernel that applies them: the same case with a sink
    // of -inf on every head (no sink), or with the causal mask written as the window (-1, 0),
    // has the same exact output and must pass against the same reference.
    const unsigned applies = ctx.kernel.traits().attention_variants;
    const auto same_output = [&](const Case& twin, const char* relation, const char* what) {
      const RunOutcome r = ctx.run(twin, inputs);
      if (r.status == Disposition::NotSupported) return;
      const std::string why = r.status == Disposition::Ok ? ctx.judge_same(r) : fmt::format("{}: {}", name(r.status), r.message);
      if (!why.empty()) out.push_back({relation, fmt::format("{} fails: {}", what, why)});
    };
    if (a.sinks.empty() && (applies & kAttnSinks)) {
      Case twin = c;
      twin.attention.sinks.assign(static_cast<std::size_t>(a.heads), -INFINITY);
      same_output(twin, "sink_none", "a sink of -inf (none) on every head");
    }
    if (a.causal && !a.windowed() && (applies & kAttnWindow)) {
      Case twin = c;
      twin.attention.causal = false, twin.attention.window_left = -1, twin.attention.window_right = 0;
      same_output(twin, "window_causal", "the causal mask as the window (-1, 0)");
    }
    // Key permutation within each batch's visible keys (not where masks or ALiBi's biases
    // tell the keys' positions apart).
    if (!a.causal && !a.windowed() && a.alibi_slopes.empty() && a.seq_kv > 1 && !shared_pages) {
      Inputs perm = inputs;
      permute_keys(c, perm);
      const RunOutcome r = ctx.run(c, perm);
      const std::string why = r.status == Disposition::Ok ? ctx.judge_same(r)  // O is the same exactly
                                                          : fmt::format("{}: {}", name(r.status), r.message);
      if (!why.empty()) out.push_back({"key_permutation", "keys and values permuted together fail: " + why});
    }
    if (a.batch > 1) {  // the last batch alone, its K and V contiguous
      Case one = unpaged(c);
      one.attention.batch = 1;
      if (!a.kv_lengths.empty()) one.attention.kv_lengths = {a.kv_lengths.back()};
      one.dist.clear();
      if (ctx.kernel.supports(one)) {
        Inputs slice;
        for (const char* op : {"Q", "K", "V"}) {
          slice.emplace(op, gather(c, one, inputs.at(op), op, a.batch - 1));
        }
        const std::string why = ctx.run_and_judge(one, slice);
        if (!why.empty()) out.push_back({"batch_independence", "the last batch run alone fails: " + why});
      }
    }
    return out;
  }

  EffectiveBits effective_bits(const Case&, const Inputs&, const OutputComparison&, double,
                               const KernelTraits&) const override {
    return {};
  }

 private:
  // Operand op of case `to` (contiguous, batches [0, to.batch)) from its buffer `from` in case c,
  // batch b of `to` being batch first + b of c (through c's page table where it has one).
  static Tensor gather(const Case& c, const Case& to, const Tensor& from, const char* op, std::int64_t first) {
    const AttentionView src = attention_view(c, op), dst = attention_view(to, op);
    Tensor t(from.format(), static_cast<std::size_t>(dst.elements()));
    for (std::int64_t b = 0; b < dst.batch; ++b)
      for (std::int64_t h = 0; h < dst.heads; ++h)
        for (std::int64_t s = 0; s < dst.seq; ++s)
          for (std::int64_t d = 0; d < dst.dim; ++d)
            t.set_code(static_cast<std::size_t>(dst.offset(b, h, s, d)),
                       from.code(static_cast<std::size_t>(src.offset(first + b, h, s, d))));
    return t;
  }

  // Whether two table entries that hold keys point at one page.
  static bool shares_pages(const AttentionShape& a) {
    if (!a.paged()) return false;
    std::vector<char> seen(static_cast<std::size_t>(a.num_pages), 0);
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t col = 0; col < a.pages_needed(); ++col) {
        char& s = seen[static_cast<std::size_t>(a.page_table[static_cast<std::size_t>(b * a.pages_per_seq() + col)])];
        if (s) return true;
        s = 1;
      }
    return false;
  }

  static void paged_contiguous(const RelationContext& ctx, const Case& c, const Inputs& inputs, const RunOutcome& first,
                               std::vector<RelationFailure>& out) {
    const Case twin = unpaged(c);
    Inputs packed = inputs;
    for (const char* op : {"K", "V"}) packed.at(op) = gather(c, twin, inputs.at(op), op, 0);
    const RunOutcome r = ctx.run(twin, packed);
    if (r.status == Disposition::NotSupported) return;
    std::string why = r.status == Disposition::Ok ? ctx.judge_same(r) : fmt::format("{}: {}", name(r.status), r.message);
    if (why.empty() && ctx.kernel.traits().deterministic) {
      std::int64_t differ = 0;
      for (const auto& [op, t] : first.outputs) {
        const auto it = r.outputs.find(op);
        if (it == r.outputs.end()) continue;
        for (const std::int64_t e : attention_view(c, op).logical_offsets())
          differ += t.code(static_cast<std::size_t>(e)) != it->second.code(static_cast<std::size_t>(e));
      }
      if (differ)
        why = fmt::format("{} output elements differ from the paged run's bits (the kernel is declared deterministic)", differ);
    }
    if (!why.empty()) out.push_back({"paged_contiguous", "the contiguous twin (K and V gathered from the pages) fails: " + why});
  }

  // Rows reached by a non-finite Q, K or V value (empty when there is none; then
  // `sanitized` stays empty too, else it holds the inputs with those values set to 0).
  static std::vector<char> poisoned_rows(const Case& c, const Inputs& in, Inputs& sanitized) {
    bool any = false;
    for (const char* op : {"Q", "K", "V"})
      for (std::size_t e = 0; e < in.at(op).size() && !any; ++e) any = !std::isfinite(in.at(op).value(e));
    if (!any) return {};
    const AttentionShape& a = c.attention;
    sanitized = in;
    std::vector<char> rows(static_cast<std::size_t>(a.batch * a.heads * a.seq_q), 0);
    const AttentionView qv = attention_view(c, "Q"), kv = attention_view(c, "K"), vv = attention_view(c, "V");
    const auto bad = [&](const char* op, const AttentionView& view, std::int64_t b, std::int64_t h, std::int64_t s) {
      bool found = false;
      for (std::int64_t d = 0; d < view.dim; ++d) {
        const std::int64_t off = view.offset(b, h, s, d);
        if (!std::isfinite(in.at(op).value(off))) {
          found = true;
          sanitized.at(op).set_value(off, 0.0);
        }
      }
      return found;
    };
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h) {
        const std::int64_t hk = a.kv_head(h);
        std::vector<char> key_bad(static_cast<std::size_t>(a.seq_kv));
        for (std::int64_t j = 0; j < a.seq_kv; ++j) {
          const bool k_bad = bad("K", kv, b, hk, j), v_bad = bad("V", vv, b, hk, j);  // both: each sanitizes its own
          key_bad[j] = static_cast<char>(k_bad || v_bad);
        }
        for (std::int64_t i = 0; i < a.seq_q; ++i) {
          bool row = bad("Q", qv, b, h, i);
          for (std::int64_t j = 0; j < a.seq_kv && !row; ++j) row = key_bad[j] && attention_visible(c, b, i, j);
          rows[static_cast<std::size_t>((b * a.heads + h) * a.seq_q + i)] = row;
        }
      }
    return rows;
  }

  // Per output element (b, h, i, d), 1 where V[b, kv_head(h), j, d] is NaN or Inf for a key j
  // that row i does not see (causal, past kv_length): a kernel computing P V as a matrix
  // product multiplies it by p = 0 and gets a NaN there (OutputComparison::nan_allowed).
  // Empty when V is finite.
  static std::vector<char> masked_nonfinite_v(const Case& c, const Inputs& in) {
    const Tensor& v = in.at("V");
    bool any = false;
    for (std::size_t e = 0; e < v.size() && !any; ++e) any = !std::isfinite(v.value(e));
    if (!any) return {};
    const AttentionShape& a = c.attention;
    const std::int64_t dv = a.eff_head_dim_v();
    const AttentionView vv = attention_view(c, "V");
    std::vector<char> out(static_cast<std::size_t>(a.batch * a.heads * a.seq_q * dv), 0);
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t j = 0; j < a.seq_kv; ++j)
          for (std::int64_t d = 0; d < dv; ++d) {
            if (std::isfinite(v.value(vv.offset(b, a.kv_head(h), j, d)))) continue;
            for (std::int64_t i = 0; i < a.seq_q; ++i)
              if (!attention_visible(c, b, i, j)) out[static_cast<std::size_t>(((b * a.heads + h) * a.seq_q + i) * dv + d)] = 1;
          }
    return out;
  }

  // The small regime's budgets: the reference's exponentials and P V terms, and each
  // operand's elements. The longer sequence halves first, batch and heads shrink last.
  // Soft cap, ALiBi and sinks, each in one case of three where kernel k applies it, at the
  // edges their bugs live on (docs/concepts/softcap.md, alibi.md, sinks.md): caps from 0.5
  // to 50 (small ones make tanh bend the drawn scores); ALiBi in either form with the
  // standard slopes, in half of them for 12, 40 or 66 heads (not powers of two: the slope
  // tables' second half), else a slope of 0.5 or 2^-3 for every head; sinks of 0, 20, 100,
  // -inf (none), 2.25 or -1.5 per head. Each kept where k supports the case.
  static void draw_served_variants(Case& c, const Kernel* k, const GenLimits& limits) {
    if (!k) return;
    const unsigned applies = k->traits().attention_variants;
    AttentionShape& a = c.attention;
    const auto one_in_three = [] { return *gen::pick(std::vector<int>{0, 0, 1}) == 1; };
    if ((applies & kAttnSoftcap) && one_in_three()) {
      a.softcap = *gen::pick(std::vector<double>{0.5, 1.0, 2.0, 5.0, 30.0, 50.0});
      if (k->unsupported(c)) a.softcap = 0;
    }
    if ((applies & kAttnAlibi) && one_in_three()) {
      const AttentionShape before = a;
      a.alibi_form = *gen::pick(std::vector<AlibiForm>{AlibiForm::Flash, AlibiForm::FlashInfer});
      const int slopes = *gen::pick(std::vector<int>{0, 0, 1, 2});
      if (slopes == 0 && !limits.large && !limits.mapping) {
        // Only heads and the batch change: the lengths, window and mask drawn stay valid.
        const std::int64_t heads = *gen::pick(std::vector<std::int64_t>{12, 40, 66});
        AttentionShape more = a;
        more.heads = heads, more.batch = 1;
        if (more.kv_heads && heads % more.kv_heads) more.kv_heads = 0;
        more.kv_lengths.resize(std::min<std::size_t>(more.kv_lengths.size(), 1));
        if (!over_small_budget(more)) a = more;
      }
      if (slopes <= 1) a.alibi_slopes = alibi_standard_slopes(a.heads);
      else a.alibi_slopes.assign(static_cast<std::size_t>(a.heads), *gen::pick(std::vector<double>{0.5, 0.125}));
      if (!a.sinks.empty()) a.sinks.resize(static_cast<std::size_t>(a.heads), 0.0);
      if (k->unsupported(c)) a = before;
    }
    if ((applies & kAttnSinks) && one_in_three()) {
      const std::vector<double> sinks{0.0, 20.0, 100.0, -INFINITY, 2.25, -1.5};
      for (std::int64_t h = 0; h < a.heads; ++h) a.sinks.push_back(*gen::pick(sinks));
      if (k->unsupported(c)) a.sinks.clear();
    }
  }

  // Far-negative logits in one case of six (docs/concepts/cases.md): every score near -T, T
  // of 6e4, 1.2e5 or 2.45e5, below the running-max sentinels kernels start from (-5e4, -1e5)
  // and as low as a real model's logits went. Q about m and K about -m (std m / 16, so a
  // row's scores spread by about T sqrt(2 / head_dim) / 16); not for FP8 Q or K, whose range
  // m may leave. Such cases ask for the LSE where kernel k writes it: a row of zeros hides
  // inside the bound wherever the scores' rounding at these magnitudes moves P by more than
  // a third, and its LSE of -inf does not.
  static void draw_far_negative_logits(Case& c, const Kernel* k) {
    const bool draw = *gen::pick(std::vector<int>{0, 0, 0, 0, 0, 1}) == 1;
    const double t = *gen::pick(std::vector<double>{6e4, 1.2e5, 2.45e5});
    if (!draw || is_fp8(c.types.at("Q")) || is_fp8(c.types.at("K"))) return;
    const double m = std::sqrt(t / (std::fabs(c.attention.scale()) * static_cast<double>(c.attention.head_dim)));
    c.dist["Q"] = fmt::format("normal({:.6g},{:.6g})", m, m / 16);
    c.dist["K"] = fmt::format("normal({:.6g},{:.6g})", -m, m / 16);
    if (k && k->traits().writes_lse && !c.types.count("LSE")) {
      c.types["LSE"] = Format::FP32;
      if (k->unsupported(c)) c.types.erase("LSE");
    }
  }

  // Paged K/V in one case of two where kernel k reads it (docs/concepts/paged-kv.md): page
  // sizes of 1, 3, 16, 64, 100, 128 and 256 (not dividing 64 or 128; above 128, a third of
  // the draws, on 257 keys or the most --max-k allows where the drawn sequence fits in 128 slots), in half of
  // them every batch's keys ending on a page boundary (kv_lengths a multiple of the page size:
  // a kernel reading one page too far meets the next entry's keys); pages in a shuffled order,
  // two or three of them in no row (holding the padding poison), rows one entry longer than
  // needed in half (the extra entry pointing at an unused page), and in half of the batched
  // cases every row sharing batch 0's first pages (a cached prefix); in half of the draws the
  // queries of a decode or speculative step (seq_q 1 to 16).
  static void draw_paged(Case& c, const Kernel* k, const GenLimits& limits) {
    if (!k || !(k->traits().attention_variants & kAttnPaged) || *gen::pick(std::vector<int>{0, 1}) == 0) return;
    const Case before = c;
    AttentionShape& a = c.attention;
    // Paged kernels serve decoding: half the draws have the queries of a decode step (seq_q 1)
    // or of a speculative one (2 to 16) against the keys drawn.
    if (*gen::pick(std::vector<bool>{false, true})) a.seq_q = *gen::pick(std::vector<std::int64_t>{1, 1, 2, 4, 5, 8, 16});
    // Pages above 128 keys in a third of the cases, on sequences longer than 128 where there are.
    a.page_size = *gen::pick(std::vector<std::int64_t>{1, 3, 16, 64, 100, 128, 256, 256, 256});
    if (a.page_size == 256 && a.seq_kv <= 128) {  // keys beyond slot 127: a longer sequence where it fits
      AttentionShape longer = a;
      longer.seq_kv = std::min<std::int64_t>(257, limits.max_reduction);
      if (longer.seq_kv > 128 && !over_small_budget(longer)) a.seq_kv = longer.seq_kv;
    }
    if (*gen::pick(std::vector<bool>{false, true}) && a.seq_kv >= a.page_size) {
      a.kv_lengths.assign(static_cast<std::size_t>(a.batch), a.seq_kv / a.page_size * a.page_size);
      if (a.batch > 1) a.kv_lengths.back() = a.page_size;  // one page exactly
    }
    const std::int64_t need = a.pages_needed(), per = need + *gen::pick(std::vector<std::int64_t>{0, 1});
    const std::int64_t shared = a.batch > 1 && *gen::pick(std::vector<bool>{false, true}) ? std::max<std::int64_t>(1, need / 2) : 0;
    const std::int64_t spare = *gen::pick(std::vector<std::int64_t>{2, 3});
    a.num_pages = a.batch * need - (a.batch - 1) * shared + spare;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(a.num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    for (std::size_t i = ids.size(); i > 1; --i)
      std::swap(ids[i - 1], ids[static_cast<std::size_t>(*rc::gen::inRange<std::int64_t>(0, static_cast<std::int64_t>(i)))]);
    a.page_table.assign(static_cast<std::size_t>(a.batch * per), ids.back());  // extra entries: an unused page
    std::size_t next = 0;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t col = 0; col < need; ++col)
        a.page_table[static_cast<std::size_t>(b * per + col)] =
            b > 0 && col < shared ? a.page_table[static_cast<std::size_t>(col)] : ids[next++];
    if (k->unsupported(c)) c = before;
  }

  // An FP8 K/V cache in one case of three where kernel k applies K/V scales (docs/concepts/
  // fp8-kv.md): Q in FP32, FP16 or BF16 as drawn, K and V in E4M3 or E5M2, each drawn
  // distribution scaled by amax to all, half or 1/64 of the format's range (scales on either
  // side of 1), per tensor or, in two draws of three where k applies them and the case has
  // two K/V heads or more, per K/V head. A K drawn jointly with Q (logits, sink, masked) is
  // stored unscaled.
  static void draw_kv_scales(Case& c, const Kernel* k) {
    const unsigned variants = k ? k->traits().attention_variants : 0u;
    if (!(variants & (kAttnKvScales | kAttnKvHeadScales)) || *gen::pick(std::vector<int>{0, 0, 1}) == 0) return;
    if (is_fp8(c.types.at("Q")) || c.types.at("Q") == Format::FP64) return;
    const Case before = c;
    const Format f = *gen::pick(std::vector<Format>{Format::E4M3, Format::E5M2});
    const double frac = *gen::pick(std::vector<double>{1.0, 0.5, 0.015625});
    // Per head where there are two K/V heads or more (with one, per head is per tensor).
    const bool per_head = (variants & kAttnKvHeadScales) && c.attention.eff_kv_heads() > 1 &&
                          (!(variants & kAttnKvScales) || *gen::pick(std::vector<int>{0, 1, 1}) == 1);
    apply_kv_cache(c, fmt::format("{}:{}{}", name(f), frac, per_head ? ":head" : ""),
                   !c.dist.count("K"));  // no K spec: Q's family draws K
    if (k->unsupported(c)) c = before;
  }

  static bool over_small_budget(const AttentionShape& a) {
    return a.batch * a.heads * a.seq_q * a.seq_kv > kScoreBudget ||
           a.batch * a.heads * a.seq_q * a.seq_kv * a.eff_head_dim_v() > kOutputTermBudget ||
           a.batch * a.heads * std::max(a.seq_q, a.seq_kv) * std::max(a.head_dim, a.eff_head_dim_v()) > gen::kElementBudget;
  }

  static void fit_small_budget(AttentionShape& a) {
    while (over_small_budget(a)) {
      if (a.seq_q > 1 && a.seq_q >= a.seq_kv) a.seq_q = (a.seq_q + 1) / 2;
      else if (a.seq_kv > 1) a.seq_kv = (a.seq_kv + 1) / 2;
      else if (a.heads > 1) --a.heads;
      else if (a.batch > 1) --a.batch;
      else break;
    }
    if (a.kv_heads > a.heads || (a.kv_heads && a.heads % a.kv_heads)) a.kv_heads = 0;
  }

  // GenLimits::mapping's batch and heads (seq_q and seq_kv drawn): each piece is one a wrong
  // index mapping needs to read other elements. 1 < kv_heads < heads (h % kv_heads against
  // h / group), two or three batches (batch and head swapped), seq_q != seq_kv (K/V strides
  // of seq_q). The generator adds BSHD (read as BHSD; K/V strides of the query heads),
  // unequal kv_lengths hiding batch 0's last key (one length for all; one key too many)
  // and the LSE output (its packed [batch][head][seq] order).
  template <class Keep>
  static void draw_mapping_shape(AttentionShape& a, Keep& keep_if_supported) {
    static const std::vector<std::pair<std::int64_t, std::int64_t>> kGroups{
        {4, 2}, {6, 3}, {6, 2}, {8, 2}, {8, 4}, {12, 4}, {16, 4}, {24, 8}, {32, 8}, {64, 8}};
    a.batch = *rc::gen::inRange<std::int64_t>(2, 4);
    const auto group = *gen::pick(kGroups);
    const std::int64_t kv_heads = group.second;
    a.heads = group.first;
    keep_if_supported([&] { a.kv_heads = kv_heads; }, [&] { a.kv_heads = 0; });
    if (a.seq_q == a.seq_kv && a.seq_kv > 1) a.seq_q = (a.seq_kv + 1) / 2;
  }

  // K/V head counts for `heads` query heads, simplest first: 0 (multi-head), then every
  // proper divisor from the largest down to 1 (multi-query).
  static std::vector<std::int64_t> kv_head_choices(std::int64_t heads) {
    std::vector<std::int64_t> out{0};
    for (std::int64_t d = heads / 2; d >= 1; --d)
      if (heads % d == 0) out.push_back(d);
    return out;
  }

  // A length in [lo, hi], log-uniform (gen::log_dim), shrinking towards lo, its tiles those
  // of attention kernels' key blocks: a multiple of 64 plus or minus a small tail (a
  // remainder block that is no multiple of 16 either).
  static rc::Gen<std::int64_t> log_length(std::int64_t lo, std::int64_t hi) {
    return gen::log_dim(lo, hi, {64}, {1, -1, 3, -5, 17, -33}, lo);
  }

  // The large regime's shape (head_dim, head_dim_v already drawn): seq_kv log-spread over
  // [256, kLargeReduction], queries mostly decode (1) or a few (speculative decoding), else a
  // prefill as long as the keys or any length up to 8192; batch up to 4, heads up to 32 with
  // GQA or MQA two times in three; then cut to kLargeReferenceSeconds of reference and
  // kLargeAttentionTermBudget of kernel work: batch first, then queries while every query is
  // referenced, heads (down to a group of two K/V-sharing heads), V's width down to 32, then
  // the longer of queries and keys while the kernel's work is over budget, keys down to
  // 4096, and the rest. A prefill keeps its length up to the kernel budget (2^26 terms: some
  // 500 to 1,800 queries against as many keys): the reference then computes a sample of its
  // queries (referenced_queries), about 3 us per score each.
  template <class Keep>
  static void draw_large_shape(AttentionShape& a, Keep& keep_if_supported) {
    a.seq_kv = *log_length(256, kLargeReduction);
    const int q_kind = *gen::pick(std::vector<int>{0, 0, 1, 2, 3});  // decode twice as often
    a.seq_q = q_kind == 0 ? 1 : q_kind == 1 ? *rc::gen::inRange<std::int64_t>(2, 17) : q_kind == 2 ? a.seq_kv : *log_length(2, 8192);
    a.batch = *rc::gen::inRange<std::int64_t>(1, 5);
    a.heads = *gen::pick(std::vector<std::int64_t>{1, 2, 4, 8, 16, 32, 12, 6});
    const int grouping = *gen::pick(std::vector<int>{0, 1, 2});  // MHA, GQA, MQA
    if (a.heads > 1 && grouping > 0) {
      std::vector<std::int64_t> kv = kv_head_choices(a.heads);
      kv.erase(kv.begin());  // the proper divisors, largest first; the last is 1
      const std::int64_t kv_heads = grouping == 2 ? 1 : *gen::pick(kv);
      keep_if_supported([&] { a.kv_heads = kv_heads; }, [&] { a.kv_heads = 0; });
    }
    const auto terms = [&] {
      return static_cast<double>(a.batch) * a.heads * a.seq_q * a.seq_kv * (a.head_dim + a.eff_head_dim_v());
    };
    // A kernel that takes only some value heads (flash: head_dim_v == head_dim) keeps its own.
    bool dv_fixed = false;
    const auto halve_dv = [&](std::int64_t dv) {
      const std::int64_t before = a.head_dim_v;
      keep_if_supported([&] { a.head_dim_v = dv / 2 == a.head_dim ? 0 : dv / 2; }, [&] { a.head_dim_v = before, dv_fixed = true; });
    };
    while (large_reference_seconds(a) > kLargeReferenceSeconds || terms() > static_cast<double>(kLargeAttentionTermBudget)) {
      const std::int64_t dv = a.eff_head_dim_v();
      const bool over_terms = terms() > static_cast<double>(kLargeAttentionTermBudget);
      // fewer queries cut the reference only while every query is referenced
      const bool all_queries = affordable_queries(a) >= a.seq_q;
      if (a.batch > 1) a.batch /= 2;
      else if (a.seq_q > 1 && all_queries && !over_terms) a.seq_q = (a.seq_q + 1) / 2;
      else if (a.kv_heads == 0 && a.heads > 1) a.heads /= 2;
      else if (a.kv_heads > 2 && a.kv_heads % 2 == 0) a.heads /= 2, a.kv_heads /= 2;  // the group stays
      else if (a.kv_heads > 0 && a.heads > 2 * a.kv_heads) a.heads = 2 * a.kv_heads;  // a group of two stays
      else if (!dv_fixed && dv > 32) halve_dv(dv);
      else if (over_terms && a.seq_q > 1 && a.seq_q >= a.seq_kv) a.seq_q = (a.seq_q + 1) / 2;  // the longer of the two
      else if (a.seq_kv > 4096 || (over_terms && a.seq_kv > 1)) a.seq_kv = (a.seq_kv + 1) / 2;
      else if (!dv_fixed && dv > 1) halve_dv(dv);
      else if (a.seq_q > 1) a.seq_q = (a.seq_q + 1) / 2;
      else if (a.seq_kv > 1) a.seq_kv = (a.seq_kv + 1) / 2;
      else break;
    }
    if (a.kv_heads > a.heads || (a.kv_heads && a.heads % a.kv_heads)) a.kv_heads = 0;
  }

  static rc::Gen<std::int64_t> pick_seq_q(std::int64_t seq_kv, std::int64_t max_seq, const std::vector<std::int64_t>& seqs) {
    return rc::gen::exec([=]() {
      // As often as not the same length as the keys (self-attention), else anything.
      return *gen::pick(std::vector<bool>{true, false}) ? seq_kv : *gen::dim(max_seq, seqs);
    });
  }

  // V scaled by 2 must double O exactly where every product p_j v_jd and every sum is a
  // normal FP32 number: nonzero |v| in [2^-20, max/4], logits (the sink's too) within 64 of each other
  // (p_j >= e^-64 > 2^-93, so p v >= 2^-113), O normal and 2 O finite.
  static std::string v_scaling(const RelationContext& ctx, const Case& c, const Inputs& inputs, const Tensor& o) {
    const AttentionShape& a = c.attention;
    const Tensor& v = inputs.at("V");
    const double vmax = info(v.format()).max_finite();
    for (const std::int64_t e : attention_view(c, "V").logical_offsets()) {  // a paged pool's unread pages aside
      const double x = std::fabs(v.value(static_cast<std::size_t>(e)));
      if (!std::isfinite(x) || (x != 0 && (x < 0x1p-20 || 4 * x > vmax))) return "";
    }
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t i = 0; i < a.seq_q; ++i)
          if (const RowFacts f = row_facts(c, inputs, b, h, i); 2 * std::max(f.s, f.logit) > 64) return "";
    Inputs scaled = inputs;
    Tensor& sv = scaled.at("V");
    for (std::size_t e = 0; e < sv.size(); ++e) sv.set_value(e, 2 * sv.value(e));
    const RunOutcome r = ctx.run(c, scaled);
    if (r.status != Disposition::Ok) return fmt::format("V scaled by 2: {}: {}", name(r.status), r.message);
    if (!ctx.kernel.traits().deterministic) {  // other bits each run: against its own reference
      const std::string why = ctx.judge(c, scaled, r);
      return why.empty() ? "" : "V scaled by 2 fails against its own reference: " + why;
    }
    const Format fo = c.types.at("O");
    const Tensor& o2 = r.outputs.at("O");
    const AttentionView ov = attention_view(c, "O"), vv = attention_view(c, "V");
    std::int64_t off = 0;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t i = 0; i < a.seq_q; ++i)
          for (std::int64_t d = 0; d < a.eff_head_dim_v(); ++d) {
            // Only where the visible v_jd share one sign: then no partial sum cancels, and
            // every product, sum and rescaled sum stays a normal FP32 number (a cancelling
            // sum can fall below the normal range, where doubling is not exact).
            bool pos = false, neg = false;
            for (std::int64_t j = 0; j < a.seq_kv; ++j)
              if (attention_visible(c, b, i, j)) {
                const double x = v.value(vv.offset(b, a.kv_head(h), j, d));
                pos |= x > 0, neg |= x < 0;
              }
            if (pos && neg) continue;
            const std::int64_t e = ov.offset(b, h, i, d);
            const double x = decode(fo, o.code(e)), y = decode(fo, o2.code(e));
            if (std::isfinite(x) && std::fabs(x) >= info(fo).min_normal() && 2 * std::fabs(x) <= info(fo).max_finite() &&
                y != 2 * x)
              ++off;
          }
    return off ? fmt::format("scaling V by 2 did not double O exactly in {} elements", off) : "";
  }

  // K + shift per K head, rounded to K's format: shift_d = t sign(sum_i q_id) over the
  // queries of every query head reading that K head, with t a power of two making the
  // largest of their scores grow by about 100. False where no query has weight.
  static bool shift_keys(const Case& c, Inputs& in) {
    const AttentionShape& a = c.attention;
    const AttentionView qv = attention_view(c, "Q"), kv = attention_view(c, "K");
    Tensor& k = in.at("K");
    const Tensor& q = in.at("Q");
    const double sigma = std::fabs(c.attention.scale());
    const std::int64_t group = a.heads / a.eff_kv_heads();  // query heads h with kv_head(h) == hk
    bool any = false;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t hk = 0; hk < a.eff_kv_heads(); ++hk) {
        std::vector<double> dir(a.head_dim, 0.0);
        for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (std::int64_t i = 0; i < a.seq_q; ++i)
            for (std::int64_t d = 0; d < a.head_dim; ++d) dir[d] += q.value(qv.offset(b, h, i, d));
        double grow = 0;  // the largest q_i . sign(dir) over queries
        for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (std::int64_t i = 0; i < a.seq_q; ++i) {
            double g = 0;
            for (std::int64_t d = 0; d < a.head_dim; ++d) g += q.value(qv.offset(b, h, i, d)) * (dir[d] < 0 ? -1.0 : 1.0);
            grow = std::max(grow, sigma * g);
          }
        if (!(grow > 0) || !std::isfinite(grow)) continue;
        const double t = std::exp2(std::round(std::log2(100.0 / grow)));
        for (std::int64_t j = 0; j < a.seq_kv; ++j)
          for (std::int64_t d = 0; d < a.head_dim; ++d) {
            const std::int64_t off = kv.offset(b, hk, j, d);
            const double x = k.value(off) + (dir[d] < 0 ? -t : t);
            if (!std::isfinite(x) || std::fabs(x) > info(k.format()).max_finite()) return false;
            k.set_value(off, x);  // rounds to K's format
          }
        any = true;
      }
    return any;
  }

  // Keys and values permuted together, the same reversal-and-rotation within each batch's
  // visible keys [0, len_b): O is mathematically unchanged.
  static void permute_keys(const Case& c, Inputs& in) {
    const AttentionShape& a = c.attention;
    const Inputs orig = in;
    for (const char* op : {"K", "V"}) {
      const AttentionView view = attention_view(c, op);
      const Tensor& from = orig.at(op);
      Tensor& to = in.at(op);
      for (std::int64_t b = 0; b < a.batch; ++b) {
        const std::int64_t len = a.kv_lengths.empty() ? a.seq_kv : a.kv_lengths[b];
        for (std::int64_t h = 0; h < view.heads; ++h)
          for (std::int64_t j = 0; j < len; ++j) {
            const std::int64_t src = (len - 1 - j + len / 2) % len;  // first keys go mid-way
            for (std::int64_t d = 0; d < view.dim; ++d) to.set_code(view.offset(b, h, j, d), from.code(view.offset(b, h, src, d)));
          }
      }
    }
  }
};

}  // namespace

void draw_window(Case& c, const Kernel* k) {
  if (!k || !(k->traits().attention_variants & kAttnWindow) || *gen::pick(std::vector<int>{0, 0, 1}) == 0) return;
  AttentionShape& a = c.attention;
  const std::int64_t base = *gen::pick(std::vector<std::int64_t>{1, 2, 16, 63, 64, 65, 127, 128, 129, a.seq_kv / 2, a.seq_kv - 1, a.seq_kv});
  const std::int64_t w = std::max<std::int64_t>(1, base + *gen::pick(std::vector<std::int64_t>{-1, 0, 1}));
  const int convention = *gen::pick(std::vector<int>{0, 1, 2, 3});
  std::string spec;
  switch (convention) {
    case 0: spec = fmt::format("flash:{},{}", w, *gen::pick(std::vector<std::int64_t>{-1, 0, 0, w})); break;
    case 1: spec = fmt::format("hf:{}", w); break;
    case 2: spec = fmt::format("flashinfer:{}", w); break;
    default: spec = *gen::pick(std::vector<bool>{false, true}) ? fmt::format("cudnn:{},0", w) : fmt::format("cudnn:{}", w);
  }
  const auto [left, right] = window_from_convention(spec);
  const std::int64_t left0 = a.window_left, right0 = a.window_right;
  a.window_left = left, a.window_right = right;
  if (k->unsupported(c)) a.window_left = left0, a.window_right = right0;
}

Case dtype_attention_case(std::string_view dtype, std::optional<Format> out) {
  const auto f = parse_format(dtype);
  if (!f || !(*f == Format::FP32 || *f == Format::FP16 || *f == Format::BF16 || *f == Format::E4M3))
    throw InputError(fmt::format("--dtype '{}': attention takes fp32, fp16, bf16 or e4m3", dtype));
  Case c;
  c.op = Op::Attention;
  AttentionShape& a = c.attention;
  a.batch = a.heads = 1, a.seq_q = 4, a.seq_kv = 8, a.head_dim = 64;  // 64: the head size every attention kernel takes (flash: 64 and 128 only)
  const Format o = out.value_or(*f == Format::E4M3 ? Format::BF16 : *f);
  c.types = {{"Q", *f}, {"K", *f}, {"V", *f}, {"O", o}, {"compute", Format::FP32}};
  validate(c);
  return c;
}

const OpModule& attention_module() {
  static const AttentionModule m;
  return m;
}

}  // namespace ulpgate
