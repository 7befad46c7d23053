// Reference throughput, one binary, one run: the MPFR oracle against the superaccumulator
// (ns per term, single thread), and a full GEMM reference on all cores. The "ns_per_term"
// counter prints with an "s" suffix: read it as ns. How to run it: see docs/dev/benchmarks.md.
#include <benchmark/benchmark.h>

#include <bit>
#include <vector>

#include "core/format_mpfr.hpp"
#include "core/rng.hpp"
#include "references/exact_dot.hpp"
#include "references/gemm_reference.hpp"

using namespace ulpgate;

namespace {

// Uniform(-1, 1) FP32 data from Philox: the ordinary case a reference spends its time on.
std::vector<float> uniform_floats(std::size_t n, std::uint32_t stream) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(2.0 * to_unit_closed_open(low64(random_block(42, stream, i))) - 1.0);
  return v;
}

void set_ns_per_term(benchmark::State& state, double terms_per_iteration, double cores = 1.0) {
  state.counters["ns_per_term"] = benchmark::Counter(
      terms_per_iteration / cores * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_OracleDot(benchmark::State& state) {
  const auto k = static_cast<std::size_t>(state.range(0));
  const auto x = uniform_floats(k, 1), y = uniform_floats(k, 2);
  MpfrOracle oracle;
  Mpfr out(620);
  for (auto _ : state) {
    oracle.dot(out, x, y);
    benchmark::DoNotOptimize(encode_exact(Format::FP32, out));
  }
  set_ns_per_term(state, static_cast<double>(k));
}
BENCHMARK(BM_OracleDot)->Arg(256)->Arg(4096)->Arg(65536)->Unit(benchmark::kMicrosecond);

// The superaccumulator's dot product, standalone (known_ranges false: the operands' exponent
// ranges found by the call, as add_products(span, span) does) or as the GEMM reference
// computes it (true: the ranges found once per row of op(A) and column of op(B), shared by N
// and M dot products).
template <bool known_ranges, Simd simd = Simd::Avx512>
void fast_dot(benchmark::State& state) {
  const auto k = static_cast<std::size_t>(state.range(0));
  const auto x = uniform_floats(k, 1), y = uniform_floats(k, 2);
  const Operand ox(x, simd), oy(y, simd);
  ExactAccumulator acc(simd);
  for (auto _ : state) {
    acc.clear();
    if constexpr (known_ranges) acc.add_products(ox, oy);
    else acc.add_products(std::span<const float>(x), std::span<const float>(y));
    benchmark::DoNotOptimize(acc.value().round_to(Format::FP32));
  }
  set_ns_per_term(state, static_cast<double>(k));
  state.counters["simd"] = static_cast<double>(acc.simd());  // 0 scalar, 1 AVX2, 2 AVX-512
}
void BM_FastDot(benchmark::State& state) { fast_dot<false>(state); }
void BM_FastDotKnownRanges(benchmark::State& state) { fast_dot<true>(state); }
BENCHMARK(BM_FastDot)->Arg(256)->Arg(4096)->Arg(65536)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FastDotKnownRanges)->Arg(256)->Arg(4096)->Arg(65536)->Unit(benchmark::kMicrosecond);
// The same with AVX2 at most (on a CPU with AVX-512: which of the two is faster there).
void BM_FastDotAvx2(benchmark::State& state) { fast_dot<false, Simd::Avx2>(state); }
BENCHMARK(BM_FastDotAvx2)->Arg(256)->Arg(4096)->Arg(65536)->Unit(benchmark::kMicrosecond);

// A full size^3 FP32 GEMM reference (every element exact, with its condition term) on
// range(1) threads (0: all cores, ULPGATE_THREADS to change); ns_per_term is per core:
// wall time * threads / K M N, so parallel efficiency = the 1-thread figure / this one.
void BM_GemmReference(benchmark::State& state) {
  const std::int64_t size = state.range(0);
  Case c;
  c.gemm.m = c.gemm.n = c.gemm.k = size;
  c.types = {{"A", Format::FP32}, {"B", Format::FP32}, {"D", Format::FP32}, {"compute", Format::FP32}};
  std::map<std::string, Tensor> in;
  for (const char* op : {"A", "B"}) {
    const auto v = uniform_floats(static_cast<std::size_t>(size * size), op[0] == 'A' ? 3 : 4);
    Tensor t(Format::FP32, v.size());
    for (std::size_t i = 0; i < v.size(); ++i) t.set_value(i, v[i]);
    in.emplace(op, std::move(t));
  }
  const unsigned threads = state.range(1) > 0 ? static_cast<unsigned>(state.range(1)) : default_threads();
  for (auto _ : state) {
    const GemmReference r = gemm_reference(c, in, threads);
    benchmark::DoNotOptimize(r.values.data());
  }
  state.counters["threads"] = threads;
  set_ns_per_term(state, static_cast<double>(size) * size * size, threads);
}
BENCHMARK(BM_GemmReference)->Args({1024, 1})->Args({1024, 0})->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_GemmReference)->Args({4096, 0})->Args({8192, 0})->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
