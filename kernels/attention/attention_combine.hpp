// Split-KV attention's combine step on the GPU, registered as cuda.attn_combine.*
// (kernels/attention/combine.cu), with the device launch it is built from. Built with CUDA only.
#pragma once

#include <memory>
#include <vector>

#include "kernels/attention/launch.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

namespace attn {

/// Merges `splits` partial states per query row on `stream`, FP32 throughout: o_part holds
/// splits x batch batches (split s of batch b is batch s x batch + b; format FP32, FP16 or
/// BF16), lse_part their log-sum-exps ([splits x batch][heads][seq_q] FP32, -inf: an empty
/// split, its O_s never read), o the merged rows (o.batch batches; FP32, FP16 or BF16) and
/// lse, where not nullptr, the merged log-sum-exps ([batch][heads][seq_q]). lse_base2: every
/// LSE is log2 sum 2^x, else ln sum e^x. Rows below 2^31 (else cudaErrorInvalidValue).
cudaError_t combine_attention_states(const Operand& o_part, const float* lse_part, const Operand& o, float* lse,
                                     long long splits, bool lse_base2, cudaStream_t stream);

}  // namespace attn

/// cuda.attn_combine.fp32 / .fp16 / .bf16 (by O_part's format): a block per query row and
/// chunk of 256 columns, max of the LSE_s, then w_s = exp(LSE_s - max) in shared memory and
/// each thread's column accumulated in split order (FMA), O = acc / sum w_s rounded once, LSE =
/// max + log sum w_s; O in FP32 or O_part's format, any splits and head_dim, both layouts and
/// bases, empty splits skipped.
std::vector<std::unique_ptr<Kernel>> make_attention_combine_kernels();

}  // namespace ulpgate
