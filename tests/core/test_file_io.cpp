// Reading JSON: every reader refuses what would exhaust the stack or the number type, with
// one line naming the file, the byte or the field (core/file_io.hpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "core/file_io.hpp"

using namespace ulpgate;

namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::path(testing::TempDir()) / ("ulpgate_file_io_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string error_of(const std::string& path) {
  try {
    read_json_file(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

}  // namespace

// 100000 nested arrays parse (the parser does not recurse), but every later walk over the
// document (dump, the readers' messages) recursed once per level: exit 139.
TEST(FileIo, NestingDeeperThanTheLimitIsRefusedWithItsByte) {
  EXPECT_EQ(error_of(write_file("ok.json", nested(kMaxJsonDepth))), "(accepted)");
  const std::string deep = write_file("deep.json", nested(kMaxJsonDepth + 1));
  EXPECT_EQ(error_of(deep), deep + ": JSON nested deeper than 64 levels at byte 65");
  const std::string very = write_file("very.json", "{\"a\": " + nested(100000) + "}");
  EXPECT_EQ(error_of(very), very + ": JSON nested deeper than 64 levels at byte 70");
  // Brackets inside strings are text, not nesting.
  EXPECT_EQ(error_of(write_file("text.json", "{\"a\": \"" + std::string(1000, '[') + "\\\"[\"}")), "(accepted)");
}

// 1e400 is valid JSON but no double: the JSON library threw its own out_of_range (exit 3).
TEST(FileIo, NumbersBeyondDoubleNameTheField) {
  const std::string top = write_file("big.json", R"({"gemm": {"m": 3, "k": 1e400}})");
  EXPECT_EQ(error_of(top), top + ": gemm.k: number 1e400 is out of range (beyond +-1.8e308)");
  const std::string in_array = write_file("array.json", R"({"cases": [{"x": 1}, {"y": [0, -1e999]}]})");
  EXPECT_EQ(error_of(in_array), in_array + ": cases[1].y[1]: number -1e999 is out of range (beyond +-1.8e308)");
  const std::string bare = write_file("bare.json", "1e400");
  EXPECT_EQ(error_of(bare), bare + ": number 1e400 is out of range (beyond +-1.8e308)");
}

// The same checks for text that is not a file of its own (a journal line).
TEST(FileIo, ParseJsonTextAppliesTheSameLimits) {
  const auto error_of_text = [](const std::string& text) {
    try {
      parse_json(text);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error_of_text(nested(kMaxJsonDepth + 1)), "JSON nested deeper than 64 levels at byte 65");
  EXPECT_EQ(error_of_text(R"({"a": 1e400})"), "a: number 1e400 is out of range (beyond +-1.8e308)");
  EXPECT_EQ(error_of_text("[1,").rfind("not valid JSON at byte 4: ", 0), 0u) << error_of_text("[1,");
  EXPECT_EQ(parse_json(R"({"a": [1, 2]})")["a"][1], 2);
}

// A parameterised model's name as a file name: letters, digits, '.', '_' and '-' kept, every
// other byte (':', ',', '=', '/', spaces, non-ASCII) one '_'.
TEST(FileIo, SafeFileNameKeepsOnlyPortableCharacters) {
  EXPECT_EQ(safe_file_name("cpu.blockfma:block=4,frac=23-ab12"), "cpu.blockfma_block_4_frac_23-ab12");
  EXPECT_EQ(safe_file_name("a/b c\xc3\xa9_d"), "a_b_c___d");
  EXPECT_EQ(safe_file_name(""), "");
}
