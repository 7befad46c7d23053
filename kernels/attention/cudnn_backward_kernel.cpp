#include "kernels/attention/cudnn_backward_kernel.hpp"

#if ULPGATE_HAVE_CUDNN
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/attention/cudnn_sdpa.hpp"
#include "kernels/device.hpp"
#endif

namespace ulpgate {

#if ULPGATE_HAVE_CUDNN
namespace {

class CudnnAttentionBackward final : public Kernel {
 public:
  CudnnAttentionBackward(Format in, bool deterministic) : in_(in), det_(deterministic) {}
  std::string name() const override {
    return fmt::format("cudnn.sdpa_bwd.{}{}", ulpgate::name(in_), det_ ? ".det" : "");
  }
  std::string description() const override {
    const std::string in(ulpgate::name(in_));
    return fmt::format("cuDNN fused flash-attention backward (backend graph API, the frontend's SDPA backward graph: "
                       "D = rowsum(dO o O), P = exp(S - LSE), dV = P^T dO, dS = P o (dP - D), dK = dS^T Q, dQ = dS K; the "
                       "engine of heuristics mode A), {} inputs, P and dS rounded to {}, dQ {}",
                       in, in, det_ ? "without the FP32 accumulator (the deterministic algorithm)" : "added into an FP32 accumulator by atomics");
  }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, true};
    t.thread_safe = true;  // all work on io.stream
    t.p_bits = info(in_).precision();  // P and dS: the graph's views of them in the I/O type
    if (!det_) t.deterministic = false, t.atomic_dq = true;
    t.flushes_subnormals = true;  // as cuDNN's fused forward (measured there on the H200)
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::AttentionBackward) return std::string("attention backward only");
    for (const char* op : {"Q", "K", "V", "O", "dO", "dQ", "dK", "dV"})
      if (c.types.at(op) != in_)
        return fmt::format("{} must be {} for this kernel, got {}", op, ulpgate::name(in_), ulpgate::name(c.types.at(op)));
    if (!c.types.count("LSE") || c.types.at("LSE") != Format::FP32) return std::string("LSE must be fp32 (cuDNN's softmax stats)");
    if (c.types.at("compute") != Format::FP32) return std::string("compute must be fp32");
    for (const auto& [op, s] : c.scales)
      if (s != 1.0) return fmt::format("scale {} is not applied by this kernel", op);
    const AttentionShape& a = c.attention;
    if (a.head_dim != a.eff_head_dim_v() || a.head_dim % 8 != 0 || a.head_dim > 256)
      return fmt::format("head_dim {} (head_dim_v {}): equal, a multiple of 8, at most 256", a.head_dim, a.eff_head_dim_v());
    if (a.seq_q == 1 && a.seq_kv == 1) return std::string("seq_q = seq_kv = 1: cuDNN's SDPA backward refuses it");
    if (a.causal && a.seq_q > a.seq_kv)
      return std::string("causal with seq_q > seq_kv: cuDNN's bottom-right causal mask needs seq_q <= seq_kv");
    if (a.causal && std::any_of(a.kv_lengths.begin(), a.kv_lengths.end(), [&](std::int64_t n) { return n != a.seq_kv; }))
      return std::string("causal with kv_lengths below seq_kv: cuDNN's backward aligns the causal diagonal to each batch's "
                         "own length, the case to seq_kv");
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const AttentionShape& a = c.attention;
    attn::SdpaBackwardShape sh;
    sh.bf16 = in_ == Format::BF16;
    sh.batch = a.batch, sh.heads = a.heads, sh.kv_heads = a.eff_kv_heads(), sh.seq_q = a.seq_q, sh.seq_kv = a.seq_kv;
    sh.head_dim = a.head_dim, sh.causal = a.causal, sh.bshd = a.layout == AttentionLayout::BSHD;
    sh.deterministic = det_, sh.scale = static_cast<float>(a.scale());
    DeviceBuffer lq, lkv;
    if (!a.kv_lengths.empty()) {
      // A batch of length 0 runs too: its rows' LSE is +inf, and what cuDNN makes of them
      // is for the check to say.
      std::vector<int> qs(a.kv_lengths.size(), static_cast<int>(a.seq_q)), ks;
      for (const std::int64_t len : a.kv_lengths) ks.push_back(static_cast<int>(std::min(len, a.seq_kv)));
      lq = DeviceBuffer(qs.size() * sizeof(int), io.stream), lkv = DeviceBuffer(ks.size() * sizeof(int), io.stream);
      copy_to_device(lq.get(), qs.data(), qs.size() * sizeof(int), io.stream);
      copy_to_device(lkv.get(), ks.data(), ks.size() * sizeof(int), io.stream);
      sh.padded = true;
    }
    // cuDNN writes no gradient of a key past its batch's length (a batch of length 0: none
    // of dK, dV): zero them first, as a caller must.
    if (sh.padded)
      for (const char* g : {"dK", "dV"})
        device_memset(io.out.at(g), 0, static_cast<std::size_t>(operand_elements(c, g)) * 2, io.stream);
    notes["engine"] = attn::cudnn_sdpa_backward(sh, io.in.at("Q"), io.in.at("K"), io.in.at("V"), io.in.at("O"), io.in.at("dO"),
                                                static_cast<const float*>(io.in.at("LSE")), io.out.at("dQ"), io.out.at("dK"),
                                                io.out.at("dV"), static_cast<const int*>(lq.get()), static_cast<const int*>(lkv.get()),
                                                io.stream);
    notes["cudnn"] = attn::cudnn_version();
    notes["kernel"] = det_ ? "cuDNN SDPA backward, deterministic: dQ = dS K straight into dQ (dP workspace)"
                           : "cuDNN SDPA backward: dQ = dS K into an FP32 accumulator, then converted";
  }

 private:
  Format in_;
  bool det_;
};

}  // namespace
#endif

std::vector<std::unique_ptr<Kernel>> make_cudnn_attention_backward_kernels() {
  std::vector<std::unique_ptr<Kernel>> out;
#if ULPGATE_HAVE_CUDNN
  for (const bool det : {false, true})
    for (const Format in : {Format::FP16, Format::BF16}) out.push_back(std::make_unique<CudnnAttentionBackward>(in, det));
#endif
  return out;
}

}  // namespace ulpgate
