// A run record (`ulpgate report RUN.json`, `gate`, `baseline update`), read by
// read_record_file. A record read without error must read back from the text
// write_record_file makes of it (record.hpp: a record read back equals the one written).
#include <string>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_input.hpp"
#include "campaign/record.hpp"

using namespace ulpgate;
using json = nlohmann::json;

namespace {
// write_record_file's text.
std::string written(const RunRecord& r) { return to_json(r).dump(1, ' ', false, json::error_handler_t::replace); }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::InputFile file("record.json");
  const std::string& path = file.write(data, size);
  fuzz::expect_input_errors_only([&] {
    const std::string first = written(read_record_file(path));
    std::string again;
    try {
      again = written(record_from_json(json::parse(first)));
    } catch (const InputError& e) {
      fuzz::finding(std::string("a record read without error is refused once written: ") + e.what() + "\n" + first);
    }
    if (again != first) fuzz::finding("a written record reads back different:\n" + first + "\n" + again);
  });
  return 0;
}
