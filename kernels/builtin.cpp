#include "kernels/builtin.hpp"

#include "kernels/emulated/attention_backward_models.hpp"
#include "kernels/emulated/attention_combine_models.hpp"
#include "kernels/emulated/attention_models.hpp"
#include "kernels/emulated/gemm_models.hpp"

#if ULPGATE_HAVE_CUDA
#include "kernels/attention/attention_backward.hpp"
#include "kernels/attention/attention_combine.hpp"
#include "kernels/attention/cuda_attention.hpp"
#include "kernels/attention/cudnn_backward_kernel.hpp"
#include "kernels/gemm/ladder.hpp"
#include "kernels/gemm/library.hpp"
#endif

namespace ulpgate {

Registry builtin_registry() {
  Registry r;
  for (const auto& m : default_models()) r.add(make_emulated_gemm(m));
  for (const auto& m : default_attention_models()) r.add(make_emulated_attention(m));
  for (const auto& m : default_attention_backward_models()) r.add(make_emulated_attention_backward(m));
  for (const auto& m : default_attention_combine_models()) r.add(make_emulated_attention_combine(m));
#if ULPGATE_HAVE_CUDA
  if (cuda_device_available()) {
    for (auto& k : make_library_kernels()) r.add(std::move(k));
    for (auto& k : make_ladder_kernels()) r.add(std::move(k));
    for (auto& k : make_attention_kernels()) r.add(std::move(k));
    for (auto& k : make_attention_backward_kernels()) r.add(std::move(k));
    for (auto& k : make_attention_combine_kernels()) r.add(std::move(k));
#if ULPGATE_HAVE_CUDNN
    for (auto& k : make_cudnn_attention_backward_kernels()) r.add(std::move(k));
#endif
  }
#endif
  return r;
}

}  // namespace ulpgate
