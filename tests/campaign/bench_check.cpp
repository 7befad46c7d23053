// Where a small case's time goes: each phase of the one check path, timed on the same 200
// cases the default fuzz stream draws first for one target (so the mix of sizes, epilogues
// and distributions is the campaign's), plus the isolated round trip and the journal.
//   build/tests/campaign/bench_check --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// ULPGATE_BENCH_KERNEL (default cpu.fp32_seq) and ULPGATE_BENCH_DTYPE (default bf16) pick
// the target, ULPGATE_BENCH_MAX_K (default 256) the largest K; ULPGATE_BENCH_EPILOGUES=0 keeps
// only cases without an epilogue (the mix a cuBLAS target gets, for a CPU model here). items_per_second is cases/s
// of that phase alone; the phases of one case add up to BM_EvaluateWithRelations + the
// rest (generation, record, journal) in process, or BM_Isolated through the worker.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "core/rng.hpp"
#include "distributions/fill.hpp"
#include "campaign/journal.hpp"
#include "isolate_test_util.hpp"
#include "kernels/builtin.hpp"

namespace {

using namespace ulpgate;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct Target {
  Registry registry = builtin_registry();
  Kernel* kernel = nullptr;
  std::string why_not;
  std::vector<Case> cases;                  // as generated (requested)
  std::vector<Case> filled;                 // after fill_inputs
  std::vector<Inputs> inputs;
  std::vector<RunOutcome> runs;

  Target() {
    const std::string name = env_or("ULPGATE_BENCH_KERNEL", "cpu.fp32_seq"), dtype = env_or("ULPGATE_BENCH_DTYPE", "bf16");
    kernel = registry.resolve(name);
    if (!kernel) {
      why_not = name + " is not a kernel here";
      return;
    }
    const GenLimits limits{std::atoll(env_or("ULPGATE_BENCH_MAX_K", "256").c_str()), true};
    const rc::Gen<Case> gen = op_module(Op::Gemm).generate(dtype, kernel, limits);
    for (std::uint64_t i = 0; cases.size() < 200 && i < 1000; ++i) {
      const rc::Random random(low64(random_block(1, 0xF023u, i)));
      Case c = gen(random, static_cast<int>((37 * i) % 101)).value();
      if (!kernel->supports(c)) continue;
      if (env_or("ULPGATE_BENCH_EPILOGUES", "1") == "0" && c.epilogue != Epilogue::None) continue;
      cases.push_back(c);
      filled.push_back(c);
      inputs.push_back(fill_inputs(filled.back()));
      runs.push_back(run_kernel(*kernel, filled.back(), inputs.back()));
      if (runs.back().status != Disposition::Ok) {
        why_not = fmt::format("{} does not run here: {}", name, runs.back().message);
        return;
      }
    }
  }
};

Target& target() {
  static Target t;
  return t;
}

// Runs fn(i) over the cases once per iteration; items = cases.
template <class Fn>
void over_cases(benchmark::State& state, Fn&& fn) {
  Target& t = target();
  if (!t.why_not.empty()) {
    state.SkipWithError(t.why_not.c_str());
    return;
  }
  for (auto _ : state)
    for (std::size_t i = 0; i < t.cases.size(); ++i) fn(t, i);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * t.cases.size()));
}

void BM_Generate(benchmark::State& state) {
  Target& t = target();
  const rc::Gen<Case> gen = op_module(Op::Gemm).generate(env_or("ULPGATE_BENCH_DTYPE", "bf16"), t.kernel,
                                                         GenLimits{256, true});
  over_cases(state, [&](Target&, std::size_t i) {
    benchmark::DoNotOptimize(gen(rc::Random(low64(random_block(1, 0xF023u, i))), static_cast<int>((37 * i) % 101)).value());
  });
}

