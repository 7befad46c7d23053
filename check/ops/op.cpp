#include "check/ops/op.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "core/parallel.hpp"
#include "distributions/fill.hpp"
#include "distributions/spec.hpp"
#include "check/ops/attention.hpp"
#include "check/ops/attention_backward.hpp"
#include "check/ops/attention_combine.hpp"
#include "check/ops/gemm.hpp"

namespace ulpgate {

const OpModule& op_module(Op op) {
  switch (op) {
    case Op::Gemm: return gemm_module();
    case Op::Attention: return attention_module();
    case Op::AttentionBackward: return attention_backward_module();
    case Op::AttentionCombine: return attention_combine_module();
  }
  throw std::logic_error("op_module: unknown op");
}

std::vector<const OpModule*> all_op_modules() {
  return {&gemm_module(), &attention_module(), &attention_backward_module(), &attention_combine_module()};
}

std::string RelationContext::run_and_judge(const Case& c, const Inputs& inputs) const {
  const RunOutcome r = run(c, inputs);
  return r.status == Disposition::Ok ? judge(c, inputs, r) : fmt::format("{}: {}", name(r.status), r.message);
}

Inputs case_inputs(Case& c) {
  Inputs in = fill_inputs(c);
  op_module(c.op).derive_inputs(c, in);
  return in;
}

std::vector<Case> OpModule::basic_cases(std::string_view dtype) const {
  std::vector<Case> out;
  for (const Format f : output_formats(dtype)) {
    Case c = basic_case(dtype);
    c.types[outputs_of(c).front()] = f;
    out.push_back(std::move(c));
  }
  return out;
}

std::optional<Format> OpModule::supported_output(const Kernel& k, std::string_view dtype) const {
  for (const Case& c : basic_cases(dtype))
    if (k.supports(c)) return c.types.at(outputs_of(c).front());
  return std::nullopt;
}

UninitVector<Code> OpModule::logical_output(const Case& c, const std::string& name, const Tensor& output) const {
  const std::vector<std::int64_t> offsets = output_offsets(c, name);
  UninitVector<Code> got(offsets.size());
  constexpr std::int64_t kGrain = std::int64_t{1} << 14;
  const auto n = static_cast<std::int64_t>(offsets.size());
  parallel_for((n + kGrain - 1) / kGrain, [&](std::int64_t chunk) {
    for (std::int64_t e = chunk * kGrain; e < std::min(n, (chunk + 1) * kGrain); ++e)
      got[static_cast<std::size_t>(e)] = output.code(static_cast<std::size_t>(offsets[static_cast<std::size_t>(e)]));
  }, threads_for(static_cast<double>(n), 0x1p20));
  return got;
}

ToleranceModel precision_terms(const Case& c, const KernelTraits& traits) {
  ToleranceModel t;
  const Format compute = c.types.at("compute");
  switch (compute) {
    case Format::FP64: t.accumulator_bits = 53; break;
    case Format::FP16: t.accumulator_bits = 11; break;
    case Format::BF16: t.accumulator_bits = 8; break;
    case Format::TF32: t.accumulator_bits = 24, t.input_bits = 11; break;
    default: t.accumulator_bits = 24; break;
  }
  const Format input = c.types.at(primary_input(c.op));
  const bool declared = traits.accumulator_bits > 0;
  if (declared) t.accumulator_bits = traits.accumulator_bits;
  t.promote = traits.promote;
  // FP8 inputs on tensor cores: an undeclared kernel may keep their narrow accumulator (13
  // fraction bits, truncated) and promote it to FP32 every kFp8PromoteInterval products.
  if (!declared && is_fp8(input) && compute == Format::FP32)
    t.accumulator_bits = kFp8AccumulatorBits, t.promote = kFp8PromoteInterval;
  t.nearest = traits.rounds_to_nearest;
  t.input_rounding = traits.input_rounding;
  t.rule = fmt::format("{}: {}-bit accumulation{}{}{}", declared ? "declared" : "default", t.accumulator_bits,
                       t.nearest ? " rounding to nearest" : " in any order and blocking, truncating or to nearest",
                       t.promote ? fmt::format(", promoted to FP32 every {} products", t.promote) : "",
                       t.input_bits ? fmt::format(", inputs rounded to {} bits ({})", t.input_bits, name(t.input_rounding)) : "");
  const FormatInfo& acc = info(compute == Format::TF32 ? Format::FP32 : compute);
  t.accumulator_eta = traits.flushes_subnormals ? acc.min_normal() : acc.min_subnormal();
  if (c.op == Op::Gemm && has_gelu(c.epilogue)) t.activation_error = traits.activation_error;
  return t;
}

std::vector<Format> distinct_formats(const std::vector<Format>& formats) {
  std::vector<Format> out;
  for (const Format f : formats)
    if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
  return out;
}

std::string op_family(const Case& c, const char* op, const char* in, const char* out) {
  const auto it = c.dist.find(in);
  return fmt::format("{} {}->{} {} {}", op, name(c.types.at(in)), name(c.types.at(out)), name(c.types.at("compute")),
                     it == c.dist.end() ? std::string(kDefaultDist) : it->second);
}

std::vector<std::int64_t> edge_and_spread_sample(std::int64_t n, std::int64_t afford, std::uint64_t seed) {
  std::vector<std::int64_t> picks;
  if (afford >= n) {
    picks.resize(static_cast<std::size_t>(n));
    std::iota(picks.begin(), picks.end(), std::int64_t{0});
    return picks;
  }
  std::vector<char> taken(static_cast<std::size_t>(n), 0);
  const auto take = [&](std::int64_t i) {
    if (i >= 0 && i < n && !taken[static_cast<std::size_t>(i)] && static_cast<std::int64_t>(picks.size()) < afford)
      taken[static_cast<std::size_t>(i)] = 1, picks.push_back(i);
  };
  take(0), take(1);
  for (std::int64_t i = 1; i <= 4; ++i) take(n - i);
  for (std::int64_t tile : {128, 64}) {
    const std::int64_t edge = (n - 1) / tile * tile;  // the last tile's first index
    take(edge), take(edge - 1);
  }
  const std::int64_t rest = afford - static_cast<std::int64_t>(picks.size());
  if (rest > 0) {
    const double step = static_cast<double>(n) / static_cast<double>(rest);
    const double offset = static_cast<double>(seed % 1024) / 1024.0 * step;
    for (std::int64_t t = 0; t < rest; ++t) take(static_cast<std::int64_t>(offset + step * static_cast<double>(t)));
  }
  for (std::int64_t i = 0; i < n && static_cast<std::int64_t>(picks.size()) < afford; ++i) take(i);  // collisions
  std::sort(picks.begin(), picks.end());
  return picks;
}

}  // namespace ulpgate
