// Crash isolation: every planted misbehaviour becomes the right status and message, the
// campaign's next case still passes in a fresh worker, and the protocol survives noise.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "campaign/fuzz.hpp"
#include "campaign/journal.hpp"
#include "isolate_test_util.hpp"
#include "kernels/builtin.hpp"

namespace ulpgate {
namespace {

using test::planted_isolation;
using test::running;
using test::timeless;
using test::tiny_case;

// The good case the tests run after a misbehaving one: it must pass in a fresh worker.
void expect_good_case_passes(IsolatedEvaluator& ev) {
  const CaseResult r = ev.evaluate("cpu.fp32_seq", tiny_case(7));
  EXPECT_EQ(r.status, Disposition::Ok) << r.message;
  EXPECT_TRUE(r.verdict.passed);
  ASSERT_EQ(r.metrics.size(), 1u);
  EXPECT_EQ(r.metrics[0].unwritten, 0);
}

// What every lost case carries besides its status.
void expect_lost_case(const CaseResult& r, const std::string& kernel, const Case& c) {
  EXPECT_EQ(r.kernel, kernel);
  EXPECT_EQ(to_json(r.spec), to_json(c));
  EXPECT_EQ(r.family, case_family(c));
  EXPECT_FALSE(r.verdict.passed);
  ASSERT_EQ(r.verdict.reasons.size(), 1u);
  EXPECT_CONTAINS(r.verdict.reasons[0], r.message);
  EXPECT_TRUE(r.metrics.empty());
}

TEST(Isolate, ResultEqualsInProcessEvaluation) {
  // Non-default options, a parameterised baseline model (resolved in the worker) and a
  // tolerance, so that the request carries everything evaluate() is given.
  EvaluationOptions options;
  options.baseline = BaselineRule{"cpu.blockfma:block=8,frac=13,round=rz", 3.0};
  ToleranceModel t;
  t.accumulator_bits = 20;
  t.lambda = 2.5;
  options.tolerance = t;
  Registry registry = builtin_registry();
  ASSERT_NE(registry.resolve(options.baseline->model), nullptr);
  IsolatedEvaluator ev(planted_isolation());
  for (const std::string kernel : {"cpu.fp32_seq", "cpu.fp32_pairwise", "cpu.blockfma:block=16,frac=10,round=rz"}) {
    Case c = tiny_case(3);
    const CaseResult isolated = ev.evaluate(kernel, c, options);
    Kernel* k = registry.resolve(kernel);
    ASSERT_NE(k, nullptr);
    const Evaluation in_process = evaluate(*k, c, options, &registry);
    EXPECT_EQ(timeless(isolated), timeless(to_case_result(*k, c, in_process, case_family(c)))) << kernel;
    EXPECT_GT(isolated.seconds, 0);
  }
  EXPECT_EQ(ev.workers_started(), 1);
}

TEST(Isolate, SegfaultIsCrashedNamingTheSignalAndStderr) {
  IsolatedEvaluator ev(planted_isolation());
  const Case c = tiny_case();
  const CaseResult r = ev.evaluate("planted.segfault", c);
  EXPECT_EQ(r.status, Disposition::Crashed);
  EXPECT_CONTAINS(r.message, "killed by SIGSEGV");
  EXPECT_CONTAINS(r.message, "planted.segfault: writing through a null pointer");
  expect_lost_case(r, "planted.segfault", c);
  EXPECT_EQ(ev.worker_pid(), -1);  // restarts lazily, on the next case
  expect_good_case_passes(ev);
  EXPECT_EQ(ev.workers_started(), 2);
}

TEST(Isolate, AbortIsCrashedWithSigabrt) {
  IsolatedEvaluator ev(planted_isolation());
  const Case c = tiny_case();
  const CaseResult r = ev.evaluate("planted.abort", c);
  EXPECT_EQ(r.status, Disposition::Crashed);
  EXPECT_CONTAINS(r.message, "killed by SIGABRT");
  EXPECT_CONTAINS(r.message, "planted.abort: calling abort()");
  expect_lost_case(r, "planted.abort", c);
  expect_good_case_passes(ev);
}

TEST(Isolate, ExitIsCrashedWithTheStatus) {
  IsolatedEvaluator ev(planted_isolation());
  const Case c = tiny_case();
  const CaseResult r = ev.evaluate("planted.exit", c);
  EXPECT_EQ(r.status, Disposition::Crashed);
  EXPECT_CONTAINS(r.message, "exited with status 3");
  EXPECT_CONTAINS(r.message, "planted.exit: calling _exit(3)");
  expect_lost_case(r, "planted.exit", c);
  expect_good_case_passes(ev);
}

TEST(Isolate, HangIsTimedOutAndTheWorkerIsKilled) {
  IsolatedEvaluator ev(planted_isolation(2.0));
  expect_good_case_passes(ev);  // a worker is up; its pid must be gone after the timeout
  const pid_t hung = ev.worker_pid();
  ASSERT_GT(hung, 0);
  const Case c = tiny_case();
  const auto start = std::chrono::steady_clock::now();
  const CaseResult r = ev.evaluate("planted.hang", c);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, Disposition::TimedOut);
  EXPECT_CONTAINS(r.message, "no result after 2 s");
  EXPECT_CONTAINS(r.message, "planted.hang: sleeping forever");
  expect_lost_case(r, "planted.hang", c);
  // Honoured: not before the limit, and not much after it (kill + reap only).
  EXPECT_GE(waited, 2.0);
  EXPECT_LT(waited, 4.0);
  EXPECT_GE(r.seconds, 2.0);
  EXPECT_FALSE(running(hung));
  errno = 0;
  EXPECT_EQ(::waitpid(hung, nullptr, WNOHANG), -1);  // already reaped: not our child any more
  EXPECT_EQ(errno, ECHILD);
  expect_good_case_passes(ev);
  EXPECT_EQ(ev.workers_started(), 2);
}

TEST(Isolate, NoisyStdoutDoesNotBreakTheProtocol) {
  IsolatedEvaluator ev(planted_isolation());
  const Case c = tiny_case(5);
  const CaseResult noisy = ev.evaluate("planted.noisy", c);
  EXPECT_EQ(noisy.status, Disposition::Ok) << noisy.message;
  EXPECT_TRUE(noisy.verdict.passed);
  // Same arithmetic as cpu.fp32_seq, so the same errors, element for element.
  const CaseResult seq = ev.evaluate("cpu.fp32_seq", c);
  ASSERT_EQ(noisy.metrics.size(), 1u);
  ASSERT_EQ(seq.metrics.size(), 1u);
  nlohmann::json a = timeless(noisy), b = timeless(seq);
  a.erase("kernel"), b.erase("kernel");
  a.erase("id"), b.erase("id");  // the kernel's name is part of the id
  a.erase("notes"), b.erase("notes");
  // What the bias test allows follows the declared arithmetic (cpu.fp32_seq declares
  // rounding to nearest, the planted kernel nothing), not the errors.
  a["metrics"][0].erase("bias_allowed"), b["metrics"][0].erase("bias_allowed");
  EXPECT_EQ(a, b);
  // The fake "restart" line it printed was not taken for a reply.
  EXPECT_EQ(ev.workers_started(), 1);
  EXPECT_GT(ev.worker_pid(), 0);
}

TEST(Isolate, InputErrorsThrowAndTheWorkerSurvives) {
  IsolatedEvaluator ev(planted_isolation());
  expect_good_case_passes(ev);
  const pid_t pid = ev.worker_pid();
  try {
    ev.evaluate("no.such_kernel", tiny_case());
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_CONTAINS(e.what(), "unknown kernel 'no.such_kernel'");
  }
  EvaluationOptions bad_baseline;
  bad_baseline.baseline = BaselineRule{"no.such_model", 8};
  EXPECT_THROW(ev.evaluate("cpu.fp32_seq", tiny_case(), bad_baseline), InputError);
  EXPECT_EQ(ev.worker_pid(), pid);
  expect_good_case_passes(ev);
  EXPECT_EQ(ev.workers_started(), 1);
}

TEST(Isolate, NotSupportedIsNotACrash) {
  IsolatedEvaluator ev(planted_isolation());
  Case c = dtype_gemm_case("bf16", 8, 8, 32);  // the planted kernels take FP32 only
  const CaseResult r = ev.evaluate("planted.segfault", c);
  EXPECT_EQ(r.status, Disposition::NotSupported);
  EXPECT_CONTAINS(r.message, "FP32");
  EXPECT_EQ(ev.workers_started(), 1);
  EXPECT_GT(ev.worker_pid(), 0);
}

TEST(Isolate, WorkerThatCannotStartIsAnInputError) {
  IsolationOptions missing = planted_isolation();
  missing.worker_binary = "/nonexistent/ulpgate";
  try {
    IsolatedEvaluator ev(missing);
    ev.evaluate("cpu.fp32_seq", tiny_case());
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_CONTAINS(e.what(), "exec failed");
    EXPECT_CONTAINS(e.what(), "exited with status 127");
  }
  IsolationOptions bad_plugin = planted_isolation();
  bad_plugin.plugins = {"/nonexistent/plugin.so"};
  try {
    IsolatedEvaluator ev(bad_plugin);
    ev.evaluate("cpu.fp32_seq", tiny_case());
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_CONTAINS(e.what(), "/nonexistent/plugin.so");
    EXPECT_CONTAINS(e.what(), "before it was ready");
  }
}

TEST(Isolate, DestructionReapsTheWorker) {
  pid_t pid = -1;
  {
    IsolatedEvaluator ev(planted_isolation());
    expect_good_case_passes(ev);
    pid = ev.worker_pid();
    ASSERT_TRUE(running(pid));
  }
  EXPECT_FALSE(running(pid));
  errno = 0;
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);  // reaped, not a zombie left to us
  EXPECT_EQ(errno, ECHILD);
}

