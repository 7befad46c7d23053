#include "core/tensor.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <mutex>
#include <stdexcept>

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
  // Fixed-size loads (little-endian hosts): a memcpy of a variable size is a library call.
  const auto* p = static_cast<const std::byte*>(base);
  switch (storage_bytes(f)) {
    case 8: { std::uint64_t w; std::memcpy(&w, p + index * 8, 8); return w; }
    case 4: { std::uint32_t w; std::memcpy(&w, p + index * 4, 4); return storage_to_code(f, w); }
    case 2: { std::uint16_t w; std::memcpy(&w, p + index * 2, 2); return w; }
    default: return static_cast<Code>(p[index]);
  }
}

void store_code(Format f, void* base, std::int64_t index, Code c) {
  auto* p = static_cast<std::byte*>(base);
  const std::uint64_t word = code_to_storage(f, c);
  switch (storage_bytes(f)) {
    case 8: std::memcpy(p + index * 8, &word, 8); break;
    case 4: { const auto w = static_cast<std::uint32_t>(word); std::memcpy(p + index * 4, &w, 4); break; }
    case 2: { const auto w = static_cast<std::uint16_t>(word); std::memcpy(p + index * 2, &w, 2); break; }
    default: p[index] = static_cast<std::byte>(word);
  }
}

namespace {
// float(decode(f, code)) for every code of a format of 2^bits codes, made once.
template <int Bits>
const std::array<float, (1u << Bits)>& float_table(Format f) {
  static std::array<std::array<float, (1u << Bits)>, 8> tables;
  static std::array<std::once_flag, 8> made;
  const auto i = static_cast<std::size_t>(f);
  std::call_once(made.at(i), [&] {
    for (std::uint32_t c = 0; c < (1u << Bits); ++c) tables[i][c] = static_cast<float>(decode(f, c));
  });
  return tables[i];
}
}  // namespace

void decode_floats(Format f, const void* base, std::int64_t first, std::int64_t step, std::int64_t count, float* out) {
  const auto* p = static_cast<const std::byte*>(base);
  switch (f) {
    case Format::FP64: throw std::logic_error("decode_floats: FP64 values are not all floats");
    case Format::FP32:
    case Format::TF32: {
      const std::uint32_t mask = f == Format::TF32 ? ~std::uint32_t{0x1FFF} : ~std::uint32_t{0};
      for (std::int64_t i = 0; i < count; ++i) {
        std::uint32_t w;
        std::memcpy(&w, p + (first + i * step) * 4, 4);
        const float v = std::bit_cast<float>(w & mask);
        out[i] = std::isnan(v) ? (std::signbit(v) ? -NAN : NAN) : v;
      }
      return;
    }
    case Format::FP16:
    case Format::BF16: {
      const auto& table = float_table<16>(f);
      for (std::int64_t i = 0; i < count; ++i) {
        std::uint16_t w;
        std::memcpy(&w, p + (first + i * step) * 2, 2);
        out[i] = table[w];
      }
      return;
    }
    case Format::E4M3:
    case Format::E5M2: {
      const auto& table = float_table<8>(f);
      for (std::int64_t i = 0; i < count; ++i) out[i] = table[static_cast<std::uint8_t>(p[first + i * step])];
      return;
    }
  }
}

Code Tensor::code(std::size_t i) const { return load_code(format_, bytes_.data(), i); }
void Tensor::set_code(std::size_t i, Code c) { store_code(format_, bytes_.data(), i, c); }

namespace {
template <class Word>
void fill_words(std::vector<std::byte, DefaultInitAllocator<std::byte>>& bytes, std::uint64_t word) {
  const auto w = static_cast<Word>(word);
  for (std::size_t i = 0, n = bytes.size() / sizeof(Word); i < n; ++i) std::memcpy(bytes.data() + i * sizeof(Word), &w, sizeof w);
}
}  // namespace

void Tensor::fill_code(Code c) {
  const std::uint64_t word = code_to_storage(format_, c);
  switch (storage_bytes(format_)) {
    case 8: fill_words<std::uint64_t>(bytes_, word); break;
    case 4: fill_words<std::uint32_t>(bytes_, word); break;
    case 2: fill_words<std::uint16_t>(bytes_, word); break;
    default: std::memset(bytes_.data(), static_cast<int>(word & 0xFF), bytes_.size());
  }
}

}  // namespace ulpgate
