#include "check/ops/attention_backward.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "check/ops/attention.hpp"
#include "core/error.hpp"
#include "distributions/case_gen.hpp"
#include "references/attention_backward.hpp"
#include "references/attention_reference.hpp"

namespace ulpgate {
namespace {

const std::vector<std::string> kBackwardDtypes = {"fp32", "fp16", "bf16"};

// The families that put NaN, Inf or values near overflow into the operands: the gradient has
// no finite exact value there (the reference refuses them). FP16 also loses the heavy tails
// and large outliers, which reach past its largest finite value (65504).
std::vector<std::string> excluded_families(const Case& c) {
  std::vector<std::string> out = {"specials", "near_overflow", "gendot"};
  if (c.types.at("Q") == Format::FP16) out.insert(out.end(), {"lognormal", "cauchy", "student_t", "outliers"});
  return out;
}

// The exact gradients cost an MPFR exponential per visible score and MPFR products and sums
// per (score, dimension) term for dV, dP, dQ and dK, besides the forward reference that
// derives O and LSE: the generator keeps batch * heads * seq_q * seq_kv below kScoreBudget
// and that times (2 head_dim + 2 head_dim_v) below kTermBudget.
constexpr std::int64_t kScoreBudget = std::int64_t{1} << 13;
constexpr std::int64_t kTermBudget = std::int64_t{1} << 20;

// The precision P and dS are rounded to before the products without a declaration: the
// inputs' format where it is 16 bits wide (FlashAttention-2/3 and cuDNN feed both to the
// tensor cores in Q's type), none for FP32.
int default_p_bits(const Case& c) {
  const Format q = c.types.at("Q");
  return q == Format::FP16 || q == Format::BF16 ? info(q).precision() : 0;
}

// The absolute error of rounding to p_bits: the smallest subnormal of the 16-bit format of
// that precision (FP16, BF16), else one with FP32's exponent range.
double rounding_eta(int p_bits) {
  for (Format f : {Format::FP16, Format::BF16})
    if (info(f).precision() == p_bits) return info(f).min_subnormal();
  return std::ldexp(1.0, info(Format::FP32).emin() + 1 - p_bits);
}

// The per-element bound of the admitted fused backward (docs/concepts/precision.md,
// "Attention backward"): for every visible (query, key) pair, the error of the recomputed
// P (scores, the stored LSE, exp, the rounding to p_bits), of dP = dO . v_j, of D from the
// stored O, and of dS = P (dP - D) with its rounding; then those errors carried through the
// FP32 sums dV = P^T dO, dQ = scale dS K and dK = scale dS^T Q, in any order.
class BackwardBound {
 public:
  /// forward: the exact forward of the case's Q, K, V, against which the stored O and LSE
  /// (whatever gave them) are measured.
  BackwardBound(const Case& c, const Inputs& in, const ToleranceModel& tol, const AttentionReference& forward)
      : c_(c), a_(c.attention), in_(in), tol_(tol), forward_(forward), q_(in, c, "Q"), k_(in, c, "K"), v_(in, c, "V"),
        o_(in, c, "O"), do_(in, c, "dO"),
        u_(std::ldexp(1.0, 1 - tol.accumulator_bits)),
        u_p_(tol.p_bits > 0 && tol.p_bits < 24 ? std::ldexp(1.0, 1 - tol.p_bits) : 0.0),
        eta_p_(tol.p_bits > 0 && tol.p_bits < 24 ? rounding_eta(tol.p_bits) : 0.0),
        eta_(tol.accumulator_eta), sigma_(c.attention.scale()),
        ds_max_(tol.p_bits > 0 && tol.p_bits < 24 && tol.p_bits == info(Format::FP16).precision()
                    ? info(Format::FP16).max_finite() : INFINITY) {}

  struct Allowed {
    std::vector<double> dq, dk, dv;
    /// Per dQ and dK element, 1 where some dS term may pass the largest finite value of the
    /// format dS is rounded to (FP16: 65504): the admitted arithmetic then gives Inf or NaN
    /// there, so the comparison takes any (OutputComparison::accumulated +Inf).
    std::vector<char> dq_overflow, dk_overflow;
  };

