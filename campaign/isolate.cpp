#include "campaign/isolate.hpp"

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
#include <cctype>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <tuple>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/profile.hpp"
#include "campaign/fuzz.hpp"
#include "kernels/device.hpp"

#if ULPGATE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

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

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

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
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

std::string errno_text() { return std::strerror(errno); }

// Milliseconds left until deadline for poll(), at least 0.
int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
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

// Worker stderr for a one-line message: trailing space trimmed, lines joined by " | ".
std::string one_line(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::string out;
  for (char c : s) {
    if (c == '\n') out += " | ";
    else if (c != '\r') out += c;
  }
  return out;
}

// Writes all of text to fd (a pipe or socket), retrying on EINTR and short writes; MSG_NOSIGNAL
// on sockets so that a dead reader is an EPIPE error, not a SIGPIPE that kills this process.
bool write_all(int fd, std::string_view text, bool socket, std::optional<Clock::time_point> deadline = {}) {
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

// A protocol line: prefix, compact JSON, newline. Strings from kernels and plugins need not
// be UTF-8; invalid bytes become U+FFFD rather than a failed reply.
std::string protocol_line(const json& j) {
  return std::string(kWorkerLinePrefix) + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

/// The CUDA context's sticky error after a device kernel, if there is one (illegal address,
/// launch failure, ...): every later CUDA call in this process fails with it, so the worker
/// must not run another case. A thread-safe kernel did all its work on this thread's stream
/// (KernelTraits::thread_safe), so waiting for that stream is enough (a device-wide wait
/// would wait for every other thread's cases too); others get a device-wide one.
std::optional<std::string> lost_cuda_context(bool own_stream) {
#if ULPGATE_HAVE_CUDA
  (void)cudaGetLastError();  // clears an ordinary launch error; a sticky one stays
  cudaError_t e = own_stream ? cudaStreamSynchronize(static_cast<cudaStream_t>(thread_stream())) : cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) return fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
#endif
  return std::nullopt;
}

// --- Worker side -------------------------------------------------------------------------

// Reads newline-terminated lines from a blocking descriptor.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  /// The next line without its newline; false at end of input (a final unterminated line
  /// is dropped: the parent always ends its requests with a newline).
  bool next(std::string& line) {
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

 private:
  int fd_;
  std::string buffer_;
};

EvaluationOptions options_from_json(const json& j) {
  EvaluationOptions o;
  if (j.is_null()) return o;
  if (!j.is_object()) throw InputError("request.options: must be a JSON object");
  for (const auto& [key, value] : j.items())
    if (key != "tolerance" && key != "baseline" && key != "relations" && key != "effective_bits")
      throw InputError("request.options." + key + ": unknown field");
  for (const char* flag : {"relations", "effective_bits"})
    if (auto f = j.find(flag); f != j.end() && !f->is_boolean())
      throw InputError(fmt::format("request.options.{}: must be true or false", flag));
  o.relations = j.value("relations", true);
  o.effective_bits = j.value("effective_bits", false);
  if (auto t = j.find("tolerance"); t != j.end() && !t->is_null())
    o.tolerance = tolerance_from_json(*t, "request.options.tolerance");
  if (auto b = j.find("baseline"); b != j.end() && !b->is_null())
    o.baseline = baseline_from_json(*b, "request.options.baseline");
  return o;
}

json options_to_json(const EvaluationOptions& o) {
  return {{"tolerance", o.tolerance ? tolerance_to_json(*o.tolerance) : json(nullptr)},
          {"baseline", o.baseline ? baseline_to_json(*o.baseline) : json(nullptr)},
          {"relations", o.relations},
          {"effective_bits", o.effective_bits}};
}

// {"kernels": [...]} for the named kernels (resolved here), or every kernel when null.
json describe_kernels(Registry& registry, const json& names) {
  std::vector<Kernel*> kernels;
  if (names.is_null()) {
    for (const auto& k : registry.all()) kernels.push_back(k.get());
  } else {
    if (!names.is_array()) throw InputError("worker request: describe must be a list of names or null");
    for (const auto& n : names) {
      if (!n.is_string()) throw InputError("worker request: describe must be a list of names or null");
      Kernel* k = registry.resolve(n.get<std::string>());
      if (!k) throw InputError(fmt::format("unknown kernel '{}' (see ulpgate list)", n.get<std::string>()));
      kernels.push_back(k);
    }
  }
  json out = json::array();
  for (Kernel* k : kernels) {
    const KernelTraits t = k->traits();
    out.push_back({{"name", k->name()}, {"description", k->description()},
                   {"memory", t.memory == Memory::Device ? "device" : "host"}, {"deterministic", t.deterministic},
                   {"accumulator_bits", t.accumulator_bits}, {"p_bits", t.p_bits}, {"promote", t.promote},
                   {"arithmetic_source", t.arithmetic_source}, {"accumulation_model", t.accumulation_model},
                   {"rounds_to_nearest", t.rounds_to_nearest}, {"flushes_subnormals", t.flushes_subnormals},
                   {"activation_error", t.activation_error}, {"writes_lse", t.writes_lse},
                   {"input_rounding", std::string(name(t.input_rounding))}});
  }
  return {{"kernels", out}};
}

struct ParsedCheck {
  Kernel* kernel = nullptr;
  Case c;
  std::optional<DrawSpec> draw;  ///< c is to be drawn first
  EvaluationOptions options;
};

json draw_to_json(const DrawSpec& d) {
  return {{"op", d.op == Op::Gemm ? "gemm" : "attention"}, {"dtype", d.dtype}, {"target_seed", d.target_seed},
          {"index", d.index}, {"max_reduction", d.limits.max_reduction}, {"gelu", d.limits.gelu},
          {"large", d.limits.large}, {"large_kind", d.limits.large_kind}, {"mapping", d.limits.mapping}};
}

DrawSpec draw_from_json(const json& j) {
  const auto bad = [] { return InputError("worker request: draw must be {\"op\", \"dtype\", \"target_seed\", \"index\", "
                                          "\"max_reduction\", \"gelu\", \"large\", \"large_kind\", \"mapping\"}"); };
  if (!j.is_object()) throw bad();
  DrawSpec d;
  try {
    const std::string op = j.at("op").get<std::string>();
    if (op != "gemm" && op != "attention") throw bad();
    d.op = op == "gemm" ? Op::Gemm : Op::Attention;
    d.dtype = j.at("dtype").get<std::string>();
    d.target_seed = j.at("target_seed").get<std::uint64_t>();
    d.index = j.at("index").get<std::uint64_t>();
    d.limits.max_reduction = j.at("max_reduction").get<std::int64_t>();
    d.limits.gelu = j.at("gelu").get<bool>();
    d.limits.large = j.at("large").get<bool>();
    d.limits.large_kind = j.at("large_kind").get<int>();
    d.limits.mapping = j.at("mapping").get<bool>();
  } catch (const json::exception&) {
    throw bad();
  }
  return d;
}

// Draws case d.index of a target's stream with kernel k (its supports() answers shape the
// case). RapidCheck's generators share global state, so one thread draws at a time; the
// generators are kept per target.
Case draw_in_worker(Kernel& k, const DrawSpec& d) {
  static std::mutex mu;
  static std::map<std::tuple<const Kernel*, Op, std::string, std::int64_t, bool, bool, int, bool>, rc::Gen<Case>> gens;
  std::lock_guard lock(mu);
  const auto key = std::make_tuple(&k, d.op, d.dtype, d.limits.max_reduction, d.limits.gelu, d.limits.large, d.limits.large_kind,
                                   d.limits.mapping);
  auto it = gens.find(key);
  if (it == gens.end()) it = gens.emplace(key, op_module(d.op).generate(d.dtype, &k, d.limits)).first;
  try {
    return draw_case(it->second, d.target_seed, d.index).value();
  } catch (const std::exception& e) {
    throw InputError(std::string("case generation failed: ") + e.what());
  }
}
ParsedCheck parse_check(Registry& registry, const json& request);
std::pair<CaseResult, bool> run_check(Registry& registry, Kernel& kernel, const Case& c, const EvaluationOptions& options);

// One request: the reply's JSON, and whether the worker must exit after sending it.
json parse_request(const std::string& line) {
  try {
    return json::parse(line);
  } catch (const json::parse_error& e) {
    throw InputError(fmt::format("worker request: not valid JSON: {}", e.what()));
  }
}

// The kernel a {"kernel": NAME, FIELD: ...} request names, resolved here.
Kernel& requested_kernel(Registry& registry, const json& q, const char* verb, const char* field, const char* value) {
  if (!q.is_object() || !q.contains("kernel") || !q["kernel"].is_string() || !q.contains(field))
    throw InputError(fmt::format("worker request: {} must be {{\"kernel\": NAME, \"{}\": {}}}", verb, field, value));
  Kernel* k = registry.resolve(q["kernel"].get<std::string>());
  if (!k) throw InputError(fmt::format("unknown kernel '{}' (see ulpgate list)", q["kernel"].get<std::string>()));
  return *k;
}

std::pair<json, bool> serve_request(Registry& registry, const json& request) {
  if (request.is_object() && request.contains("describe")) return {describe_kernels(registry, request["describe"]), false};
  if (request.is_object() && request.contains("draw_case")) {
    const json& q = request["draw_case"];
    Kernel& k = requested_kernel(registry, q, "draw_case", "draw", "DRAW");
    return {json{{"case", to_json(draw_in_worker(k, draw_from_json(q["draw"])))}}, false};
  }
  if (request.is_object() && request.contains("supports")) {
    const json& q = request["supports"];
    const auto why = requested_kernel(registry, q, "supports", "case", "CASE").unsupported(case_from_json(q["case"]));
    return {json{{"supports", {{"ok", !why}, {"why", why.value_or("")}}}}, false};
  }
  const ParsedCheck p = parse_check(registry, request);
  if (p.draw) throw InputError("worker request: a case to draw is submitted ({\"submit\": ...}) or drawn alone ({\"draw_case\": ...})");
  auto [result, restart] = run_check(registry, *p.kernel, p.c, p.options);
  return {json{{"result", case_result_to_json(result)}, {"restart", restart}}, restart};
}

// A check request's kernel (resolved), case and options.
ParsedCheck parse_check(Registry& registry, const json& request) {
  if (!request.is_object() || !request.contains("kernel") || !request["kernel"].is_string() ||
      (!request.contains("case") && !request.contains("draw")))
    throw InputError("worker request: must be {\"kernel\": NAME, \"case\": CASE | \"draw\": DRAW, \"options\": {...}}");
  const std::string kernel_name = request["kernel"].get<std::string>();
  ParsedCheck p;
  p.kernel = registry.resolve(kernel_name);
  if (!p.kernel) throw InputError(fmt::format("unknown kernel '{}' (see ulpgate list)", kernel_name));
  if (request.contains("draw")) p.draw = draw_from_json(request["draw"]);
  else p.c = case_from_json(request["case"]);
  p.options = options_from_json(request.value("options", json(nullptr)));
  // evaluate() looks the baseline model up with find(); a parameterised CPU model exists
  // only once resolved.
  if (p.options.baseline && !registry.resolve(p.options.baseline->model))
    throw InputError(fmt::format("baseline model '{}' is not a kernel here", p.options.baseline->model));
  return p;
}

// Checks a parsed case; "restart" when the kernel lost this process's CUDA context.
std::pair<CaseResult, bool> run_check(Registry& registry, Kernel& kernel, const Case& c, const EvaluationOptions& options) {
  CaseResult result = check_case(kernel, c, options, &registry);
  bool restart = false;
  if (kernel.traits().memory == Memory::Device) {
    if (auto lost = lost_cuda_context(kernel.traits().thread_safe)) {
      restart = true;
      result.notes["worker"] = fmt::format("CUDA context lost ({}); the next case runs in a fresh worker", *lost);
      if (result.status == Disposition::Ok) {
        // The error surfaced only after the run (e.g. an asynchronous fault the runner's
        // synchronisation missed): the outputs cannot be trusted.
        result.status = Disposition::Failed;
        result.message = fmt::format("CUDA context lost after the run: {}", *lost);
        result.verdict.fail(status_check(result.status), fmt::format("{}: {}", name(result.status), result.message));
        stamp(result);
      }
    }
  }
  return {std::move(result), restart};
}

// --- Parent side -------------------------------------------------------------------------

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

std::string resolve_binary(const std::string& given) {
  if (!given.empty()) return given;
  // The path itself, not /proc/self/exe, so that messages name the binary.
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) return "/proc/self/exe";
  path.resize(static_cast<std::size_t>(n));
  return path;
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

/// A running worker process and the parent's ends of its pipes. Destruction kills the
/// worker's process group if the worker has not been reaped, then reaps it: no zombies.
struct IsolatedEvaluator::Worker {
  pid_t pid = -1;
  bool reaped = false;
  int wait_status = 0;
  UniqueFd request, result, err;
  std::string result_buffer;  ///< bytes of the protocol stream not yet split into lines
  std::string stderr_tail;    ///< the worker's stderr since the current request was sent
  std::size_t tail_limit = 2048;

  ~Worker() { kill_and_reap(); }

  void kill_and_reap() {
    if (pid <= 0 || reaped) return;
    ::kill(-pid, SIGKILL);  // the group: helpers a kernel forked die too
    ::kill(pid, SIGKILL);   // in case the child had not reached setpgid yet
    while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    set_reaped();
  }

  void set_reaped() {
    reaped = true;
    unregister_worker(pid);
  }

  /// Reads whatever stderr holds now, keeping the last tail_limit bytes.
  void drain_stderr() {
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

  std::string tail() const {
    const std::string t = stderr_tail.size() > tail_limit ? "..." + stderr_tail.substr(stderr_tail.size() - tail_limit)
                                                          : stderr_tail;
    return one_line(t);
  }

  enum class Wait { Line, Closed, TimedOut };

  /// The next protocol line (prefix removed), or why there is none: the worker closed its
  /// stdout (it died or is dying) or the deadline passed. Drains stderr meanwhile so that
  /// a worker writing a lot of it never blocks.
  Wait next_line(Clock::time_point deadline, std::string& line) {
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

  /// After the protocol pipe closed: waits up to grace seconds for the worker to end (it
  /// normally has: it died), kills the group if it has not, reaps it, and collects the
  /// rest of its stderr. Returns what happened, e.g. "killed by SIGSEGV (Segmentation fault)".
  std::string reap_after_close(double grace_seconds) {
    const auto deadline = after(grace_seconds);
    bool killed = false;
    while (!reaped) {
      const pid_t w = ::waitpid(pid, &wait_status, WNOHANG);
      if (w == pid) {
        set_reaped();
        break;
      }
      if (w < 0 && errno != EINTR) break;
      if (Clock::now() >= deadline) {
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
    const auto stderr_deadline = after(0.5);
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
};

/// The pool's replies, read and parsed off the campaign thread: each line of the worker's
/// protocol stream becomes an Item with its JSON and, where present, the "result" and
/// "case" already converted. It polls in short steps so that stopping it (stop_reader:
/// before the worker is killed, restarted, or used for a single exchange) takes at most
/// one step. Lines it has read but nobody took are dropped then: only a lost pool (whose
/// cases are all checked again alone) or an idle one is ever stopped.
struct IsolatedEvaluator::Reader {
  struct Item {
    enum class Kind { Line, Closed, Garbled };
    Kind kind = Kind::Line;
    json reply;
    std::optional<CaseResult> result;  ///< reply["result"], converted
    std::optional<Case> drawn;         ///< reply["case"], converted
    bool malformed = false;            ///< one of them present but not convertible
    std::string result_text, case_text;  ///< the same, as JSON text (for the journal)
  };

  explicit Reader(Worker& w) : thread_([this, &w] { run(w); }) {}
  ~Reader() {
    stop_ = true;
    thread_.join();
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  /// The next line's item, or nullopt when none came by the deadline.
  std::optional<Item> next(Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return !items_.empty(); })) return std::nullopt;
    Item it = std::move(items_.front());
    items_.pop_front();
    return it;
  }

 private:
  void push(Item it) {
    {
      std::lock_guard lock(mu_);
      items_.push_back(std::move(it));
    }
    cv_.notify_one();
  }
  void run(Worker& w) {
    std::string line;
    try {
      while (!stop_) {
        const auto wait = w.next_line(after(0.05), line);
        if (wait == Worker::Wait::TimedOut) continue;
        Item it;
        if (wait == Worker::Wait::Closed) {
          it.kind = Item::Kind::Closed;
          push(std::move(it));
          return;
        }
        try {
          it.reply = json::parse(line);
        } catch (const json::parse_error&) {
          it.kind = Item::Kind::Garbled;
          push(std::move(it));
          return;
        }
        if (it.reply.is_object()) {
          try {
            const auto text = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
            if (const auto r = it.reply.find("result"); r != it.reply.end())
              it.result = case_result_from_json(*r, "result"), it.result_text = text(*r);
            if (const auto c = it.reply.find("case"); c != it.reply.end()) it.drawn = case_from_json(*c), it.case_text = text(*c);
          } catch (const std::exception&) {
            it.malformed = true;
          }
        }
        push(std::move(it));
      }
    } catch (const std::exception&) {  // poll failed: as good as a closed stream
      Item it;
      it.kind = Item::Kind::Closed;
      push(std::move(it));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: it starts once the members above exist
};

void IsolatedEvaluator::stop_reader() { reader_.reset(); }

IsolatedEvaluator::IsolatedEvaluator(IsolationOptions options)
    : options_(std::move(options)), binary_(resolve_binary(options_.worker_binary)) {
  if (!(options_.timeout_seconds > 0)) throw InputError("isolation: the timeout must be > 0 seconds");
  if (!(options_.startup_timeout_seconds > 0)) throw InputError("isolation: the startup timeout must be > 0 seconds");
}

IsolatedEvaluator::~IsolatedEvaluator() { stop_worker(); }

pid_t IsolatedEvaluator::worker_pid() const { return worker_ ? worker_->pid : -1; }

void IsolatedEvaluator::start_worker() {
  // Everything the child needs is built before fork: after fork only async-signal-safe
  // calls are allowed (the parent may have threads).
  std::vector<std::string> args = {binary_, "worker"};
  if (options_.reference_threads > 0) args.insert(args.end(), {"--threads", std::to_string(options_.reference_threads)});
  if (options_.jobs > 1) args.insert(args.end(), {"--jobs", std::to_string(options_.jobs)});
  for (const auto& p : options_.plugins) args.insert(args.end(), {"--plugin", p});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ChildPipes pipes = make_child_pipes();
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("worker: fork failed: " + errno_text());
  if (pid == 0) {
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
    ::execv(argv[0], argv.data());
    const int exec_errno = errno;
    const char msg[] = "ulpgate worker: exec failed: ";
    [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    const char* why = strerror(exec_errno);  // not async-signal-safe in theory; only on this error path
    ignored = ::write(STDERR_FILENO, why, std::strlen(why));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // both sides set it, so it holds before either side relies on it
  auto w = std::make_unique<Worker>();
  w->pid = pid;
  register_worker(pid);
  w->tail_limit = options_.stderr_tail_bytes;
  w->request = std::move(pipes.request_parent);
  w->result = std::move(pipes.result_parent);
  w->err = std::move(pipes.stderr_parent);
  // The child's ends close here (ChildPipes' destructor), so a dead worker reads as EOF.
  pipes = ChildPipes{};
  ++workers_started_;

  std::string line;
  const auto wait = w->next_line(after(options_.startup_timeout_seconds), line);
  if (wait == Worker::Wait::Line) {
    json hello;
    try {
      hello = json::parse(line);
    } catch (const json::parse_error&) {
    }
    if (hello.is_object() && hello.contains("ready")) {
      worker_ = std::move(w);
      return;
    }
    const std::string why = fmt::format("{}: worker sent '{}' instead of its ready line", binary_, one_line(line));
    w->kill_and_reap();
    throw InputError(why);
  }
  std::string what;
  if (wait == Worker::Wait::TimedOut) {
    w->kill_and_reap();
    w->drain_stderr();
    what = fmt::format("not ready after {} s", options_.startup_timeout_seconds);
  } else {
    what = w->reap_after_close(1.0);
  }
  throw InputError(fmt::format("{} worker: {} before it was ready; stderr: {}", binary_, what, w->tail()));
}

void IsolatedEvaluator::stop_worker() {
  stop_reader();
  if (!worker_) return;
  // End of input tells the worker to exit; give it a moment, then the group is killed.
  worker_->request.reset();
  worker_->reap_after_close(2.0);
  worker_.reset();
}

IsolatedEvaluator::Exchange IsolatedEvaluator::exchange(const json& request, const char* doing) {
  if (!pending_.empty()) throw std::logic_error("IsolatedEvaluator: a request while submitted cases are in flight");
  stop_reader();
  if (!worker_) start_worker();
  Worker& w = *worker_;
  const auto deadline = after(options_.timeout_seconds);
  w.stderr_tail.clear();
  Exchange x;
  const auto lost = [&](Disposition status, std::string message) {
    x.status = status;
    x.message = std::move(message);
    worker_.reset();  // reaps (kills first if needed); the next request starts a fresh worker
    return x;
  };
  const auto died = [&]() {
    const std::string how = w.reap_after_close(1.0);
    const std::string tail = w.tail();
    return lost(Disposition::Crashed, fmt::format("worker {} while {}; stderr: {}", how, doing, tail.empty() ? "(empty)" : tail));
  };
  if (!write_all(w.request.get(), request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", true, deadline)) {
    // Only a worker that died or stopped reading gets here (a request is far smaller than
    // the socket's buffer).
    if (Clock::now() >= deadline) {
      w.kill_and_reap();
      return lost(Disposition::TimedOut, fmt::format("the worker did not take the request within {} s", options_.timeout_seconds));
    }
    return died();
  }
  std::string line;
  switch (w.next_line(deadline, line)) {
    case Worker::Wait::TimedOut: {
      w.kill_and_reap();
      w.drain_stderr();
      const std::string tail = w.tail();
      return lost(Disposition::TimedOut, fmt::format("no result after {} s while {} (the worker's process group was killed){}",
                                                     options_.timeout_seconds, doing, tail.empty() ? "" : "; stderr: " + tail));
    }
    case Worker::Wait::Closed:
      return died();
    case Worker::Wait::Line:
      break;
  }
  try {
    x.reply = json::parse(line);
  } catch (const json::parse_error& e) {
    w.kill_and_reap();
    return lost(Disposition::Crashed, fmt::format("worker sent a malformed reply ({})", e.what()));
  }
  if (x.reply.is_object() && x.reply.contains("error") && x.reply["error"].is_string()) {
    // The worker refused the request as in-process evaluation would have: not the kernel's
    // doing. The worker itself is fine and keeps running.
    throw InputError(x.reply["error"].get<std::string>());
  }
  return x;
}

CaseResult IsolatedEvaluator::evaluate(const std::string& kernel, const Case& c, const EvaluationOptions& options) {
  const Phase phase("worker round trip");
  const auto start = Clock::now();
  // What the record says about a case whose worker gave no result.
  const auto lost = [&](Disposition status, const std::string& message) {
    CaseResult r = failed_result(kernel, c, status, message);
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return r;
  };
  Exchange x = exchange({{"kernel", kernel}, {"case", to_json(c)}, {"options", options_to_json(options)}},
                        "evaluating the case");
  if (x.status != Disposition::Ok) return lost(x.status, x.message);
  CaseResult result;
  try {
    if (!x.reply.is_object() || !x.reply.contains("result")) throw InputError("no \"result\"");
    result = case_result_from_json(x.reply["result"], "result");
  } catch (const InputError& e) {
    worker_.reset();
    return lost(Disposition::Crashed, fmt::format("worker sent a malformed reply ({})", e.what()));
  }
  if (x.reply.value("restart", false)) stop_worker();
  return result;
}

namespace {
double now_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
}  // namespace

void IsolatedEvaluator::lose_pool() {
  stop_reader();
  if (worker_) worker_->kill_and_reap();
  worker_.reset();
  for (auto& [id, p] : pending_) redo_.push_back(std::move(p));
  pending_.clear();
}

void IsolatedEvaluator::submit(std::uint64_t id, const std::string& kernel, const Case& c, const EvaluationOptions& options) {
  submit(Pending{id, kernel, c, options, std::nullopt, -1, now_seconds()});
}

void IsolatedEvaluator::submit(std::uint64_t id, const std::string& kernel, const DrawSpec& draw,
                               const EvaluationOptions& options) {
  submit(Pending{id, kernel, Case{}, options, draw, -1, now_seconds()});
}

void IsolatedEvaluator::submit(Pending p) {
  const std::uint64_t id = p.id;
  if (!redo_.empty()) {
    // A pool lost earlier is being checked again alone: this case waits its turn there.
    redo_.push_back(std::move(p));
    return;
  }
  if (!worker_) start_worker();
  json request = {{"submit", {{"id", id}, {"kernel", p.kernel}, {"options", options_to_json(p.options)}}}};
  if (p.draw) request["submit"]["draw"] = draw_to_json(*p.draw);
  else request["submit"]["case"] = to_json(p.c);
  const bool sent = write_all(worker_->request.get(), request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", true,
                              after(options_.timeout_seconds));
  pending_.emplace(id, std::move(p));
  if (!sent) lose_pool();
}

IsolatedEvaluator::Finished IsolatedEvaluator::evaluate_alone(const Pending& p) {
  if (!p.draw) return {p.id, evaluate(p.kernel, p.c, p.options), p.c, {}, {}};
  // The worker draws it (so that a crash or hang is recorded with the case that caused
  // it), then it is checked as any other. A draw that fails (the generator threw, or the
  // kernel's supports() took the worker down) names the op's basic case.
  const Case basic = op_module(p.draw->op).basic_case(p.draw->dtype);
  Case c;
  try {
    Exchange x = exchange({{"draw_case", {{"kernel", p.kernel}, {"draw", draw_to_json(*p.draw)}}}}, "drawing the case");
    if (x.status != Disposition::Ok) return {p.id, failed_result(p.kernel, basic, x.status, x.message), basic, {}, {}};
    if (!x.reply.is_object() || !x.reply.contains("case")) throw InputError("worker sent a malformed reply");
    c = case_from_json(x.reply["case"]);
  } catch (const InputError& e) {
    return {p.id, failed_result(p.kernel, basic, Disposition::Failed, std::string("harness error: ") + e.what()), basic, {}, {}};
  }
  return {p.id, evaluate(p.kernel, c, p.options), c, {}, {}};
}

IsolatedEvaluator::Finished IsolatedEvaluator::next_result() {
  for (;;) {
    if (pending_.empty()) {
      if (redo_.empty()) throw std::logic_error("IsolatedEvaluator::next_result: no case in flight");
      Pending p = std::move(redo_.front());
      redo_.pop_front();
      return evaluate_alone(p);
    }
    // The earliest deadline of a case a thread has taken; while none has been taken, of
    // the oldest case sent (a worker that takes nothing is stuck).
    double deadline = INFINITY, oldest_sent = INFINITY;
    for (const auto& [id, p] : pending_) {
      if (p.started >= 0) deadline = std::min(deadline, p.started + options_.timeout_seconds);
      oldest_sent = std::min(oldest_sent, p.sent);
    }
    if (std::isinf(deadline)) deadline = oldest_sent + options_.timeout_seconds;
    if (!reader_) reader_ = std::make_unique<Reader>(*worker_);
    std::optional<Reader::Item> item = reader_->next(after(std::max(0.0, deadline - now_seconds())));
    if (!item || item->kind != Reader::Item::Kind::Line) {
      lose_pool();  // crashed, hung or garbled: each case again alone says which
      continue;
    }
    const json& reply = item->reply;
    const auto id_of = [&]() -> std::optional<std::uint64_t> {
      if (!reply.is_object()) return std::nullopt;
      for (const char* key : {"started", "id"})
        if (auto it = reply.find(key); it != reply.end() && it->is_number_unsigned() && pending_.count(it->get<std::uint64_t>()))
          return it->get<std::uint64_t>();
      return std::nullopt;
    };
    const auto id = id_of();
    if (!id) {
      lose_pool();  // not a reply to anything in flight: the stream cannot be trusted
      continue;
    }
    if (reply.contains("started")) {
      pending_.at(*id).started = now_seconds();
      continue;
    }
    const Pending& p = pending_.at(*id);
    Finished f{p.id, {}, p.c, {}, {}};
    if (reply.contains("error") && reply["error"].is_string()) {
      if (p.draw) f.requested = op_module(p.draw->op).basic_case(p.draw->dtype);
      f.result = failed_result(p.kernel, f.requested, Disposition::Failed, "harness error: " + reply["error"].get<std::string>());
      pending_.erase(*id);
      return f;
    }
    if (item->malformed || !item->result || (p.draw && !item->drawn)) {
      lose_pool();  // a garbled reply: this case too, again alone
      continue;
    }
    f.result = std::move(*item->result);
    f.result_json = std::move(item->result_text);
    if (p.draw) f.requested = std::move(*item->drawn), f.requested_json = std::move(item->case_text);
    // A lost CUDA context: the other cases' results are suspect, and this one's could be
    // another case's doing; all of them again, alone.
    if (reply.value("restart", false)) {
      lose_pool();
      continue;
    }
    pending_.erase(*id);
    return f;
  }
}

IsolatedEvaluator::SupportAnswer IsolatedEvaluator::supports(const std::string& kernel, const Case& c) {
  Exchange x = exchange({{"supports", {{"kernel", kernel}, {"case", to_json(c)}}}}, "asking whether the kernel supports the case");
  SupportAnswer a;
  if (x.status == Disposition::Ok) {
    const json* q = x.reply.is_object() && x.reply.contains("supports") ? &x.reply["supports"] : nullptr;
    if (q && q->is_object() && q->contains("ok") && (*q)["ok"].is_boolean()) {
      a.supported = (*q)["ok"].get<bool>();
      a.why = q->value("why", "");
      return a;
    }
    worker_.reset();
    x.status = Disposition::Crashed, x.message = "worker sent a malformed supports reply";
  }
  a.status = x.status;
  a.why = fmt::format("supports() {}: {}", x.status == Disposition::TimedOut ? "timed out" : "crashed", x.message);
  CaseResult r;
  r.kernel = kernel;
  r.spec = c;
  r.family = "supports() " + case_family(c);
  r.status = x.status;
  r.message = a.why;
  r.verdict.fail("supports:" + std::string(name(x.status)), a.why);
  stamp(r);
  support_failures_.push_back(std::move(r));
  return a;
}

namespace {

// The parent's stand-in for a kernel that lives in the worker.
class WorkerKernel final : public Kernel {
 public:
  WorkerKernel(IsolatedEvaluator& ev, std::string name, std::string description, KernelTraits traits)
      : ev_(ev), name_(std::move(name)), description_(std::move(description)), traits_(traits) {}
  std::string name() const override { return name_; }
  std::string description() const override { return description_; }
  KernelTraits traits() const override { return traits_; }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (broken_) return broken_;  // its supports() took a worker down once: not again
    const std::string key = to_json(c).dump();
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    const IsolatedEvaluator::SupportAnswer a = ev_.supports(name_, c);
    std::optional<std::string> why;
    if (!a.supported) why = a.why;
    if (a.status != Disposition::Ok) broken_ = why;
    if (cache_.size() > 4096) cache_.clear();
    return cache_[key] = why;
  }
  void run(const Case&, const KernelIo&, RunNotes&) override {
    throw KernelError(fmt::format("{}: kernels run in the worker process only", name_));
  }

 private:
  IsolatedEvaluator& ev_;
  std::string name_, description_;
  KernelTraits traits_;
  mutable std::map<std::string, std::optional<std::string>> cache_;
  mutable std::optional<std::string> broken_;
};

}  // namespace

std::vector<std::unique_ptr<Kernel>> IsolatedEvaluator::describe(const std::vector<std::string>& names) {
  Exchange x = exchange({{"describe", names.empty() ? json(nullptr) : json(names)}}, "listing its kernels");
  if (x.status != Disposition::Ok) throw std::runtime_error("worker: cannot list its kernels: " + x.message);
  std::vector<std::unique_ptr<Kernel>> out;
  if (!x.reply.is_object() || !x.reply.contains("kernels") || !x.reply["kernels"].is_array())
    throw std::runtime_error("worker: malformed kernel list");
  for (const auto& k : x.reply["kernels"]) {
    KernelTraits t;
    t.memory = k.value("memory", "host") == "device" ? Memory::Device : Memory::Host;
    t.deterministic = k.value("deterministic", true);
    t.accumulator_bits = k.value("accumulator_bits", 0);
    t.p_bits = k.value("p_bits", 0);
    t.promote = k.value("promote", 0);
    t.arithmetic_source = k.value("arithmetic_source", "");
    t.accumulation_model = k.value("accumulation_model", "");
    t.rounds_to_nearest = k.value("rounds_to_nearest", false);
    t.flushes_subnormals = k.value("flushes_subnormals", false);
    t.activation_error = k.value("activation_error", 0.0);
    t.writes_lse = k.value("writes_lse", false);  // the generator draws LSE cases only for such kernels
    if (const auto r = parse_rounding(k.value("input_rounding", ""))) t.input_rounding = *r;
    out.push_back(std::make_unique<WorkerKernel>(*this, k.value("name", ""), k.value("description", ""), t));
  }
  return out;
}

Registry worker_registry(IsolatedEvaluator& evaluator, const std::vector<std::string>& names) {
  Registry r;
  for (auto& k : evaluator.describe()) r.add(std::move(k));
  if (!names.empty())
    for (auto& k : evaluator.describe(names))
      if (!r.find(k->name())) r.add(std::move(k));
  return r;
}

namespace {

// A kernel that is not thread-safe as the pool's threads see it: one call at a time.
class SerializedKernel final : public Kernel {
 public:
  explicit SerializedKernel(Kernel& k) : k_(k) {}
  std::string name() const override { return k_.name(); }
  std::string description() const override { return k_.description(); }
  KernelTraits traits() const override { return k_.traits(); }
  std::optional<std::string> unsupported(const Case& c) const override {
    std::lock_guard lock(mu_);
    return k_.unsupported(c);
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    std::lock_guard lock(mu_);
    k_.run(c, io, notes);
  }

 private:
  Kernel& k_;
  mutable std::mutex mu_;
};

// The worker's threads for submitted cases: each takes the oldest waiting case, says it
// started, checks it and sends the result, tagged with the case's id. A result that lost
// the CUDA context ends the process once sent: every other case in flight is suspect, and
// the parent checks them again, one at a time.
class CheckPool {
 public:
  using Send = std::function<void(const json&)>;
  CheckPool(Registry& registry, unsigned threads, Send send) : registry_(registry), send_(std::move(send)) {
    for (unsigned t = 0; t < std::max(1u, threads); ++t) threads_.emplace_back([this] { serve(); });
  }
  ~CheckPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  CheckPool(const CheckPool&) = delete;
  CheckPool& operator=(const CheckPool&) = delete;

  /// Queues a parsed case; kernels that are not thread-safe run through one proxy each.
  void add(std::uint64_t id, ParsedCheck p) {
    if (!p.kernel->traits().thread_safe) {
      auto& proxy = proxies_[p.kernel];
      if (!proxy) proxy = std::make_unique<SerializedKernel>(*p.kernel);
      p.kernel = proxy.get();
    }
    {
      std::lock_guard lock(mu_);
      queue_.emplace_back(id, std::move(p));
    }
    wake_.notify_one();
  }
  /// Whether any case is queued or being checked.
  bool busy() {
    std::lock_guard lock(mu_);
    return !queue_.empty() || running_ > 0;
  }

 private:
  void serve() {
    for (;;) {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [id, p] = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      lock.unlock();
      send_({{"started", id}});
      json reply;
      bool restart = false;
      try {
        if (p.draw) p.c = draw_in_worker(*p.kernel, *p.draw);
        CaseResult result;
        std::tie(result, restart) = run_check(registry_, *p.kernel, p.c, p.options);
        reply = {{"result", case_result_to_json(result)}, {"id", id}, {"restart", restart}};
        if (p.draw) reply["case"] = to_json(p.c);
      } catch (const InputError& e) {
        reply = {{"error", e.what()}, {"id", id}};
      }
      // Not busy before the reply leaves: a parent that has every result may send any
      // request next.
      lock.lock();
      --running_;
      lock.unlock();
      send_(reply);
      if (restart) std::_Exit(0);
    }
  }

  Registry& registry_;
  Send send_;
  std::map<Kernel*, std::unique_ptr<SerializedKernel>> proxies_;  // the reading thread's alone
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::pair<std::uint64_t, ParsedCheck>> queue_;
  unsigned running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

int serve_worker(Registry& registry, unsigned jobs) {
  // The protocol keeps the real stdout; fd 1 becomes a second stderr and fd 0 /dev/null,
  // so that a kernel that prints or reads cannot corrupt or steal a line.
  std::fflush(stdout);
  UniqueFd results(::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3));
  UniqueFd requests(::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3));
  if (results.get() < 0 || requests.get() < 0) {
    std::fprintf(stderr, "ulpgate worker: cannot duplicate stdin/stdout: %s\n", errno_text().c_str());
    return 3;
  }
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  if (UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC)); null.get() >= 0) ::dup2(null.get(), STDIN_FILENO);

  const json ready = {{"ready", {{"pid", ::getpid()}, {"kernels", registry.all().size()}}}};
  if (!write_all(results.get(), protocol_line(ready), false)) return 3;
  std::mutex send_mu;
  // Whatever a kernel printed through stdio reaches stderr before the reply, so the
  // parent's stderr tail is complete when the result arrives. A parent that is gone ends
  // the worker, pool threads included.
  const auto send = [&](const json& reply) {
    const std::string line = protocol_line(reply);  // serialised outside the lock: the pool's threads send at once
    std::lock_guard lock(send_mu);
    std::fflush(stdout);
    if (!write_all(results.get(), line, false)) std::_Exit(3);
  };
  std::unique_ptr<CheckPool> pool;
  LineReader reader(requests.get());
  for (std::string line; reader.next(line);) {
    json reply;
    bool restart = false;
    try {
      json request = parse_request(line);
      if (request.is_object() && request.contains("submit")) {
        const json& q = request["submit"];
        if (!q.is_object() || !q.contains("id") || !q["id"].is_number_unsigned())
          throw InputError("worker request: submit must be {\"id\": N, \"kernel\": NAME, \"case\": CASE, ...}");
        const auto id = q["id"].get<std::uint64_t>();
        try {
          ParsedCheck p = parse_check(registry, q);
          if (!pool) pool = std::make_unique<CheckPool>(registry, jobs, send);
          pool->add(id, std::move(p));
        } catch (const InputError& e) {
          send({{"error", e.what()}, {"id", id}});
        }
        continue;
      }
      if (pool && pool->busy()) throw InputError("worker request: submitted cases are still being checked");
      std::tie(reply, restart) = serve_request(registry, request);
    } catch (const InputError& e) {
      reply = {{"error", e.what()}};
    }
    send(reply);
    if (restart) return 0;
  }
  // The parent is done: results of cases still being checked have no reader.
  if (pool && pool->busy()) std::_Exit(0);
  return 0;
}

}  // namespace ulpgate
