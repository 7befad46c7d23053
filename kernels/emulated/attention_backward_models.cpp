#include "kernels/emulated/attention_backward_models.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "kernels/emulated/model_name.hpp"

namespace ulpgate {
namespace {

class EmulatedAttentionBackward final : public Kernel {
 public:
  explicit EmulatedAttentionBackward(AttentionBackwardModel m) : m_(m) {}
  std::string name() const override { return m_.name(); }
  std::string description() const override {
    std::string d = m_.block == 0 ? std::string("CPU model: attention backward in FP32, P and dS in FP32")
                                  : fmt::format("CPU model: FlashAttention-2-style attention backward, {} keys per block, "
                                                "P and dS rounded to {}", m_.block, ulpgate::name(m_.p_format));
    if (m_.exp2) d += ", exp2 with log2 e folded in";
    if (m_.ftz) d += ", subnormals flushed to zero";
    if (m_.group_round) d += ", per-head dK and dV rounded before the group sum";
    return m_.no_d ? d + " (planted bug: dS without the D correction)" : d;
  }
  KernelTraits traits() const override {
    KernelTraits t;
    t.thread_safe = true;
    t.attention_variants = kAttnWindow;  // the keys are attention_visible()'s
    t.p_bits = info(m_.p_format).precision();
    t.flushes_subnormals = m_.ftz;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::AttentionBackward) return "attention backward models cover attention backward only";
    for (const char* op : {"Q", "K", "V", "O", "dO"})
      if (c.types.at(op) == Format::FP64) return "FP64 operands: the models compute in FP32";
    if (c.types.at("compute") != Format::FP32) return "the CPU models compute in fp32 (compute must be fp32)";
    if (m_.block != 0 && c.types.at("Q") != m_.p_format)
      return fmt::format("P and dS are rounded to {}, the inputs' format (Q is {})", ulpgate::name(m_.p_format),
                         ulpgate::name(c.types.at("Q")));
    if (m_.exp2 && !(c.attention.softmax_scale.value_or(1.0) > 0))
      return "exp2 with log2 e folded into the scale needs a positive softmax scale";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override;

 private:
  AttentionBackwardModel m_;
};

// One (batch, K/V head): its keys' dK and dV, and dQ of the query heads that read it.
struct HeadPass {
  const AttentionBackwardModel& m;
  const Case& c;
  const KernelIo& io;
  std::int64_t b, hk;

  float fz(float x) const { return m.ftz && std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; }
  float in(const char* op, std::int64_t h, std::int64_t s, std::int64_t d) const {
    const Format f = c.types.at(op);
    return static_cast<float>(decode(f, load_code(f, io.in.at(op), attention_view(c, op).offset(b, h, s, d))));
  }
  float round_to(Format f, float x) const { return f == Format::FP32 ? x : static_cast<float>(decode(f, encode(f, x))); }
  void store(const char* op, std::int64_t h, std::int64_t s, std::int64_t d, float x) const {
    const Format f = c.types.at(op);
    store_code(f, io.out.at(op), attention_view(c, op).offset(b, h, s, d),
               encode(f, x, Rounding::NearestEven, is_fp8(f) ? Overflow::Saturate : Overflow::NoSaturate));
  }

