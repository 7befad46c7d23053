// What the default rule admits, on the GPU (label gpu): the flash attention kernels here
// (ours and cuDNN's: P rounded to the inputs' 16-bit format) pass 20 seeds as kernels that
// declare nothing, as a user's plugin of the same arithmetic would.
#include <gtest/gtest.h>

#include <memory>

#include "campaign/fuzz.hpp"
#include "kernels/device.hpp"
#include "tests/check/undeclared.hpp"
#include "kernels/builtin.hpp"

using namespace ulpgate;

TEST(AdmittedArithmeticsGpu, FlashKernelsPassUndeclaredOverTwentySeeds) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Registry reg = builtin_registry();
  std::vector<std::string> names;
  for (const auto& k : reg.all())
    if (k->traits().memory == Memory::Device && k->traits().p_bits > 0 && k->traits().p_bits < 24) names.push_back(k->name());
  ASSERT_FALSE(names.empty()) << "no device kernel rounds P: the test shows nothing";
  std::int64_t checked = 0;
  for (const std::string& n : names) {
    reg.add(std::make_unique<test::Undeclared>(*reg.find(n)));
    const std::vector<FuzzTarget> targets = all_targets(reg, {"undeclared." + n});
    for (const FuzzTarget& t : targets) {
      if (t.op != Op::Attention || t.dtype == "fp32") continue;  // P in 16 bits is admitted for narrower inputs only
      for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        FuzzOptions o;
        o.targets = {t};
        o.cases = 4;
        o.seed = seed;
        o.max_k = 256;
        o.sizes = SizeSchedule::Small;
        for (const CaseResult& c : run_fuzz(reg, o).cases) {
          if (c.status == Disposition::NotSupported) continue;
          ++checked;
          EXPECT_TRUE(c.verdict.passed) << n << " " << t.dtype << ", seed " << seed << ": false alarm on " << c.family
                                        << ": " << c.verdict.reasons.front();
        }
      }
    }
  }
  std::printf("[ admitted ] %zu flash kernels, declaring nothing: %lld cases over 20 seeds\n", names.size(),
              static_cast<long long>(checked));
  EXPECT_GT(checked, 0);
}
