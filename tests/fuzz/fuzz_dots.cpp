// A dump of `ulpgate probe --dump` (campaign/probe.hpp), read as the fitting tools read it:
// read_dots. A dump read without error must hold whole dot products whose factors are
// values of its input format (a and b of one length each).
#include <string>

#include "tests/fuzz/fuzz_input.hpp"
#include "campaign/probe.hpp"

using namespace ulpgate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::InputFile file("unit.dots");
  const std::string& path = file.write(data, size);
  fuzz::expect_input_errors_only([&] {
    const DotDump d = read_dots(path);
    for (const DumpedDot& dot : d.dots)
      if (dot.a.size() != dot.b.size()) fuzz::finding("a dumped dot product with factors of two lengths");
  });
  return 0;
}
