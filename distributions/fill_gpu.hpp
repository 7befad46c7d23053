// Per-element sampling on the GPU (built with CUDA only; fill.cpp uses it for operands of
// kGpuFillValues values and more, where the CPU's portable sampling took seconds).
#pragma once

#include <cstdint>

#include "core/format_rne.hpp"
#include "distributions/sampling.hpp"

namespace ulpgate::detail {

/// Values from which an operand is sampled on the GPU when one is present.
inline constexpr std::int64_t kGpuFillValues = std::int64_t{1} << 23;

/// Whether a CUDA device is present (asked once).
bool gpu_fill_available();

/// out[i] = sampling::sample(s, seed, stream, i, (i / channel_stride) % channels) for i in
/// [0, n), computed on the GPU; false (out undefined) without a device or on a CUDA error.
bool gpu_sample_range(const sampling::Sampler& s, std::uint64_t seed, std::uint32_t stream, std::int64_t n,
                      std::int64_t channel_stride, std::int64_t channels, double* out);

/// Where a packed operand keeps its logical elements: storage position p holds logical
/// index sum over axes of ((p / storage_stride) % dim) x logical_stride (the axes of a
/// transposed or column-major operand in another order; one axis {1, n, 1}: index order).
struct StorageOrder {
  static constexpr int kMaxAxes = 8;
  int axes = 0;
  std::int64_t storage_stride[kMaxAxes] = {}, dim[kMaxAxes] = {}, logical_stride[kMaxAxes] = {};
};

/// The same values rounded to a format on the GPU (rne_storage: encode's bits) and stored
/// as its storage words of `word_bytes` bytes each into out[0, n) in the given order: a
/// quarter to an eighth of the doubles' transfer, and no storing pass on the host. false
/// (out undefined) without a device or on a CUDA error.
bool gpu_sample_store(const sampling::Sampler& s, std::uint64_t seed, std::uint32_t stream, std::int64_t n,
                      std::int64_t channel_stride, std::int64_t channels, const StorageOrder& order,
                      const RneFormat& format, int word_bytes, void* out);

}  // namespace ulpgate::detail
