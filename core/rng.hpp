// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11), the generator of
// Random123 and cuRAND's Philox. The bits for an element are a pure function of (seed,
// stream, index), with no state, so a case gives the same bits on the CPU and the GPU with
// any number of threads. Key and counter convention: see docs/concepts/cases.md ("Seeds").
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace ulpgate {

struct RandomBlock {
  std::uint32_t w[4];
};

namespace detail {
ULPGATE_HD void mulhilo32(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace detail

/// Philox4x32 with 10 rounds on an explicit counter and key (Random123 semantics).
ULPGATE_HD RandomBlock philox4x32_10(RandomBlock ctr, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    detail::mulhilo32(kM0, ctr.w[0], hi0, lo0);
    detail::mulhilo32(kM1, ctr.w[2], hi1, lo1);
    ctr = RandomBlock{{hi1 ^ ctr.w[1] ^ k0, lo1, hi0 ^ ctr.w[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

/// 128 random bits for (seed, stream, index).
ULPGATE_HD RandomBlock random_block(std::uint64_t seed, std::uint32_t stream, std::uint64_t index) {
  return philox4x32_10(RandomBlock{{static_cast<std::uint32_t>(index),
                                    static_cast<std::uint32_t>(index >> 32), stream, 0u}},
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

/// Words 0 and 1 of the block as one 64-bit value (word 1 high).
ULPGATE_HD std::uint64_t low64(const RandomBlock& b) {
  return (static_cast<std::uint64_t>(b.w[1]) << 32) | b.w[0];
}
/// Words 2 and 3 of the block as one 64-bit value (word 3 high).
ULPGATE_HD std::uint64_t high64(const RandomBlock& b) {
  return (static_cast<std::uint64_t>(b.w[3]) << 32) | b.w[2];
}

/// A double in [0, 1) with 53 random bits: (bits >> 11) * 2^-53. Exact, so identical on
/// any machine.
ULPGATE_HD double to_unit_closed_open(std::uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}
/// A double in (0, 1]: for logarithms.
ULPGATE_HD double to_unit_open_closed(std::uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53;
}

}  // namespace ulpgate
