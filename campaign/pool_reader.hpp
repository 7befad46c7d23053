// The worker pool's reply stream read off the campaign thread (IsolatedEvaluator's
// submit/next_result): a thread polls the worker's protocol stream and parses each line.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "campaign/process.hpp"
#include "campaign/protocol.hpp"

namespace ulpgate {

/// The pool's replies, read and parsed off the campaign thread: each line of the worker's
/// protocol stream becomes an Item (parse_pool_reply). It polls in short steps so that
/// stopping it (stop_reader: before the worker is killed, restarted, or used for a single
/// exchange) takes at most one step. Lines it has read but nobody took are dropped then:
/// only a lost pool (whose cases are all checked again alone) or an idle one is ever stopped.
class PoolReader {
 public:
  struct Item {
    enum class Kind { Line, Closed, Garbled };
    Kind kind = Kind::Line;
    PoolReply reply;
  };

  explicit PoolReader(WorkerProcess& w) : thread_([this, &w] { run(w); }) {}
  ~PoolReader() {
    stop_ = true;
    thread_.join();
  }
  PoolReader(const PoolReader&) = delete;
  PoolReader& operator=(const PoolReader&) = delete;

  /// The next line's item, or nullopt when none came by the deadline.
  std::optional<Item> next(ProcessClock::time_point deadline) {
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

}  // namespace ulpgate
