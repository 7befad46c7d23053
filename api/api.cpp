// The C++ API (include/ulpgate/ulpgate.hpp): a thin layer over the check path, as
// python/ulpgate_py.cpp is for Python.
#include "ulpgate/ulpgate.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <ostream>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "distributions/fill.hpp"
#include "check/ops/op.hpp"
#include "check/runner.hpp"
#include "references/attention_reference.hpp"
#include "references/gemm_reference.hpp"
#include "kernels/builtin.hpp"

namespace ulpgate {
namespace {

// Buffer offsets of an operand's elements in logical order (ulpgate.hpp's Values).
std::vector<std::int64_t> logical_offsets(const Case& c, const std::string& operand) {
  std::vector<std::int64_t> at;
  if (c.op == Op::Gemm) {
    const GemmShape& g = c.gemm;
    const MatrixView v = gemm_view(c, operand);
    if (operand == "bias") {
      for (std::int64_t j = 0; j < g.n; ++j) at.push_back(v.offset(0, 0, j));
      return at;
    }
    const std::int64_t rows = operand == "B" ? g.k : g.m, cols = operand == "A" ? g.k : g.n;
    at.reserve(static_cast<std::size_t>(g.batch * rows * cols));
    for (std::int64_t b = 0; b < g.batch; ++b)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t col = 0; col < cols; ++col)
          at.push_back(operand == "A"   ? op_a_offset(c, v, b, r, col)
                       : operand == "B" ? op_b_offset(c, v, b, r, col)
                                        : v.offset(b, r, col));
    return at;
  }
  return attention_view(c, operand).logical_offsets();
}

Values logical_values(const Case& c, const std::map<std::string, Tensor>& buffers) {
  Values out;
  for (const auto& [op, t] : buffers) {
    std::vector<double>& v = out[op];
    for (const std::int64_t e : logical_offsets(c, op)) v.push_back(t.value(static_cast<std::size_t>(e)));
  }
  return out;
}

// What a HostFunction's outputs hold before it runs: a signalling NaN with a payload that
// neither arithmetic (which quiets NaNs) nor a decoded input produces, so an element still
// holding it was not written and keeps the runner's poison (the write audit reports it).
constexpr std::uint64_t kUnwrittenBits = 0x7ff4'0000'5a5a'0bad;

// Rounds each logical value of `values` into the output buffer `to` of format f (elements
// holding kUnwrittenBits left alone). KernelError (InputError for check) on a wrong size.
template <class Error>
void store_output(const Case& c, const std::string& op, const std::vector<double>& values, void* to) {
  const std::vector<std::int64_t> at = logical_offsets(c, op);
  if (values.size() != at.size())
    throw Error(fmt::format("output {}: {} values given, the case has {}", op, values.size(), at.size()));
  const Format f = c.types.at(op);
  for (std::size_t e = 0; e < at.size(); ++e)
    if (std::bit_cast<std::uint64_t>(values[e]) != kUnwrittenBits) store_code(f, to, at[e], encode(f, values[e]));
}

class HostKernel final : public Kernel {
 public:
  HostKernel(HostFunction f, std::string name, Supports supports, KernelTraits traits)
      : f_(std::move(f)), name_(std::move(name)), supports_(std::move(supports)), traits_(std::move(traits)) {
    traits_.memory = Memory::Host;
  }
  std::string name() const override { return name_; }
  std::string description() const override { return "a C++ host function (ulpgate::host_kernel)"; }
  KernelTraits traits() const override { return traits_; }
  std::optional<std::string> unsupported(const Case& c) const override {
    return supports_ ? supports_(c) : std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    std::map<std::string, Tensor> in;
    for (const auto& [op, p] : io.in) {
      Tensor t(c.types.at(op), static_cast<std::size_t>(operand_elements(c, op)), Tensor::uninitialized);
      std::memcpy(t.data(), p, t.size_bytes());
      in.emplace(op, std::move(t));
    }
    Values out;
    for (const auto& [op, p] : io.out)
      out[op].assign(logical_offsets(c, op).size(), std::bit_cast<double>(kUnwrittenBits));
    f_(c, logical_values(c, in), out);
    for (const auto& [op, p] : io.out) store_output<KernelError>(c, op, out[op], p);
  }

 private:
  HostFunction f_;
  std::string name_;
  Supports supports_;
  KernelTraits traits_;
};

Result to_result(CaseResult r) {
  Result out;
  out.passed = r.status == Disposition::Ok && r.verdict.passed;
  out.reasons = r.verdict.reasons;
  if (r.status == Disposition::NotSupported) out.reasons.push_back(fmt::format("not supported: {}", r.message));
  out.metrics = r.metrics;
  out.record = std::move(r);
  return out;
}

}  // namespace

Case gemm_case(const GemmOptions& o) {
  const bool fp64 = o.dtype == "fp64";
  const std::string out = !o.out.empty() ? o.out : fp64 ? "fp64" : "fp32";
  nlohmann::json types = {{"A", o.dtype}, {"B", o.dtype}, {"D", out},
                          {"compute", !o.compute.empty() ? o.compute : fp64 ? "fp64" : "fp32"}};
  nlohmann::json dist = {{"A", o.dist}, {"B", o.dist}};
  if (o.beta != 0) types["C"] = out, dist["C"] = o.dist;
  if (o.epilogue.find("bias") != std::string::npos) types["bias"] = out, dist["bias"] = o.dist;
  return case_from_json({{"ulpgate_case", kCaseSchemaVersion}, {"op", "gemm"}, {"alpha", o.alpha}, {"beta", o.beta},
                         {"epilogue", o.epilogue}, {"seed", o.seed}, {"types", types}, {"dist", dist},
                         {"gemm", {{"m", o.m}, {"n", o.n}, {"k", o.k}, {"batch", o.batch}, {"layout", o.layout},
                                   {"trans_a", o.trans_a}, {"trans_b", o.trans_b}}}});
}

