// Bit identity of ulpgate's conversions with CUDA's host-side conversions.
//
// By default: >= 1e8 FP32 inputs per conversion, built to contain every boundary class
// (for every sign, exponent and rounding position: exact, just below/at/above the tie,
// all ones below the cut; the special values and each format's overflow thresholds),
// plus an even spread over all 2^32 patterns. ULPGATE_EXHAUSTIVE=1 compares all 2^32.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "core/format.hpp"

using namespace ulpgate;

namespace {

struct Conversion {
  const char* name;
  Format format;
  Overflow overflow;
  Code (*cuda)(float);
};

Code cuda_fp16(float x) { return __half_raw(__float2half_rn(x)).x; }
Code cuda_bf16(float x) { return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x; }
Code cuda_e4m3_sat(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
Code cuda_e4m3_nosat(float x) { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3); }
Code cuda_e5m2_sat(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }
Code cuda_e5m2_nosat(float x) { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2); }

const Conversion kConversions[] = {
    {"fp32->fp16 (__float2half_rn)", Format::FP16, Overflow::NoSaturate, cuda_fp16},
    {"fp32->bf16 (__float2bfloat16_rn)", Format::BF16, Overflow::NoSaturate, cuda_bf16},
    {"fp32->e4m3 satfinite", Format::E4M3, Overflow::Saturate, cuda_e4m3_sat},
    {"fp32->e4m3 nosat", Format::E4M3, Overflow::NoSaturate, cuda_e4m3_nosat},
    {"fp32->e5m2 satfinite", Format::E5M2, Overflow::Saturate, cuda_e5m2_sat},
    {"fp32->e5m2 nosat", Format::E5M2, Overflow::NoSaturate, cuda_e5m2_nosat},
};

// The boundary-class inputs (a few million).
std::vector<std::uint32_t> boundary_inputs() {
  std::vector<std::uint32_t> v;
  std::uint32_t rnd = 0x9E3779B9u;
  auto next = [&] { rnd ^= rnd << 13; rnd ^= rnd >> 17; rnd ^= rnd << 5; return rnd; };
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t exp = 0; exp < 256; ++exp)
      for (int cut = 1; cut <= 23; ++cut) {
        const std::uint32_t tie = 1u << (cut - 1), below = (1u << cut) - 1;
        for (std::uint32_t low : {0u, 1u, tie - 1, tie, tie + 1, below})
          for (int rep = 0; rep < 48; ++rep) {
            const std::uint32_t high = (next() << cut) & 0x7FFFFFu;
            v.push_back((sign << 31) | (exp << 23) | high | (low & below));
          }
      }
  // Specials, NaN payloads, and each format's thresholds with their neighbours.
  const float specials[] = {0.0f, INFINITY, 65504.0f, 65520.0f, 448.0f, 464.0f, 480.0f,
                            57344.0f, 61440.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-9f,
                            0x1p-10f, 0x1p-16f, 0x1p-17f, 0x1p-133f, 0x1p-134f, 0x1p-6f,
                            0x1p-14f, 0x1.fep127f, 0x1.ffp127f, FLT_MAX, 0x1p-149f};
  for (float s : specials) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(s);
    for (std::int32_t d = -3; d <= 3; ++d)
      for (std::uint32_t sign : {0u, 0x80000000u}) v.push_back(sign | (b + d));
  }
  for (std::uint32_t nan : {0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x7FA00000u, 0x7F800100u})
    for (std::uint32_t sign : {0u, 0x80000000u}) v.push_back(sign | nan);
  return v;
}

}  // namespace

