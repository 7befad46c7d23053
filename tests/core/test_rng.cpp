#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <set>
#include <thread>
#include <vector>

#include "core/rng.hpp"

using namespace ulpgate;

// Known-answer vectors of Random123 (kat_vectors, philox4x32 with 10 rounds):
// counter (4 words), key (2 words) -> output (4 words).
TEST(Philox, KnownAnswerVectors) {
  struct Kat { RandomBlock ctr; std::uint32_t k0, k1; RandomBlock out; };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const auto& k : kats) {
    const RandomBlock r = philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.w[i], k.out.w[i]) << "word " << i;
  }
}

TEST(Philox, CounterLayoutIsSeedStreamIndex) {
  const std::uint64_t seed = 0x0123456789abcdefull;
  const RandomBlock a = random_block(seed, 7, 0x1122334455667788ull);
  const RandomBlock b = philox4x32_10(RandomBlock{{0x55667788u, 0x11223344u, 7u, 0u}},
                                      0x89abcdefu, 0x01234567u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.w[i], b.w[i]);
}

// Bits do not depend on the number of threads or the order elements are visited in.
TEST(Philox, IndependentOfThreadCountAndOrder) {
  const std::size_t n = 1 << 16;
  std::vector<std::uint64_t> serial(n), threaded(n);
  for (std::size_t i = 0; i < n; ++i) serial[i] = low64(random_block(42, 3, i));
  std::vector<std::thread> pool;
  const unsigned t = 4;
  for (unsigned w = 0; w < t; ++w)
    pool.emplace_back([&, w] {
      for (std::size_t i = n - 1 - w; i < n; i -= t) threaded[i] = low64(random_block(42, 3, i));
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(serial, threaded);
}

TEST(Philox, StreamsAndSeedsDiffer) {
  std::set<std::uint64_t> seen;
  for (std::uint64_t seed : {0ull, 1ull, 1ull << 32})
    for (std::uint32_t stream : {0u, 1u, 2u})
      for (std::uint64_t i : {0ull, 1ull, 1ull << 32})
        seen.insert(low64(random_block(seed, stream, i)));
  EXPECT_EQ(seen.size(), 27u);
}

// Uniform doubles: exact 53-bit grid, range, and mean/variance on a large sample.
TEST(Philox, UnitIntervalConversions) {
  EXPECT_EQ(to_unit_closed_open(0), 0.0);
  EXPECT_EQ(to_unit_closed_open(~0ull), 1.0 - 0x1p-53);
  EXPECT_EQ(to_unit_open_closed(0), 0x1p-53);
  EXPECT_EQ(to_unit_open_closed(~0ull), 1.0);
  const int n = 1 << 20;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = to_unit_closed_open(low64(random_block(9, 0, i)));
    sum += u;
    sum2 += u * u;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  // Standard error of the mean: sqrt(1/12/n) ~ 2.8e-4; allow 5 sigma.
  EXPECT_NEAR(mean, 0.5, 5 * 2.8e-4);
  EXPECT_NEAR(var, 1.0 / 12, 1e-3);
}

RC_GTEST_PROP(Philox, EachOutputBitIsBalanced, ()) {
  // Over 4096 consecutive indices from a random seed and stream, every one of the 128
  // output bits is set close to half the time (binomial sd = 32; allow 6 sd).
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const auto stream = *rc::gen::arbitrary<std::uint32_t>();
  int ones[128] = {};
  for (std::uint64_t i = 0; i < 4096; ++i) {
    const RandomBlock b = random_block(seed, stream, i);
    for (int w = 0; w < 4; ++w)
      for (int bit = 0; bit < 32; ++bit) ones[w * 32 + bit] += (b.w[w] >> bit) & 1;
  }
  for (int k = 0; k < 128; ++k) RC_ASSERT(std::abs(ones[k] - 2048) < 6 * 32);
}
