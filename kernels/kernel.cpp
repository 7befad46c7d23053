#include "kernels/kernel.hpp"

#include "core/error.hpp"
#include "kernels/emulated/attention_backward_models.hpp"
#include "kernels/emulated/attention_combine_models.hpp"
#include "kernels/emulated/attention_models.hpp"
#include "kernels/emulated/gemm_models.hpp"

#if ULPGATE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ulpgate {

void Registry::add(std::unique_ptr<Kernel> k) {
  if (find(k->name())) throw InputError("kernel '" + k->name() + "' is registered twice");
  kernels_.push_back(std::move(k));
}

Kernel* Registry::find(const std::string& name) const {
  for (const auto& k : kernels_)
    if (k->name() == name) return k.get();
  return nullptr;
}

Kernel* Registry::resolve(const std::string& name) {
  if (Kernel* k = find(name)) return k;
  if (auto m = AccumulationModel::parse(name)) {
    if (Kernel* k = find(m->name())) return k;  // the same model spelled differently
    add(make_emulated_gemm(*m));
    return kernels_.back().get();
  }
  if (auto m = AttentionModel::parse(name)) {
    if (Kernel* k = find(m->name())) return k;
    add(make_emulated_attention(*m));
    return kernels_.back().get();
  }
  if (auto m = AttentionBackwardModel::parse(name)) {
    if (Kernel* k = find(m->name())) return k;
    add(make_emulated_attention_backward(*m));
    return kernels_.back().get();
  }
  if (auto m = AttentionCombineModel::parse(name)) {
    if (Kernel* k = find(m->name())) return k;
    add(make_emulated_attention_combine(*m));
    return kernels_.back().get();
  }
  return nullptr;
}

std::vector<Kernel*> Registry::matching(const std::string& prefix) const {
  std::vector<Kernel*> out;
  for (const auto& k : kernels_)
    if (k->name().rfind(prefix, 0) == 0) out.push_back(k.get());
  return out;
}

bool cuda_device_available() {
#if ULPGATE_HAVE_CUDA
  // Asked per case by device kernels' unsupported(): the answer does not change.
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace ulpgate