// Drawing with the stand-ins an isolated campaign plans with: every supports() question
// the generator asks is a round trip to the planning worker.
void BM_GenerateWithStandIns(benchmark::State& state) {
  IsolationOptions io;
  io.worker_binary = ULPGATE_BIN;
  IsolatedEvaluator planner(io);
  const std::string name = env_or("ULPGATE_BENCH_KERNEL", "cpu.fp32_seq");
  Registry stand_ins = worker_registry(planner, {name});
  Kernel* k = stand_ins.resolve(name);
  const rc::Gen<Case> gen = op_module(Op::Gemm).generate(env_or("ULPGATE_BENCH_DTYPE", "bf16"), k, GenLimits{256, true});
  std::uint64_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(gen(rc::Random(low64(random_block(1, 0xF023u, i))), static_cast<int>((37 * i) % 101)).value());
    ++i;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void BM_FillInputs(benchmark::State& state) {
  over_cases(state, [](Target& t, std::size_t i) {
    Case c = t.cases[i];
    benchmark::DoNotOptimize(fill_inputs(c));
  });
}

void BM_RunKernel(benchmark::State& state) {
  over_cases(state, [](Target& t, std::size_t i) { benchmark::DoNotOptimize(run_kernel(*t.kernel, t.filled[i], t.inputs[i])); });
}

void BM_ReferenceAndCompare(benchmark::State& state) {
  over_cases(state, [](Target& t, std::size_t i) {
    const Case& c = t.filled[i];
    benchmark::DoNotOptimize(op_module(c.op).compare(c, t.inputs[i], t.runs[i].outputs,
                                                     nominal_tolerance(c, t.kernel->traits())));
  });
}

void evaluate_all(benchmark::State& state, bool relations) {
  EvaluationOptions o;
  o.relations = relations;
  over_cases(state, [&](Target& t, std::size_t i) {
    benchmark::DoNotOptimize(evaluate_with_inputs(*t.kernel, t.filled[i], t.inputs[i], o, &t.registry));
  });
}
void BM_EvaluateWithoutRelations(benchmark::State& state) { evaluate_all(state, false); }
void BM_EvaluateWithRelations(benchmark::State& state) { evaluate_all(state, true); }

void BM_RecordEntry(benchmark::State& state) {
  over_cases(state, [](Target& t, std::size_t i) {
    const Case& c = t.filled[i];
    Evaluation ev;
    ev.run = t.runs[i];
    benchmark::DoNotOptimize(case_result_to_json(to_case_result(*t.kernel, c, ev, case_family(c))).dump());
  });
}

void BM_JournalAppend(benchmark::State& state) {
  const std::string path = (std::filesystem::temp_directory_path() / "ulpgate-bench-journal.jsonl").string();
  std::filesystem::remove(path);
  {
    Journal journal(path, nlohmann::json{{"bench", 1}}, false, state.range(0) != 0);
    std::vector<CaseResult> results;
    for (std::size_t i = 0; i < target().cases.size(); ++i) {
      Evaluation ev;
      ev.run = target().runs[i];
      results.push_back(to_case_result(*target().kernel, target().filled[i], ev, case_family(target().filled[i])));
    }
    over_cases(state, [&](Target& t, std::size_t i) { journal.append(t.kernel->name(), t.cases[i], results[i]); });
  }
  std::filesystem::remove(path);
}

void BM_Isolated(benchmark::State& state) {
  IsolationOptions io;
  io.worker_binary = ULPGATE_BIN;
  IsolatedEvaluator ev(io);
  EvaluationOptions o;
  o.relations = state.range(0) != 0;
  // The worker's start (process, CUDA context, library handles) is not a case's cost: one
  // case first, untimed.
  if (target().why_not.empty()) ev.evaluate(target().kernel->name(), target().cases.front(), o);
  over_cases(state, [&](Target& t, std::size_t i) { benchmark::DoNotOptimize(ev.evaluate(t.kernel->name(), t.cases[i], o)); });
}

BENCHMARK(BM_Generate)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GenerateWithStandIns)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_FillInputs)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RunKernel)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ReferenceAndCompare)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EvaluateWithoutRelations)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EvaluateWithRelations)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RecordEntry)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_JournalAppend)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Isolated)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
