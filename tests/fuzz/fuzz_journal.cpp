// A campaign journal (`ulpgate fuzz --resume`, and a report on an interrupted campaign),
// read line by line by read_journal and by Journal's resume. A journal read without error
// must resume, and its entries appended to a new journal must read back the same.
#include <string>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_input.hpp"
#include "campaign/journal.hpp"

using namespace ulpgate;
using json = nlohmann::json;

namespace {
// An entry as text (the journal writes strings that are not UTF-8 as U+FFFD).
std::string text(const JournalEntry& e) {
  return json{{"kernel", e.kernel}, {"case", to_json(e.requested)}, {"result", case_result_to_json(e.result)}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::InputFile file("journal.jsonl"), copy("copy.jsonl");
  const std::string& path = file.write(data, size);
  fuzz::expect_input_errors_only([&] {
    const JournalContents contents = read_journal(path);
    try {
      // A resume reads the same file (and drops a truncated last line from it).
      const Journal resumed(path, contents.campaign, /*resume=*/true, /*sync=*/false);
      if (resumed.loaded() != contents.entries.size()) fuzz::finding("resume and read_journal disagree on the entries");
      const std::string& copied = copy.write(nullptr, 0);
      {
        Journal out(copied, contents.campaign, /*resume=*/false, /*sync=*/false);
        for (const JournalEntry& e : contents.entries) out.append(e.kernel, e.requested, e.result);
      }
      const JournalContents again = read_journal(copied);
      if (again.campaign != contents.campaign || again.entries.size() != contents.entries.size())
        fuzz::finding("a rewritten journal reads back different");
      for (std::size_t i = 0; i < again.entries.size(); ++i)
        if (text(again.entries[i]) != text(contents.entries[i]))
          fuzz::finding("a rewritten journal entry reads back different:\n" + text(contents.entries[i]) + "\n" +
                        text(again.entries[i]));
    } catch (const InputError& e) {
      fuzz::finding(std::string("a journal read without error cannot be resumed or rewritten: ") + e.what());
    }
  });
  return 0;
}