  Allowed compute() const {
    const std::int64_t hd = a_.head_dim, dv = a_.eff_head_dim_v(), hk_n = a_.eff_kv_heads();
    Allowed out;
    out.dq.assign(static_cast<std::size_t>(a_.batch * a_.heads * a_.seq_q * hd), 0.0);
    out.dk.assign(static_cast<std::size_t>(a_.batch * hk_n * a_.seq_kv * hd), 0.0);
    out.dv.assign(static_cast<std::size_t>(a_.batch * hk_n * a_.seq_kv * dv), 0.0);
    out.dq_overflow.assign(out.dq.size(), 0);
    out.dk_overflow.assign(out.dk.size(), 0);
    std::vector<double> dk_abs(out.dk.size(), 0.0), dv_abs(out.dv.size(), 0.0);
    std::vector<std::int64_t> terms(static_cast<std::size_t>(a_.batch * hk_n * a_.seq_kv), 0);
    for (std::int64_t b = 0; b < a_.batch; ++b)
      for (std::int64_t h = 0; h < a_.heads; ++h)
        for (std::int64_t i = 0; i < a_.seq_q; ++i) row(b, h, i, out, dk_abs, dv_abs, terms);
    const double s = std::fabs(sigma_);
    const std::int64_t group = a_.heads / hk_n;
    const double u_dk = group > 1 ? std::ldexp(1.0, -info(c_.types.at("dK")).precision()) : 0.0;
    const double u_dv = group > 1 ? std::ldexp(1.0, -info(c_.types.at("dV")).precision()) : 0.0;
    const double eta_dk = group > 1 ? group * info(c_.types.at("dK")).min_subnormal() : 0.0;
    const double eta_dv = group > 1 ? group * info(c_.types.at("dV")).min_subnormal() : 0.0;
    for (std::size_t e = 0; e < out.dk.size(); ++e) {
      const std::int64_t n = terms[e / static_cast<std::size_t>(hd)];
      const double err = s * (out.dk[e] + tol_.gamma(n + 2) * dk_abs[e]) + static_cast<double>(n + 1) * eta_;
      // Grouped heads: per-head dK rounded to its format before the group's sum (admitted).
      out.dk[e] = err + (u_dk + tol_.gamma(group)) * (s * dk_abs[e] + err) + eta_dk;
    }
    for (std::size_t e = 0; e < out.dv.size(); ++e) {
      const std::int64_t n = terms[e / static_cast<std::size_t>(dv)];
      const double err = out.dv[e] + tol_.gamma(n + 1) * dv_abs[e] + static_cast<double>(n + 1) * eta_;
      out.dv[e] = err + (u_dv + tol_.gamma(group)) * (dv_abs[e] + err) + eta_dv;
    }
    return out;
  }

 private:
  // An input and its view, looked up once (the bound reads them per visible (query, key)).
  struct Operand {
    Operand(const Inputs& in, const Case& c, const char* name) : t(in.at(name)), v(attention_view(c, name)) {}
    double at(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) const { return t.value(v.offset(b, h, s, d)); }
    const Tensor& t;
    AttentionView v;
  };

  // An upper bound of |x - exact| (x finite): from the exact value's double-double, whose
  // error is below 2^-104 of it.
  static double distance(double x, const RefValue& exact) {
    const DoubleDouble e = exact.double_double();
    const double gap = std::fabs((x - e.hi) - e.lo);
    return gap * (1 + 0x1p-50) + std::ldexp(std::fabs(e.hi), -100) + 0x1p-1074;
  }

