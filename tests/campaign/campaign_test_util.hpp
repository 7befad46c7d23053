// Campaigns of the size-regime tests (test_gemm_size_regimes.cpp, test_size_regimes.cpp):
// one kernel's default campaign, and what its record must show.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "campaign/fuzz.hpp"

namespace ulpgate::test {

// The default campaign of one kernel (the CLI's `ulpgate fuzz --kernel NAME`: every dtype
// it supports, 10 cases each unless told, max_k 1024, relations on, FuzzOptions' default
// size schedule, which draws every fifth case from the large regime), in process.
inline RunRecord default_campaign(Registry& reg, const std::string& kernel, std::uint64_t seed, std::int64_t cases = 10) {
  FuzzOptions o;
  o.targets = all_targets(reg, {kernel});
  o.cases = cases;
  o.max_k = 1024;
  o.seed = seed;
  return run_fuzz(reg, o);
}

// Every failing case meets `trigger` (the bug's condition), and at least one case failed.
// When none did, the message lists describe(c) of every case where it is not empty.
inline void expect_found_only_where(const RunRecord& r, const std::function<bool(const Case&)>& trigger,
                                    const std::string& what,
                                    const std::function<std::string(const CaseResult&)>& describe = {}) {
  int failed = 0;
  for (const CaseResult& c : r.cases) {
    if (c.verdict.passed) continue;
    ++failed;
    EXPECT_TRUE(trigger(c.spec)) << what << ": a case without the trigger failed: " << c.family << ": "
                                 << c.verdict.reasons.front();
  }
  std::string drawn;
  if (describe)
    for (const CaseResult& c : r.cases)
      if (const std::string d = describe(c); !d.empty()) drawn += "\n  " + d;
  EXPECT_GT(failed, 0) << what << ": not found in " << r.cases.size() << " cases" << drawn;
}

// No false alarm: every case passed.
inline void expect_all_pass(const RunRecord& r, const std::string& what) {
  for (const CaseResult& c : r.cases)
    EXPECT_TRUE(c.verdict.passed) << what << ": false alarm on " << c.family << ": " << c.verdict.reasons.front();
}

}  // namespace ulpgate::test
