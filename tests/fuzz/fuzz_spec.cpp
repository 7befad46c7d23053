// A distribution spec (`--dist`, and every "dist" string of a case), read by parse_dist.
// A spec parsed without error must parse again from its canonical text to the same spec.
#include <string>
#include <string_view>

#include "distributions/spec.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace ulpgate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_input_errors_only([&] {
    const DistSpec s = parse_dist(text);
    if (!find_family(s.family)) fuzz::finding("parsed to an unknown family " + s.family);
    const std::string canonical = s.canonical();
    std::string again;
    try {
      again = parse_dist(canonical).canonical();
    } catch (const InputError& e) {
      fuzz::finding(std::string("the canonical text of a valid spec is refused: ") + e.what());
    }
    if (again != canonical) fuzz::finding("canonical text is not stable: " + canonical + " -> " + again);
  });
  return 0;
}
