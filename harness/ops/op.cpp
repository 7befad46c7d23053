#include "harness/ops/op.hpp"

#include "harness/ops/attention.hpp"
#include "harness/ops/gemm.hpp"

namespace ulpgate {

const OpModule& op_module(Op op) { return op == Op::Gemm ? gemm_module() : attention_module(); }

std::vector<const OpModule*> all_op_modules() { return {&gemm_module(), &attention_module()}; }

}  // namespace ulpgate
