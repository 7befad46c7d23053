// The attention kernels on the GPU (kernels/attention/, issue 19) through the one check path
// on the attention generator's cases: every input format, both layouts, causal, kv_lengths,
// GQA, seq_q != seq_kv (label gpu: skips without a device).
#include <gtest/gtest.h>

#include <cstdio>

#include <rapidcheck.h>

#include "harness/check.hpp"
#include "harness/ops/op.hpp"
#include "kernels/attention/naive.hpp"
#include "kernels/device.hpp"
#include "kernels/kernel.hpp"

using namespace ulpgate;

TEST(AttentionGpu, EveryKernelPassesGeneratedCases) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::printf("[ device ] %s\n", device_description().c_str());
  for (auto& k : make_attention_kernels()) {
    int run = 0, passed = 0, skipped = 0;
    const bool ok = rc::check(k->name() + " on generated attention cases", [&] {
      Case c = *op_module(Op::Attention).generate("", k.get(), GenLimits{1024, false});
      c.kernel = k->name();
      if (k->unsupported(c)) {
        ++skipped;
        return;
      }
      const Evaluation ev = evaluate(*k, c, {});
      ++run;
      RC_ASSERT(ev.run.status == Disposition::Ok);
      RC_ASSERT(ev.run.unwritten == 0);
      RC_ASSERT(ev.run.inputs_modified.empty());
      if (!ev.verdict.passed) RC_FAIL(ev.verdict.reasons.front());
      ++passed;
    });
    EXPECT_TRUE(ok) << k->name();
    std::printf("[ attention ] %s: %d of %d cases passed, %d not supported\n", k->name().c_str(), passed, run, skipped);
  }
}

// The planted bug (no rescale of the accumulator when the running max grows) is caught on
// generated cases: some case fails its check.
TEST(AttentionGpu, MissingRescaleIsCaught) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  auto k = make_planted_online_no_rescale();
  int run = 0, failed = 0;
  rc::check("planted no-rescale on generated attention cases", [&] {
    Case c = *op_module(Op::Attention).generate("", k.get(), GenLimits{1024, false});
    c.kernel = k->name();
    if (k->unsupported(c)) return;
    const Evaluation ev = evaluate(*k, c, {});
    ++run;
    failed += !ev.verdict.passed;
  });
  std::printf("[ attention ] %s: %d of %d cases failed\n", k->name().c_str(), failed, run);
  EXPECT_GT(failed, 0);
}
