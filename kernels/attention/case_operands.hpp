// A case's attention operands as the device launches take them (launch.hpp): format codes and
// views. Host code, shared by the forward (cuda_attention.cpp) and backward
// (attention_backward.cpp) kernels.
#pragma once

#include <string>

#include "core/case.hpp"
#include "kernels/attention/launch.hpp"

namespace ulpgate::attn {

inline FormatCode code(Format f) {
  switch (f) {
    case Format::TF32: return kTf32;
    case Format::FP16: return kFp16;
    case Format::BF16: return kBf16;
    case Format::E4M3: return kE4m3;
    case Format::E5M2: return kE5m2;
    default: return kFp32;
  }
}

/// Operand `name` of case c (its view; data pointers left for the caller).
inline Operand operand(const Case& c, const std::string& name) {
  const AttentionView v = attention_view(c, name);
  Operand o;
  o.format = code(c.types.at(name));
  o.batch = v.batch, o.heads = v.heads, o.seq = v.seq, o.dim = v.dim;
  o.bshd = v.layout == AttentionLayout::BSHD;
  return o;
}

}  // namespace ulpgate::attn
