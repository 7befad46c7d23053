// Crash isolation on a GPU (label gpu): a kernel that poisons the CUDA context with an
// illegal address is recorded as failed (or crashed), and the next device case runs in a
// fresh worker with a working context. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <string>

#include "isolate_test_util.hpp"

namespace ulpgate {
namespace {

using test::planted_isolation;
using test::tiny_case;

TEST(IsolateGpu, IllegalAddressGetsAFreshWorkerForTheNextCase) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  IsolatedEvaluator ev(planted_isolation(60));
  const Case c = tiny_case();
  const CaseResult bad = ev.evaluate("planted.illegal_address", c);
  EXPECT_TRUE(bad.status == Disposition::Failed || bad.status == Disposition::Crashed)
      << name(bad.status) << ": " << bad.message;
  EXPECT_FALSE(bad.verdict.passed);
  if (bad.status == Disposition::Failed) {
    // The runner's synchronisation met the fault; the worker saw the sticky error and left.
    EXPECT_CONTAINS(bad.message, "illegal");
    ASSERT_EQ(bad.notes.count("worker"), 1u) << bad.message;
    EXPECT_CONTAINS(bad.notes.at("worker"), "CUDA context lost");
  }
  EXPECT_EQ(ev.worker_pid(), -1);  // that worker is gone
  // The next cases, a device one first, pass in a fresh worker.
  for (const char* kernel : {"cublas.fp32", "cpu.fp32_seq"}) {
    const CaseResult good = ev.evaluate(kernel, tiny_case(2));
    EXPECT_EQ(good.status, Disposition::Ok) << kernel << ": " << good.message;
    EXPECT_TRUE(good.verdict.passed) << kernel;
  }
  EXPECT_EQ(ev.workers_started(), 2);
}

}  // namespace
}  // namespace ulpgate