TEST(Isolate, EveryPlantedKernelInOneCampaign) {
  // One evaluator through them in a row, as a fuzz campaign would meet them (the hang,
  // which costs its full timeout, has its own test).
  IsolatedEvaluator ev(planted_isolation());
  const struct {
    const char* kernel;
    Disposition status;
    const char* says;
  } expected[] = {
      {"planted.segfault", Disposition::Crashed, "SIGSEGV"}, {"cpu.fp32_seq", Disposition::Ok, ""},
      {"planted.abort", Disposition::Crashed, "SIGABRT"},    {"planted.noisy", Disposition::Ok, ""},
      {"planted.exit", Disposition::Crashed, "status 3"},    {"cpu.fp32_seq", Disposition::Ok, ""},
  };
  for (const auto& e : expected) {
    const CaseResult r = ev.evaluate(e.kernel, tiny_case(11));
    EXPECT_EQ(r.status, e.status) << e.kernel << ": " << r.message;
    EXPECT_CONTAINS(r.message, e.says) << e.kernel;
    EXPECT_EQ(r.verdict.passed, e.status == Disposition::Ok) << e.kernel;
  }
  EXPECT_EQ(ev.workers_started(), 4);  // the first, then one after each of the 3 lost cases
}

// supports() runs in the worker too: the parent plans with stand-ins, and a supports()
// that crashes or hangs is an unsupported kernel with the reason, a recorded failure, and
// a fresh worker for what follows.
TEST(Isolate, SupportsCrashOrHangIsReportedAndTheWorkerReplaced) {
  IsolationOptions o = planted_isolation();
  o.timeout_seconds = 2;
  IsolatedEvaluator ev(o);
  Registry stand_ins = worker_registry(ev, {"cpu.attn_online:block=32"});
  ASSERT_NE(stand_ins.find("planted.supports_segfault"), nullptr);
  ASSERT_NE(stand_ins.find("cpu.attn_online:block=32"), nullptr);  // resolved in the worker
  EXPECT_EQ(stand_ins.find("cpu.attn_flash:block=64,p=fp16")->traits().p_bits, 11);
  const Case c = tiny_case(3);
  EXPECT_FALSE(stand_ins.find("cpu.fp32_seq")->unsupported(c).has_value());
  const int before = ev.workers_started();
  const auto why = stand_ins.find("planted.supports_segfault")->unsupported(c);
  ASSERT_TRUE(why.has_value());
  EXPECT_CONTAINS(*why, "supports() crashed");
  EXPECT_CONTAINS(*why, "SIGSEGV");
  const auto hang = stand_ins.find("planted.supports_hang")->unsupported(c);
  ASSERT_TRUE(hang.has_value());
  EXPECT_CONTAINS(*hang, "supports() timed out");
  ASSERT_EQ(ev.support_failures().size(), 2u);
  EXPECT_EQ(ev.support_failures()[0].status, Disposition::Crashed);
  EXPECT_EQ(ev.support_failures()[1].status, Disposition::TimedOut);
  // Asked again: the known answer, no new worker taken down.
  EXPECT_TRUE(stand_ins.find("planted.supports_segfault")->unsupported(tiny_case(4)).has_value());
  EXPECT_EQ(ev.support_failures().size(), 2u);
  expect_good_case_passes(ev);
  EXPECT_EQ(ev.workers_started(), before + 2);
  EXPECT_THROW(stand_ins.find("cpu.fp32_seq")->run(c, KernelIo{}, *std::make_unique<RunNotes>()), KernelError);
}

