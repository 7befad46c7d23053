#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

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