  // One query row: its dQ bound, and its terms of dK's and dV's (accumulated over rows).
  void row(std::int64_t b, std::int64_t h, std::int64_t i, Allowed& out, std::vector<double>& dk_abs,
           std::vector<double>& dv_abs, std::vector<std::int64_t>& terms) const {
    const std::int64_t hd = a_.head_dim, dv = a_.eff_head_dim_v(), hk = a_.kv_head(h);
    const KeyRange keys = attention_visible_keys(c_, b, i);
    const std::int64_t n_i = keys.size();
    if (n_i == 0) return;  // no key: every gradient term of the row is exactly 0
    std::vector<double> q(hd), dout(dv);
    // D from the stored O; rho bounds |D(stored O) - D(exact O)|: the stored O's distance from
    // the exact one, measured (a double-double's error, 2^-100 of it, and more, added).
    double dsum = 0, dsum_abs = 0, rho = 0;
    for (std::int64_t d = 0; d < hd; ++d) q[d] = q_.at(b, h, i, d);
    for (std::int64_t d = 0; d < dv; ++d) {
      dout[d] = do_.at(b, h, i, d);
      const double o = o_.at(b, h, i, d);
      dsum += dout[d] * o, dsum_abs += std::fabs(dout[d] * o);
      rho += std::fabs(dout[d]) * distance(o, forward_.at(b, h, i, d));
    }
    const double lse = in_.at("LSE").value((b * a_.heads + h) * a_.seq_q + i);
    const double lambda = distance(lse, forward_.lse[static_cast<std::size_t>(forward_.row(b, h, i))]);
    if (!std::isfinite(lse) || !std::isfinite(lambda)) {  // a row with keys given a non-finite LSE: no bound
      for (std::int64_t d = 0; d < hd; ++d) out.dq[((b * a_.heads + h) * a_.seq_q + i) * hd + d] = INFINITY;
      for (std::int64_t j = keys.first; j < keys.end; ++j) {
        const std::int64_t kj = (b * a_.eff_kv_heads() + hk) * a_.seq_kv + j;
        for (std::int64_t d = 0; d < hd; ++d) out.dk[kj * hd + d] = INFINITY;
        for (std::int64_t d = 0; d < dv; ++d) out.dv[kj * dv + d] = INFINITY;
      }
      return;
    }
    const double e_d = tol_.gamma(dv) * dsum_abs + rho + static_cast<double>(dv) * eta_;
    const double s = std::fabs(sigma_);
    std::vector<double> dq_err(hd, 0.0), dq_abs(hd, 0.0);
    for (std::int64_t j = keys.first; j < keys.end; ++j) {
      double dot = 0, dot_abs = 0, dp = 0, dp_abs = 0;
      for (std::int64_t d = 0; d < hd; ++d) {
        const double x = q[d] * k_.at(b, hk, j, d);
        dot += x, dot_abs += std::fabs(x);
      }
      for (std::int64_t d = 0; d < dv; ++d) {
        const double x = dout[d] * v_.at(b, hk, j, d);
        dp += x, dp_abs += std::fabs(x);
      }
      const double big = s * dot_abs;  // |score| bound
      // P's upper bound (the double computation's own error included) and its errors.
      const double p_up = std::exp(sigma_ * dot - lse + lambda + 0x1p-50 * (big + std::fabs(lse) + 1));
      const double delta = tol_.gamma(hd + 2) * big + lambda + 2 * u_ * (big + std::fabs(lse) + 1);
      const double e_p32 = p_up * (std::expm1(delta) + 2 * u_ * std::exp(delta)) + eta_;
      const double e_p = e_p32 + u_p_ * (p_up + e_p32) + eta_p_;
      // dP - D: exact bound g, the kernel's error e_g
      const double g = std::fabs(dp - dsum) + rho + 0x1p-50 * (dp_abs + dsum_abs);
      const double e_g = (1 + u_) * (tol_.gamma(dv) * dp_abs + static_cast<double>(dv) * eta_ + e_d) + u_ * g;
      const double g_up = g + e_g;
      const double e_ds32 = e_p * g_up + p_up * e_g + u_ * (p_up + e_p) * g_up + eta_;
      const double ds_up32 = (p_up + e_p) * g_up * (1 + u_);
      const double e_ds = e_ds32 + u_p_ * ds_up32 + eta_p_;
      const double ds_up = ds_up32 * (1 + u_p_) + eta_p_;
      const bool ds_overflows = ds_up32 >= ds_max_;
      const std::int64_t kj = (b * a_.eff_kv_heads() + hk) * a_.seq_kv + j;
      ++terms[static_cast<std::size_t>(kj)];
      for (std::int64_t d = 0; d < hd; ++d) {
        const double kd = std::fabs(k_.at(b, hk, j, d));
        dq_err[d] += e_ds * kd, dq_abs[d] += ds_up * kd;
        if (ds_overflows) {
          out.dq_overflow[((b * a_.heads + h) * a_.seq_q + i) * hd + d] = 1;
          out.dk_overflow[kj * hd + d] = 1;
        }
        out.dk[kj * hd + d] += e_ds * std::fabs(q[d]);
        dk_abs[kj * hd + d] += ds_up * std::fabs(q[d]);
      }
      for (std::int64_t d = 0; d < dv; ++d) {
        out.dv[kj * dv + d] += e_p * std::fabs(dout[d]);
        dv_abs[kj * dv + d] += (p_up + e_p) * std::fabs(dout[d]);
      }
    }
    for (std::int64_t d = 0; d < hd; ++d)
      out.dq[((b * a_.heads + h) * a_.seq_q + i) * hd + d] =
          s * (dq_err[d] + tol_.gamma(n_i + 2) * dq_abs[d]) + static_cast<double>(n_i + 1) * eta_;
  }

