#include "kernels/attention/attention_backward.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "kernels/attention/case_operands.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"

namespace ulpgate {
namespace {

using attn::operand;

enum class Variant { Naive, FlashFp16, FlashBf16, FlashFp16Det, FlashBf16Det, FlashNoD };

// The largest dQ workspace of a deterministic flash run (one FP32 partial per key block).
constexpr std::int64_t kMaxDetWorkspaceBytes = std::int64_t{4} << 30;

class CudaAttentionBackward final : public Kernel {
 public:
  explicit CudaAttentionBackward(Variant v) : v_(v) {}
  bool flash() const { return v_ != Variant::Naive; }
  bool det() const { return v_ == Variant::FlashFp16Det || v_ == Variant::FlashBf16Det; }
  Format flash_input() const { return v_ == Variant::FlashBf16 || v_ == Variant::FlashBf16Det ? Format::BF16 : Format::FP16; }
  std::string name() const override {
    switch (v_) {
      case Variant::Naive: return "cuda.attn_bwd_naive";
      case Variant::FlashFp16: return "cuda.attn_bwd_flash.fp16";
      case Variant::FlashBf16: return "cuda.attn_bwd_flash.bf16";
      case Variant::FlashFp16Det: return "cuda.attn_bwd_flash.fp16.det";
      case Variant::FlashBf16Det: return "cuda.attn_bwd_flash.bf16.det";
      case Variant::FlashNoD: return "planted.cuda_attn_bwd_flash_no_d";
    }
    return "";
  }
  std::string description() const override {
    if (!flash())
      return "CUDA: attention backward in FP32 (D = rowsum(dO o O), P and dS in global memory, then dQ, dK, dV each a "
             "kernel)";
    const std::string in(ulpgate::name(flash_input()));
    return fmt::format("CUDA: FlashAttention-2 style backward, {} tensor cores (mma.sync m16n8k16, FP32 accumulation), "
                       "128-key blocks x 64-row query blocks, P and dS rounded to {}, dQ {}; head_dim 64 or 128{}",
                       in, in, det() ? "summed over key blocks in a fixed order" : "accumulated with atomics",
                       v_ == Variant::FlashNoD ? " (planted bug: dS without the D correction)" : "");
  }
  KernelTraits traits() const override {
    KernelTraits t{Memory::Device, true};
    t.thread_safe = true;  // all work on io.stream
    t.p_bits = flash() ? info(flash_input()).precision() : 24;
    if (flash() && !det()) t.deterministic = false, t.atomic_dq = true;
    t.flushes_subnormals = flash();  // red.add.f32 flushes; tensor-core and exp2 paths treated alike
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::AttentionBackward) return std::string("attention backward only");
    for (const char* op : {"Q", "K", "V", "O", "dO", "dQ", "dK", "dV"})
      if (c.types.at(op) == Format::FP64) return std::string("FP64 operands: this kernel computes in FP32");
    for (const char* op : {"dQ", "dK", "dV"}) {
      const Format f = c.types.at(op);
      if (f != Format::FP32 && f != Format::FP16 && f != Format::BF16)
        return fmt::format("{} must be fp32, fp16 or bf16, got {}", op, ulpgate::name(f));
    }
    if (c.types.count("LSE") && c.types.at("LSE") != Format::FP32) return std::string("LSE must be fp32");
    if (c.types.at("compute") != Format::FP32) return std::string("compute must be fp32");
    for (const auto& [op, s] : c.scales)
      if (s != 1.0) return fmt::format("scale {} is not applied by this kernel", op);
    const AttentionShape& a = c.attention;
    if (!flash()) {
      if (a.batch * a.heads * a.seq_q * a.seq_kv > (std::int64_t{1} << 30))
        return std::string("P and dS would pass 2^30 elements each (4 GB)");
      return std::nullopt;
    }
    for (const char* op : {"Q", "K", "V", "dO"})
      if (c.types.at(op) != flash_input())
        return fmt::format("{} must be {} for this kernel, got {}", op, ulpgate::name(flash_input()), ulpgate::name(c.types.at(op)));
    if (c.types.at("O") != Format::FP32 && c.types.at("O") != Format::FP16 && c.types.at("O") != Format::BF16)
      return fmt::format("O must be fp32, fp16 or bf16, got {}", ulpgate::name(c.types.at("O")));
    if (a.head_dim != a.eff_head_dim_v() || (a.head_dim != 64 && a.head_dim != 128))
      return fmt::format("head_dim {} (head_dim_v {}): only 64 and 128, equal", a.head_dim, a.eff_head_dim_v());
    if (a.batch * a.eff_kv_heads() > 65535) return std::string("batch x kv_heads > 65535");
    if (det()) {
      const std::int64_t blocks = (a.seq_kv + attn::kFlashBackwardKeys - 1) / attn::kFlashBackwardKeys;
      const std::int64_t bytes = blocks * a.batch * a.heads * a.seq_q * a.head_dim * 4;
      if (bytes > kMaxDetWorkspaceBytes)
        return fmt::format("deterministic dQ needs {:.1f} GiB of per-key-block partials (at most 4)", bytes / 1073741824.0);
    }
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const AttentionShape& a = c.attention;
    const auto stream = static_cast<cudaStream_t>(io.stream);
    attn::Shape s{a.batch, a.heads, a.seq_q, a.seq_kv, a.head_dim, a.eff_head_dim_v(), a.heads / a.eff_kv_heads(), a.causal,
                  static_cast<float>(a.scale()), nullptr};
    attn::BackwardOperands ops;
    ops.q = operand(c, "Q"), ops.k = operand(c, "K"), ops.v = operand(c, "V"), ops.o = operand(c, "O");
    ops.dout = operand(c, "dO"), ops.dq = operand(c, "dQ"), ops.dk = operand(c, "dK"), ops.dv = operand(c, "dV");
    ops.q.p = io.in.at("Q"), ops.k.p = io.in.at("K"), ops.v.p = io.in.at("V"), ops.o.p = io.in.at("O");
    ops.dout.p = io.in.at("dO");
    ops.lse = static_cast<const float*>(io.in.at("LSE"));
    ops.dq.out = io.out.at("dQ"), ops.dk.out = io.out.at("dK"), ops.dv.out = io.out.at("dV");
    DeviceBuffer lengths;
    if (!a.kv_lengths.empty()) {
      lengths = DeviceBuffer(a.kv_lengths.size() * sizeof(long long), io.stream);
      ULPGATE_CHECK(cudaMemcpyAsync(lengths.get(), a.kv_lengths.data(), a.kv_lengths.size() * sizeof(long long),
                                    cudaMemcpyHostToDevice, stream));
      s.kv_lengths = static_cast<const long long*>(lengths.get());
    }
    const long long rows = a.batch * a.heads * a.seq_q;
    DeviceBuffer dsum(static_cast<std::size_t>(rows) * sizeof(float), io.stream);
    if (flash()) {
      DeviceBuffer acc(static_cast<std::size_t>(attn::flash_backward_workspace_floats(s, det())) * sizeof(float), io.stream);
      ULPGATE_CHECK(attn::flash_attention_backward(s, ops, static_cast<float*>(dsum.get()), static_cast<float*>(acc.get()), det(),
                                                   v_ == Variant::FlashNoD, stream));
      device_synchronize(io.stream);  // the buffers above are freed on return
      notes["kernel"] = std::string("flash backward: 128-key blocks (8 warps x 16 keys) x 64-row query blocks, Q/dO "
                                    "double-buffered by cp.async, ldmatrix, mma.sync m16n8k16; dQ ") +
                        (det() ? "per-key-block partials summed in order" : "by float4 atomics (lanes t, t ^ 1 trade pairs)");
      return;
    }
    DeviceBuffer P(static_cast<std::size_t>(rows * a.seq_kv) * sizeof(float), io.stream);
    DeviceBuffer dS(static_cast<std::size_t>(rows * a.seq_kv) * sizeof(float), io.stream);
    ULPGATE_CHECK(attn::naive_attention_backward(s, ops, static_cast<float*>(dsum.get()), static_cast<float*>(P.get()),
                                                 static_cast<float*>(dS.get()), stream));
    device_synchronize(io.stream);
    notes["kernel"] = "naive backward: FP32 P and dS in global memory, dQ, dK, dV by separate kernels";
  }

 private:
  Variant v_;
};

}  // namespace

std::vector<std::unique_ptr<Kernel>> make_attention_backward_kernels() {
  std::vector<std::unique_ptr<Kernel>> out;
  out.push_back(std::make_unique<CudaAttentionBackward>(Variant::Naive));
  out.push_back(std::make_unique<CudaAttentionBackward>(Variant::FlashFp16));
  out.push_back(std::make_unique<CudaAttentionBackward>(Variant::FlashBf16));
  out.push_back(std::make_unique<CudaAttentionBackward>(Variant::FlashFp16Det));
  out.push_back(std::make_unique<CudaAttentionBackward>(Variant::FlashBf16Det));
  return out;
}

std::unique_ptr<Kernel> make_planted_flash_backward_no_d() { return std::make_unique<CudaAttentionBackward>(Variant::FlashNoD); }

}  // namespace ulpgate
