#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/tensor.hpp"

using namespace ulpgate;

TEST(Tensor, StorageIsWhatKernelsSee) {
  Tensor h(Format::FP16, 3);
  h.set_value(0, 1.0);
  h.set_value(1, -2.0);
  h.set_value(2, 65520.0);  // rounds to Inf
  std::uint16_t raw[3];
  std::memcpy(raw, h.data(), sizeof raw);
  EXPECT_EQ(raw[0], 0x3C00);
  EXPECT_EQ(raw[1], 0xC000);
  EXPECT_EQ(raw[2], 0x7C00);
  EXPECT_EQ(h.size_bytes(), 6u);

  Tensor t(Format::TF32, 1);
  t.set_value(0, 1.0 + 0x1p-10 + 0x1p-12);
  float f;
  std::memcpy(&f, t.data(), 4);
  EXPECT_EQ(f, 1.0f + 0x1p-10f);  // an FP32 word with the low 13 bits zero
  EXPECT_EQ(t.value(0), 1.0 + 0x1p-10);

  Tensor e(Format::E4M3, 4);
  e.fill_code(canonical_nan(Format::E4M3));
  EXPECT_TRUE(std::isnan(e.value(3)));
  EXPECT_EQ(e.size_bytes(), 4u);
  EXPECT_EQ(storage_bytes(Format::FP64), 8u);
}

// decode_floats is float(decode) bit for bit: every code of the narrow formats, and FP32 /
// TF32 words of every class (NaNs of both signs and any payload, Inf, subnormals, TF32
// words with low bits set), read with a stride.
TEST(Tensor, DecodeFloatsIsTheExactValueOfEveryWord) {
  const auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
  for (const Format f : {Format::FP16, Format::BF16, Format::E4M3, Format::E5M2}) {
    const std::int64_t codes = std::int64_t{1} << (8 * storage_bytes(f));
    Tensor t(f, static_cast<std::size_t>(3 * codes));
    for (std::int64_t c = 0; c < codes; ++c) store_code(f, t.data(), 3 * c + 1, static_cast<Code>(c));
    std::vector<float> out(static_cast<std::size_t>(codes));
    decode_floats(f, t.data(), 1, 3, codes, out.data());
    for (std::int64_t c = 0; c < codes; ++c)
      ASSERT_EQ(bits(out[c]), bits(static_cast<float>(decode(f, static_cast<Code>(c))))) << name(f) << " code " << c;
  }
  std::vector<std::uint32_t> words{0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x3F800000,
                                   0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
                                   0xFFFFFFFF, 0x3F801FFF, 0x00001FFF, 0x7F801000};
  for (std::uint32_t w = 0x1234567; words.size() < 100000; w = w * 1664525u + 1013904223u) words.push_back(w);
  for (const Format f : {Format::FP32, Format::TF32}) {
    std::vector<float> out(words.size());
    decode_floats(f, words.data(), 0, 1, static_cast<std::int64_t>(words.size()), out.data());
    for (std::size_t i = 0; i < words.size(); ++i)
      ASSERT_EQ(bits(out[i]), bits(static_cast<float>(decode(f, storage_to_code(f, words[i])))))
          << name(f) << " word " << std::hex << words[i];
  }
  EXPECT_THROW(decode_floats(Format::FP64, words.data(), 0, 1, 1, nullptr), std::logic_error);
}
