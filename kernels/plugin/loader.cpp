#include "kernels/plugin/loader.hpp"

#include <dlfcn.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "core/error.hpp"
#include "ulpgate/plugin.h"

namespace ulpgate {
namespace {

int32_t abi_format(const Case& c, const char* op) {
  auto it = c.types.find(op);
  return it == c.types.end() ? -1 : static_cast<int32_t>(it->second);  // enum orders match
}
static_assert(static_cast<int>(Format::E5M2) == ULPGATE_E5M2 && static_cast<int>(Format::TF32) == ULPGATE_TF32);
static_assert(static_cast<int>(Epilogue::BiasGeluTanh) == ULPGATE_EPI_BIAS_GELU_TANH);

// plugin.h promises scale 1 on every non-FP8 operand, and a plugin for a wider format rightly
// ignores the field; validate() refuses such a scale, so one here is a harness bug: say so
// rather than let the plugin drop a factor the reference applies.
double scale_of(const Case& c, const char* op) {
  auto it = c.scales.find(op);
  if (it == c.scales.end()) return 1.0;
  const auto t = c.types.find(op);
  if (t == c.types.end() || !takes_scale(t->second))
    throw std::logic_error(fmt::format("case.scales.{} on a non-FP8 operand reached the plugin ABI", op));
  return it->second;
}

// The ABI view of a case; data pointers filled from io when given.
ulpgate_problem to_problem(const Case& c, const KernelIo* io) {
  ulpgate_problem p{};
  p.struct_size = sizeof(ulpgate_problem);
  p.op = c.op == Op::Gemm                ? ULPGATE_OP_GEMM
         : c.op == Op::Attention         ? ULPGATE_OP_ATTENTION
         : c.op == Op::AttentionBackward ? ULPGATE_OP_ATTENTION_BACKWARD
                                         : ULPGATE_OP_ATTENTION_COMBINE;
  auto in = [&](const char* op) -> const void* {
    if (!io) return nullptr;
    auto it = io->in.find(op);
    return it == io->in.end() ? nullptr : it->second;
  };
  auto out = [&](const char* op) -> void* { return io ? io->out.at(op) : nullptr; };
  if (c.op == Op::Gemm) {
    auto& g = p.gemm;
    g.m = c.gemm.m, g.n = c.gemm.n, g.k = c.gemm.k, g.batch = c.gemm.batch;
    g.layout = c.gemm.layout == Layout::RowMajor ? ULPGATE_ROW_MAJOR : ULPGATE_COL_MAJOR;
    g.trans_a = c.gemm.trans_a, g.trans_b = c.gemm.trans_b;
    const MatrixView a = gemm_view(c, "A"), b = gemm_view(c, "B"), d = gemm_view(c, "D");
    const MatrixView cv = c.types.count("C") ? gemm_view(c, "C") : d;
    g.lda = a.ld, g.ldb = b.ld, g.ldc = cv.ld, g.ldd = d.ld;
    g.batch_stride_a = a.batch_stride(), g.batch_stride_b = b.batch_stride();
    g.batch_stride_c = cv.batch_stride(), g.batch_stride_d = d.batch_stride();
    g.type_a = abi_format(c, "A"), g.type_b = abi_format(c, "B"), g.type_c = abi_format(c, "C");
    g.type_d = abi_format(c, "D"), g.type_bias = abi_format(c, "bias"), g.type_compute = abi_format(c, "compute");
    g.alpha = c.alpha, g.beta = c.beta;
    g.epilogue = static_cast<int32_t>(c.epilogue);
    g.scale_a = scale_of(c, "A"), g.scale_b = scale_of(c, "B"), g.scale_c = scale_of(c, "C"), g.scale_d = scale_of(c, "D");
    g.a = in("A"), g.b = in("B"), g.c = in("C"), g.bias = in("bias"), g.d = io ? out("D") : nullptr;
  } else if (c.op == Op::AttentionCombine) {
    // The forward's O and LSE as outputs, no keys; the partial states in p.combine.
    auto& t = p.attention;
    const auto& s = c.attention;
    t.batch = s.batch, t.heads = s.heads, t.seq_q = s.seq_q, t.head_dim = t.head_dim_v = s.head_dim;
    t.layout = s.layout == AttentionLayout::BHSD ? ULPGATE_BHSD : ULPGATE_BSHD;
    t.type_q = t.type_k = t.type_v = -1;
    t.type_o = abi_format(c, "O"), t.type_compute = abi_format(c, "compute");
    t.o = io ? out("O") : nullptr;
    p.want_lse = c.types.count("LSE") ? 1 : 0;
    p.lse = p.want_lse && io ? out("LSE") : nullptr;
    auto& m = p.combine;
    m.splits = s.splits;
    m.lse_base = s.lse_base2 ? 1 : 0;
    m.type_o_part = abi_format(c, "O_part");
    m.o_part = in("O_part");
    m.lse_part = static_cast<const float*>(in("LSE_part"));
  } else {
    auto& t = p.attention;
    const auto& s = c.attention;
    t.batch = s.batch, t.heads = s.heads, t.seq_q = s.seq_q, t.seq_kv = s.seq_kv;
    t.head_dim = s.head_dim, t.head_dim_v = s.eff_head_dim_v();
    t.layout = s.layout == AttentionLayout::BHSD ? ULPGATE_BHSD : ULPGATE_BSHD;
    t.causal = s.causal;
    t.softmax_scale = s.scale();
    t.kv_lengths = nullptr;  // ProblemArrays
    t.type_q = abi_format(c, "Q"), t.type_k = abi_format(c, "K"), t.type_v = abi_format(c, "V");
    t.type_o = abi_format(c, "O"), t.type_compute = abi_format(c, "compute");
    t.q = in("Q"), t.k = in("K"), t.v = in("V");
    p.kv_heads = s.eff_kv_heads();
    if (c.op == Op::AttentionBackward) {
      // O and LSE are the forward's, inputs here (the ABI's o and lse are not const).
      t.o = const_cast<void*>(in("O"));
      p.lse = const_cast<void*>(in("LSE"));
      auto& g = p.backward;
      g.type_do = abi_format(c, "dO"), g.type_dq = abi_format(c, "dQ"), g.type_dk = abi_format(c, "dK");
      g.type_dv = abi_format(c, "dV");
      g.d_o = in("dO");
      if (io) g.dq = out("dQ"), g.dk = out("dK"), g.dv = out("dV");
    } else {
      t.o = io ? out("O") : nullptr;
      p.want_lse = c.types.count("LSE") ? 1 : 0;
      p.lse = p.want_lse && io ? out("LSE") : nullptr;
    }
  }
  p.stream = io ? io->stream : nullptr;
  p.window_left = p.window_right = -1;
  if (is_attention(c.op)) {
    p.window_left = c.attention.window_left, p.window_right = c.attention.window_right;
    p.softcap = c.attention.softcap;
    p.alibi_form = c.attention.alibi_form == AlibiForm::Flash ? ULPGATE_ALIBI_FLASH : ULPGATE_ALIBI_FLASHINFER;
    p.page_size = c.attention.page_size, p.num_pages = c.attention.num_pages, p.pages_per_seq = c.attention.pages_per_seq();
    p.scale_k = scale_of(c, "K"), p.scale_v = scale_of(c, "V");
  }
  return p;  // kv_lengths, alibi_slopes, sinks, page_table and head scales: ProblemArrays
}

// The arrays a problem points to: kv_lengths (one per batch, seq_kv where the case gives
// none; NULL for GEMM and combine), version 7's per-head slopes and sinks (FP32 values:
// validate() keeps them so; empty: NULL), version 8's page table and version 9's per-head
// K/V scales (empty: NULL). Kept alive by the caller for the call.
struct ProblemArrays {
  std::vector<std::int64_t> kv, pages;
  std::vector<float> slopes, sinks;
  std::vector<double> head_k, head_v;
  explicit ProblemArrays(const Case& c) {
    if (!is_attention(c.op)) return;
    const AttentionShape& a = c.attention;
    kv = a.kv_lengths.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(a.batch), a.seq_kv) : a.kv_lengths;
    slopes.assign(a.alibi_slopes.begin(), a.alibi_slopes.end());
    sinks.assign(a.sinks.begin(), a.sinks.end());
    pages = a.page_table;
    if (const auto k = c.head_scales.find("K"); k != c.head_scales.end()) head_k = k->second;
    if (const auto v = c.head_scales.find("V"); v != c.head_scales.end()) head_v = v->second;
  }
  void point(ulpgate_problem& p) const {
    p.attention.kv_lengths = kv.empty() ? nullptr : kv.data();
    p.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    p.sinks = sinks.empty() ? nullptr : sinks.data();
    p.page_table = pages.empty() ? nullptr : pages.data();
    p.head_scale_k = head_k.empty() ? nullptr : head_k.data();
    p.head_scale_v = head_v.empty() ? nullptr : head_v.data();
  }
};

// The kernel descriptors of older ABI versions, whose kernel lists have these strides:
// versions 1 to 3 end before writes_lse, version 4 before the declared arithmetic.
struct KernelBeforeV4 {
  const char* name;
  const char* description;
  int32_t memory;
  int32_t deterministic;
  int (*supports)(const ulpgate_problem*, char*, size_t);
  int (*run)(const ulpgate_problem*, char*, size_t);
};
static_assert(offsetof(ulpgate_kernel, writes_lse) == sizeof(KernelBeforeV4));
struct KernelV4 {
  KernelBeforeV4 head;
  int32_t writes_lse;
};
static_assert(offsetof(ulpgate_kernel, accumulator_bits) == offsetof(KernelV4, writes_lse) + sizeof(int32_t));
// Versions 5 and 6: the declared arithmetic, and atomic_dq (version 5 ends before it, in the
// padding of its list: never read). Version 7 appended attention_variants, which makes the
// stride longer.
struct KernelV6 {
  KernelBeforeV4 head;
  int32_t writes_lse, accumulator_bits, promote, p_bits, input_rounding, atomic_dq;
};
static_assert(offsetof(ulpgate_kernel, atomic_dq) == offsetof(KernelV6, atomic_dq));
static_assert(offsetof(ulpgate_kernel, attention_variants) == sizeof(KernelV6));
static_assert(ULPGATE_VARIANT_WINDOW == kAttnWindow && ULPGATE_VARIANT_SOFTCAP == kAttnSoftcap &&
              ULPGATE_VARIANT_ALIBI == kAttnAlibi && ULPGATE_VARIANT_SINKS == kAttnSinks &&
              ULPGATE_VARIANT_PAGED == kAttnPaged && ULPGATE_VARIANT_KV_SCALES == kAttnKvScales &&
              ULPGATE_VARIANT_KV_HEAD_SCALES == kAttnKvHeadScales);

// Kernel i of a plugin, read with the descriptor its version has (the fields it lacks 0:
// nothing declared). A version-3 kernel is asked about every case with the log-sum-exp (its
// supports() decides); versions 1 and 2 have no way to write it.
ulpgate_kernel kernel_at(const ulpgate_plugin& p, uint32_t i) {
  if (p.abi_version >= 7) return p.kernels[i];
  ulpgate_kernel out{};
  if (p.abi_version >= 5) {
    const KernelV6& k = reinterpret_cast<const KernelV6*>(p.kernels)[i];
    std::memcpy(&out, &k, offsetof(KernelV6, atomic_dq));
    out.atomic_dq = p.abi_version == 6 ? k.atomic_dq : 0;
    return out;
  }
  const KernelBeforeV4& k = p.abi_version == 4 ? reinterpret_cast<const KernelV4*>(p.kernels)[i].head
                                               : reinterpret_cast<const KernelBeforeV4*>(p.kernels)[i];
  out.name = k.name, out.description = k.description, out.memory = k.memory, out.deterministic = k.deterministic;
  out.supports = k.supports, out.run = k.run;
  out.writes_lse = p.abi_version == 4 ? reinterpret_cast<const KernelV4*>(p.kernels)[i].writes_lse
                                      : (p.abi_version >= 3 ? 1 : 0);
  return out;
}

// What is wrong with a kernel's declared arithmetic (a plugin of ABI version abi); nullopt
// when nothing is.
std::optional<std::string> bad_declaration(const ulpgate_kernel& k, unsigned abi) {
  if (k.accumulator_bits != 0 && (k.accumulator_bits < 2 || k.accumulator_bits > 53))
    return fmt::format("accumulator_bits {} (0, or 2 to 53 bits)", k.accumulator_bits);
  if (k.promote < 0) return fmt::format("promote {} (0, or a number of products)", k.promote);
  if (k.promote > 0 && k.accumulator_bits == 0)
    return fmt::format("promote {} without accumulator_bits (the accumulator that is promoted)", k.promote);
  if (k.p_bits != 0 && (k.p_bits < 2 || k.p_bits > 24)) return fmt::format("p_bits {} (0, or 2 to 24 bits)", k.p_bits);
  if (k.input_rounding < ULPGATE_INPUTS_ROUND_TO_NEAREST || k.input_rounding > ULPGATE_INPUTS_TIES_TO_EVEN)
    return fmt::format("input_rounding {} (0: to nearest, ties away; 1: truncate; 2: to nearest, ties to even)",
                       k.input_rounding);
  // Paged K/V and K/V scales came with version 8, per-head K/V scales with 9: an older plugin
  // has no field to read them from.
  const unsigned known = abi >= 9   ? kAllAttentionVariants
                         : abi >= 8 ? kAllAttentionVariants & ~kAttnKvHeadScales
                                    : kAttnWindow | kAttnSoftcap | kAttnAlibi | kAttnSinks;
  if (k.attention_variants & ~known)
    return fmt::format("attention_variants {:#x} (ULPGATE_VARIANT_* bits of ABI version {}: at most {:#x})",
                       k.attention_variants, abi, known);
  return std::nullopt;
}

class PluginKernel final : public Kernel {
 public:
  PluginKernel(const ulpgate_kernel& k, std::string library, unsigned abi)
      : k_(k), library_(std::move(library)), abi_(abi) {}
  std::string name() const override { return k_.name; }
  std::string description() const override {
    return fmt::format("{} (plugin {})", k_.description ? k_.description : "", library_);
  }
  KernelTraits traits() const override {
    KernelTraits t{k_.memory == ULPGATE_DEVICE_MEMORY ? Memory::Device : Memory::Host, k_.deterministic != 0};
    t.writes_lse = k_.writes_lse != 0;
    t.accumulator_bits = k_.accumulator_bits;
    t.promote = k_.promote;
    t.p_bits = k_.p_bits;
    t.atomic_dq = k_.atomic_dq != 0;
    t.attention_variants = k_.attention_variants;
    if (k_.input_rounding == ULPGATE_INPUTS_TRUNCATE) t.input_rounding = Rounding::TowardZero;
    if (k_.input_rounding == ULPGATE_INPUTS_TIES_TO_EVEN) t.input_rounding = Rounding::NearestEven;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    // Its buffers would be device memory: without a device every case would fail in
    // cudaMalloc (or "built without CUDA"), which says nothing about the kernel.
    if (k_.memory == ULPGATE_DEVICE_MEMORY && !cuda_device_available()) return std::string(kNeedsCudaDevice);
    if (auto why = beyond_abi(c)) return why;
    ulpgate_problem p = to_problem(c, nullptr);
    const ProblemArrays arrays(c);
    arrays.point(p);
    char why[512] = "";
    if (k_.supports(&p, why, sizeof why)) return std::nullopt;
    const std::string text = message(why, sizeof why);
    return text.empty() ? std::string("not supported by the plugin") : text;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    // The runner asks unsupported() first; a caller that did not must not get a misread run.
    if (auto why = beyond_abi(c)) throw std::logic_error(fmt::format("plugin kernel {}: {}", k_.name, *why));
    ulpgate_problem p = to_problem(c, &io);
    const ProblemArrays arrays(c);
    arrays.point(p);
    char err[1024] = "";
    if (const int rc = k_.run(&p, err, sizeof err); rc != 0) {
      const std::string text = message(err, sizeof err);
      throw KernelError(fmt::format("plugin kernel {} returned {}: {}", k_.name, rc, text.empty() ? "(no message)" : text));
    }
    notes["plugin"] = library_;
  }

