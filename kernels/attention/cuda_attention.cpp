#include "kernels/attention/cuda_attention.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "kernels/attention/launch.hpp"
#if ULPGATE_HAVE_CUDNN
#include "kernels/attention/cudnn_sdpa.hpp"
#endif
#include "kernels/attention/case_operands.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"

namespace ulpgate {
namespace {

using attn::operand;

enum class Variant { Naive, NaiveNoMax, Online, OnlineNoRescale, FlashFp16, FlashBf16, FlashNoRescale, CudnnFp16, CudnnBf16 };

class CudaAttention final : public Kernel {
 public:
  explicit CudaAttention(Variant v) : v_(v) {}
  bool naive() const { return v_ == Variant::Naive || v_ == Variant::NaiveNoMax; }
  bool flash() const { return v_ == Variant::FlashFp16 || v_ == Variant::FlashBf16 || v_ == Variant::FlashNoRescale; }
  Format flash_input() const { return v_ == Variant::FlashBf16 ? Format::BF16 : Format::FP16; }
  std::string name() const override {
    switch (v_) {
      case Variant::Naive: return "cuda.attn_naive";
      case Variant::Online: return "cuda.attn_online";
      case Variant::NaiveNoMax: return "planted.cuda_attn_naive_no_max";
      case Variant::OnlineNoRescale: return "planted.cuda_attn_online_no_rescale";
      case Variant::FlashFp16: return "cuda.attn_flash.fp16";
      case Variant::FlashBf16: return "cuda.attn_flash.bf16";
      case Variant::FlashNoRescale: return "planted.cuda_attn_flash_no_rescale";
      case Variant::CudnnFp16: return "cudnn.sdpa.fp16";
      case Variant::CudnnBf16: return "cudnn.sdpa.bf16";
    }
    return "";
  }
  bool cudnn() const { return v_ == Variant::CudnnFp16 || v_ == Variant::CudnnBf16; }
  std::string description() const override {
    if (cudnn())
      return fmt::format("cuDNN fused attention (backend graph API: Q K^T, scale, masks, softmax, P V; the engine of "
                         "heuristics mode A), {} inputs", v_ == Variant::CudnnBf16 ? "bf16" : "fp16");
    if (flash())
      return fmt::format("CUDA: FlashAttention-2 style, {} tensor cores (mma.sync m16n8k16, FP32 accumulation), 128 query "
                         "rows x 64-key tiles, P rounded to {} before P V; head_dim 64 or 128{}",
                         ulpgate::name(flash_input()), ulpgate::name(flash_input()),
                         v_ == Variant::FlashNoRescale ? " (planted bug: no rescale when the max grows)" : "");
    if (naive())
      return std::string("CUDA: three-pass attention (scores, row softmax, P V) with FP32 intermediates in global memory") +
             (v_ == Variant::NaiveNoMax ? " (planted bug: softmax without subtracting the row's max)" : "");
    return std::string("CUDA: online-softmax attention, a warp per query row, keys in blocks of 32, FP32") +
           (v_ == Variant::OnlineNoRescale ? " (planted bug: no rescale when the max grows)" : "");
  }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, true};
    t.thread_safe = true;  // all work on io.stream
    t.writes_lse = true;
    t.p_bits = flash() ? info(flash_input()).frac_bits + 1 : 24;  // FP16 11, BF16 8; naive, online: FP32 P
    if (cudnn()) t.p_bits = v_ == Variant::CudnnBf16 ? 8 : 11;   // P in the input type (the graph's P tensor)
    // cuDNN's fused engine flushes FP32 subnormal results (H200, cuDNN 9.19: BF16 O
    // exact -0x1.04p-126 and 0x1.6p-129 came back as zeros; Evaluate.DeclaredSubnormalFlushing-
    // CoversAttentionOutputs): the underflow allowance per operation is FP32's smallest normal.
    if (cudnn()) t.flushes_subnormals = true;
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
    if (cudnn()) {
      const Format in = v_ == Variant::CudnnBf16 ? Format::BF16 : Format::FP16;
      for (const char* op : {"Q", "K", "V", "O"})
        if (c.types.at(op) != in) return fmt::format("{} must be {} for this kernel, got {}", op, ulpgate::name(in), ulpgate::name(c.types.at(op)));
      if (a.head_dim != a.eff_head_dim_v() || a.head_dim % 8 != 0 || a.head_dim > 256)
        return fmt::format("head_dim {} (head_dim_v {}): equal, a multiple of 8, at most 256", a.head_dim, a.eff_head_dim_v());
      if (a.causal && a.seq_q != a.seq_kv) return std::string("causal with seq_q != seq_kv: the graph's mask is top-left aligned");
      // Said here, not only at run time (where it is a failed run): a batch without keys,
      // given or made by the masked(...) family when the inputs are filled (it empties at
      // least one batch: distributions/fill.cpp).
      for (const std::int64_t len : a.kv_lengths)
        if (len == 0) return std::string("a batch without keys: cuDNN leaves its rows undefined");
      for (const auto& [op, dist] : c.dist)
        if (dist.rfind("masked", 0) == 0)
          return fmt::format("{} {} empties a batch's keys: cuDNN leaves its rows undefined", op, dist);
      return std::nullopt;
    }
    if (flash()) {
      for (const char* op : {"Q", "K", "V"})
        if (c.types.at(op) != flash_input())
          return fmt::format("{} must be {} for this kernel, got {}", op, ulpgate::name(flash_input()), ulpgate::name(c.types.at(op)));
      const Format out = c.types.at("O");
      if (out != Format::FP32 && out != Format::FP16 && out != Format::BF16)
        return fmt::format("O must be fp32, fp16 or bf16, got {}", ulpgate::name(out));
      if (a.head_dim != a.eff_head_dim_v() || (a.head_dim != 64 && a.head_dim != 128))
        return fmt::format("head_dim {} (head_dim_v {}): only 64 and 128, equal", a.head_dim, a.eff_head_dim_v());
      if (a.batch * a.heads > 65535) return std::string("batch x heads > 65535");
    }
    if (naive() && a.batch * a.heads * a.seq_q * a.seq_kv > (std::int64_t{1} << 31))
      return std::string("the score matrix would pass 2^31 elements (8 GB)");
    if (!naive() && a.eff_head_dim_v() > attn::kOnlineMaxHeadDimV)
      return fmt::format("head_dim_v {} > {}", a.eff_head_dim_v(), attn::kOnlineMaxHeadDimV);
    if (!naive() && a.head_dim > 8192) return fmt::format("head_dim {} > 8192 (shared memory)", a.head_dim);
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const AttentionShape& a = c.attention;
    const auto stream = static_cast<cudaStream_t>(io.stream);
    attn::Shape s{a.batch, a.heads, a.seq_q, a.seq_kv, a.head_dim, a.eff_head_dim_v(), a.heads / a.eff_kv_heads(), a.causal,
            static_cast<float>(a.scale()), nullptr};
    attn::Operand q = operand(c, "Q"), k = operand(c, "K"), v = operand(c, "V"), o = operand(c, "O");
    q.p = io.in.at("Q"), k.p = io.in.at("K"), v.p = io.in.at("V"), o.out = io.out.at("O");
    if (io.out.count("LSE")) s.lse = static_cast<float*>(io.out.at("LSE"));
    DeviceBuffer lengths;
    if (!a.kv_lengths.empty()) {
      lengths = DeviceBuffer(a.kv_lengths.size() * sizeof(long long), io.stream);
      ULPGATE_CHECK(cudaMemcpyAsync(lengths.get(), a.kv_lengths.data(), a.kv_lengths.size() * sizeof(long long),
                                    cudaMemcpyHostToDevice, stream));
      s.kv_lengths = static_cast<const long long*>(lengths.get());
    }
    if (cudnn()) {
#if ULPGATE_HAVE_CUDNN
      attn::SdpaShape sh;
      sh.bf16 = v_ == Variant::CudnnBf16;
      sh.batch = a.batch, sh.heads = a.heads, sh.kv_heads = a.eff_kv_heads(), sh.seq_q = a.seq_q, sh.seq_kv = a.seq_kv;
      sh.head_dim = a.head_dim, sh.causal = a.causal, sh.bshd = a.layout == AttentionLayout::BSHD, sh.scale = s.scale;
      sh.stats = s.lse != nullptr;
      DeviceBuffer lq, lkv;
      if (!a.kv_lengths.empty()) {
        std::vector<int> qs(a.kv_lengths.size(), static_cast<int>(a.seq_q)), ks;
        for (const std::int64_t len : a.kv_lengths) {
          if (len == 0) throw KernelUnsupported("a batch without keys: cuDNN leaves its rows undefined");
          ks.push_back(static_cast<int>(std::min(len, a.seq_kv)));
        }
        lq = DeviceBuffer(qs.size() * sizeof(int), io.stream), lkv = DeviceBuffer(ks.size() * sizeof(int), io.stream);
        copy_to_device(lq.get(), qs.data(), qs.size() * sizeof(int), io.stream);
        copy_to_device(lkv.get(), ks.data(), ks.size() * sizeof(int), io.stream);
        sh.padded = true;
      }
      notes["engine"] = attn::cudnn_sdpa(sh, io.in.at("Q"), io.in.at("K"), io.in.at("V"), io.out.at("O"), s.lse,
                                         static_cast<const int*>(lq.get()), static_cast<const int*>(lkv.get()), io.stream);
      notes["cudnn"] = attn::cudnn_version();
      return;
#else
      throw KernelUnsupported("this build has no cuDNN");
#endif
    }
    if (flash()) {
      ULPGATE_CHECK(attn::flash_attention(s, q, k, v, o, v_ != Variant::FlashNoRescale, stream));
      device_synchronize(io.stream);
      notes["kernel"] = "flash: 128 query rows (4 warps x 32) x 64-key tiles, K/V double-buffered by cp.async, ldmatrix, mma.sync m16n8k16";
      return;
    }
    if (!naive()) {
      ULPGATE_CHECK(attn::online_attention(s, q, k, v, o, v_ == Variant::Online, stream));
      device_synchronize(io.stream);
      notes["kernel"] = "online softmax, a warp per query row, 32 keys per block";
      return;
    }
    const long long rows = a.batch * a.heads * a.seq_q;
    DeviceBuffer S(static_cast<std::size_t>(rows * a.seq_kv) * sizeof(float), io.stream);
    DeviceBuffer l(static_cast<std::size_t>(rows) * sizeof(float), io.stream);
    ULPGATE_CHECK(attn::naive_attention(s, q, k, v, o, static_cast<float*>(S.get()), static_cast<float*>(l.get()),
                                        v_ != Variant::NaiveNoMax, stream));
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
  out.push_back(std::make_unique<CudaAttention>(Variant::FlashFp16));
  out.push_back(std::make_unique<CudaAttention>(Variant::FlashBf16));
#if ULPGATE_HAVE_CUDNN
  out.push_back(std::make_unique<CudaAttention>(Variant::CudnnFp16));
  out.push_back(std::make_unique<CudaAttention>(Variant::CudnnBf16));
#endif
  return out;
}

std::unique_ptr<Kernel> make_planted_naive_no_max() { return std::make_unique<CudaAttention>(Variant::NaiveNoMax); }
std::unique_ptr<Kernel> make_planted_online_no_rescale() { return std::make_unique<CudaAttention>(Variant::OnlineNoRescale); }
std::unique_ptr<Kernel> make_planted_flash_no_rescale() { return std::make_unique<CudaAttention>(Variant::FlashNoRescale); }

}  // namespace ulpgate
