// FNV-1a, 64 bits: the stable short hashes of case ids, plugin files and seeds.
#pragma once

#include <cstdint>
#include <string_view>

namespace ulpgate {

inline constexpr std::uint64_t kFnv1aOffset = 1469598103934665603ull;

/// FNV-1a of bytes, continuing from h (kFnv1aOffset for a new hash).
inline std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h = kFnv1aOffset) {
  for (unsigned char ch : bytes) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace ulpgate
