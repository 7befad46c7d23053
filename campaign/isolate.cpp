// The parent side of crash isolation, one request at a time: IsolatedEvaluator (isolate.hpp)
// and the stand-in kernels of worker_registry. Its pool of submitted cases is isolate_pool.cpp;
// processes are process.hpp's, messages protocol.hpp's.
#include "campaign/isolate.hpp"

#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/profile.hpp"
#include "campaign/pool_reader.hpp"
#include "campaign/process.hpp"
#include "campaign/protocol.hpp"

namespace ulpgate {
namespace {

using json = nlohmann::json;
using Clock = ProcessClock;

// Waits for a new worker's ready line; InputError (with its stderr) when it sends another
// line, dies or is not ready in time, after killing it.
void await_ready(WorkerProcess& w, const std::string& binary, double startup_timeout_seconds) {
  std::string line;
  const auto wait = w.next_line(deadline_after(startup_timeout_seconds), line);
  if (wait == WorkerProcess::Wait::Line) {
    json hello;
    try {
      hello = json::parse(line);
    } catch (const json::parse_error&) {
    }
    if (reply_kind(hello) == ReplyKind::Ready) return;
    const std::string why = fmt::format("{}: worker sent '{}' instead of its ready line", binary, one_line(line));
    w.kill_and_reap();
    throw InputError(why);
  }
  std::string what;
  if (wait == WorkerProcess::Wait::TimedOut) {
    w.kill_and_reap();
    w.drain_stderr();
    what = fmt::format("not ready after {} s", startup_timeout_seconds);
  } else {
    what = w.reap_after_close(1.0);
  }
  throw InputError(fmt::format("{} worker: {} before it was ready; stderr: {}", binary, what, w.tail()));
}

}  // namespace

// --- The worker's life -----------------------------------------------------------------------

IsolatedEvaluator::IsolatedEvaluator(IsolationOptions options)
    : options_(std::move(options)), binary_(resolve_binary(options_.worker_binary)) {
  if (!(options_.timeout_seconds > 0)) throw InputError("isolation: the timeout must be > 0 seconds");
  if (!(options_.startup_timeout_seconds > 0)) throw InputError("isolation: the startup timeout must be > 0 seconds");
}

IsolatedEvaluator::~IsolatedEvaluator() { stop_worker(); }

pid_t IsolatedEvaluator::worker_pid() const { return worker_ ? worker_->pid : -1; }

void IsolatedEvaluator::start_worker() {
  std::vector<std::string> args = {binary_, "worker"};
  if (options_.reference_threads > 0) args.insert(args.end(), {"--threads", std::to_string(options_.reference_threads)});
  if (options_.jobs > 1) args.insert(args.end(), {"--jobs", std::to_string(options_.jobs)});
  for (const auto& p : options_.plugins) args.insert(args.end(), {"--plugin", p});
  std::unique_ptr<WorkerProcess> w = spawn_worker(std::move(args), options_.stderr_tail_bytes);
  ++workers_started_;
  await_ready(*w, binary_, options_.startup_timeout_seconds);
  worker_ = std::move(w);
}

void IsolatedEvaluator::stop_worker() {
  stop_reader();
  if (!worker_) return;
  // End of input tells the worker to exit; give it a moment, then the group is killed.
  worker_->request.reset();
  worker_->reap_after_close(2.0);
  worker_.reset();
}

// --- One request at a time -------------------------------------------------------------------

IsolatedEvaluator::Exchange IsolatedEvaluator::exchange(const json& request, const char* doing) {
  if (!pending_.empty()) throw std::logic_error("IsolatedEvaluator: a request while submitted cases are in flight");
  stop_reader();
  if (!worker_) start_worker();
  WorkerProcess& w = *worker_;
  const auto deadline = deadline_after(options_.timeout_seconds);
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
  if (!write_all(w.request.get(), request_line(request), true, deadline)) {
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
    case WorkerProcess::Wait::TimedOut: {
      w.kill_and_reap();
      w.drain_stderr();
      const std::string tail = w.tail();
      return lost(Disposition::TimedOut, fmt::format("no result after {} s while {} (the worker's process group was killed){}",
                                                     options_.timeout_seconds, doing, tail.empty() ? "" : "; stderr: " + tail));
    }
    case WorkerProcess::Wait::Closed:
      return died();
    case WorkerProcess::Wait::Line:
      break;
  }
  try {
    x.reply = json::parse(line);
  } catch (const json::parse_error& e) {
    w.kill_and_reap();
    return lost(Disposition::Crashed, fmt::format("worker sent a malformed reply ({})", e.what()));
  }
  if (reply_kind(x.reply) == ReplyKind::Error) {
    // The worker refused the request as in-process evaluation would have: not the kernel's
    // doing. The worker itself is fine and keeps running.
    throw InputError(x.reply.value("error", std::string("the worker refused the request")));
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
  Exchange x = exchange(check_request(kernel, c, options), "evaluating the case");
  if (x.status != Disposition::Ok) return lost(x.status, x.message);
  CaseResult result;
  try {
    result = case_result_from_json(expect_reply(x.reply, ReplyKind::Result, "evaluating the case").at("result"), "result");
  } catch (const InputError& e) {
    worker_.reset();
    return lost(Disposition::Crashed, fmt::format("worker sent a malformed reply ({})", e.what()));
  }
  if (x.reply.value("restart", false)) stop_worker();
  return result;
}

// --- Asking the worker's kernels -------------------------------------------------------------

IsolatedEvaluator::SupportAnswer IsolatedEvaluator::supports(const std::string& kernel, const Case& c) {
  Exchange x = exchange(supports_request(kernel, c), "asking whether the kernel supports the case");
  SupportAnswer a;
  if (x.status == Disposition::Ok) {
    const json& q = x.reply;
    if (reply_kind(q) == ReplyKind::Supports && q.contains("ok") && q["ok"].is_boolean()) {
      a.supported = q["ok"].get<bool>();
      a.why = q.value("why", "");
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
  Exchange x = exchange(describe_request(names), "listing its kernels");
  if (x.status != Disposition::Ok) throw std::runtime_error("worker: cannot list its kernels: " + x.message);
  std::vector<std::unique_ptr<Kernel>> out;
  if (reply_kind(x.reply) != ReplyKind::Kernels || !x.reply.contains("kernels") || !x.reply["kernels"].is_array())
    throw std::runtime_error("worker: malformed kernel list");
  for (const auto& k : x.reply["kernels"])
    out.push_back(std::make_unique<WorkerKernel>(*this, k.value("name", ""), k.value("description", ""), traits_from_description(k)));
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

}  // namespace ulpgate
