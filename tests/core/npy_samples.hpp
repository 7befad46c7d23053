// .npy files of other versions and layouts than npy_bytes writes, for the reader's tests and
// the fuzz seeds (tests/fuzz/make_seeds.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ulpgate::samples {

/// A .npy file of format version major.0 with header dict text `dict`, laid out as NumPy
/// lays it out (spaces to a multiple of 64 bytes, then a newline), followed by data.
inline std::string npy_file(int major, const std::string& dict, std::string_view data) {
  const std::size_t preamble = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append(63 - (preamble + header.size()) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < preamble - 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data);
}

}  // namespace ulpgate::samples