// Concurrent checks in one worker's threads: every submitted case comes back once, with
// the result evaluate() gives it alone, also when some of them crash or hang the worker
// (the cases in flight then are checked again one at a time, so the crash or the hang is
// the result of its own case and the others pass).
TEST(Isolate, SubmittedCasesEqualEvaluatedOnesThroughCrashesAndHangs) {
  IsolationOptions o = planted_isolation(2.0);
  o.jobs = 3;
  IsolatedEvaluator pool(o), alone(planted_isolation(2.0));
  std::vector<std::pair<std::string, Case>> cases;
  for (int i = 0; i < 24; ++i) {
    const char* kernel = i == 5 ? "planted.segfault" : i == 11 ? "planted.hang" : i == 17 ? "planted.abort"
                         : i % 2 ? "planted.noisy" : "cpu.fp32_seq";
    cases.emplace_back(kernel, tiny_case(static_cast<std::uint64_t>(100 + i)));
  }
  std::map<std::uint64_t, CaseResult> got;
  std::size_t next = 0;
  while (got.size() < cases.size()) {
    while (next < cases.size() && pool.in_flight() < 6) {
      pool.submit(next, cases[next].first, cases[next].second);
      ++next;
    }
    IsolatedEvaluator::Finished f = pool.next_result();
    EXPECT_EQ(to_json(f.requested), to_json(cases.at(f.id).second));
    EXPECT_TRUE(got.emplace(f.id, std::move(f.result)).second) << "case " << f.id << " came back twice";
  }
  EXPECT_EQ(pool.in_flight(), 0u);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const CaseResult& r = got.at(i);
    const CaseResult want = alone.evaluate(cases[i].first, cases[i].second);
    EXPECT_EQ(r.status, want.status) << i << " " << cases[i].first << ": " << r.message;
    if (want.status == Disposition::Ok) EXPECT_EQ(timeless(r), timeless(want)) << i;
    else EXPECT_EQ(r.verdict.reasons.at(0).substr(0, 12), want.verdict.reasons.at(0).substr(0, 12)) << i;
  }
  EXPECT_CONTAINS(got.at(5).message, "SIGSEGV");
  EXPECT_CONTAINS(got.at(11).message, "no result after 2 s");
  EXPECT_CONTAINS(got.at(17).message, "SIGABRT");
  // After the pool's cases, the ordinary requests work on the same evaluator.
  expect_good_case_passes(pool);
}

