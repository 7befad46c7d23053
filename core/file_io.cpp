#include "core/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace ulpgate {
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

}  // namespace

nlohmann::json read_json_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(fmt::format("{}: is a directory, not a {}", path, what));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open ({})", path, errno_text(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read failed");
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann's message starts "[json.exception.parse_error.101] parse error at line L,
    // column C: ..."; the tag is noise to a user, the rest says what broke.
    std::string why = e.what();
    if (const auto p = why.find("] "); p != std::string::npos) why = why.substr(p + 2);
    throw InputError(fmt::format("{}: not valid JSON at byte {}: {}", path, e.byte, why));
  }
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
