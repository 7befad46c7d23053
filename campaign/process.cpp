#include "campaign/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "core/profile.hpp"
#include "campaign/isolate.hpp"

namespace ulpgate {

const char* known_signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGTRAP: return "SIGTRAP";
    case SIGPIPE: return "SIGPIPE";
    case SIGSYS: return "SIGSYS";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGALRM: return "SIGALRM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return nullptr;
  }
}

namespace {

// Milliseconds left until deadline for poll(), at least 0.
int ms_until(ProcessClock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - ProcessClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

std::string signal_name(int sig) {
  const char* known = known_signal_name(sig);
  return known ? known : fmt::format("signal {}", sig);
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return fmt::format("killed by {} ({})", signal_name(sig), strsignal(sig));
  }
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return fmt::format("ended with wait status {:#x}", status);
}

// The pids of the running workers of this process, for kill_all_workers() in a signal
// handler: plain atomics, no locks or allocation.
constexpr int kWorkerSlots = 1024;
std::atomic<pid_t> worker_pids[kWorkerSlots];

void register_worker(pid_t pid) {
  for (auto& slot : worker_pids) {
    pid_t none = 0;
    if (slot.compare_exchange_strong(none, pid)) return;
  }
}

void unregister_worker(pid_t pid) {
  for (auto& slot : worker_pids) {
    pid_t mine = pid;
    if (slot.compare_exchange_strong(mine, 0)) return;
  }
}

}  // namespace

void kill_all_workers() {
  for (auto& slot : worker_pids)
    if (const pid_t pid = slot.load(); pid > 0) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
    }
}

int UniqueFd::release() { return std::exchange(fd_, -1); }

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string errno_text() { return std::strerror(errno); }

ProcessClock::time_point deadline_after(double seconds) {
  return ProcessClock::now() + std::chrono::duration_cast<ProcessClock::duration>(std::chrono::duration<double>(seconds));
}

std::string one_line(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::string out;
  for (char c : s) {
    if (c == '\n') out += " | ";
    else if (c != '\r') out += c;
  }
  return out;
}

bool write_all(int fd, std::string_view text, bool socket, std::optional<ProcessClock::time_point> deadline) {
  for (std::size_t done = 0; done < text.size();) {
    if (deadline) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, ms_until(*deadline));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
    }
    const ssize_t n = socket ? ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL)
                             : ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

