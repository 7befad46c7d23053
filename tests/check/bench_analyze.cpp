// Where a large output's analysis goes: analyze() and judge() over a 2048 x 2048 FP32 or
// BF16 output whose exact values are sums of 16 random products (so their significands run
// past a double), the kernel's values within a few ulps of them, with the precision rule's
// scale on every element (the case of a sweep point at M = N = 4096, a quarter of its size).
//   build/tests/check/bench_analyze --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// ULPGATE_THREADS pins the threads (1: the cost per element on one core).
#include <benchmark/benchmark.h>

#include <random>

#include "check/analyze.hpp"
#include "references/exact_dot.hpp"

namespace {

using namespace ulpgate;

OutputComparison make_comparison(Format f) {
  constexpr std::int64_t kSide = 2048, kTerms = 16;
  OutputComparison cmp;
  cmp.format = f;
  cmp.shape = {1, kSide, kSide};
  const auto n = static_cast<std::size_t>(kSide * kSide);
  cmp.got.resize(n), cmp.exact.resize(n), cmp.condition.resize(n), cmp.precision_scale.resize(n);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> step(-2, 2);
  ExactAccumulator acc;
  for (std::size_t e = 0; e < n; ++e) {
    acc.clear();
    double c = 0;
    for (int t = 0; t < kTerms; ++t) {
      const double a = static_cast<float>(normal(rng)), b = static_cast<float>(normal(rng)), p = a * b;
      acc.add(p);
      c += std::fabs(p);
    }
    cmp.exact[e] = acc.value();
    Code g = cmp.exact[e].round_to(f);
    for (int s = step(rng); s != 0; s += s > 0 ? -1 : 1) g = s > 0 ? next_up(f, g) : next_down(f, g);
    cmp.got[e] = g;
    cmp.condition[e] = c;
    cmp.precision_scale[e] = 0x1p-24 * c;
  }
  return cmp;
}

const OutputComparison& comparison(Format f) {
  static const OutputComparison fp32 = make_comparison(Format::FP32), bf16 = make_comparison(Format::BF16);
  return f == Format::FP32 ? fp32 : bf16;
}

Format format_arg(const benchmark::State& state) { return state.range(0) ? Format::BF16 : Format::FP32; }

void BM_Analyze(benchmark::State& state) {
  const OutputComparison& cmp = comparison(format_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(analyze(cmp));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(cmp.got.size()));
}

void BM_Judge(benchmark::State& state) {
  const OutputComparison& cmp = comparison(format_arg(state));
  const ErrorMetrics m = analyze(cmp);
  const ToleranceModel tol;
  for (auto _ : state) benchmark::DoNotOptimize(judge(cmp, m, tol, 16));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(cmp.got.size()));
}

void BM_AnalyzeAndJudge(benchmark::State& state) {
  const OutputComparison& cmp = comparison(format_arg(state));
  const ToleranceModel tol;
  for (auto _ : state) benchmark::DoNotOptimize(analyze_and_judge(cmp, tol, 16, ErrorMetrics{}));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(cmp.got.size()));
}

}  // namespace

BENCHMARK(BM_Analyze)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Judge)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AnalyzeAndJudge)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
