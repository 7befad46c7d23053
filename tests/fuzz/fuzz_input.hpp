// What every harness shares: the outcomes that count as normal for bad input, and the
// input written to a file so that file readers run through the tool's own entry point.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace ulpgate::fuzz {

/// Runs read(); an InputError (the documented answer to bad input: exit 2, one line) is the
/// normal outcome. The file harnesses read through the tool's own entry points, which turn
/// the JSON parser's errors into InputError, so a raw nlohmann exception is a finding (the
/// CLI would say "internal error", exit 3). Anything but InputError escapes to libFuzzer,
/// which reports it (an uncaught exception aborts) together with crashes, leaks and UB.
/// ULPGATE_FUZZ_VERBOSE=1 prints each InputError (to see what a seed or reproducer does).
template <class Read>
void expect_input_errors_only(Read&& read) {
  static const bool verbose = std::getenv("ULPGATE_FUZZ_VERBOSE") != nullptr;
  try {
    read();
    if (verbose) std::fprintf(stderr, "accepted\n");
  } catch (const InputError& e) {
    if (verbose) std::fprintf(stderr, "InputError: %s\n", e.what());
  }
}

/// A property of a value read without error failed: print what and abort (a finding).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "ulpgate fuzz finding: %s\n", what.c_str());
  std::abort();
}

/// One file per process, rewritten for each input, on tmpfs where there is one: the file
/// readers (read_case_file, ...) see the bytes exactly as `ulpgate` would.
class InputFile {
 public:
  explicit InputFile(std::string_view name = "input") {
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : tmp ? tmp : "/tmp";
    path_ = dir + "/ulpgate-fuzz-" + std::to_string(::getpid()) + "-" + std::string(name);
  }
  ~InputFile() { ::unlink(path_.c_str()); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// Replaces the file's contents with data; returns its path.
  const std::string& write(const std::uint8_t* data, std::size_t size) {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) finding("cannot write the input file " + path_);
    for (std::size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0) finding("cannot write the input file " + path_);
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace ulpgate::fuzz
