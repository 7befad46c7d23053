#include "core/tensor.hpp"

namespace ulpgate {

std::size_t storage_bytes(Format f) {
  switch (f) {
    case Format::FP64: return 8;
    case Format::FP32:
    case Format::TF32: return 4;
    case Format::FP16:
    case Format::BF16: return 2;
    case Format::E4M3:
    case Format::E5M2: return 1;
  }
  return 0;
}

std::uint64_t code_to_storage(Format f, Code c) {
  return f == Format::TF32 ? tf32_code_to_fp32_bits(c) : c;
}

Code storage_to_code(Format f, std::uint64_t word) {
  return f == Format::TF32 ? fp32_bits_to_tf32_code(static_cast<std::uint32_t>(word)) : word;
}

Code load_code(Format f, const void* base, std::int64_t index) {
  const std::size_t w = storage_bytes(f);
  std::uint64_t word = 0;
  std::memcpy(&word, static_cast<const std::byte*>(base) + index * w, w);  // little-endian hosts
  return storage_to_code(f, word);
}

void store_code(Format f, void* base, std::int64_t index, Code c) {
  const std::size_t w = storage_bytes(f);
  const std::uint64_t word = code_to_storage(f, c);
  std::memcpy(static_cast<std::byte*>(base) + index * w, &word, w);
}

Code Tensor::code(std::size_t i) const { return load_code(format_, bytes_.data(), i); }
void Tensor::set_code(std::size_t i, Code c) { store_code(format_, bytes_.data(), i, c); }

void Tensor::fill_code(Code c) {
  for (std::size_t i = 0, n = size(); i < n; ++i) set_code(i, c);
}

}  // namespace ulpgate