  const Case& c_;
  const AttentionShape& a_;
  const Inputs& in_;
  const ToleranceModel& tol_;
  const AttentionReference& forward_;
  const Operand q_, k_, v_, o_, do_;
  const double u_, u_p_, eta_p_, eta_, sigma_;
  const double ds_max_;  ///< the largest finite value of dS's 16-bit format (FP16 only; else +inf)
};

// The exact forward of a backward case's Q, K, V (checked finite, with dO). A check needs it
// twice on the same inputs (derive_inputs, then compare): each thread keeps the last one it
// computed and hands it out again while the forward case and Q, K, V are the same, bit for bit.
std::shared_ptr<const AttentionReference> forward_reference(const Case& c, const Inputs& inputs) {
  struct Last {
    Case f;
    Inputs qkv;
    std::shared_ptr<const AttentionReference> ref;
  };
  thread_local Last last;
  const Case f = forward_case(c);
  Inputs qkv;
  for (const char* op : {"Q", "K", "V", "dO"}) {
    const Tensor& t = inputs.at(op);
    const AttentionView v = attention_view(c, op);
    for (std::int64_t e = 0; e < v.elements(); ++e)
      if (!std::isfinite(t.value(static_cast<std::size_t>(e))))
        throw InputError(fmt::format("attention backward: input {} holds {} (element {}); the gradients of a backward case "
                                     "need finite inputs (case.dist.{}: {})", op, t.value(static_cast<std::size_t>(e)), e, op,
                                     c.dist.count(op) ? c.dist.at(op) : std::string("default")));
    if (op[0] != 'd') qkv.emplace(op, t);
  }
  const auto same = [&](const Tensor& x, const Tensor& y) {
    return x.format() == y.format() && x.size_bytes() == y.size_bytes() && std::memcmp(x.data(), y.data(), x.size_bytes()) == 0;
  };
  if (!last.ref || !(last.f == f) || !std::all_of(qkv.begin(), qkv.end(), [&](const auto& kv) {
        const auto it = last.qkv.find(kv.first);
        return it != last.qkv.end() && same(it->second, kv.second);
      })) {
    auto ref = std::make_shared<const AttentionReference>(attention_reference(f, qkv));
    last = Last{f, std::move(qkv), std::move(ref)};
  }
  return last.ref;
}

class AttentionBackwardModule final : public OpModule {
 public:
  Op op() const override { return Op::AttentionBackward; }
  std::vector<std::string> dtypes() const override { return kBackwardDtypes; }
  Case basic_case(std::string_view dtype) const override { return dtype_attention_backward_case(dtype); }
  std::vector<Format> output_formats(std::string_view dtype) const override {
    return {basic_case(dtype).types.at("dQ")};  // gradients in the inputs' format, as autograd gives them
  }

  void derive_inputs(const Case& c, Inputs& inputs) const override { add_forward_outputs(c, inputs); }

