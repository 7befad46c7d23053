// Shared by the isolation and journal tests: the worker set-up and result comparison.
#pragma once

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "check/check.hpp"
#include "campaign/isolate.hpp"
#include "campaign/record.hpp"

/// Expects `part` within `text` (gtest without gmock, which not every machine here has).
#define EXPECT_CONTAINS(text, part)                                                   \
  EXPECT_NE(std::string(text).find(part), std::string::npos)                          \
      << "'" << (text) << "' does not contain '" << (part) << "'"

namespace ulpgate::test {

/// Workers from the ulpgate binary under test, with the planted plugin loaded.
inline IsolationOptions planted_isolation(double timeout_seconds = 30) {
  IsolationOptions o;
  o.worker_binary = ULPGATE_BIN;
  o.plugins = {PLANTED_PLUGIN};
  o.timeout_seconds = timeout_seconds;
  return o;
}

/// A small FP32 GEMM every planted and CPU kernel takes.
inline Case tiny_case(std::uint64_t seed = 1) {
  Case c = dtype_gemm_case("fp32", 8, 8, 32);
  c.seed = seed;
  return c;
}

/// A result as JSON with its wall time zeroed: equal for equal evaluations.
inline nlohmann::json timeless(CaseResult r) {
  r.seconds = 0;
  return case_result_to_json(r);
}

/// Whether pid is a running process (a zombie or a reaped pid is not).
inline bool running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  std::getline(stat, content);
  const auto paren = content.rfind(')');
  return paren == std::string::npos || paren + 2 >= content.size() || content[paren + 2] != 'Z';
}

}  // namespace ulpgate::test
