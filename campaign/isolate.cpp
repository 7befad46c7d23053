// The parent side of crash isolation: IsolatedEvaluator (isolate.hpp) and the stand-in
// kernels of worker_registry. Processes are process.hpp's, messages protocol.hpp's.
#include "campaign/isolate.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/profile.hpp"
#include "campaign/process.hpp"
#include "campaign/protocol.hpp"

namespace ulpgate {
namespace {

using json = nlohmann::json;
using Clock = ProcessClock;

double now_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

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
    if (hello.is_object() && hello.contains("ready")) return;
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

/// The pool's replies, read and parsed off the campaign thread: each line of the worker's
/// protocol stream becomes an Item (parse_pool_reply). It polls in short steps so that
/// stopping it (stop_reader: before the worker is killed, restarted, or used for a single
/// exchange) takes at most one step. Lines it has read but nobody took are dropped then:
/// only a lost pool (whose cases are all checked again alone) or an idle one is ever stopped.
struct IsolatedEvaluator::Reader {
  struct Item {
    enum class Kind { Line, Closed, Garbled };
    Kind kind = Kind::Line;
    PoolReply reply;
  };

  explicit Reader(WorkerProcess& w) : thread_([this, &w] { run(w); }) {}
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
  void run(WorkerProcess& w) {
    std::string line;
    try {
      while (!stop_) {
        const auto wait = w.next_line(deadline_after(0.05), line);
        if (wait == WorkerProcess::Wait::TimedOut) continue;
        Item it;
        if (wait == WorkerProcess::Wait::Closed) {
          it.kind = Item::Kind::Closed;
          push(std::move(it));
          return;
        }
        std::optional<PoolReply> reply = parse_pool_reply(line);
        if (!reply) {
          it.kind = Item::Kind::Garbled;
          push(std::move(it));
          return;
        }
        it.reply = std::move(*reply);
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
  Exchange x = exchange(check_request(kernel, c, options), "evaluating the case");
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

// --- Several at once -------------------------------------------------------------------------

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
  const bool sent = write_all(worker_->request.get(), request_line(submit_request(id, p.kernel, p.c, p.draw, p.options)), true,
                              deadline_after(options_.timeout_seconds));
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
    Exchange x = exchange(draw_case_request(p.kernel, *p.draw), "drawing the case");
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
    if (!reader_) reader_ = std::make_unique<Reader>(*worker_);
    std::optional<Reader::Item> item = reader_->next(deadline_after(std::max(0.0, pool_deadline() - now_seconds())));
    if (!item || item->kind != Reader::Item::Kind::Line) {
      lose_pool();  // crashed, hung or garbled: each case again alone says which
      continue;
    }
    if (std::optional<Finished> f = take_pool_reply(item->reply)) return std::move(*f);
  }
}

// The earliest deadline of a case a thread has taken; while none has been taken, of the
// oldest case sent (a worker that takes nothing is stuck). Seconds on the steady clock.
double IsolatedEvaluator::pool_deadline() const {
  double deadline = INFINITY, oldest_sent = INFINITY;
  for (const auto& [id, p] : pending_) {
    if (p.started >= 0) deadline = std::min(deadline, p.started + options_.timeout_seconds);
    oldest_sent = std::min(oldest_sent, p.sent);
  }
  return std::isinf(deadline) ? oldest_sent + options_.timeout_seconds : deadline;
}

std::optional<IsolatedEvaluator::Finished> IsolatedEvaluator::take_pool_reply(PoolReply& item) {
  const json& reply = item.reply;
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
    return std::nullopt;
  }
  if (reply.contains("started")) {
    pending_.at(*id).started = now_seconds();
    return std::nullopt;
  }
  const Pending& p = pending_.at(*id);
  Finished f{p.id, {}, p.c, {}, {}};
  if (reply.contains("error") && reply["error"].is_string()) {
    if (p.draw) f.requested = op_module(p.draw->op).basic_case(p.draw->dtype);
    f.result = failed_result(p.kernel, f.requested, Disposition::Failed, "harness error: " + reply["error"].get<std::string>());
    pending_.erase(*id);
    return f;
  }
  if (item.malformed || !item.result || (p.draw && !item.drawn)) {
    lose_pool();  // a garbled reply: this case too, again alone
    return std::nullopt;
  }
  f.result = std::move(*item.result);
  f.result_json = std::move(item.result_text);
  if (p.draw) f.requested = std::move(*item.drawn), f.requested_json = std::move(item.case_text);
  // A lost CUDA context: the other cases' results are suspect, and this one's could be
  // another case's doing; all of them again, alone.
  if (reply.value("restart", false)) {
    lose_pool();
    return std::nullopt;
  }
  pending_.erase(*id);
  return f;
}

// --- Asking the worker's kernels -------------------------------------------------------------

IsolatedEvaluator::SupportAnswer IsolatedEvaluator::supports(const std::string& kernel, const Case& c) {
  Exchange x = exchange(supports_request(kernel, c), "asking whether the kernel supports the case");
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
  Exchange x = exchange(describe_request(names), "listing its kernels");
  if (x.status != Disposition::Ok) throw std::runtime_error("worker: cannot list its kernels: " + x.message);
  std::vector<std::unique_ptr<Kernel>> out;
  if (!x.reply.is_object() || !x.reply.contains("kernels") || !x.reply["kernels"].is_array())
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
