#include "core/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace ulpgate {

std::string control_character_problem(std::string_view text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto ch = static_cast<unsigned char>(text[i]);
    if ((ch < 0x20 && ch != '\t') || ch == 0x7f) return fmt::format("control character 0x{:02x} at offset {}", ch, i);
  }
  return {};
}
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Removes a temporary file unless the write went through (then it was renamed away).
struct TempFile {
  std::string path;
  bool keep = false;
  ~TempFile() {
    if (!keep) ::unlink(path.c_str());
  }
};

std::string errno_text(int e) { return std::strerror(e); }

using json = nlohmann::json;

// The byte (1-based, as the parser counts) of the first bracket opening a level deeper
// than kMaxJsonDepth, or 0. For text the parser accepted: brackets in strings are text.
std::size_t too_deep_at(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxJsonDepth) return i + 1;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return 0;
}

// Where a parse stopped: "gemm.k", "cases[3].y[1]" ("" at the top). The parser's
// callback reports each key and each finished value; the failing value never finishes,
// so the path at the throw is the path of that value.
class PathTracker {
 public:
  bool operator()(int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: frames_.push_back({false, 0, ""}); break;
      case json::parse_event_t::array_start: frames_.push_back({true, 0, ""}); break;
      case json::parse_event_t::key: frames_.back().key = parsed.get<std::string>(); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        finished_value();
        break;
      case json::parse_event_t::value: finished_value(); break;
    }
    return true;
  }
  std::string path() const {
    std::string p;
    for (const Frame& f : frames_)
      p += f.array ? fmt::format("[{}]", f.index) : (p.empty() ? "" : ".") + f.key;
    return p;
  }

 private:
  struct Frame {
    bool array;
    std::int64_t index;
    std::string key;
  };
  void finished_value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }
  std::vector<Frame> frames_;
};

}  // namespace

json parse_json(std::string_view text) {
  try {
    json j = json::parse(text);
    // The parser itself does not recurse, so the depth is checked on accepted text (and a
    // truncated deep file keeps its "not valid JSON" message).
    if (const std::size_t at = too_deep_at(text))
      throw InputError(fmt::format("JSON nested deeper than {} levels at byte {}", kMaxJsonDepth, at));
    return j;
  } catch (const json::parse_error& e) {
    // nlohmann's message starts "[json.exception.parse_error.101] parse error at line L,
    // column C: ..."; the tag is noise to a user, the rest says what broke.
    std::string why = e.what();
    if (const auto p = why.find("] "); p != std::string::npos) why = why.substr(p + 2);
    throw InputError(fmt::format("not valid JSON at byte {}: {}", e.byte, why));
  } catch (const json::out_of_range&) {
    // A number beyond double ("number overflow parsing '1e400'"): parse again, now
    // following the path, to name the field. Rare, so the common parse stays fast.
    PathTracker tracker;
    std::string token;
    try {
      [[maybe_unused]] const json partial = json::parse(text, std::ref(tracker));
    } catch (const json::out_of_range& e) {
      const std::string what = e.what();
      const auto open = what.find('\''), close = what.rfind('\'');
      if (open != std::string::npos && close > open) token = what.substr(open + 1, close - open - 1);
    }
    const std::string field = tracker.path();
    throw InputError(fmt::format("{}number {} is out of range (beyond +-1.8e308)", field.empty() ? "" : field + ": ",
                                 token.empty() ? "(?)" : token));
  }
}

std::string read_whole_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(fmt::format("{}: is a directory, not a {}", path, what));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open ({})", path, errno_text(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read failed");
  return std::move(text).str();
}

nlohmann::json read_json_file(const std::string& path, std::string_view what) {
  const std::string text = read_whole_file(path, what);
  try {
    return parse_json(text);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
}

std::string safe_file_name(std::string_view name) {
  std::string out(name);
  for (char& ch : out)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-') ch = '_';
  return out;
}

void write_text_file_atomically(const std::string& path, std::string_view text) {
  // The temporary lives beside the target so that rename() stays within one file system
  // (and so is atomic); the pid keeps two writers of the same path apart.
  TempFile tmp{fmt::format("{}.tmp.{}", path, ::getpid())};
  Fd f{::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (f.fd < 0) {
    tmp.keep = true;  // nothing was created
    throw InputError(fmt::format("{}: cannot write ({})", path, errno_text(errno)));
  }
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(f.fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(fmt::format("{}: write failed ({})", path, errno_text(errno)));
    done += static_cast<std::size_t>(n);
  }
  // Data on disk before the rename publishes it: after a crash a reader sees the old file
  // or the whole new one.
  if (::fsync(f.fd) != 0) throw InputError(fmt::format("{}: write failed ({})", path, errno_text(errno)));
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) throw InputError(fmt::format("{}: write failed ({})", path, errno_text(errno)));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    throw InputError(fmt::format("{}: cannot replace ({})", path, errno_text(errno)));
  tmp.keep = true;
}

}  // namespace ulpgate
