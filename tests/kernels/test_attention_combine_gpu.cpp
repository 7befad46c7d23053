// The CUDA combine kernels (kernels/attention/combine.cu, cuda.attn_combine.*) against the
// CPU model cpu.attn_combine, which sums in the same order: its bits on inputs where FP32 is
// exact, within 2 FP32 ulps of the row's magnitude elsewhere (their exp and log differ in the
// last bit). Label gpu: the device tests skip without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "kernels/attention/attention_combine.hpp"
#include "kernels/device.hpp"
#include "kernels/emulated/attention_combine_models.hpp"
#include "tests/kernels/combine_cases.hpp"

using namespace ulpgate;
using namespace ulpgate::test_support;

namespace {

constexpr AttentionLayout kBhsd = AttentionLayout::BHSD, kBshd = AttentionLayout::BSHD;
constexpr Format kFormats[] = {Format::FP32, Format::FP16, Format::BF16};

std::unique_ptr<Kernel> cpu_model() { return make_emulated_attention_combine(AttentionCombineModel{}); }

double ulp32(double x) { return ulp_of(Format::FP32, x); }

/// The largest differences between the kernel and the model: FP32 O in FP32 ulps of the
/// magnitude, FP16 and BF16 O in ulps of their format, LSE absolute; and the first element
/// out of bounds.
struct Agreement {
  double o_ulps = 0, narrow_ulps = 0, lse_abs = 0;
  std::string failure;
  void merge(const Agreement& a) {
    o_ulps = std::max(o_ulps, a.o_ulps), narrow_ulps = std::max(narrow_ulps, a.narrow_ulps), lse_abs = std::max(lse_abs, a.lse_abs);
    if (failure.empty()) failure = a.failure;
  }
};

// O: within 2 FP32 ulps of the magnitude sum w_s |O_s| / l (plus an ulp of O's format where
// it is narrower: the two FP32 values may round to neighbours), and bit for bit where
// `bitwise`; a row without splits O = +0 in both. LSE: within 2 ulps plus 2^-21 (log l of
// l within a few ulps), -inf for such a row in both.
Agreement agreement(const Case& c, const std::map<std::string, Tensor>& in, const CombineOutputs& gpu, const CombineOutputs& cpu,
                    bool bitwise) {
  const Format fo = c.types.at("O");
  const ExactCombine x = exact_combine(c, in);
  Agreement a;
  const auto fail = [&](std::string why) {
    if (a.failure.empty()) a.failure = std::move(why) + " in " + to_json(c).dump();
  };
  if (gpu.unwritten) fail(fmt::format("{} output elements not written", gpu.unwritten));
  for (std::size_t at = 0; at < gpu.o.size(); ++at) {
    const double g = decode(fo, gpu.o.code(at)), m = decode(fo, cpu.o.code(at)), scale = static_cast<double>(x.magnitude[at]);
    const double diff = g == m ? 0 : std::fabs(g - m);  // also equal infinities
    const double bound = scale == 0 ? 0 : 2 * ulp32(scale) + (fo == Format::FP32 ? 0 : ulp_of(fo, std::max(std::fabs(g), std::fabs(m))));
    if (fo != Format::FP32) {
      const auto apart = ulp_distance(fo, gpu.o.code(at), cpu.o.code(at));
      a.narrow_ulps = std::max(a.narrow_ulps, apart ? static_cast<double>(*apart) : gpu.o.code(at) == cpu.o.code(at) ? 0 : INFINITY);
    } else if (scale > 0) {
      a.o_ulps = std::max(a.o_ulps, std::isnan(diff) ? INFINITY : diff / ulp32(scale));
    }
    if (bitwise ? gpu.o.code(at) != cpu.o.code(at) : !(diff <= bound))
      fail(fmt::format("O[{}] = {}, the model's {} (magnitude {})", at, hex_float(g), hex_float(m), hex_float(scale)));
  }
  for (std::size_t row = 0; row < gpu.lse.size(); ++row) {
    const double g = gpu.lse.value(row), m = cpu.lse.value(row);
    const double diff = g == m ? 0 : std::fabs(g - m);
    a.lse_abs = std::max(a.lse_abs, std::isnan(diff) ? INFINITY : diff);
    if (!(diff <= 2 * ulp32(m) + 0x1p-21)) fail(fmt::format("LSE[{}] = {}, the model's {}", row, hex_float(g), hex_float(m)));
  }
  return a;
}

Agreement compare(Kernel& k, const Case& c, const std::map<std::string, Tensor>& in, bool bitwise) {
  auto model = cpu_model();
  return agreement(c, in, run_combine(k, c, in), run_combine(*model, c, in), bitwise);
}

}  // namespace