Case attention_case(const AttentionOptions& o) {
  nlohmann::json a = {{"batch", o.batch},       {"heads", o.heads},     {"kv_heads", o.kv_heads},
                      {"seq_q", o.seq_q},       {"seq_kv", o.seq_kv},   {"head_dim", o.head_dim},
                      {"head_dim_v", o.head_dim_v}, {"layout", o.layout}, {"causal", o.causal},
                      {"kv_lengths", o.kv_lengths}};
  if (o.softmax_scale) a["softmax_scale"] = *o.softmax_scale;
  nlohmann::json types = {{"Q", o.dtype}, {"K", o.dtype}, {"V", o.dtype}, {"O", o.out.empty() ? o.dtype : o.out},
                          {"compute", o.compute}};
  if (o.lse) types["LSE"] = "fp32";
  return case_from_json({{"ulpgate_case", kCaseSchemaVersion},
                         {"op", "attention"},
                         {"seed", o.seed},
                         {"types", types},
                         {"dist", {{"Q", o.dist}, {"K", o.dist}, {"V", o.dist}}},
                         {"attention", a}});
}

Values inputs(const Case& c, Case* filled) {
  Case f = c;
  const Values v = logical_values(f, case_inputs(f));
  if (filled) *filled = std::move(f);
  return v;
}

Values reference(const Case& c) {
  Case f = c;
  const std::map<std::string, Tensor> in = fill_inputs(f);
  std::vector<double> out;
  if (f.op == Op::Gemm) {
    const GemmReference r = gemm_reference(f, in);
    for (const RefValue& v : r.values) out.push_back(v.to_double());
    return {{"D", std::move(out)}};
  }
  const AttentionReference r = attention_reference(f, in);
  for (const RefValue& v : r.values) out.push_back(v.to_double());
  Values values{{"O", std::move(out)}};
  if (f.types.count("LSE"))
    for (const RefValue& v : r.lse) values["LSE"].push_back(v.to_double());
  return values;
}

std::optional<std::string> plain(const Case& c) {
  if (c.op == Op::Gemm) {
    if (c.alpha != 1 || c.beta != 0 || c.epilogue != Epilogue::None)
      return "plain GEMM only (alpha 1, beta 0, no epilogue)";
    return std::nullopt;
  }
  const AttentionShape& a = c.attention;
  if (a.causal || !a.kv_lengths.empty() || (a.kv_heads != 0 && a.kv_heads != a.heads) || a.softmax_scale)
    return "plain attention only (no causal mask, kv_lengths, grouped heads or softmax scale)";
  return std::nullopt;
}

std::unique_ptr<Kernel> host_kernel(HostFunction f, std::string name, Supports supports, KernelTraits traits) {
  return std::make_unique<HostKernel>(std::move(f), std::move(name), std::move(supports), std::move(traits));
}

rc::Gen<Case> gen_case(Op op, const std::string& dtype, const Kernel* kernel, const GenLimits& limits) {
  return op_module(op).generate(dtype, kernel, limits);
}

std::string Result::summary() const {
  std::vector<std::string> numbers;
  for (const ErrorMetrics& m : metrics)
    numbers.push_back(fmt::format("{} max_ulp {:.4g} max_normalised {:.4g}", m.output, m.max_ulp, m.max_normalised));
  return fmt::format("{} {} on {}{}{}\ncase: {}", passed ? "PASS" : "FAIL", record.kernel, record.family,
                     numbers.empty() ? "" : fmt::format(" ({})", fmt::join(numbers, ", ")),
                     reasons.empty() ? "" : fmt::format(": {}", fmt::join(reasons, "; ")), to_json(record.spec).dump());
}

Result run(Kernel& k, const Case& c, const EvaluationOptions& options) { return to_result(check_case(k, c, options)); }

Result run(const HostFunction& f, const Case& c, const EvaluationOptions& options) {
  KernelTraits traits;
  traits.writes_lse = true;  // the function is given every output the case has
  traits.attention_variants = kAllAttentionVariants;  // and the case itself, its variants included
  HostKernel k(f, "host", {}, traits);
  return run(k, c, options);
}

Result run(const std::string& kernel, const Case& c, const EvaluationOptions& options) {
  Registry registry = builtin_registry();
  Kernel* k = registry.resolve(kernel);
  if (!k) throw InputError(fmt::format("kernel '{}': no such kernel here (see `ulpgate list`)", kernel));
  return to_result(check_case(*k, c, options, &registry));
}

Result check(const Case& c, const Values& outputs, const std::string& kernel, const KernelTraits& declared) {
  std::map<std::string, Tensor> buffers;
  for (const auto& [op, values] : outputs) {
    const auto t = c.types.find(op);
    if (t == c.types.end() || op == "compute")
      throw InputError(fmt::format("'{}' is not an operand of this {} case", op, name(c.op)));
    Tensor& buffer = buffers[op] = Tensor(t->second, static_cast<std::size_t>(operand_elements(c, op)));
    store_output<InputError>(c, op, values, buffer.data());
  }
  CaseResult r = check_given_outputs(c, buffers, kernel, declared);
  r.origin = "check";
  return to_result(std::move(r));
}

std::ostream& operator<<(std::ostream& os, const Result& r) { return os << r.summary(); }

}  // namespace ulpgate