// Several cases checked at once (fuzz --jobs, the worker drawing them); the record, the
// journal and the failures are those of one worker, case for case, in the same order.
TEST(Isolate, FuzzWithSeveralWorkersEqualsOneWorker) {
  const auto dir = std::filesystem::temp_directory_path() / ("ulpgate-jobs-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto campaign = [&](int jobs) {
    FuzzOptions o;
    // planted.segfault: every case crashes the worker, whose other cases in flight are then
    // checked alone; each crash is recorded with its own case all the same.
    // planted.error_above_k8: failed runs (the kernel's error), shrunk like any failure.
    o.targets = {{"cpu.fp32_seq", "fp16"}, {"planted.noisy", "fp32"}, {"cpu.blockfma:block=16,frac=13,round=rz", "bf16"},
                 {"planted.segfault", "fp32"}, {"planted.error_above_k8", "fp32"}};
    o.cases = 23;  // not a multiple of the jobs or of the cases in flight
    o.seed = 5;
    o.max_k = 64;
    o.gelu = false;
    o.isolation = planted_isolation();
    o.plugins = o.isolation->plugins;
    o.jobs = jobs;
    // Failures to shrink: at most 0.5 x the error of pairwise summation (which sequential
    // summation often exceeds).
    o.evaluation.baseline = BaselineRule{"cpu.fp32_pairwise", 0.5};
    o.journal_path = (dir / ("journal" + std::to_string(jobs) + ".jsonl")).string();
    IsolatedEvaluator first(*o.isolation);
    o.evaluator = &first;
    Registry reg = worker_registry(first, {"cpu.blockfma:block=16,frac=13,round=rz", "cpu.fp32_pairwise"});
    return run_fuzz(reg, o);
  };
  const RunRecord one = campaign(1), three = campaign(3);
  ASSERT_EQ(one.cases.size(), three.cases.size());
  int failed = 0;
  for (std::size_t i = 0; i < one.cases.size(); ++i) {
    EXPECT_EQ(one.cases[i].id, three.cases[i].id) << i;
    EXPECT_EQ(timeless(one.cases[i]), timeless(three.cases[i])) << i;
    failed += !one.cases[i].verdict.passed;
  }
  EXPECT_GT(failed, 23) << "the baseline rule should fail some cases, and every planted.segfault case crashes";
  EXPECT_EQ(std::count_if(three.cases.begin(), three.cases.end(),
                          [](const CaseResult& r) { return r.origin == "generated" && r.status == Disposition::Crashed; }),
            23);
  EXPECT_TRUE(std::any_of(three.cases.begin(), three.cases.end(), [](const CaseResult& r) {
    return r.origin == "shrunk" && r.status == Disposition::Failed && r.spec.gemm.k == 9;
  })) << "a failed run is shrunk to K = 9";
  const JournalContents j1 = read_journal((dir / "journal1.jsonl").string()),
                        j3 = read_journal((dir / "journal3.jsonl").string());
  ASSERT_EQ(j1.entries.size(), j3.entries.size());
  for (std::size_t i = 0; i < j1.entries.size(); ++i) EXPECT_EQ(j1.entries[i].requested, j3.entries[i].requested) << i;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ulpgate
