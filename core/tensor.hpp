// A host tensor: a flat buffer of one format's storage words, exactly as a kernel sees it
// in memory (FP16/BF16 as 16-bit words, TF32 as FP32 words with the low 13 bits zero,
// FP8 as bytes). The shape and strides that give the buffer meaning come from the Case
// (case.hpp); element i here is the i-th storage word.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "core/format.hpp"
#include "core/uninitialized.hpp"

namespace ulpgate {

/// Bytes of one stored element: FP64 8, FP32 and TF32 4, FP16 and BF16 2, FP8 1.
std::size_t storage_bytes(Format f);

/// The storage word of a code (TF32: the FP32 word) and back.
std::uint64_t code_to_storage(Format f, Code c);
Code storage_to_code(Format f, std::uint64_t word);

/// Reads / writes element `index` of a raw buffer of format f's storage words.
Code load_code(Format f, const void* base, std::int64_t index);
void store_code(Format f, void* base, std::int64_t index, Code c);

/// out[i] = float(decode(f, element first + i x step)) for i in [0, count): the exact values
/// of a strided run of storage words as floats, for every format but FP64 (whose values
/// are not all floats). Table-driven for FP16, BF16 and FP8, bit copies for FP32 and TF32
/// (a NaN as decode gives it: the canonical one of its sign), so several times faster than
/// an element at a time through Tensor::value.
void decode_floats(Format f, const void* base, std::int64_t first, std::int64_t step, std::int64_t count, float* out);

class Tensor {
 public:
  /// Tensor(f, n, Tensor::uninitialized): storage the caller writes in full.
  struct Uninitialized {};
  static constexpr Uninitialized uninitialized{};

  Tensor() = default;
  /// n elements, every storage word zero.
  Tensor(Format f, std::size_t elements) : format_(f), bytes_(elements * storage_bytes(f)) {
    if (!bytes_.empty()) std::memset(bytes_.data(), 0, bytes_.size());
  }
  Tensor(Format f, std::size_t elements, Uninitialized) : format_(f), bytes_(elements * storage_bytes(f)) {}

  Format format() const { return format_; }
  std::size_t size() const { return bytes_.size() / storage_bytes(format_); }
  std::size_t size_bytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  Code code(std::size_t i) const;
  void set_code(std::size_t i, Code c);
  /// The exact value of element i.
  double value(std::size_t i) const { return decode(format_, code(i)); }
  /// Rounds x to the format (RNE, IEEE overflow) and stores it.
  void set_value(std::size_t i, double x) { set_code(i, encode(format_, x)); }
  /// Every element set to one code (e.g. a NaN poison pattern).
  void fill_code(Code c);

 private:
  Format format_ = Format::FP32;
  std::vector<std::byte, DefaultInitAllocator<std::byte>> bytes_;
};

}  // namespace ulpgate
