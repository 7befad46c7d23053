#include "kernels/attention/attention_combine.hpp"

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "kernels/attention/case_operands.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"

namespace ulpgate {
namespace {

class CudaAttentionCombine final : public Kernel {
 public:
  explicit CudaAttentionCombine(Format part) : part_(part) {}
  std::string name() const override { return fmt::format("cuda.attn_combine.{}", ulpgate::name(part_)); }
  std::string description() const override {
    return fmt::format("CUDA: split-KV combine of {} partial outputs, FP32 SIMT (a block per query row and 256 columns; "
                       "max of the LSE_s, w_s = exp(LSE_s - max) in shared memory, each column's sum w_s O_s in split "
                       "order by FMA, divided by sum w_s; LSE = max + log sum w_s)", ulpgate::name(part_));
  }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, true};
    t.thread_safe = true;  // all work on io.stream
    t.writes_lse = true;
    t.rounds_to_nearest = true;  // FP32 FMA and IEEE division, one RNE rounding to O's format
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::AttentionCombine) return std::string("attention_combine only");
    if (c.types.at("O_part") != part_)
      return fmt::format("O_part must be {} for this kernel, got {}", ulpgate::name(part_), ulpgate::name(c.types.at("O_part")));
    if (const Format o = c.types.at("O"); o != Format::FP32 && o != part_)
      return fmt::format("O must be fp32 or {}, got {}", ulpgate::name(part_), ulpgate::name(o));
    for (const char* op : {"LSE_part", "LSE"})
      if (c.types.count(op) && c.types.at(op) != Format::FP32) return fmt::format("{} must be fp32", op);
    if (c.types.at("compute") != Format::FP32) return std::string("compute must be fp32");
    for (const auto& [op, s] : c.scales)
      if (s != 1.0) return fmt::format("scale {} is not applied by this kernel", op);
    const AttentionShape& a = c.attention;
    if (a.batch * a.heads * a.seq_q >= (std::int64_t{1} << 31)) return std::string("batch x heads x seq_q >= 2^31 (a block per row)");
    if (!cuda_device_available()) return std::string(kNeedsCudaDevice);
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    attn::Operand part = attn::operand(c, "O_part"), o = attn::operand(c, "O");
    part.p = io.in.at("O_part"), o.out = io.out.at("O");
    float* lse = io.out.count("LSE") ? static_cast<float*>(io.out.at("LSE")) : nullptr;
    ULPGATE_CHECK(attn::combine_attention_states(part, static_cast<const float*>(io.in.at("LSE_part")), o, lse,
                                                 c.attention.splits, c.attention.lse_base2, static_cast<cudaStream_t>(io.stream)));
    device_synchronize(io.stream);
    notes["kernel"] = "combine: a block per query row and 256 columns, 256 splits' weights at a time in shared memory";
  }

 private:
  Format part_;
};

}  // namespace

std::vector<std::unique_ptr<Kernel>> make_attention_combine_kernels() {
  std::vector<std::unique_ptr<Kernel>> out;
  for (const Format f : {Format::FP32, Format::FP16, Format::BF16}) out.push_back(std::make_unique<CudaAttentionCombine>(f));
  return out;
}

}  // namespace ulpgate