 private:
  // A message the plugin wrote into buf: up to its NUL, and never past the buffer (a
  // plugin that fills it without a NUL gets its last byte cut).
  static std::string message(char* buf, std::size_t size) {
    buf[size - 1] = '\0';
    return std::string(buf, ::strnlen(buf, size));
  }
  // A case the plugin's ABI version cannot describe (version 1 has no kv_heads, and its
  // kernels would read K and V as having `heads` heads; an op newer than the plugin would be
  // read as another), or an output the kernel does not write.
  std::optional<std::string> beyond_abi(const Case& c) const {
    if (c.op == Op::AttentionBackward && abi_ < 6)
      return fmt::format("built against plugin ABI version {}, which has no attention backward op; rebuild it against "
                         "version {}", abi_, ULPGATE_PLUGIN_ABI_VERSION);
    if (c.op == Op::AttentionCombine && abi_ < 10)
      return fmt::format("built against plugin ABI version {}, which has no attention combine op; rebuild it against "
                         "version {}", abi_, ULPGATE_PLUGIN_ABI_VERSION);
    if (abi_ < 2 && c.op == Op::Attention && c.attention.eff_kv_heads() != c.attention.heads)
      return fmt::format("built against plugin ABI version {}, which cannot describe grouped-query attention "
                         "(kv_heads {} of {} heads); rebuild it against version {}",
                         abi_, c.attention.eff_kv_heads(), c.attention.heads, ULPGATE_PLUGIN_ABI_VERSION);
    if (c.op != Op::Attention && c.op != Op::AttentionCombine) return std::nullopt;  // backward: LSE is an input
    if (abi_ < 3 && c.types.count("LSE"))
      return fmt::format("built against plugin ABI version {}, which has no log-sum-exp output; rebuild it against version {}",
                         abi_, ULPGATE_PLUGIN_ABI_VERSION);
    if (!k_.writes_lse && c.types.count("LSE"))
      return std::string("does not write the log-sum-exp output (its ulpgate_kernel.writes_lse is 0)");
    return std::nullopt;
  }
  ulpgate_kernel k_;
  std::string library_;
  unsigned abi_;  ///< the plugin's abi_version
};

}  // namespace

