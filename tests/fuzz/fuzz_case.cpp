// A case file (`ulpgate replay CASE.json`, `ulpgate fuzz --corpus DIR`), read as the tool
// reads it: read_case_file. A case read without error must also survive the tool's write
// (write_case_file's text) and read back to the same case.
#include <string>

#include <nlohmann/json.hpp>

#include "core/case.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace ulpgate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::InputFile file("case.json");
  const std::string& path = file.write(data, size);
  fuzz::expect_input_errors_only([&] {
    const Case c = read_case_file(path);
    const std::string written = to_json(c).dump(2);
    std::string again;
    try {
      again = to_json(case_from_json(nlohmann::json::parse(written))).dump(2);
    } catch (const InputError& e) {
      fuzz::finding(std::string("a case read without error is refused once written: ") + e.what() + "\n" + written);
    }
    if (again != written) fuzz::finding("a written case reads back different:\n" + written + "\n" + again);
  });
  return 0;
}
