// A baseline (`ulpgate gate --baseline B.json`), read by read_baseline_file. A baseline read
// without error must read back equal from the text write_baseline_file makes of it.
#include <string>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_input.hpp"
#include "campaign/gate.hpp"

using namespace ulpgate;
using json = nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::InputFile file("baseline.json");
  const std::string& path = file.write(data, size);
  fuzz::expect_input_errors_only([&] {
    const Baseline b = read_baseline_file(path);
    const std::string first = to_json(b).dump(1);
    try {
      if (!(baseline_from_json(json::parse(first)) == b))
        fuzz::finding("a written baseline reads back different:\n" + first);
    } catch (const InputError& e) {
      fuzz::finding(std::string("a baseline read without error is refused once written: ") + e.what() + "\n" + first);
    }
  });
  return 0;
}
