#include "kernels/emulated/attention_combine_models.hpp"

#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "kernels/emulated/model_name.hpp"

namespace ulpgate {
namespace {

bool row_format(Format f) { return f == Format::FP32 || f == Format::FP16 || f == Format::BF16; }

class EmulatedAttentionCombine final : public Kernel {
 public:
  explicit EmulatedAttentionCombine(AttentionCombineModel m) : m_(m) {}
  std::string name() const override { return m_.name(); }
  std::string description() const override {
    std::string d = "CPU model: split-KV combine in FP32 (w_s = exp(LSE_s - max), O = sum w_s O_s / sum w_s, "
                    "LSE = max + log sum w_s; empty splits skipped)";
    std::vector<std::string> bugs;
    if (m_.no_empty_guard) bugs.emplace_back("empty splits not skipped");
    if (m_.wrong_base) bugs.emplace_back("the other base's exp and log");
    if (m_.no_max_shift) bugs.emplace_back("exp(LSE_s) without the max subtracted");
    if (m_.no_normalize) bugs.emplace_back("O not divided by the weights' sum");
    if (m_.bhsd_store) bugs.emplace_back("O stored at bhsd offsets whatever the layout");
    if (m_.drop_last) bugs.emplace_back("the last split left out");
    return bugs.empty() ? d : fmt::format("{} (planted bug: {})", d, fmt::join(bugs, "; "));
  }
  KernelTraits traits() const override {
    KernelTraits t;
    t.thread_safe = true;
    t.writes_lse = true;
    t.rounds_to_nearest = true;  // FP32 arithmetic, one RNE rounding to O's format
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::AttentionCombine) return "attention combine models cover attention_combine only";
    for (const char* op : {"O_part", "O"})
      if (!row_format(c.types.at(op)))
        return fmt::format("{} in {}: the models read and write fp32, fp16 or bf16 rows", op, ulpgate::name(c.types.at(op)));
    for (const char* op : {"LSE_part", "LSE"})
      if (c.types.count(op) && c.types.at(op) != Format::FP32) return fmt::format("{} must be fp32", op);
    if (c.types.at("compute") != Format::FP32) return "the CPU models compute in fp32 (compute must be fp32)";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override;

 private:
  AttentionCombineModel m_;
};

void EmulatedAttentionCombine::run(const Case& c, const KernelIo& io, RunNotes& notes) {
  const AttentionShape& a = c.attention;
  const AttentionView pv = attention_view(c, "O_part"), lpv = attention_view(c, "LSE_part"), lv = attention_view(c, "LSE");
  AttentionView ov = attention_view(c, "O");
  if (m_.bhsd_store) ov.layout = AttentionLayout::BHSD;
  const Format fp = c.types.at("O_part"), fo = c.types.at("O");
  const void* part = io.in.at("O_part");
  const auto* lse_part = static_cast<const float*>(io.in.at("LSE_part"));
  float* lse = io.out.count("LSE") ? static_cast<float*>(io.out.at("LSE")) : nullptr;
  const bool base2 = a.lse_base2 != m_.wrong_base;
  const auto exp_of = [base2](float x) { return base2 ? std::exp2(x) : std::exp(x); };
  const auto log_of = [base2](float x) { return base2 ? std::log2(x) : std::log(x); };
  const std::int64_t splits = m_.drop_last ? a.splits - 1 : a.splits, hd = a.head_dim;
  const float inf = std::numeric_limits<float>::infinity();
  parallel_for(a.batch * a.heads * a.seq_q, [&](std::int64_t row) {
    const std::int64_t i = row % a.seq_q, h = (row / a.seq_q) % a.heads, b = row / (a.seq_q * a.heads);
    const auto lse_of = [&](std::int64_t s) { return lse_part[lpv.offset(s * a.batch + b, h, i, 0)]; };
    const auto skipped = [&](float x) { return x == -inf && !m_.no_empty_guard; };
    // The max over the non-empty splits (fmax: a NaN LSE_s leaves it, as CUDA's fmaxf does).
    float m = -inf;
    bool any = false;
    for (std::int64_t s = 0; s < splits; ++s)
      if (const float x = lse_of(s); !skipped(x)) any = true, m = std::fmax(m, x);
    const float shift = m_.no_max_shift ? 0.0f : m;
    float l = 0.0f;
    std::vector<float> acc(static_cast<std::size_t>(hd), 0.0f);
    for (std::int64_t s = 0; s < splits && any; ++s) {
      const float x = lse_of(s);
      if (skipped(x)) continue;  // its O_s may be garbage: never read
      const float w = exp_of(x - shift);
      l += w;
      for (std::int64_t d = 0; d < hd; ++d) {
        const float o = static_cast<float>(decode(fp, load_code(fp, part, pv.offset(s * a.batch + b, h, i, d))));
        acc[d] = std::fma(w, o, acc[d]);
      }
    }
    for (std::int64_t d = 0; d < hd; ++d) {
      const float o = !any ? 0.0f : m_.no_normalize ? acc[d] : acc[d] / l;
      store_code(fo, io.out.at("O"), ov.offset(b, h, i, d), encode(fo, o, Rounding::NearestEven));
    }
    if (lse) lse[lv.offset(b, h, i, 0)] = any ? shift + log_of(l) : -inf;
  }, threads_for(static_cast<double>(a.batch) * a.heads * a.seq_q * a.splits * static_cast<double>(hd + 1), 0x1p16));
  notes["model"] = name();
}

}  // namespace

std::string AttentionCombineModel::name() const {
  std::vector<std::string_view> flags;
  for (const auto& [on, flag] : {std::pair{no_empty_guard, "no_empty_guard"}, {wrong_base, "wrong_base"},
                                 {no_max_shift, "no_max_shift"}, {no_normalize, "no_normalize"}, {bhsd_store, "bhsd_store"},
                                 {drop_last, "drop_last"}})
    if (on) flags.emplace_back(flag);
  return flags.empty() ? std::string("cpu.attn_combine") : fmt::format("cpu.attn_combine:{}", fmt::join(flags, ","));
}

std::optional<AttentionCombineModel> AttentionCombineModel::parse(const std::string& text) {
  if (model_name::base(text) != "cpu.attn_combine") return std::nullopt;
  AttentionCombineModel m;
  for (const model_name::Param& p : model_name::params(text)) {
    bool* flag = !p.flag                        ? nullptr
                 : p.key == "no_empty_guard"   ? &m.no_empty_guard
                 : p.key == "wrong_base"       ? &m.wrong_base
                 : p.key == "no_max_shift"     ? &m.no_max_shift
                 : p.key == "no_normalize"     ? &m.no_normalize
                 : p.key == "bhsd_store"       ? &m.bhsd_store
                 : p.key == "drop_last"        ? &m.drop_last
                                               : nullptr;
    if (!flag) throw InputError(fmt::format("kernel '{}': unknown parameter '{}'", text, p.text));
    *flag = true;
  }
  return m;
}

std::unique_ptr<Kernel> make_emulated_attention_combine(const AttentionCombineModel& m) {
  return std::make_unique<EmulatedAttentionCombine>(m);
}

std::vector<AttentionCombineModel> default_attention_combine_models() { return {AttentionCombineModel{}}; }

}  // namespace ulpgate
