#include "kernels/attention/naive.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "kernels/attention/naive_passes.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"

namespace ulpgate {
namespace {

attn::FormatCode code(Format f) {
  switch (f) {
    case Format::TF32: return attn::kTf32;
    case Format::FP16: return attn::kFp16;
    case Format::BF16: return attn::kBf16;
    case Format::E4M3: return attn::kE4m3;
    case Format::E5M2: return attn::kE5m2;
    default: return attn::kFp32;
  }
}

attn::Operand operand(const Case& c, const std::string& name) {
  const AttentionView v = attention_view(c, name);
  attn::Operand o;
  o.format = code(c.types.at(name));
  o.batch = v.batch, o.heads = v.heads, o.seq = v.seq, o.dim = v.dim;
  o.bshd = v.layout == AttentionLayout::BSHD;
  return o;
}

enum class Variant { Naive, Online, OnlineNoRescale };

class CudaAttention final : public Kernel {
 public:
  explicit CudaAttention(Variant v) : v_(v) {}
  std::string name() const override {
    return v_ == Variant::Naive ? "cuda.attn_naive" : v_ == Variant::Online ? "cuda.attn_online" : "planted.cuda_attn_online_no_rescale";
  }
  std::string description() const override {
    if (v_ == Variant::Naive)
      return "CUDA: three-pass attention (scores, row softmax, P V) with FP32 intermediates in global memory";
    return std::string("CUDA: online-softmax attention, a warp per query row, keys in blocks of 32, FP32") +
           (v_ == Variant::OnlineNoRescale ? " (planted bug: no rescale when the max grows)" : "");
  }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, true};
    t.thread_safe = true;  // all work on io.stream
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Attention) return std::string("attention only");
    for (const char* op : {"Q", "K", "V", "O"})
      if (c.types.at(op) == Format::FP64) return std::string("FP64 operands: this kernel computes in FP32");
    if (c.types.at("O") == Format::TF32) return std::string("O in TF32: not an output format here");
    if (c.types.at("compute") != Format::FP32) return std::string("compute must be fp32");
    for (const auto& [op, s] : c.scales)
      if (s != 1.0) return fmt::format("scale {} is not applied by this kernel", op);
    const AttentionShape& a = c.attention;
    if (v_ == Variant::Naive && a.batch * a.heads * a.seq_q * a.seq_kv > (std::int64_t{1} << 31))
      return std::string("the score matrix would pass 2^31 elements (8 GB)");
    if (v_ != Variant::Naive && a.eff_head_dim_v() > attn::kOnlineMaxHeadDimV)
      return fmt::format("head_dim_v {} > {}", a.eff_head_dim_v(), attn::kOnlineMaxHeadDimV);
    if (v_ != Variant::Naive && a.head_dim > 8192) return fmt::format("head_dim {} > 8192 (shared memory)", a.head_dim);
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const AttentionShape& a = c.attention;
    const auto stream = static_cast<cudaStream_t>(io.stream);
    attn::Shape s{a.batch, a.heads, a.seq_q, a.seq_kv, a.head_dim, a.eff_head_dim_v(), a.heads / a.eff_kv_heads(), a.causal,
            static_cast<float>(a.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(a.head_dim)))), nullptr};
    attn::Operand q = operand(c, "Q"), k = operand(c, "K"), v = operand(c, "V"), o = operand(c, "O");
    q.p = io.in.at("Q"), k.p = io.in.at("K"), v.p = io.in.at("V"), o.out = io.out.at("O");
    DeviceBuffer lengths;
    if (!a.kv_lengths.empty()) {
      lengths = DeviceBuffer(a.kv_lengths.size() * sizeof(long long), io.stream);
      ULPGATE_CHECK(cudaMemcpyAsync(lengths.get(), a.kv_lengths.data(), a.kv_lengths.size() * sizeof(long long),
                                    cudaMemcpyHostToDevice, stream));
      s.kv_lengths = static_cast<const long long*>(lengths.get());
    }
    if (v_ != Variant::Naive) {
      ULPGATE_CHECK(attn::online_attention(s, q, k, v, o, v_ == Variant::Online, stream));
      device_synchronize(io.stream);
      notes["kernel"] = "online softmax, a warp per query row, 32 keys per block";
      return;
    }
    const long long rows = a.batch * a.heads * a.seq_q;
    DeviceBuffer S(static_cast<std::size_t>(rows * a.seq_kv) * sizeof(float), io.stream);
    DeviceBuffer l(static_cast<std::size_t>(rows) * sizeof(float), io.stream);
    ULPGATE_CHECK(attn::naive_attention(s, q, k, v, o, static_cast<float*>(S.get()), static_cast<float*>(l.get()), stream));
    device_synchronize(io.stream);  // the buffers above are freed on return
    notes["kernel"] = "three passes, FP32 scores and probabilities in global memory";
  }

 private:
  Variant v_;
};

}  // namespace

std::vector<std::unique_ptr<Kernel>> make_attention_kernels() {
  std::vector<std::unique_ptr<Kernel>> out;
  out.push_back(std::make_unique<CudaAttention>(Variant::Naive));
  out.push_back(std::make_unique<CudaAttention>(Variant::Online));
  return out;
}

std::unique_ptr<Kernel> make_planted_online_no_rescale() { return std::make_unique<CudaAttention>(Variant::OnlineNoRescale); }

}  // namespace ulpgate
