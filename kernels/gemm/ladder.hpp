// The GEMM ladder: hand-written CUDA kernels registered as ladder.* (docs/kernels/ladder.md).
// Built with CUDA only.
#pragma once

#include <memory>
#include <vector>

#include "kernels/gemm/simt_fp32.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

/// Every ladder kernel, in ladder order (they need a CUDA device to run).
std::vector<std::unique_ptr<Kernel>> make_ladder_kernels();

/// The row-major problem of simt_fp32.hpp for an FP32 case on io's buffers: a row-major case
/// as it is; a column-major one as D^T = op(B)^T op(A)^T (N x M), which is the same memory.
simt::Problem simt_problem(const Case& c, const KernelIo& io);

}  // namespace ulpgate