  rc::Gen<Case> generate(std::string_view dtype_in, const Kernel* k, const GenLimits& limits) const override {
    return rc::gen::exec([dtype_in = std::string(dtype_in), k, limits]() {
      const std::string dtype = dtype_in.empty() ? *gen::pick(kBackwardDtypes) : dtype_in;
      Case c = dtype_attention_backward_case(dtype);
      if (k) c.kernel = k->name();
      c.forward_kernel = limits.forward_kernel;
      auto keep_if_supported = [&](auto apply, auto revert) {
        apply();
        if (k && k->unsupported(c)) revert();
      };
      AttentionShape& a = c.attention;
      // Head sizes, and the (head_dim, head_dim_v) pairs whose backward broke peers.
      const auto dims = *gen::pick(std::vector<std::pair<std::int64_t, std::int64_t>>{
          {64, 0}, {128, 0}, {32, 0}, {16, 0}, {80, 0}, {96, 0}, {111, 0}, {256, 0}, {192, 128}, {128, 96}, {64, 32}});
      keep_if_supported([&] { a.head_dim = dims.first, a.head_dim_v = dims.second; }, [&] { a.head_dim = 64, a.head_dim_v = 0; });
      // Lengths at tile edges: decode (1), one key, seq_kv % 128 == 64, ragged tails.
      const std::vector<std::int64_t> seqs{1, 2, 17, 63, 64, 65, 127, 128, 129, 192, 200, 257};
      a.seq_kv = *gen::dim(std::max<std::int64_t>(1, std::min<std::int64_t>(limits.max_reduction, 320)), seqs);
      const int q_kind = *gen::pick(std::vector<int>{0, 1, 2});  // self-attention, decode, other
      a.seq_q = q_kind == 0 ? a.seq_kv : q_kind == 1 ? 1 : *gen::dim(320, seqs);
      if (limits.mapping) {
        static const std::vector<std::pair<std::int64_t, std::int64_t>> kGroups{{4, 2}, {6, 3}, {8, 2}, {8, 4}, {12, 4}};
        a.batch = *rc::gen::inRange<std::int64_t>(2, 4);
        const auto group = *gen::pick(kGroups);
        a.heads = group.first;
        keep_if_supported([&] { a.kv_heads = group.second; }, [&] { a.kv_heads = 0; });
      } else {
        a.batch = *gen::dim(3);
        a.heads = *gen::dim(4);
      }
      fit_budget(a);
      const auto layout = *gen::pick(std::vector<AttentionLayout>{AttentionLayout::BHSD, AttentionLayout::BSHD});
      keep_if_supported([&] { a.layout = layout; }, [&] { a.layout = AttentionLayout::BHSD; });
      const bool causal = *gen::pick(std::vector<bool>{false, true});
      keep_if_supported([&] { a.causal = causal; }, [&] { a.causal = false; });
      if (limits.mapping || *gen::pick(std::vector<bool>{false, true})) {
        // Padding masks: zero-length sequences, one key, a tail of 64 past a 128-key tile.
        std::vector<std::int64_t> lens;
        for (std::int64_t b = 0; b < a.batch; ++b)
          lens.push_back(*gen::pick(std::vector<std::int64_t>{a.seq_kv, 0, 1, a.seq_kv / 2, a.seq_kv - 1,
                                                              std::min(a.seq_kv, a.seq_kv / 128 * 128 + 64)}));
        keep_if_supported([&] { a.kv_lengths = lens; }, [&] { a.kv_lengths.clear(); });
      }
      const double scale = *gen::pick(std::vector<double>{0, 0.125, 1.0, 0.05, 0.5});
      if (scale != 0) keep_if_supported([&] { a.softmax_scale = scale; }, [&] { a.softmax_scale.reset(); });
      draw_distributions(c, k);
      if (*gen::pick(std::vector<int>{0, 0, 0, 0, 0, 1})) {
        // Every score near -T (T 100 or 130): LSE below -88.7 on every row, where exp(-LSE)
        // overflows FP32 (cuDNN's NaN dQ with padded key tiles). Q about m, K about -m.
        const double t = *gen::pick(std::vector<double>{130, 100});
        const double m = std::sqrt(t / (std::fabs(c.attention.scale()) * static_cast<double>(a.head_dim)));
        c.dist["Q"] = fmt::format("normal({:.6g},{:.6g})", m, m / 16);
        c.dist["K"] = fmt::format("normal({:.6g},{:.6g})", -m, m / 16);
      }
      c.seed = *rc::gen::arbitrary<std::uint64_t>();
      if (!limits.mapping && a.heads > 1) {
        std::vector<std::int64_t> kv{0};
        for (std::int64_t d = a.heads / 2; d >= 1; --d)
          if (a.heads % d == 0) kv.push_back(d);
        const std::int64_t kv_heads = *gen::pick(kv);
        keep_if_supported([&] { a.kv_heads = kv_heads; }, [&] { a.kv_heads = 0; });
      }
      draw_window(c, k);  // last: kernels without windows draw the stream they drew before
      validate(c);
      return c;
    });
  }

