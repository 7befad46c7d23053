// The worker side of crash isolation, `ulpgate worker [--jobs N]` (isolate.hpp): serves the
// parent's requests one at a time, and submitted cases in a pool of threads (CheckPool).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "campaign/fuzz.hpp"
#include "campaign/isolate.hpp"
#include "campaign/process.hpp"
#include "campaign/protocol.hpp"
#include "kernels/device.hpp"

#if ULPGATE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ulpgate {
namespace {

using json = nlohmann::json;

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

// The kernels reply for the named kernels (resolved here), or every kernel when null.
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
  for (Kernel* k : kernels) out.push_back(kernel_description(*k));
  return kernels_reply(std::move(out));
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

// One request other than submit: the reply's JSON, and whether the worker must exit after
// sending it.
std::pair<json, bool> serve_request(Registry& registry, const Request& request) {
  const json& q = request.body;
  switch (request.kind) {
    case RequestKind::Describe:
      return {describe_kernels(registry, q.value("kernels", json(nullptr))), false};
    case RequestKind::DrawCase: {
      Kernel& k = requested_kernel(registry, q, "draw_case", "draw", "DRAW");
      return {case_reply(draw_in_worker(k, draw_from_json(q["draw"]))), false};
    }
    case RequestKind::Supports: {
      const auto why = requested_kernel(registry, q, "supports", "case", "CASE").unsupported(case_from_json(q["case"]));
      return {supports_reply(why), false};
    }
    case RequestKind::Check:
    case RequestKind::Submit:
      break;
  }
  const ParsedCheck p = parse_check(registry, q);
  if (p.draw) throw InputError("worker request: a case to draw is submitted (\"submit\") or drawn alone (\"draw_case\")");
  auto [result, restart] = run_check(registry, *p.kernel, p.c, p.options);
  return {result_reply(result, restart), restart};
}

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
      send_(started_reply(id));
      auto [reply, restart] = check(id, p);
      // Not busy before the reply leaves: a parent that has every result may send any
      // request next.
      lock.lock();
      --running_;
      lock.unlock();
      send_(reply);
      if (restart) std::_Exit(0);
    }
  }

  // A submitted case's reply (drawn first when asked), and whether the worker must exit.
  std::pair<json, bool> check(std::uint64_t id, ParsedCheck& p) {
    try {
      if (p.draw) p.c = draw_in_worker(*p.kernel, *p.draw);
      auto [result, restart] = run_check(registry_, *p.kernel, p.c, p.options);
      json reply = for_submitted(result_reply(result, restart), id);
      if (p.draw) reply["case"] = to_json(p.c);
      return {reply, restart};
    } catch (const InputError& e) {
      return {for_submitted(error_reply(e.what()), id), false};
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

// A submitted case goes to the pool (started on the first); one it cannot take is refused
// with its id.
void submit_to_pool(Registry& registry, unsigned jobs, const CheckPool::Send& send, std::unique_ptr<CheckPool>& pool,
                    const json& request) {
  const std::uint64_t id = submitted_id(request);
  try {
    ParsedCheck p = parse_check(registry, request);
    if (!pool) pool = std::make_unique<CheckPool>(registry, jobs, send);
    pool->add(id, std::move(p));
  } catch (const InputError& e) {
    send(for_submitted(error_reply(e.what()), id));
  }
}

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

  const json ready = ready_reply(::getpid(), registry.all().size());
  if (!write_all(results.get(), protocol_line(ready), false)) return 3;
  std::mutex send_mu;
  // Whatever a kernel printed through stdio reaches stderr before the reply, so the
  // parent's stderr tail is complete when the result arrives. A parent that is gone ends
  // the worker, pool threads included.
  const CheckPool::Send send = [&](const json& reply) {
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
      const Request request = parse_request(line);
      if (request.kind == RequestKind::Submit) {
        submit_to_pool(registry, jobs, send, pool, request.body);
        continue;
      }
      if (pool && pool->busy()) throw InputError("worker request: submitted cases are still being checked");
      std::tie(reply, restart) = serve_request(registry, request);
    } catch (const InputError& e) {
      reply = error_reply(e.what());
    }
    send(reply);
    if (restart) return 0;
  }
  // The parent is done: results of cases still being checked have no reader.
  if (pool && pool->busy()) std::_Exit(0);
  return 0;
}

}  // namespace ulpgate
