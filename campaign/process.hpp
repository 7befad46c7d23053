// Process handling for crash isolation (isolate.hpp): descriptors and pipes, starting a
// worker in its own process group, reading its protocol stream and stderr, reaping it, and
// the registry of running workers that kill_all_workers() empties.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ulpgate {

using ProcessClock = std::chrono::steady_clock;

/// Owns a POSIX file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  int get() const { return fd_; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// strerror(errno).
std::string errno_text();

/// The time point `seconds` from now.
ProcessClock::time_point deadline_after(double seconds);

/// Worker stderr for a one-line message: trailing space trimmed, lines joined by " | ".
std::string one_line(std::string s);

/// Writes all of text to fd (a pipe or socket), retrying on EINTR and short writes; with a
/// deadline, false once it passes. MSG_NOSIGNAL on sockets, so that a dead reader is an
/// EPIPE error, not a SIGPIPE that kills this process.
bool write_all(int fd, std::string_view text, bool socket, std::optional<ProcessClock::time_point> deadline = {});

/// Reads newline-terminated lines from a blocking descriptor.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  /// The next line without its newline; false at end of input (a final unterminated line
  /// is dropped: the parent always ends its requests with a newline).
  bool next(std::string& line);

 private:
  int fd_;
  std::string buffer_;
};

/// A running worker process and the parent's ends of its pipes. Destruction kills the
/// worker's process group if the worker has not been reaped, then reaps it: no zombies.
struct WorkerProcess {
  pid_t pid = -1;
  bool reaped = false;
  int wait_status = 0;
  UniqueFd request, result, err;
  std::string result_buffer;  ///< bytes of the protocol stream not yet split into lines
  std::string stderr_tail;    ///< the worker's stderr since the current request was sent
  std::size_t tail_limit = 2048;

  WorkerProcess() = default;
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;
  ~WorkerProcess() { kill_and_reap(); }

  /// Kills the worker's process group and reaps it (nothing when already reaped).
  void kill_and_reap();
  /// Reads whatever stderr holds now, keeping the last tail_limit bytes.
  void drain_stderr();
  /// The kept stderr as one line, "..." in front when cut.
  std::string tail() const;

  enum class Wait { Line, Closed, TimedOut };
  /// The next protocol line (kWorkerLinePrefix removed), or why there is none: the worker
  /// closed its stdout (it died or is dying) or the deadline passed. Drains stderr meanwhile
  /// so that a worker writing a lot of it never blocks.
  Wait next_line(ProcessClock::time_point deadline, std::string& line);
  /// After the protocol pipe closed: waits up to grace seconds for the worker to end (it
  /// normally has: it died), kills the group if it has not, reaps it, and collects the
  /// rest of its stderr. Returns what happened, e.g. "killed by SIGSEGV (Segmentation fault)".
  std::string reap_after_close(double grace_seconds);

 private:
  void set_reaped();
};

/// The running binary's path (/proc/self/exe resolved) when `given` is empty, else `given`.
std::string resolve_binary(const std::string& given);

/// Starts args[0] with args as its argv: in a process group of its own, dying with this
/// process, without core files, its stdin a socket and its stdout and stderr pipes to the
/// returned WorkerProcess (registered for kill_all_workers). Throws std::runtime_error when
/// no process can be made; a failed exec shows as exit status 127 with the reason on stderr.
std::unique_ptr<WorkerProcess> spawn_worker(std::vector<std::string> args, std::size_t tail_limit);

}  // namespace ulpgate
