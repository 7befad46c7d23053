#include <gtest/gtest.h>

#include <cstring>

#include "core/error.hpp"
#include "harness/runner.hpp"
#include "kernels/emulated/gemm_models.hpp"
#include "kernels/plugin/loader.hpp"
#include "tests/kernels/gemm_cases.hpp"

using namespace ulpgate;

TEST(Plugin, LoadsAndRunsHostKernelBitIdenticalToTheModel) {
  Registry reg;
  load_plugin(EXAMPLE_PLUGIN, reg);
  Kernel* k = reg.find("example.host_sgemm");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->traits().memory, Memory::Host);
  EXPECT_NE(k->description().find("(plugin "), std::string::npos);
  auto model = make_emulated_gemm(default_models()[0]);  // sequential FP32 FMA, like the plugin
  int compared = 0;
  for (Layout layout : {Layout::RowMajor, Layout::ColMajor})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Case c = test_support::gemm_case(9, 4, 33, Format::FP32, Format::FP32);
        c.gemm.layout = layout, c.gemm.trans_a = ta, c.gemm.trans_b = tb, c.gemm.batch = 3;
        c.gemm.lda = c.gemm.packed_ld(c.gemm.a_rows(), c.gemm.a_cols()) + 2;
        c.alpha = 0.75, c.beta = -1.5;
        c.types["C"] = Format::FP32;
        const auto in = test_support::fill(c, test_support::Fill::Normal, 11);
        const RunOutcome p = run_kernel(*k, c, in), m = run_kernel(*model, c, in);
        ASSERT_EQ(p.status, Disposition::Ok) << p.message;
        EXPECT_EQ(p.unwritten, 0);
        ASSERT_EQ(p.outputs.at("D").size_bytes(), m.outputs.at("D").size_bytes());
        EXPECT_EQ(std::memcmp(p.outputs.at("D").data(), m.outputs.at("D").data(), p.outputs.at("D").size_bytes()), 0);
        ++compared;
      }
  EXPECT_EQ(compared, 8);
  Case half = test_support::gemm_case(2, 2, 2, Format::FP16, Format::FP16);
  EXPECT_EQ(k->unsupported(half), "FP32 A, B, C, D and compute only");
  EXPECT_EQ(run_kernel(*k, half, test_support::fill(half, test_support::Fill::Normal)).status, Disposition::NotSupported);
}

TEST(Plugin, BadLibrariesAreInputErrors) {
  Registry reg;
  auto msg = [&](const std::string& path) {
    try {
      load_plugin(path, reg);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  EXPECT_EQ(msg("/nonexistent/plugin.so").rfind("--plugin /nonexistent/plugin.so: cannot load: ", 0), 0u);
  EXPECT_EQ(msg("libm.so.6"), "--plugin libm.so.6: no exported ulpgate_plugin_entry()");
  load_plugin(EXAMPLE_PLUGIN, reg);
  EXPECT_NE(msg(EXAMPLE_PLUGIN).find("already exists"), std::string::npos);
}
