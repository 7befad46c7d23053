// Phase timings for finding where a long case spends its time: with ULPGATE_PROFILE set,
// each Phase prints "profile: <name> <seconds> s" on stderr as it ends (a worker's stderr
// reaches the campaign's). Off by default: one getenv per process, then a branch.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace ulpgate {

inline bool profiling() {
  static const bool on = std::getenv("ULPGATE_PROFILE") != nullptr;
  return on;
}

class Phase {
 public:
  explicit Phase(const char* name) : name_(profiling() ? name : nullptr) {
    if (name_) start_ = std::chrono::steady_clock::now();
  }
  ~Phase() {
    if (name_)
      std::fprintf(stderr, "profile: %s %.3f s\n", name_,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ulpgate