  std::vector<AdmittedArithmetic> admitted(std::string_view dtype) const override {
    std::vector<AdmittedArithmetic> out = {
        {"FP32 throughout: P and dS in FP32, D from the stored O", "cpu.attn_bwd_naive"},
        {"the same with subnormals flushed to zero", "cpu.attn_bwd_naive:ftz"},
        {"grouped heads: per-head dK and dV rounded to their format, then summed (FlashAttention-2)",
         "cpu.attn_bwd_naive:group_round"},
    };
    if (dtype == "fp16" || dtype == "bf16") {
      const std::string p(dtype);
      out.push_back({"FlashAttention-2/3, cuDNN: P and dS rounded to " + p + " before the products, dQ summed over key "
                     "blocks", "cpu.attn_bwd_flash:block=64,p=" + p});
      out.push_back({"the same with exp2, blocks of 128 keys, subnormals flushed and per-head dK, dV rounded",
                     "cpu.attn_bwd_flash:block=128,p=" + p + ",exp2,ftz,group_round"});
    }
    return out;
  }

  std::string family(const Case& c) const override { return op_family(c, "attention_backward", "Q", "dQ"); }
  std::int64_t reduction_length(const Case& c) const override { return c.attention.seq_kv; }

  ToleranceModel tolerance(const Case& c, const KernelTraits& traits) const override {
    ToleranceModel t = precision_terms(c, traits);
    // Subnormals flushed to zero are admitted without a declaration (fused kernels build
    // with --use_fast_math; cuDNN flushes).
    t.accumulator_eta = info(Format::FP32).min_normal();
    t.rule += ", subnormals may flush to zero";
    t.p_bits = traits.p_bits > 0 ? traits.p_bits : default_p_bits(c);
    if (t.p_bits > 0 && t.p_bits < 24)
      t.rule += fmt::format(", P and dS rounded to {} bits before the products{}", t.p_bits,
                            traits.p_bits ? "" : " (the inputs' 16-bit format)");
    else
      t.rule += ", P and dS in FP32";
    return t;
  }

  std::vector<OutputComparison> compare(const Case& c, const Inputs& inputs, const std::map<std::string, Tensor>& outputs,
                                        const ToleranceModel& tol) const override {
    const AttentionGradients ref = attention_backward_reference(c, inputs);
    const std::shared_ptr<const AttentionReference> forward = forward_reference(c, inputs);
    const BackwardBound::Allowed allowed = BackwardBound(c, inputs, tol, *forward).compute();
    const AttentionShape& a = c.attention;
    std::vector<OutputComparison> out;
    const auto add = [&](const char* name, std::vector<std::int64_t> shape, const std::vector<RefValue>& exact,
                         const std::vector<double>& magnitude, const std::vector<double>& bound,
                         const std::vector<char>& overflow) {
      OutputComparison cmp;
      cmp.format = c.types.at(name);
      cmp.shape = std::move(shape);
      cmp.ulp_fair_condition = ulp_fair_condition(tol.accumulator_bits, cmp.format);
      cmp.got = logical_output(c, name, outputs.at(name));
      cmp.exact.assign(exact.begin(), exact.end());
      cmp.condition = magnitude;
      cmp.allowed = bound;
      cmp.accumulator_max = info(Format::FP32).max_finite();
      if (std::find(overflow.begin(), overflow.end(), 1) != overflow.end()) {
        cmp.accumulated = magnitude;
        for (std::size_t e = 0; e < overflow.size(); ++e)
          if (overflow[e]) cmp.accumulated[e] = INFINITY;
      }
      cmp.tolerance_note = fmt::format("accumulator {} bits{}, n = {} keys, {} queries", tol.accumulator_bits,
                                       tol.p_bits > 0 && tol.p_bits < 24 ? fmt::format(", P and dS {} bits", tol.p_bits) : "",
                                       a.seq_kv, a.seq_q);
      out.push_back(std::move(cmp));
    };
    const std::int64_t hk = a.eff_kv_heads();
    add("dQ", {a.batch, a.heads, a.seq_q, a.head_dim}, ref.dq, ref.dq_magnitude, allowed.dq, allowed.dq_overflow);
    add("dK", {a.batch, hk, a.seq_kv, a.head_dim}, ref.dk, ref.dk_magnitude, allowed.dk, allowed.dk_overflow);
    add("dV", {a.batch, hk, a.seq_kv, a.eff_head_dim_v()}, ref.dv, ref.dv_magnitude, allowed.dv, {});
    return out;
  }

