#include "kernels/emulated/attention_models.hpp"

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "kernels/emulated/model_name.hpp"

namespace ulpgate {
namespace {


float round_p(float p, Format f) { return static_cast<float>(decode(f, encode(f, p))); }

class EmulatedAttention final : public Kernel {
 public:
  explicit EmulatedAttention(AttentionModel m) : m_(m) {}
  std::string name() const override { return m_.name(); }
  std::string description() const override {
    std::string d;
    switch (m_.variant) {
      case AttentionModel::Variant::Naive: d = "CPU model: three-pass FP32 softmax attention"; break;
      case AttentionModel::Variant::Online:
        d = fmt::format("CPU model: online-softmax FP32 attention, {} keys per block", m_.block);
        break;
      case AttentionModel::Variant::Flash:
        d = fmt::format("CPU model: flash-style FP32 attention, {} keys per block, P rounded to {}", m_.block,
                        ulpgate::name(m_.p_format));
        break;
    }
    if (m_.exp2) d += ", exp2 with log2 e folded in";
    if (m_.ftz) d += ", subnormals flushed to zero";
    return m_.rescale ? d : d + " (planted bug: no rescale when the max grows)";
  }
  KernelTraits traits() const override {
    KernelTraits t;
    t.thread_safe = true;
    t.writes_lse = true;
    t.attention_variants = kAllAttentionVariants;  // windows, soft cap, ALiBi, sinks, pages, K/V scales
    t.p_bits = info(m_.variant == AttentionModel::Variant::Flash ? m_.p_format : Format::FP32).precision();
    t.flushes_subnormals = m_.ftz;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Attention) return "attention models cover attention only";
    for (const char* op : {"Q", "K", "V"})
      if (c.types.at(op) == Format::FP64) return "FP64 inputs: the models compute in FP32";
    if (c.types.at("compute") != Format::FP32) return "the CPU models compute in fp32 (compute must be fp32)";
    if (m_.exp2 && !(c.attention.softmax_scale.value_or(1.0) > 0))
      return "exp2 with log2 e folded into the scale needs a positive softmax scale";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const AttentionShape& a = c.attention;
    const AttentionView qv = attention_view(c, "Q"), kv = attention_view(c, "K"), vv = attention_view(c, "V"),
                        ov = attention_view(c, "O");
    const Format fq = c.types.at("Q"), fk = c.types.at("K"), fv = c.types.at("V"), fo = c.types.at("O");
    const std::int64_t hd = a.head_dim, dv = a.eff_head_dim_v();
    const double scale_exact = a.scale();
    const float scale = static_cast<float>(scale_exact);
    // Soft cap as FlashAttention computes it, cap tanh(q.k (scale / cap)); with exp2 the
    // scores stay in tanh units and cap log2 e is the exponent's factor. unit: one score unit
    // in logits (exp2: scale, or cap when capped; else 1), what ALiBi's slopes are divided by.
    const float cap = static_cast<float>(a.softcap), scale_over_cap = cap != 0 ? static_cast<float>(scale_exact / a.softcap) : 0.0f;
    const double unit_exact = !m_.exp2 ? 1.0 : cap != 0 ? a.softcap : scale_exact;
    const float unit = static_cast<float>(unit_exact);
    const float log2_scale = static_cast<float>(unit_exact * 1.4426950408889634);
    float* lse = io.out.count("LSE") ? static_cast<float*>(io.out.at("LSE")) : nullptr;  // [batch][heads][seq_q]
    // ftz: an FP32 result below the smallest normal becomes a zero of its sign; inputs are
    // kept (tensor cores take subnormal operands whatever the FP32 mode).
    const bool ftz = m_.ftz;
    const auto fz = [ftz](float x) { return ftz && std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; };
    parallel_for(a.batch * a.heads * a.seq_q, [&](std::int64_t row) {
      const std::int64_t i = row % a.seq_q, h = (row / a.seq_q) % a.heads, b = row / (a.seq_q * a.heads);
      const std::int64_t hk = a.kv_head(h);  // grouped-query: the K/V head query head h reads
      // An FP8 K/V cache's scales: each value dequantized to FP32 (stored x scale, rounded once).
      const double k_scale = input_scale(c, "K", hk), v_scale = input_scale(c, "V", hk);
      std::vector<float> q(hd), acc(dv, 0.0f), s, vrow(dv);
      const float slope = a.alibi_slopes.empty() ? 0.0f : static_cast<float>(a.alibi_slopes[static_cast<std::size_t>(h)] / unit_exact);
      const float sink = static_cast<float>(a.sink(h));
      for (std::int64_t d = 0; d < hd; ++d) q[d] = static_cast<float>(decode(fq, load_code(fq, io.in.at("Q"), qv.offset(b, h, i, d))));
      // exp2: scores stay unscaled (the scale is folded into the exponent, log2_scale).
      auto score = [&](std::int64_t j) {
        float dot = 0.0f;
        for (std::int64_t d = 0; d < hd; ++d)
          dot = fz(std::fma(q[d], static_cast<float>(k_scale * decode(fk, load_code(fk, io.in.at("K"), kv.offset(b, hk, j, d)))), dot));
        float x = cap != 0 ? fz(std::tanh(fz(dot * scale_over_cap))) : dot;
        if (cap != 0 && !m_.exp2) x = fz(cap * x);
        else if (cap == 0 && !m_.exp2) x = fz(scale * x);
        return slope != 0.0f ? fz(std::fma(slope, static_cast<float>(alibi_distance(a, i, j)), x)) : x;
      };
      // exp(s - m) in the model's way: expf of the scaled difference, or FlashAttention-2's
      // exp2f(fmaf(s, c, -m c)) on unscaled scores.
      auto exp_of = [&](float s_j, float m_j) {
        return fz(m_.exp2 ? std::exp2(fz(std::fma(s_j, log2_scale, -fz(m_j * log2_scale)))) : std::exp(fz(s_j - m_j)));
      };
      auto v_at = [&](std::int64_t j, std::int64_t d) {
        return static_cast<float>(v_scale * decode(fv, load_code(fv, io.in.at("V"), vv.offset(b, hk, j, d))));
      };
      float l = 0.0f;
      float m = -std::numeric_limits<float>::infinity();
      if (m_.variant == AttentionModel::Variant::Naive) {
        std::vector<std::int64_t> keys;
        for (std::int64_t j = 0; j < a.seq_kv; ++j)
          if (attention_visible(c, b, i, j)) keys.push_back(j), s.push_back(score(j));
        for (float x : s) m = std::max(m, x);
        for (float& x : s) l += (x = exp_of(x, m));
        for (std::size_t t = 0; t < keys.size(); ++t)
          for (std::int64_t d = 0; d < dv; ++d) acc[d] = fz(std::fma(s[t], v_at(keys[t], d), acc[d]));
      } else {
        for (std::int64_t j0 = 0; j0 < a.seq_kv; j0 += m_.block) {
          std::vector<std::int64_t> keys;
          s.clear();
          for (std::int64_t j = j0; j < std::min(a.seq_kv, j0 + m_.block); ++j)
            if (attention_visible(c, b, i, j)) keys.push_back(j), s.push_back(score(j));
          if (keys.empty()) continue;
          float m_new = m;
          for (float x : s) m_new = std::max(m_new, x);
          if (m_.rescale && m_new > m && l > 0.0f) {  // the first block has nothing to rescale
            const float r = exp_of(m, m_new);
            l = fz(l * r);
            for (float& x : acc) x = fz(x * r);
          }
          m = m_new;
          for (std::size_t t = 0; t < keys.size(); ++t) {
            const float p = exp_of(s[t], m);
            l = fz(l + p);
            const float pv = m_.variant == AttentionModel::Variant::Flash ? fz(round_p(p, m_.p_format)) : p;
            for (std::int64_t d = 0; d < dv; ++d) acc[d] = fz(std::fma(pv, v_at(keys[t], d), acc[d]));
          }
        }
      }
      // The sink: a logit in the denominator only, taken into the max at the end.
      float m_logit = l > 0.0f ? (m_.exp2 ? m * unit : m) : -std::numeric_limits<float>::infinity();
      if (sink != -INFINITY) {
        const float top = std::max(m_logit, sink);
        const float r = l > 0.0f ? fz(std::exp(fz(m_logit - top))) : 0.0f;
        l = fz(fz(l * r) + fz(std::exp(fz(sink - top))));
        for (float& x : acc) x = fz(x * r);
        m_logit = top;
      }
      for (std::int64_t d = 0; d < dv; ++d) {
        const float o = l > 0.0f ? fz(acc[d] / l) : 0.0f;
        store_code(fo, io.out.at("O"), ov.offset(b, h, i, d),
                   encode(fo, o, Rounding::NearestEven, is_fp8(fo) ? Overflow::Saturate : Overflow::NoSaturate));
      }
      // The log-sum-exp, m + ln l in FP32 (-inf for a row without a key), where asked for.
      if (lse) lse[row] = l > 0.0f ? m_logit + std::log(l) : -std::numeric_limits<float>::infinity();
    }, threads_for(static_cast<double>(a.batch) * a.heads * a.seq_q * a.seq_kv * static_cast<double>(hd + dv), 0x1p16));
    notes["model"] = name();
  }