std::string resolve_plugin_path(const std::string& path) {
  if (path.empty()) throw InputError("--plugin: empty path (name a plugin library, e.g. --plugin ./libmykernels.so)");
  std::error_code ec;
  if (path.find('/') == std::string::npos && std::filesystem::exists(path, ec)) return "./" + path;
  return path;
}

void load_plugin(const std::string& path, Registry& registry) {
  void* lib = dlopen(resolve_plugin_path(path).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw InputError(fmt::format("--plugin {}: cannot load: {}", path, dlerror()));
  auto entry = reinterpret_cast<ulpgate_plugin_entry_fn>(dlsym(lib, ULPGATE_PLUGIN_ENTRY));
  if (!entry) throw InputError(fmt::format("--plugin {}: no exported {}()", path, ULPGATE_PLUGIN_ENTRY));
  const ulpgate_plugin* p = entry();
  if (!p) throw InputError(fmt::format("--plugin {}: {}() returned NULL", path, ULPGATE_PLUGIN_ENTRY));
  if (p->abi_version < kOldestPluginAbi || p->abi_version > ULPGATE_PLUGIN_ABI_VERSION)
    throw InputError(fmt::format("--plugin {}: ABI version {}, this ulpgate speaks {} to {}", path, p->abi_version,
                                 kOldestPluginAbi, ULPGATE_PLUGIN_ABI_VERSION));
  if (p->kernel_count > 0 && !p->kernels)
    throw InputError(fmt::format("--plugin {}: reports {} kernels but no kernel list (NULL)", path, p->kernel_count));
  if (p->kernel_count > kMaxPluginKernels)
    throw InputError(fmt::format("--plugin {}: reports {} kernels (at most {}): a damaged descriptor?", path,
                                 p->kernel_count, kMaxPluginKernels));
  for (uint32_t i = 0; i < p->kernel_count; ++i) {
    const ulpgate_kernel k = kernel_at(*p, i);
    if (!k.name || !k.supports || !k.run)
      throw InputError(fmt::format("--plugin {}: kernel #{} lacks a name, supports() or run()", path, i));
    if (registry.find(k.name))
      throw InputError(fmt::format("--plugin {}: kernel '{}' already exists", path, k.name));
    if (auto bad = bad_declaration(k, p->abi_version))
      throw InputError(fmt::format("--plugin {}: kernel '{}' declares {}", path, k.name, *bad));
    registry.add(std::make_unique<PluginKernel>(k, path, p->abi_version));
  }
}

}  // namespace ulpgate
