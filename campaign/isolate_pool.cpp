// IsolatedEvaluator's pool (isolate.hpp): cases submitted to the worker's threads, their
// replies taken as they come, and a lost pool's cases checked again one at a time.
#include "campaign/isolate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "campaign/pool_reader.hpp"
#include "campaign/process.hpp"
#include "campaign/protocol.hpp"
#include "core/error.hpp"

namespace ulpgate {
namespace {

using json = nlohmann::json;

double now_seconds() { return std::chrono::duration<double>(ProcessClock::now().time_since_epoch()).count(); }

}  // namespace

void IsolatedEvaluator::stop_reader() { reader_.reset(); }

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
    c = case_from_json(expect_reply(x.reply, ReplyKind::Case, "drawing the case").at("case"));
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
    if (!reader_) reader_ = std::make_unique<PoolReader>(*worker_);
    std::optional<PoolReader::Item> item = reader_->next(deadline_after(std::max(0.0, pool_deadline() - now_seconds())));
    if (!item || item->kind != PoolReader::Item::Kind::Line) {
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
  const bool to_submitted = item.kind == ReplyKind::Started || item.kind == ReplyKind::Result || item.kind == ReplyKind::Error;
  const auto id = reply.find("id");
  if (!to_submitted || id == reply.end() || !id->is_number_unsigned() || !pending_.count(id->get<std::uint64_t>())) {
    lose_pool();  // not a reply to anything in flight: the stream cannot be trusted
    return std::nullopt;
  }
  Pending& p = pending_.at(id->get<std::uint64_t>());
  if (item.kind == ReplyKind::Started) {
    p.started = now_seconds();
    return std::nullopt;
  }
  Finished f{p.id, {}, p.c, {}, {}};
  if (item.kind == ReplyKind::Error) {
    if (p.draw) f.requested = op_module(p.draw->op).basic_case(p.draw->dtype);
    f.result = failed_result(p.kernel, f.requested, Disposition::Failed,
                             "harness error: " + reply.value("error", std::string("the worker refused the case")));
    pending_.erase(p.id);
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
  pending_.erase(p.id);
  return f;
}

}  // namespace ulpgate
