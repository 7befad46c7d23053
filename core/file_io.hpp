// Files: reading JSON with one-line errors, writing text atomically. Every file ulpgate
// reads (cases, run records, baselines) and writes (those, reports) goes through here.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace ulpgate {

/// The deepest nesting of arrays and objects any reader accepts: every ulpgate file needs
/// a handful of levels, and walks over a document (dump, messages) recurse once per level.
inline constexpr int kMaxJsonDepth = 64;

/// The first control character of untrusted one-line text (a byte below 0x20 other than
/// tab, or 0x7f; NUL included) as an error message tells it, "control character 0x00 at
/// offset 7", never writing the byte raw; empty when there is none.
std::string control_character_problem(std::string_view text);

/// Parses JSON text. InputError, without a source in front: "not valid JSON at byte N:
/// <parser's message>", "JSON nested deeper than 64 levels at byte N", "FIELD: number 1e400
/// is out of range (beyond +-1.8e308)" with FIELD a path such as "cases[3].seconds".
nlohmann::json parse_json(std::string_view text);

/// The whole file's bytes; InputError naming the path when it cannot be read (`what`
/// names the kind of file expected, for a directory given in its place).
std::string read_whole_file(const std::string& path, std::string_view what = "file");

/// Parses a JSON file (parse_json, the path in front of its messages). InputError also for
/// "path: cannot open (reason)", "path: is a directory, not a <what>".
nlohmann::json read_json_file(const std::string& path, std::string_view what = "JSON file");

/// read_json_file, then convert(json); an InputError from convert gets the path in front.
template <class Convert>
auto read_json_file_as(const std::string& path, Convert&& convert, std::string_view what = "JSON file") {
  const nlohmann::json j = read_json_file(path, what);
  try {
    return convert(j);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
}

/// name as a file name of letters, digits, '.', '_' and '-' only, every other byte '_':
/// "cpu.blockfma:block=4" -> "cpu.blockfma_block_4". Not a path: '/' becomes '_' too.
std::string safe_file_name(std::string_view name);

/// Writes text to path through a temporary file beside it, fsync and rename, so that a
/// reader sees the old file or the whole new one; throws InputError naming the path.
void write_text_file_atomically(const std::string& path, std::string_view text);

}  // namespace ulpgate