// Names, and the cases each kernel takes or refuses (no device needed).
TEST(AttentionCombineGpu, HostSide) {
  const auto kernels = make_attention_combine_kernels();
  ASSERT_EQ(kernels.size(), 3u);
  const char* names[] = {"cuda.attn_combine.fp32", "cuda.attn_combine.fp16", "cuda.attn_combine.bf16"};
  for (std::size_t n = 0; n < 3; ++n) {
    const Kernel& k = *kernels[n];
    EXPECT_EQ(k.name(), names[n]);
    EXPECT_EQ(k.traits().memory, Memory::Device);
    EXPECT_TRUE(k.traits().writes_lse && k.traits().thread_safe && k.traits().rounds_to_nearest);
    const Format own = kFormats[n], other = kFormats[(n + 1) % 3];
    const std::string device = cuda_device_available() ? "" : kNeedsCudaDevice;
    EXPECT_EQ(k.unsupported(combine_case(2, 2, 2, 64, 4, kBshd, true, own, own)).value_or(""), device);
    EXPECT_EQ(k.unsupported(combine_case(2, 2, 2, 64, 4, kBhsd, false, own, Format::FP32)).value_or(""), device);
    EXPECT_EQ(k.unsupported(combine_case(2, 2, 2, 64, 4, kBhsd, false, other, own)).value_or(""),
              fmt::format("O_part must be {} for this kernel, got {}", name(own), name(other)));
    if (own != Format::FP32) {  // the other 16-bit format
      const Format half = own == Format::FP16 ? Format::BF16 : Format::FP16;
      EXPECT_EQ(k.unsupported(combine_case(2, 2, 2, 64, 4, kBhsd, false, own, half)).value_or(""),
                fmt::format("O must be fp32 or {}, got {}", name(own), name(half)));
    }
    Case attention;
    attention.op = Op::Attention;
    EXPECT_EQ(k.unsupported(attention).value_or(""), "attention_combine only");
  }
}

// Inputs where FP32 is exact (integer base-2 LSE_s, equal base-e ones, small-integer rows):
// the kernel's O has the model's bits, for every format, layout and base, with empty splits
// and rows, over chunks of splits and of columns.
TEST(AttentionCombineGpu, ExactInputsGiveTheModelsBits) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::printf("[ device ] %s\n", device_description().c_str());
  int n = 0;
  for (auto& k : make_attention_combine_kernels())
    for (const std::int64_t splits : {1, 7, 300})
      for (const std::int64_t head_dim : {1, 64, 300})
        for (const bool base2 : {false, true}) {
          const Format part = k->name().ends_with("fp32") ? Format::FP32 : k->name().ends_with("fp16") ? Format::FP16 : Format::BF16;
          const Case c = combine_case(2, 2, 3, head_dim, splits, n % 2 ? kBshd : kBhsd, base2, part, n % 3 ? part : Format::FP32);
          validate(c);
          const auto in = exact_by_construction(c, static_cast<std::uint64_t>(700 + n++));
          const Agreement a = compare(*k, c, in, true);
          EXPECT_EQ(a.failure, "") << k->name();
        }
}

// The shapes split-KV decoding makes (1 to 300 splits, head_dim 1 to 300: chunks of splits
// and of columns), both layouts and bases, every O_part format with O in FP32 or its own, LSE
// asked for in half, LSE_s centred up to 1e4, empty splits (NaN rows) and a row of them in
// every case: within 2 FP32 ulps of the model (printed: the largest differences per split
// count).
TEST(AttentionCombineGpu, MatchesTheCpuModel) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::printf("[ device ] %s\n", device_description().c_str());
  int n = 0;
  for (const std::int64_t splits : {1, 2, 7, 33, 129, 300}) {
    Agreement worst;
    for (auto& k : make_attention_combine_kernels())
      for (const std::int64_t head_dim : {1, 64, 128, 256, 300})
        for (const AttentionLayout layout : {kBhsd, kBshd})
          for (const bool base2 : {false, true})
            for (const bool own_out : {false, true}) {
              const Format part = kFormats[k->name().ends_with("fp32") ? 0 : k->name().ends_with("fp16") ? 1 : 2];
              const Case c = combine_case(2, 2, 3, head_dim, splits, layout, base2, part, own_out ? part : Format::FP32, n % 2);
              validate(c);
              CombineFill fill;
              fill.centre = n % 4 < 2 ? 10 : 1e4, fill.spread = n % 3 ? 3 : 30;
              auto in = combine_inputs(c, fill, static_cast<std::uint64_t>(5000 + n++));
              for (std::int64_t s = 0; s < splits; ++s) make_empty(c, in, s, 1, 1, 2);
              const Agreement a = compare(*k, c, in, false);
              EXPECT_EQ(a.failure, "") << k->name();
              worst.merge(a);
            }
    std::printf("[ combine ] %3lld splits, the model's O within %.2f FP32 ulps of its magnitude (FP16, BF16 O: %.0f ulps), LSE "
                "within %.3g\n", static_cast<long long>(splits), worst.o_ulps, worst.narrow_ulps, worst.lse_abs);
  }
}
