#include "harness/ops/op.hpp"

#include <fmt/format.h>

#include "distributions/spec.hpp"
#include "harness/ops/attention.hpp"
#include "harness/ops/gemm.hpp"

namespace ulpgate {

const OpModule& op_module(Op op) { return op == Op::Gemm ? gemm_module() : attention_module(); }

std::vector<const OpModule*> all_op_modules() { return {&gemm_module(), &attention_module()}; }

std::vector<Code> OpModule::logical_output(const Case& c, const Tensor& output) const {
  const std::vector<std::int64_t> offsets = output_offsets(c);
  std::vector<Code> got(offsets.size());
  for (std::size_t e = 0; e < offsets.size(); ++e) got[e] = output.code(static_cast<std::size_t>(offsets[e]));
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
  if (traits.accumulator_bits > 0) t.accumulator_bits = traits.accumulator_bits;
  t.nearest = traits.rounds_to_nearest;
  t.accumulator_eta = info(compute == Format::TF32 ? Format::FP32 : compute).min_subnormal();
  return t;
}

std::string op_family(const Case& c, const char* op, const char* in, const char* out) {
  const auto it = c.dist.find(in);
  return fmt::format("{} {}->{} {} {}", op, name(c.types.at(in)), name(c.types.at(out)), name(c.types.at("compute")),
                     it == c.dist.end() ? std::string(kDefaultDist) : it->second);
}

}  // namespace ulpgate
