// A .npy file (`ulpgate check --outputs`), read by parse_npy_header and tensor_from_npy for
// every format. An array read without error must read back bit for bit from the bytes
// npy_bytes writes of it.
#include <cstring>
#include <string_view>

#include "core/npy.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace ulpgate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::int64_t elements = 0;
  fuzz::expect_input_errors_only([&] { elements = parse_npy_header(bytes).elements; });
  for (const Format f : kAllFormats)
    fuzz::expect_input_errors_only([&] {
      const Tensor t = tensor_from_npy(bytes, f, elements);
      const std::string again = npy_bytes(t);
      const Tensor back = tensor_from_npy(again, f, elements);
      // An array of no elements has no storage: memcmp must not see its null data().
      if (back.size_bytes() != t.size_bytes() || (t.size_bytes() != 0 && std::memcmp(back.data(), t.data(), t.size_bytes()) != 0))
        fuzz::finding("a .npy array written by npy_bytes reads back different");
    });
  return 0;
}