  void run() const {
    const AttentionShape& a = c.attention;
    const std::int64_t hd = a.head_dim, dv = a.eff_head_dim_v(), nq = a.seq_q, nk = a.seq_kv;
    const std::int64_t group = a.heads / a.eff_kv_heads(), h0 = hk * group;
    const double scale_exact = a.scale();
    const float scale = static_cast<float>(scale_exact), log2_scale = static_cast<float>(scale_exact * 1.4426950408889634);
    const auto* lse_in = static_cast<const float*>(io.in.at("LSE"));
    std::vector<float> k(nk * hd), v(nk * dv), q(group * nq * hd), dout(group * nq * dv), dsum(group * nq), lse(group * nq);
    for (std::int64_t j = 0; j < nk; ++j) {
      for (std::int64_t d = 0; d < hd; ++d) k[j * hd + d] = in("K", hk, j, d);
      for (std::int64_t d = 0; d < dv; ++d) v[j * dv + d] = in("V", hk, j, d);
    }
    for (std::int64_t g = 0; g < group; ++g)
      for (std::int64_t i = 0; i < nq; ++i) {
        const std::int64_t r = g * nq + i;
        for (std::int64_t d = 0; d < hd; ++d) q[r * hd + d] = in("Q", h0 + g, i, d);
        float dsum_r = 0.0f;  // D_i = dO_i . O_i with the stored O
        for (std::int64_t d = 0; d < dv; ++d) {
          dout[r * dv + d] = in("dO", h0 + g, i, d);
          dsum_r = fz(std::fma(dout[r * dv + d], in("O", h0 + g, i, d), dsum_r));
        }
        dsum[r] = dsum_r;
        lse[r] = lse_in[(b * a.heads + h0 + g) * nq + i];
      }
    std::vector<float> dq(group * nq * hd, 0.0f);
    const std::int64_t block = m.block == 0 ? nk : m.block;
    for (std::int64_t j0 = 0; j0 < nk; j0 += block) {
      const std::int64_t j1 = std::min(nk, j0 + block);
      // dK and dV of this block's keys: one accumulator, or one per query head (group_round)
      const std::int64_t parts = m.group_round ? group : 1;
      std::vector<float> dk(parts * (j1 - j0) * hd, 0.0f), dvacc(parts * (j1 - j0) * dv, 0.0f);
      for (std::int64_t g = 0; g < group; ++g)
        for (std::int64_t i = 0; i < nq; ++i) {
          const std::int64_t r = g * nq + i, part = m.group_round ? g : 0;
          for (std::int64_t j = j0; j < j1; ++j) {
            if (!attention_visible(c, b, i, j)) continue;
            float s = 0.0f;
            for (std::int64_t d = 0; d < hd; ++d) s = fz(std::fma(q[r * hd + d], k[j * hd + d], s));
            // +inf LSE (a row that sees no key, FlashAttention's convention) gives p = 0
            const float p = m.exp2 ? fz(std::exp2(fz(std::fma(s, log2_scale, -fz(lse[r] * 1.4426950408889634f)))))
                                   : fz(std::exp(fz(fz(s * scale) - lse[r])));
            const float p16 = fz(round_to(m.p_format, p));
            float dp = 0.0f;
            for (std::int64_t d = 0; d < dv; ++d) {
              float& acc = dvacc[(part * (j1 - j0) + j - j0) * dv + d];
              acc = fz(std::fma(p16, dout[r * dv + d], acc));
              dp = fz(std::fma(dout[r * dv + d], v[j * dv + d], dp));
            }
            const float ds = m.no_d ? fz(p * dp) : fz(p * fz(dp - dsum[r]));
            const float ds16 = fz(round_to(m.p_format, ds));
            for (std::int64_t d = 0; d < hd; ++d) {
              float& acc = dk[(part * (j1 - j0) + j - j0) * hd + d];
              acc = fz(std::fma(ds16, q[r * hd + d], acc));
              dq[r * hd + d] = fz(std::fma(ds16, k[j * hd + d], dq[r * hd + d]));
            }
          }
        }
      for (std::int64_t j = j0; j < j1; ++j) {
        for (std::int64_t d = 0; d < hd; ++d) {
          float sum = 0.0f;  // over the group's per-head parts, each rounded to dK's format (group_round)
          for (std::int64_t part = 0; part < parts; ++part) {
            const float x = fz(dk[(part * (j1 - j0) + j - j0) * hd + d] * scale);
            sum = fz(sum + (m.group_round ? round_to(c.types.at("dK"), x) : x));
          }
          store("dK", hk, j, d, sum);
        }
        for (std::int64_t d = 0; d < dv; ++d) {
          float sum = 0.0f;
          for (std::int64_t part = 0; part < parts; ++part) {
            const float x = dvacc[(part * (j1 - j0) + j - j0) * dv + d];
            sum = fz(sum + (m.group_round ? round_to(c.types.at("dV"), x) : x));
          }
          store("dV", hk, j, d, sum);
        }
      }
    }
    for (std::int64_t g = 0; g < group; ++g)
      for (std::int64_t i = 0; i < nq; ++i)
        for (std::int64_t d = 0; d < hd; ++d) store("dQ", h0 + g, i, d, fz(dq[(g * nq + i) * hd + d] * scale));
  }
};

void EmulatedAttentionBackward::run(const Case& c, const KernelIo& io, RunNotes& notes) {
  const AttentionShape& a = c.attention;
  parallel_for(a.batch * a.eff_kv_heads(), [&](std::int64_t bh) {
    HeadPass{m_, c, io, bh / a.eff_kv_heads(), bh % a.eff_kv_heads()}.run();
  }, threads_for(static_cast<double>(a.batch) * a.heads * a.seq_q * a.seq_kv * static_cast<double>(a.head_dim + a.eff_head_dim_v()),
                 0x1p16));
  notes["model"] = name();
}

}  // namespace

std::string AttentionBackwardModel::name() const {
  const std::string flags = std::string(exp2 ? ",exp2" : "") + (ftz ? ",ftz" : "") + (group_round ? ",group_round" : "") +
                            (no_d ? ",no_d" : "");
  if (block == 0) return "cpu.attn_bwd_naive" + (flags.empty() ? "" : ":" + flags.substr(1));
  return fmt::format("cpu.attn_bwd_flash:block={},p={}{}", block, ulpgate::name(p_format), flags);
}

std::optional<AttentionBackwardModel> AttentionBackwardModel::parse(const std::string& text) {
  const std::string base = model_name::base(text);
  AttentionBackwardModel m;
  if (base == "cpu.attn_bwd_flash") m.block = 64, m.p_format = Format::FP16;
  else if (base != "cpu.attn_bwd_naive") return std::nullopt;
  const bool flash = m.block != 0;
  for (const model_name::Param& p : model_name::params(text)) {
    if (p.key == "block" && flash) {
      m.block = model_name::integer(text, p, 1, 4096);
    } else if (p.key == "p" && flash) {
      const auto f = parse_format(p.value);
      if (!f || (*f != Format::FP16 && *f != Format::BF16))
        throw InputError(fmt::format("kernel '{}': p must be fp16 or bf16, got '{}'", text, p.value));
      m.p_format = *f;
    } else if (p.flag && p.key == "exp2") {
      m.exp2 = true;
    } else if (p.flag && p.key == "ftz") {
      m.ftz = true;
    } else if (p.flag && p.key == "group_round") {
      m.group_round = true;
    } else if (p.flag && p.key == "no_d") {
      m.no_d = true;
    } else {
      throw InputError(fmt::format("kernel '{}': unknown parameter '{}'", text, p.text));
    }
  }
  return m;
}

std::unique_ptr<Kernel> make_emulated_attention_backward(const AttentionBackwardModel& m) {
  return std::make_unique<EmulatedAttentionBackward>(m);
}

std::vector<AttentionBackwardModel> default_attention_backward_models() {
  AttentionBackwardModel naive, fp16, bf16;
  fp16.block = 64, fp16.p_format = Format::FP16;
  bf16.block = 128, bf16.p_format = Format::BF16, bf16.exp2 = true;
  return {naive, fp16, bf16};
}

}  // namespace ulpgate