  std::vector<std::int64_t> output_offsets(const Case& c, const std::string& output) const override {
    return attention_view(c, output).logical_offsets();
  }

  std::vector<RelationFailure> relations(const RelationContext& ctx, const Case& c, const Inputs& inputs,
                                         const RunOutcome&) const override {
    std::vector<RelationFailure> out;
    // Rows whose log-sum-exp is far below -88.7 (exp(-LSE) overflows FP32): every key
    // shifted so that the mean query's scores fall by about 120.
    Inputs shifted = inputs;
    if (shift_keys_down(c, shifted)) {
      add_forward_outputs(c, shifted);
      const std::string why = ctx.run_and_judge(c, shifted);
      if (!why.empty())
        out.push_back({"low_lse", "every score lowered by about 120 (LSE below -88.7) fails: " + why});
    }
    return out;
  }

  EffectiveBits effective_bits(const Case&, const Inputs&, const OutputComparison&, double, const KernelTraits&) const override {
    return {};
  }

 private:
  // The reference's budgets: the longer sequence halves first, batch and heads shrink last.
  static void fit_budget(AttentionShape& a) {
    const auto over = [&] {
      const std::int64_t scores = a.batch * a.heads * a.seq_q * a.seq_kv;
      return scores > kScoreBudget || scores * 2 * (a.head_dim + a.eff_head_dim_v()) > kTermBudget;
    };
    while (over()) {
      if (a.seq_q > 1 && a.seq_q >= a.seq_kv) a.seq_q = (a.seq_q + 1) / 2;
      else if (a.heads > 2) --a.heads;
      else if (a.batch > 1) --a.batch;
      else if (a.seq_kv > 1) a.seq_kv = (a.seq_kv + 1) / 2;
      else break;
    }
    if (a.kv_heads > a.heads || (a.kv_heads && a.heads % a.kv_heads)) a.kv_heads = 0;
  }

  static void draw_distributions(Case& c, const Kernel* k) {
    const std::vector<std::string> excluded_here = excluded_families(c);
    c.dist["Q"] = *gen::dist_spec(c, "Q", true, excluded_here);
    if (k && parse_dist(c.dist["Q"]).family == "masked") {
      Case probe = c;  // masked() sets kv_lengths with a zero: ask the kernel first
      probe.attention.kv_lengths.assign(static_cast<std::size_t>(c.attention.batch), c.attention.seq_kv);
      probe.attention.kv_lengths.front() = 0;
      if (k->unsupported(probe)) {
        std::vector<std::string> excluded = excluded_here;
        excluded.push_back("masked");
        c.dist["Q"] = *gen::dist_spec(c, "Q", true, excluded);
      }
    }
    if (find_family(parse_dist(c.dist["Q"]).family)->scope != Scope::AttnQK)
      c.dist["K"] = *gen::dist_spec(c, "K", false, excluded_here);
    c.dist["V"] = *gen::dist_spec(c, "V", false, excluded_here);
    // dO as training gives it: Gaussian, sparse, a few large rows (outliers), outlier channels.
    c.dist["dO"] = *gen::pick(std::vector<std::string>{"normal(0,1)", "sparse(density=0.1)", "outliers(rate=0.01,scale=100,base=normal(0,1))",
                                                       "activations(std=1,rate=0.01,scale=100)", "normal(0,0.001)", "uniform(-9,9)"});
  }

