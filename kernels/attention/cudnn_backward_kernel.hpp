// cuDNN's fused attention backward as registered kernels (the graph: cudnn_sdpa_backward.cpp).
#pragma once

#include <memory>
#include <vector>

#include "kernels/kernel.hpp"

namespace ulpgate {

/// cudnn.sdpa_bwd.fp16 / .bf16: cuDNN's fused flash-attention backward (P and dS rounded to
/// the inputs' type, dQ added into an FP32 accumulator by atomics); cudnn.sdpa_bwd.fp16.det /
/// .bf16.det: the frontend's deterministic algorithm (dQ without the accumulator). Empty in a
/// build without cuDNN; the kernels need no device to be listed.
std::vector<std::unique_ptr<Kernel>> make_cudnn_attention_backward_kernels();

}  // namespace ulpgate
