#include "core/parallel.hpp"

#include <cstdlib>
#include <cstring>

namespace ulpgate {
namespace {
std::atomic<std::uint64_t> started{0};
}

std::uint64_t parallel_threads_started() { return started.load(); }
void detail::count_threads_started(unsigned n) { started += n; }

unsigned default_threads() {
  if (const char* s = std::getenv("ULPGATE_THREADS")) {
    const long v = std::strtol(s, nullptr, 10);
    if (v > 0) return static_cast<unsigned>(v);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

void parallel_memcpy(void* to, const void* from, std::size_t bytes) {
  for_each_piece(bytes, [&](std::size_t at, std::size_t n) {
    std::memcpy(static_cast<std::byte*>(to) + at, static_cast<const std::byte*>(from) + at, n);
  });
}

}  // namespace ulpgate
