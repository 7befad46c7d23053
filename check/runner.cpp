#include "check/runner.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/device.hpp"
#include "references/fp_env.hpp"

namespace ulpgate {

std::string_view name(Disposition d) {
  switch (d) {
    case Disposition::Ok: return "ok";
    case Disposition::NotSupported: return "not_supported";
    case Disposition::Failed: return "failed";
    case Disposition::Crashed: return "crashed";
    case Disposition::TimedOut: return "timed_out";
  }
  return "?";
}

Code poison_code(Format f) {
  switch (f) {
    case Format::FP64: return 0xFFF5BADBADBADBADull;
    case Format::FP32: return 0xFFBADBADull;
    case Format::TF32: return 0x7FEADull;  // the 19-bit code of FP32 word 0xFFD5A000
    case Format::FP16: return 0xFDADull;
    case Format::BF16: return 0xFFADull;
    case Format::E4M3: return 0xFFull;  // E4M3 has one NaN per sign: the negative one
    case Format::E5M2: return 0xFDull;
  }
  return 0;
}

Code alternate_poison_code(Format f) {
  // The poison with its sign flipped: another NaN no arithmetic produces, except in E4M3,
  // whose positive NaN 0x7F is the canonical one: there a finite code (-1.25).
  return f == Format::E4M3 ? Code{0xBA} : poison_code(f) ^ info(f).sign_mask();
}

std::vector<std::string> outputs_of(const Case& c) {
  if (c.op == Op::Gemm) return {"D"};
  if (c.op == Op::AttentionBackward) return {"dQ", "dK", "dV"};
  if (c.types.count("LSE")) return {"O", "LSE"};
  return {"O"};
}

Tensor make_output(const Case& c, const std::string& operand, bool alternate) {
  const Format f = c.types.at(operand);
  Tensor t(f, static_cast<std::size_t>(operand_elements(c, operand)));
  t.fill_code(alternate ? alternate_poison_code(f) : poison_code(f));
  return t;
}

namespace {

// Counts changed padding elements, and the logical elements still holding the poison
// (unwritten, unless a second run says otherwise: see run_kernel), with their offsets.
void audit_output(const Case& c, const std::string& operand, const Tensor& t, bool alternate, RunOutcome& out) {
  const Code poison = alternate ? alternate_poison_code(t.format()) : poison_code(t.format());
  const bool gemm = c.op == Op::Gemm;
  const MatrixView v = gemm ? gemm_view(c, operand) : MatrixView{};
  // Packed (no padding) and written everywhere, the usual case: one pass over the codes,
  // word by word where they are 4 bytes (FP32 outputs of 10^7 elements).
  const bool packed = !gemm || v.ld == (v.layout == Layout::RowMajor ? v.cols : v.rows);
  if (packed && t.format() == Format::FP32) {
    const auto* w = reinterpret_cast<const std::uint32_t*>(t.data());
    if (std::find(w, w + t.size(), static_cast<std::uint32_t>(poison)) == w + t.size()) return;
  } else if (packed) {
    bool any = false;
    for (std::size_t e = 0; e < t.size() && !any; ++e) any = t.code(e) == poison;
    if (!any) return;
  }
  for (std::size_t e = 0; e < t.size(); ++e) {
    const bool pad = gemm && v.is_padding(static_cast<std::int64_t>(e));
    const bool untouched = t.code(e) == poison;
    if (pad && !untouched) ++out.padding_written;
    if (!pad && untouched) ++out.unwritten, out.unwritten_at[operand].push_back(static_cast<std::int64_t>(e));
  }
}

RunOutcome audited(const Case& c, bool alternate, RunOutcome& out) {
  for (const auto& [op, t] : out.outputs) audit_output(c, op, t, alternate, out);
  return std::move(out);
}

// A device run of a thread-safe kernel on its thread's stream, through one device block and
// this thread's page-locked staging buffer: the inputs and poisoned outputs packed (each at
// a 256-byte boundary) and copied in one go, the block copied back in one go after the run
// (outputs, and the inputs to see whether the kernel wrote them). False, with nothing done,
// when the case is too large for the staging buffer (the caller copies tensor by tensor).
bool run_staged(Kernel& k, const Case& c, const std::map<std::string, Tensor>& inputs, KernelIo& io, RunOutcome& out) {
  constexpr std::size_t kAlign = 256;
  std::vector<std::pair<const Tensor*, std::size_t>> parts;  // tensor, offset in the block
  std::size_t total = 0;
  const auto place = [&](const Tensor& t) {
    parts.emplace_back(&t, total);
    total += (t.size_bytes() + kAlign - 1) / kAlign * kAlign;
  };
  for (const auto& [op, t] : inputs) place(t);
  for (const auto& [op, t] : out.outputs) place(t);
  auto* host = static_cast<std::byte*>(pinned_staging(total));
  if (!host) return false;
  for (const auto& [t, at] : parts) std::memcpy(host + at, t->data(), t->size_bytes());
  DeviceBuffer block(total, io.stream);
  auto* dev = static_cast<std::byte*>(block.get());
  // However this ends (a kernel error too), the stream is idle before the staging buffer
  // can be filled again.
  struct Drain {
    void* stream;
    ~Drain() { wait_quietly(stream); }
  } drain{io.stream};
  copy_to_device(dev, host, total, io.stream);
  std::size_t i = 0;
  for (const auto& [op, t] : inputs) io.in[op] = dev + parts[i++].second;
  for (auto& [op, t] : out.outputs) io.out[op] = dev + parts[i++].second;
  k.run(c, io, out.notes);
  device_synchronize(io.stream);
  copy_to_host(host, dev, total, io.stream);
  i = 0;
  for (const auto& [op, t] : inputs) {
    const std::size_t at = parts[i++].second;
    if (t.size_bytes() && std::memcmp(host + at, t.data(), t.size_bytes()) != 0) out.inputs_modified.push_back(op);
  }
  for (auto& [op, t] : out.outputs) std::memcpy(t.data(), host + parts[i++].second, t.size_bytes());
  return true;
}

// One run on outputs filled with the poison (or the alternate poison), audited.
RunOutcome run_poisoned(Kernel& k, const Case& c, const std::map<std::string, Tensor>& inputs, bool alternate) {
  RunOutcome out;
  if (auto why = k.unsupported(c)) {
    out.status = Disposition::NotSupported;
    out.message = *why;
    return out;
  }
  if ((c.op == Op::Attention || c.op == Op::AttentionCombine) && c.types.count("LSE") && !k.traits().writes_lse) {
    out.status = Disposition::NotSupported;
    out.message = "the kernel does not write the log-sum-exp output (LSE)";
    return out;
  }
  if (const unsigned lacking = attention_variants(c) & ~k.traits().attention_variants) {
    out.status = Disposition::NotSupported;
    out.message = "the kernel does not apply the case's " + attention_variant_names(lacking);
    return out;
  }
  for (const auto& op : c.inputs())
    if (!inputs.count(op)) throw InputError(fmt::format("run_kernel: input {} missing", op));
  for (const auto& op : outputs_of(c)) out.outputs[op] = make_output(c, op, alternate);
  try {
    KernelIo io;
    if (k.traits().memory == Memory::Host) {
      // The kernel gets copies, so a kernel that writes its inputs is caught below.
      std::map<std::string, Tensor> copies = inputs;
      for (auto& [op, t] : copies) io.in[op] = t.data();
      for (auto& [op, t] : out.outputs) io.out[op] = t.data();
      k.run(c, io, out.notes);
      for (const auto& [op, t] : copies)
        if (t.size_bytes() && std::memcmp(t.data(), inputs.at(op).data(), t.size_bytes()) != 0)
          out.inputs_modified.push_back(op);
    } else {
      // A thread-safe device kernel does all its work on the stream it is given: this
      // thread's own, so that threads checking cases at once overlap on the GPU. Others
      // (plugins) get the legacy default stream and a device-wide synchronisation.
      void* stream = k.traits().thread_safe ? thread_stream() : nullptr;
      io.stream = stream;
      if (stream && run_staged(k, c, inputs, io, out)) return audited(c, alternate, out);
      std::map<std::string, DeviceBuffer> din, dout;
      for (const auto& [op, t] : inputs) io.in[op] = (din[op] = to_device(t, stream)).get();
      for (auto& [op, t] : out.outputs) io.out[op] = (dout[op] = to_device(t, stream)).get();
      k.run(c, io, out.notes);
      device_synchronize(stream);
      for (auto& [op, t] : out.outputs) to_host(t, dout.at(op), stream);
      for (const auto& [op, t] : inputs)
        if (!equals_host(din.at(op), t, stream)) out.inputs_modified.push_back(op);
    }
  } catch (const KernelUnsupported& e) {
    out.status = Disposition::NotSupported;
    out.message = e.what();
    return out;
  } catch (const KernelError& e) {
    out.status = Disposition::Failed;
    out.message = e.what();
    return out;
  }
  return audited(c, alternate, out);
}

}  // namespace

// A kernel may write the poison's bit pattern itself (E4M3's only negative NaN is 0xFF),
// but no element holds the poison after one run and the alternate poison after another
// unless nothing wrote it (or a kernel that is not repeatable wrote just these two codes
// there). So a run that left poison somewhere is run again on the
// alternate poison, and only elements holding both are unwritten (a second run that fails
// cannot tell: the first run's count stands). No extra run where everything was written.
RunOutcome run_kernel(Kernel& k, const Case& c, const std::map<std::string, Tensor>& inputs) {
  const RestoreFpEnv caller_env;
  RunOutcome out = run_poisoned(k, c, inputs, false);
  if (out.status != Disposition::Ok || out.unwritten == 0) return out;
  const RunOutcome again = run_poisoned(k, c, inputs, true);
  if (again.status != Disposition::Ok) return out;
  out.unwritten = 0;
  for (auto& [op, at] : out.unwritten_at) {
    const auto it = again.unwritten_at.find(op);
    std::vector<std::int64_t> both;
    if (it != again.unwritten_at.end())
      std::set_intersection(at.begin(), at.end(), it->second.begin(), it->second.end(), std::back_inserter(both));
    at = std::move(both);
    out.unwritten += static_cast<std::int64_t>(at.size());
  }
  return out;
}

}  // namespace ulpgate