 private:
  AttentionModel m_;
};

}  // namespace

std::string AttentionModel::name() const {
  const std::string bug = std::string(exp2 ? ",exp2" : "") + (ftz ? ",ftz" : "") + (rescale ? "" : ",rescale=off");
  switch (variant) {
    case Variant::Naive: return ftz ? "cpu.attn_naive:ftz" : "cpu.attn_naive";
    case Variant::Online: return fmt::format("cpu.attn_online:block={}{}", block, bug);
    case Variant::Flash: return fmt::format("cpu.attn_flash:block={},p={}{}", block, ulpgate::name(p_format), bug);
  }
  return "";
}

std::optional<AttentionModel> AttentionModel::parse(const std::string& text) {
  const std::string base = model_name::base(text);
  AttentionModel m;
  if (base == "cpu.attn_naive") m.variant = Variant::Naive;
  else if (base == "cpu.attn_online") m.variant = Variant::Online;
  else if (base == "cpu.attn_flash") m.variant = Variant::Flash;
  else return std::nullopt;
  const bool blocked = m.variant != Variant::Naive;
  for (const model_name::Param& p : model_name::params(text)) {
    if (p.key == "block" && blocked) {
      m.block = model_name::integer(text, p, 1, 4096);
    } else if (p.key == "p" && m.variant == Variant::Flash) {
      const auto f = parse_format(p.value);
      if (!f || (*f != Format::FP16 && *f != Format::BF16))
        throw InputError(fmt::format("kernel '{}': p must be fp16 or bf16, got '{}'", text, p.value));
      m.p_format = *f;
    } else if (p.key == "exp2" && blocked && p.flag) {
      m.exp2 = true;
    } else if (p.key == "ftz" && p.flag) {
      m.ftz = true;
    } else if (p.key == "rescale" && blocked && (p.value == "on" || p.value == "off")) {
      m.rescale = p.value == "on";
    } else {
      throw InputError(fmt::format("kernel '{}': unknown parameter '{}'", text, p.text));
    }
  }
  return m;
}

std::unique_ptr<Kernel> make_emulated_attention(const AttentionModel& m) {
  return std::make_unique<EmulatedAttention>(m);
}

std::vector<AttentionModel> default_attention_models() {
  using V = AttentionModel::Variant;
  return {{V::Naive, 64, Format::FP16, true},
          {V::Online, 64, Format::FP16, true},
          {V::Flash, 64, Format::FP16, true},
          {V::Flash, 128, Format::BF16, true}};
}

}  // namespace ulpgate