bool LineReader::next(std::string& line) {
  for (;;) {
    if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
      line.assign(buffer_, 0, nl);
      buffer_.erase(0, nl + 1);
      return true;
    }
    char chunk[65536];
    const ssize_t n = ::read(fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

// --- A running worker ----------------------------------------------------------------------

void WorkerProcess::kill_and_reap() {
  if (pid <= 0 || reaped) return;
  ::kill(-pid, SIGKILL);  // the group: helpers a kernel forked die too
  ::kill(pid, SIGKILL);   // in case the child had not reached setpgid yet
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  set_reaped();
}

void WorkerProcess::set_reaped() {
  reaped = true;
  unregister_worker(pid);
}

void WorkerProcess::drain_stderr() {
  char chunk[8192];
  for (;;) {
    const ssize_t n = ::read(err.get(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EAGAIN (nothing more now) or end of file
    if (profiling()) std::fwrite(chunk, 1, static_cast<std::size_t>(n), stderr);  // the worker's phase timings
    stderr_tail.append(chunk, static_cast<std::size_t>(n));
    if (stderr_tail.size() > 2 * tail_limit) stderr_tail.erase(0, stderr_tail.size() - tail_limit);
  }
}

std::string WorkerProcess::tail() const {
  const std::string t = stderr_tail.size() > tail_limit ? "..." + stderr_tail.substr(stderr_tail.size() - tail_limit)
                                                        : stderr_tail;
  return one_line(t);
}

WorkerProcess::Wait WorkerProcess::next_line(ProcessClock::time_point deadline, std::string& line) {
  for (;;) {
    for (std::size_t nl; (nl = result_buffer.find('\n')) != std::string::npos;) {
      std::string l = result_buffer.substr(0, nl);
      result_buffer.erase(0, nl + 1);
      if (l.rfind(kWorkerLinePrefix, 0) == 0) {
        line = l.substr(kWorkerLinePrefix.size());
        return Wait::Line;
      }
      // Not ours: the worker redirects kernel output away from this pipe, so this is
      // someone writing to the protocol descriptor directly. Keep it for the message.
      stderr_tail += "[stray output on the protocol pipe] " + l + "\n";
    }
    pollfd fds[2] = {{result.get(), POLLIN, 0}, {err.get(), POLLIN, 0}};
    const int r = ::poll(fds, err.get() >= 0 ? 2 : 1, ms_until(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error("worker: poll failed: " + errno_text());
    if (r == 0) return Wait::TimedOut;
    if (fds[1].revents) drain_stderr();
    if (fds[0].revents) {
      char chunk[65536];
      const ssize_t n = ::read(result.get(), chunk, sizeof chunk);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) return Wait::Closed;
      result_buffer.append(chunk, static_cast<std::size_t>(n));
    }
  }
}

std::string WorkerProcess::reap_after_close(double grace_seconds) {
  const auto deadline = deadline_after(grace_seconds);
  bool killed = false;
  while (!reaped) {
    const pid_t w = ::waitpid(pid, &wait_status, WNOHANG);
    if (w == pid) {
      set_reaped();
      break;
    }
    if (w < 0 && errno != EINTR) break;
    if (ProcessClock::now() >= deadline) {
      killed = true;
      kill_and_reap();
      break;
    }
    pollfd p{err.get(), POLLIN, 0};
    if (::poll(&p, 1, 10) > 0) drain_stderr();
  }
  ::kill(-pid, SIGKILL);  // helpers a kernel may have forked; the group is gone otherwise
  // The rest of stderr: end of file once every writer is gone; bounded, since a helper
  // outside the group could hold it open.
  const auto stderr_deadline = deadline_after(0.5);
  for (;;) {
    pollfd p{err.get(), POLLIN, 0};
    if (::poll(&p, 1, ms_until(stderr_deadline)) <= 0) break;
    char chunk[8192];
    const ssize_t n = ::read(err.get(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    stderr_tail.append(chunk, static_cast<std::size_t>(n));
  }
  if (killed) return "closed its output but did not exit (killed)";
  return describe_wait_status(wait_status);
}

// --- Starting one --------------------------------------------------------------------------

namespace {

// A process's descriptors for the worker's stdin (a socket, so a write to a dead worker is
// EPIPE rather than SIGPIPE), stdout (the protocol) and stderr (kept for crash messages).
struct ChildPipes {
  UniqueFd request_parent, request_child;
  UniqueFd result_parent, result_child;
  UniqueFd stderr_parent, stderr_child;
};

ChildPipes make_child_pipes() {
  ChildPipes p;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error("worker: socketpair failed: " + errno_text());
  p.request_parent.reset(sv[0]);
  p.request_child.reset(sv[1]);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("worker: pipe failed: " + errno_text());
  p.result_parent.reset(fds[0]);
  p.result_child.reset(fds[1]);
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("worker: pipe failed: " + errno_text());
  p.stderr_parent.reset(fds[0]);
  p.stderr_child.reset(fds[1]);
  // The parent polls stderr together with the results and must never block on it.
  ::fcntl(p.stderr_parent.get(), F_SETFL, ::fcntl(p.stderr_parent.get(), F_GETFL) | O_NONBLOCK);
  ::fcntl(p.result_parent.get(), F_SETFL, ::fcntl(p.result_parent.get(), F_GETFL) | O_NONBLOCK);
  return p;
}

// The child's side of spawn_worker, after fork: only async-signal-safe calls (the parent
// may have threads). Never returns.
[[noreturn]] void exec_worker(const ChildPipes& pipes, char* const* argv, pid_t parent) {
  // Own process group, so a timeout kills the worker and anything it started.
  ::setpgid(0, 0);
  // Die with the parent: a campaign killed with SIGKILL leaves no worker behind.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(126);
  // A crashing kernel is expected here; core files would only fill the campaign folder.
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  ::dup2(pipes.request_child.get(), STDIN_FILENO);
  ::dup2(pipes.result_child.get(), STDOUT_FILENO);
  ::dup2(pipes.stderr_child.get(), STDERR_FILENO);
#ifdef SYS_close_range
  // Descriptors the parent opened without O_CLOEXEC (a journal, say) stay out of the worker.
  ::syscall(SYS_close_range, 3u, ~0u, 0u);
#endif
  ::execv(argv[0], argv);
  const int exec_errno = errno;
  const char msg[] = "ulpgate worker: exec failed: ";
  [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  const char* why = strerror(exec_errno);  // not async-signal-safe in theory; only on this error path
  ignored = ::write(STDERR_FILENO, why, std::strlen(why));
  ::_exit(127);
}

}  // namespace

std::string resolve_binary(const std::string& given) {
  if (!given.empty()) return given;
  // The path itself, not /proc/self/exe, so that messages name the binary.
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) return "/proc/self/exe";
  path.resize(static_cast<std::size_t>(n));
  return path;
}

std::unique_ptr<WorkerProcess> spawn_worker(std::vector<std::string> args, std::size_t tail_limit) {
  // Everything the child needs is built before fork.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ChildPipes pipes = make_child_pipes();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("worker: fork failed: " + errno_text());
  if (pid == 0) exec_worker(pipes, argv.data(), parent);
  ::setpgid(pid, pid);  // both sides set it, so it holds before either side relies on it
  auto w = std::make_unique<WorkerProcess>();
  w->pid = pid;
  register_worker(pid);
  w->tail_limit = tail_limit;
  w->request = std::move(pipes.request_parent);
  w->result = std::move(pipes.result_parent);
  w->err = std::move(pipes.stderr_parent);
  // The child's ends close here (ChildPipes' destructor), so a dead worker reads as EOF.
  pipes = ChildPipes{};
  return w;
}

}  // namespace ulpgate
