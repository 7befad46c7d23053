// Per-case cost of crash isolation: one tiny case (8x8x32 FP32, cpu.fp32_seq) evaluated in
// process and through the worker (request, evaluation, reply; the worker already running).
//   build/tests/harness/bench_isolate --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "isolate_test_util.hpp"

namespace {

using namespace ulpgate;

void BM_InProcess(benchmark::State& state) {
  Registry registry = builtin_registry();
  Kernel* k = registry.resolve("cpu.fp32_seq");
  for (auto _ : state) {
    Case c = test::tiny_case();
    const Evaluation ev = evaluate(*k, c, {}, &registry);
    benchmark::DoNotOptimize(to_case_result(*k, c, ev, case_family(c)));
  }
}
BENCHMARK(BM_InProcess)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_Isolated(benchmark::State& state) {
  IsolatedEvaluator ev(test::planted_isolation());
  benchmark::DoNotOptimize(ev.evaluate("cpu.fp32_seq", test::tiny_case()));  // starts the worker
  for (auto _ : state) benchmark::DoNotOptimize(ev.evaluate("cpu.fp32_seq", test::tiny_case()));
}
BENCHMARK(BM_Isolated)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