TEST(FormatCuda, Fp32ToNarrowFormatsBitIdentical) {
  const bool exhaustive = std::getenv("ULPGATE_EXHAUSTIVE") != nullptr;
  const std::vector<std::uint32_t> boundary = boundary_inputs();
  // The spread: every pattern (exhaustive) or 1e8 - |boundary| patterns i * step.
  const std::uint64_t spread = exhaustive ? (std::uint64_t{1} << 32) : 100000000 - boundary.size();
  const std::uint64_t step = exhaustive ? 1 : (std::uint64_t{1} << 32) / spread;

  struct Mismatch { std::uint32_t input; Code cuda, ours; };
  std::atomic<std::uint64_t> mismatches[6] = {};
  std::mutex mu;
  std::vector<std::pair<int, Mismatch>> examples;
  auto check = [&](std::uint32_t bits) {
    const float x = std::bit_cast<float>(bits);
    for (int k = 0; k < 6; ++k) {
      const auto& conv = kConversions[k];
      const Code cuda = conv.cuda(x), ours = encode(conv.format, x, Rounding::NearestEven, conv.overflow);
      if (cuda != ours) {
        if (mismatches[k]++ < 5) {
          std::lock_guard lock(mu);
          examples.push_back({k, {bits, cuda, ours}});
        }
      }
    }
  };
  const unsigned nthreads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < nthreads; ++t)
    pool.emplace_back([&, t] {
      for (std::size_t i = t; i < boundary.size(); i += nthreads) check(boundary[i]);
      for (std::uint64_t i = t; i < spread; i += nthreads) check(static_cast<std::uint32_t>(i * step));
    });
  for (auto& th : pool) th.join();

  const std::uint64_t total = boundary.size() + spread;
  for (const auto& [k, m] : examples)
    ADD_FAILURE() << kConversions[k].name << ": input 0x" << std::hex << m.input << " cuda 0x"
                  << m.cuda << " ulpgate 0x" << m.ours;
  for (int k = 0; k < 6; ++k) {
    std::printf("[ format ] %-36s compared %llu FP32 inputs (%zu boundary-class, %s), %llu mismatches\n",
                kConversions[k].name, static_cast<unsigned long long>(total), boundary.size(),
                exhaustive ? "all 2^32" : "1e8 total", static_cast<unsigned long long>(mismatches[k].load()));
    EXPECT_EQ(mismatches[k].load(), 0u) << kConversions[k].name;
  }
}

// Decoding: every FP16/BF16 code and every FP8 code against CUDA's conversions to float.
TEST(FormatCuda, DecodeEveryCodeBitIdentical) {
  auto same = [](double ours, float cuda) {
    return (std::isnan(ours) && std::isnan(cuda)) || std::bit_cast<std::uint64_t>(ours) ==
                                                          std::bit_cast<std::uint64_t>(static_cast<double>(cuda));
  };
  for (std::uint32_t c = 0; c < 65536; ++c) {
    __half_raw hr;
    hr.x = static_cast<unsigned short>(c);
    ASSERT_TRUE(same(decode(Format::FP16, c), __half2float(__half(hr)))) << std::hex << c;
    __nv_bfloat16_raw br;
    br.x = static_cast<unsigned short>(c);
    ASSERT_TRUE(same(decode(Format::BF16, c), __bfloat162float(__nv_bfloat16(br)))) << std::hex << c;
  }
  for (std::uint32_t c = 0; c < 256; ++c) {
    const auto s = static_cast<__nv_fp8_storage_t>(c);
    const float e4 = __half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E4M3)));
    const float e5 = __half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E5M2)));
    ASSERT_TRUE(same(decode(Format::E4M3, c), e4)) << std::hex << c;
    ASSERT_TRUE(same(decode(Format::E5M2, c), e5)) << std::hex << c;
  }
  std::printf("[ format ] decoded 65536 fp16, 65536 bf16, 256 e4m3 and 256 e5m2 codes: all identical\n");
}

// CUDA's double -> FP8 conversion rounds directly from FP64; so does ours.
TEST(FormatCuda, Fp64ToFp8BitIdentical) {
  std::uint64_t n = 0;
  std::uint64_t r = 88172645463325252ull;
  for (int i = 0; i < 20000000; ++i) {
    r ^= r << 13; r ^= r >> 7; r ^= r << 17;
    // exponents within the FP8 range and around it; random 52-bit fractions
    const double x = std::ldexp(1.0 + static_cast<double>(r >> 12) * 0x1p-52, static_cast<int>(r % 48) - 30) *
                     ((r >> 11) & 1 ? -1 : 1);
    for (auto sat : {__NV_SATFINITE, __NV_NOSAT}) {
      const Overflow o = sat == __NV_SATFINITE ? Overflow::Saturate : Overflow::NoSaturate;
      ASSERT_EQ(encode(Format::E4M3, x, Rounding::NearestEven, o), __nv_cvt_double_to_fp8(x, sat, __NV_E4M3)) << x;
      ASSERT_EQ(encode(Format::E5M2, x, Rounding::NearestEven, o), __nv_cvt_double_to_fp8(x, sat, __NV_E5M2)) << x;
      n += 2;
    }
  }
  std::printf("[ format ] compared %llu fp64->fp8 conversions: all identical\n", static_cast<unsigned long long>(n));
}