  // K - t sign(sum of the queries) per K/V head, rounded to K's format, with t a power of two
  // that lowers the scores of the mean query by about 120 (the rows near that mean then have
  // LSE below -88.7; rows far from it may rise). False where no query has weight or a shifted
  // key leaves K's range.
  static bool shift_keys_down(const Case& c, Inputs& in) {
    const AttentionShape& a = c.attention;
    const AttentionView qv = attention_view(c, "Q"), kv = attention_view(c, "K");
    Tensor& k = in.at("K");
    const Tensor& q = in.at("Q");
    const double sigma = c.attention.scale();
    const std::int64_t group = a.heads / a.eff_kv_heads();
    bool any = false;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t hk = 0; hk < a.eff_kv_heads(); ++hk) {
        std::vector<double> dir(a.head_dim, 0.0);
        for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (std::int64_t i = 0; i < a.seq_q; ++i)
            for (std::int64_t d = 0; d < a.head_dim; ++d) dir[d] += q.value(qv.offset(b, h, i, d));
        double fall = 0;  // the mean sigma q_i . sign(dir) over the queries (> 0: dir is their sum)
        for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (std::int64_t i = 0; i < a.seq_q; ++i) {
            double g = 0;
            for (std::int64_t d = 0; d < a.head_dim; ++d) g += q.value(qv.offset(b, h, i, d)) * (dir[d] < 0 ? -1.0 : 1.0);
            fall += sigma * g / static_cast<double>(group * a.seq_q);
          }
        if (!(fall > 0) || !std::isfinite(fall)) continue;
        const double t = std::exp2(std::ceil(std::log2(120.0 / fall)));
        for (std::int64_t j = 0; j < a.seq_kv; ++j)
          for (std::int64_t d = 0; d < a.head_dim; ++d) {
            const std::int64_t off = kv.offset(b, hk, j, d);
            const double x = k.value(off) - (dir[d] < 0 ? -t : t);
            if (!std::isfinite(x) || std::fabs(x) > info(k.format()).max_finite()) return false;
            k.set_value(off, x);
          }
        any = true;
      }
    return any;
  }
};

}  // namespace

Case dtype_attention_backward_case(std::string_view dtype) {
  const auto f = parse_format(dtype);
  if (!f || !(*f == Format::FP32 || *f == Format::FP16 || *f == Format::BF16))
    throw InputError(fmt::format("--dtype '{}': attention backward takes fp32, fp16 or bf16", dtype));
  Case c;
  c.op = Op::AttentionBackward;
  AttentionShape& a = c.attention;
  a.batch = a.heads = 1, a.seq_q = 4, a.seq_kv = 8, a.head_dim = 64;
  c.types = {{"Q", *f},  {"K", *f},  {"V", *f},  {"O", *f},  {"LSE", Format::FP32}, {"dO", *f},
             {"dQ", *f}, {"dK", *f}, {"dV", *f}, {"compute", Format::FP32}};
  validate(c);
  return c;
}

Case forward_case(const Case& backward) {
  Case f = backward;
  f.op = Op::Attention;
  f.kernel.clear();
  f.forward_kernel.clear();
  f.dist.clear();
  for (const char* g : {"dO", "dQ", "dK", "dV"}) f.types.erase(g);
  return f;
}

void add_forward_outputs(const Case& c, Inputs& inputs) {
  const std::shared_ptr<const AttentionReference> forward = forward_reference(c, inputs);
  const AttentionReference& ref = *forward;
  const AttentionShape& a = c.attention;
  const Format fo = c.types.at("O");
  const AttentionView ov = attention_view(c, "O");
  Tensor o(fo, static_cast<std::size_t>(ov.elements()));
  Tensor lse(Format::FP32, static_cast<std::size_t>(a.batch * a.heads * a.seq_q));
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        const std::int64_t r = ref.row(b, h, i);
        for (std::int64_t d = 0; d < a.eff_head_dim_v(); ++d) o.set_code(ov.offset(b, h, i, d), ref.expected(b, h, i, d));
        lse.set_code(static_cast<std::size_t>(r), attention_visible_count(c, b, i) == 0
                                                      ? encode(Format::FP32, INFINITY)
                                                      : ref.lse[static_cast<std::size_t>(r)].round_to(Format::FP32));
      }
  inputs.insert_or_assign("O", std::move(o));
  inputs.insert_or_assign("LSE", std::move(lse));
}

const OpModule& attention_backward_module() {
  static const AttentionBackwardModule m;
  return m;
}

}  // namespace ulpgate
