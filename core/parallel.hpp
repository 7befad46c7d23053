// A minimal parallel loop over independent items (output elements, rows, cases).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ulpgate {

/// Threads to use by default: ULPGATE_THREADS if set, else the hardware concurrency.
unsigned default_threads();

/// Threads parallel_for has started in this process (a diagnostic: small cases must start
/// none, since starting one costs more than their whole work).
std::uint64_t parallel_threads_started();
namespace detail {
void count_threads_started(unsigned n);
}

/// The threads worth starting for `work` units when one thread should get at least
/// `min_per_thread` of them (starting a thread costs tens of microseconds: a small case is
/// faster on one), at most `threads`.
inline unsigned threads_for(double work, double min_per_thread, unsigned threads = default_threads()) {
  const double useful = work / min_per_thread;
  return useful >= threads ? threads : static_cast<unsigned>(std::max(1.0, useful));
}

/// Calls fn(i) for every i in [0, n) on up to `threads` threads, in chunks of `grain`
/// items handed out dynamically. The first exception thrown by fn is rethrown here.
template <class Fn>
void parallel_for(std::int64_t n, Fn&& fn, unsigned threads = default_threads(),
                  std::int64_t grain = 1) {
  threads = static_cast<unsigned>(std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(1, n / grain)));
  if (threads <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto worker = [&] {
    try {
      for (std::int64_t start; (start = next.fetch_add(grain)) < n;)
        for (std::int64_t i = start, end = std::min(n, start + grain); i < end; ++i) fn(i);
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error) error = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> pool;
  detail::count_threads_started(threads - 1);
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

/// fn(offset, length) over [0, bytes) in pieces of kBytePiece (4 MB) on several threads (a
/// thread per piece at least): for streaming a large block through memcpy or memcmp.
inline constexpr std::size_t kBytePiece = std::size_t{4} << 20;
template <class Fn>
void for_each_piece(std::size_t bytes, Fn&& fn) {
  parallel_for(static_cast<std::int64_t>((bytes + kBytePiece - 1) / kBytePiece), [&](std::int64_t q) {
    const std::size_t at = static_cast<std::size_t>(q) * kBytePiece;
    fn(at, std::min(kBytePiece, bytes - at));
  }, threads_for(static_cast<double>(bytes), static_cast<double>(kBytePiece)));
}

/// memcpy of a large block on several threads (for_each_piece): one thread copies about
/// 10 GB/s, and into fresh memory it also takes every page fault.
void parallel_memcpy(void* to, const void* from, std::size_t bytes);

}  // namespace ulpgate
