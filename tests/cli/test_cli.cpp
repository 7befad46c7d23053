// The CLI contract: exit codes and one-line errors.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <array>
#include <csignal>
#include <thread>
#include <cstdio>
#include <string>
#include <vector>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/npy.hpp"
#include "campaign/record.hpp"
#include "check/runner.hpp"
#include "kernels/builtin.hpp"

namespace {

struct Result {
  int code;
  std::string out, err;
};

Result run(const std::string& args, const std::string& env = "") {
  // One file per process and call: ctest runs the tests of this binary in parallel.
  static int calls = 0;
  const std::string err_file =
      testing::TempDir() + "ulpgate_cli_stderr_" + std::to_string(getpid()) + "_" + std::to_string(++calls) + ".txt";
  const std::string cmd = env + (env.empty() ? "" : " ") + std::string(ULPGATE_BIN) + " " + args + " 2>" + err_file;
  Result r{};
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (FILE* e = std::fopen(err_file.c_str(), "r")) {
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), e)) r.err.append(buf.data(), n);
    std::fclose(e);
  }
  return r;
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST(Cli, HelpAndVersion) {
  const Result h = run("--help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("list"), std::string::npos);
  const Result v = run("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_EQ(v.out.rfind("ulpgate ", 0), 0u) << v.out;
}

// Every verb's --help exits 0 and ends with examples of that verb and its exit codes.
TEST(Cli, EveryVerbsHelpShowsExamplesAndExitCodes) {
  for (const char* verb : {"list", "fuzz", "sweep", "merge", "replay", "export", "check", "probe", "bench", "gate",
                           "baseline", "baseline update", "report"}) {
    const Result h = run(std::string(verb) + " --help");
    EXPECT_EQ(h.code, 0) << verb;
    const auto examples = h.out.find("\nExamples:\n"), exits = h.out.find("\nExit codes: 0 ");
    EXPECT_NE(examples, std::string::npos) << verb << ":\n" << h.out;
    EXPECT_NE(exits, std::string::npos) << verb << ":\n" << h.out;
    const std::string first = std::string("  ulpgate ") + std::string(verb).substr(0, std::string(verb).find(' '));
    EXPECT_NE(h.out.find(first, examples), std::string::npos) << verb << ": no example runs the verb";
  }
}

TEST(Cli, ListShowsEveryFormat) {
  const Result r = run("list");
  EXPECT_EQ(r.code, 0);
  for (const char* f : {"fp64", "fp32", "tf32", "fp16", "bf16", "e4m3", "e5m2"})
    EXPECT_NE(r.out.find(f), std::string::npos) << f;
  EXPECT_NE(r.out.find("448"), std::string::npos);
}

TEST(Cli, ListShowsEveryDistributionWithParameters) {
  const Result r = run("list");
  EXPECT_EQ(r.code, 0);
  for (const char* d : {"uniform(lo=-1, hi=1)", "normal(mean=0, std=1)", "lognormal(", "student_t(nu=3",
                        "cauchy(", "activations(", "weights(", "softmax(", "sparse(", "relu(", "positive(",
                        "gendot(cond=1e+12, pairs=1)", "near_overflow(", "subnormal(",
                        "specials(nan=0.0001, inf=0.0001, negzero=0.01, base=normal(0,1))",
                        "outliers(rate=0.001, scale=100, base=normal(0,1))", "amax(frac=1", "logits(std=1)",
                        "sink(logit=16, key=0, std=1)", "masked(", "exact("})
    EXPECT_NE(r.out.find(std::string("  ") + d), std::string::npos) << d;
}

TEST(Cli, BadUsageExitsTwoWithOneLine) {
  for (const char* args : {"frobnicate", "list --no-such-flag", "--no-such-flag", ""}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << "'" << args << "'";
    if (*args) {
      EXPECT_EQ(lines(r.err), 1) << "'" << args << "': " << r.err;
      EXPECT_EQ(r.err.rfind("ulpgate: error: ", 0), 0u) << r.err;
    }
  }
  EXPECT_NE(run("frobnicate").err.find("unknown command 'frobnicate'"), std::string::npos);
}

TEST(Cli, ListShowsKernelsAndPlugins) {
  const Result r = run("list");
  EXPECT_EQ(r.code, 0);
  for (const char* k : {"cpu.fp32_seq", "cpu.fp32_pairwise", "cpu.blockfma:block=4,frac=23,round=rz"})
    EXPECT_NE(r.out.find(k), std::string::npos) << k;
  const Result p = run(std::string("list --plugin ") + EXAMPLE_PLUGIN);
  EXPECT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.out.find("example.host_sgemm"), std::string::npos);
  const Result bad = run("list --plugin /nonexistent.so");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(lines(bad.err), 1) << bad.err;
  EXPECT_NE(bad.err.find("--plugin /nonexistent.so: cannot load"), std::string::npos) << bad.err;
}

// A campaign that could not draw its HTML report says so before it starts, not after.
TEST(Cli, FuzzWithoutGnuplotStopsAtTheStart) {
  const std::string out = testing::TempDir() + "ulpgate_cli_nognuplot_" + std::to_string(getpid());
  const std::string args = "fuzz --cases 1 --kernel cpu.fp32_seq --dtype fp16 --in-process --out " + out;
  const Result no = run(args, "ULPGATE_GNUPLOT=/nonexistent/gnuplot");
  EXPECT_EQ(no.code, 2);
  EXPECT_EQ(lines(no.err), 1) << no.err;
  EXPECT_NE(no.err.find("needs gnuplot"), std::string::npos) << no.err;
  EXPECT_EQ(std::fopen((out + "/fuzz.json").c_str(), "r"), nullptr) << "no campaign ran";
  const Result skip = run(args + " --no-html", "ULPGATE_GNUPLOT=/nonexistent/gnuplot");
  EXPECT_EQ(skip.code, 0) << skip.err;
  EXPECT_EQ(skip.out.find("report.html"), std::string::npos) << skip.out;
  EXPECT_NE(std::fopen((out + "/fuzz.json").c_str(), "r"), nullptr);
}

// fuzz, sweep and replay survive kernels whose supports() or run() crash or hang: each is
// recorded, and the command goes on (planted kernels: tests/campaign/planted).
TEST(Cli, FuzzSweepAndReplaySurvivePlantedKernels) {
  const std::string dir = testing::TempDir() + "ulpgate_cli_planted_" + std::to_string(getpid());
  const std::string plugin = std::string("--plugin ") + PLANTED_PLUGIN;
  const Result f = run("fuzz " + plugin + " --kernel planted.supports_segfault --kernel planted.supports_hang"
                       " --kernel planted.segfault --kernel cpu.attn_naive --dtype fp32 --cases 2 --max-k 32"
                       " --timeout 3 --no-html --time 0 --out " + dir);
  EXPECT_EQ(f.code, 1) << f.out << f.err;
  EXPECT_NE(f.out.find("planted.supports_segfault: supports() crashed"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("planted.supports_hang: supports() timed out"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("SIGSEGV"), std::string::npos) << f.out;  // planted.segfault's run
  EXPECT_NE(f.out.find("cases,"), std::string::npos) << f.out;   // the campaign's summary line

  const Result s = run("sweep " + plugin + " --kernel planted.supports_segfault --kernel cpu.fp32_seq"
                       " --vary K=16:32 --mn 4 --timeout 3");
  EXPECT_EQ(s.code, 0) << s.out << s.err;
  EXPECT_NE(s.out.find("not supported (supports() crashed"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("growth exponent"), std::string::npos) << s.out;

  // A saved case of the crashing kernel replays as a crashed result (exit 1), not a crash.
  std::string corpus_case;
  if (FILE* p = popen(("ls " + dir + "/corpus/planted.segfault-*.json 2>/dev/null | head -1").c_str(), "r")) {
    char buf[4096] = {};
    if (std::fgets(buf, sizeof buf, p)) corpus_case = buf;
    pclose(p);
  }
  while (!corpus_case.empty() && corpus_case.back() == '\n') corpus_case.pop_back();
  ASSERT_FALSE(corpus_case.empty()) << "no corpus case for planted.segfault in " << dir;
  const Result r = run("replay " + plugin + " " + corpus_case);  // --plugin before the file: one value each
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("crashed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SIGSEGV"), std::string::npos) << r.out;
}

// sweep has verdicts: a point that fails (here: the kernel crashes at every K) makes the
// exit code 1, and a sweep where no requested kernel supports the case is bad input (2).
TEST(Cli, SweepExitCodesFollowTheVerdicts) {
  const std::string plugin = std::string("--plugin ") + PLANTED_PLUGIN;
  const Result crash = run("sweep " + plugin + " --kernel planted.segfault --vary K=16:32 --mn 4 --timeout 5");
  EXPECT_EQ(crash.code, 1) << crash.out << crash.err;
  EXPECT_NE(crash.out.find("FAIL"), std::string::npos) << crash.out;
  const Result none = run("sweep --kernel cpu.fp32_seq --dtype fp64 --vary K=16:32 --mn 4");
  EXPECT_EQ(none.code, 2) << none.out << none.err;
  EXPECT_EQ(lines(none.err), 1) << none.err;
  const Result ok = run("sweep --kernel cpu.fp32_seq --vary K=16:32 --mn 4");
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
}

// The split-KV combine sweeps its number of splits; a planted merge that drops the last split
// fails every point with more than one, and a bad --lse-base is one line.
TEST(Cli, SweepOfCombineVariesSplits) {
  const Result ok = run("sweep --kernel cpu.attn_combine --vary splits=1:64:4 --seq-q 2 --lse-base 2");
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("(error ~ splits^exponent)"), std::string::npos) << ok.out;
  const Result bad = run("sweep --kernel cpu.attn_combine:drop_last --vary splits=1:16:4 --seq-q 2");
  EXPECT_EQ(bad.code, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("FAIL splits=16:"), std::string::npos) << bad.out;
  const Result base = run("sweep --kernel cpu.attn_combine --vary splits=1:4 --lse-base 10");
  EXPECT_EQ(base.code, 2);
  EXPECT_EQ(base.err, "ulpgate: error: --lse-base '10': e or 2\n");
}

// Without a terminal, fuzz prints progress lines to stderr (at least every 10 s; here every
// case), so CI logs are not silent during a long campaign.
TEST(Cli, FuzzPrintsProgressWithoutATerminal) {
  const std::string dir = testing::TempDir() + "ulpgate_cli_progress_" + std::to_string(getpid());
  const Result r = run("fuzz --kernel cpu.fp32_seq --dtype fp16 --cases 3 --max-k 16 --no-html --out " + dir,
                       "ULPGATE_PROGRESS_SECONDS=0");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("progress: 1/3 cases, 0 failing"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("progress: 3/3 cases"), std::string::npos) << r.err;
}

// Without a terminal, sweep prints a line per point to stderr, and its tables reach stdout
// as each series ends (a 500 s sweep on the H200 wrote nothing to its log before).
TEST(Cli, SweepPrintsProgressWithoutATerminal) {
  const Result r = run("sweep --kernel cpu.fp32_seq --vary K=16:64 --mn 4");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("cpu.fp32_seq fp32 normal(0,1): 1/3 points, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cpu.fp32_seq fp32 normal(0,1): 3/3 points, "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "terminal control in a log";
}

namespace {

// Reads a whole file ("" when it cannot be opened).
std::string slurp(const std::string& path) {
  std::string s;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    std::array<char, 4096> buf;
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), f)) s.append(buf.data(), n);
    std::fclose(f);
  }
  return s;
}

std::string tmp_dir(const std::string& what) { return testing::TempDir() + "ulpgate_cli_" + what + "_" + std::to_string(getpid()); }

const std::string kSmallCampaign = "fuzz --kernel cpu.fp32_seq --dtype fp16 --max-k 32 --no-html --time 0";

}  // namespace

// The gate matches cases by id and refuses to compare runs of different campaigns: a run
// with another seed or case count would compare nothing and pass.
TEST(Cli, GateMatchesCasesAndRefusesADifferentCampaign) {
  const std::string dir = tmp_dir("gate_campaign");
  ASSERT_EQ(run(kSmallCampaign + " --cases 5 --seed 1 --out " + dir + "/base").code, 0);
  ASSERT_EQ(run("baseline update --out " + dir + "/base.json " + dir + "/base/fuzz.json").code, 0);
  ASSERT_EQ(run(kSmallCampaign + " --cases 5 --seed 1 --out " + dir + "/same").code, 0);
  const Result same = run("gate --baseline " + dir + "/base.json " + dir + "/same/fuzz.json");
  EXPECT_EQ(same.code, 0) << same.out << same.err;
  EXPECT_NE(same.out.find("5 matched"), std::string::npos) << same.out;

  ASSERT_EQ(run(kSmallCampaign + " --cases 5 --seed 2 --out " + dir + "/seed2").code, 0);
  const Result seed = run("gate --baseline " + dir + "/base.json " + dir + "/seed2/fuzz.json");
  EXPECT_EQ(seed.code, 2) << seed.out << seed.err;
  EXPECT_EQ(lines(seed.err), 1) << seed.err;
  EXPECT_NE(seed.err.find("seed"), std::string::npos) << seed.err;

  // One more case per target: a different campaign (exit 2); told to compare anyway, the
  // first five cases are the same cases (a target's stream does not depend on --cases).
  ASSERT_EQ(run(kSmallCampaign + " --cases 6 --seed 1 --out " + dir + "/six").code, 0);
  EXPECT_EQ(run("gate --baseline " + dir + "/base.json " + dir + "/six/fuzz.json").code, 2);
  const Result six = run("gate --allow-different-campaign --baseline " + dir + "/base.json " + dir + "/six/fuzz.json");
  EXPECT_EQ(six.code, 0) << six.out << six.err;
  EXPECT_NE(six.out.find("5 matched"), std::string::npos) << six.out;
  EXPECT_NE(six.out.find("1 new"), std::string::npos) << six.out;
}

// A campaign cut short by --time records what it did not run, says so, and exits 1 unless
// --allow-partial; the gate fails on baseline cases that were not run unless --allow-missing.
TEST(Cli, PartialCampaignsAreRecordedAndRefused) {
  const std::string dir = tmp_dir("partial");
  const std::string two = " --kernel cpu.fp32_pairwise --cases 4 --seed 3 --out ";
  ASSERT_EQ(run(kSmallCampaign + two + dir + "/base").code, 0);
  ASSERT_EQ(run("baseline update --out " + dir + "/base.json " + dir + "/base/fuzz.json").code, 0);
  const std::string cut = kSmallCampaign.substr(0, kSmallCampaign.size() - 1) + "0.000001" + two + dir + "/cut";
  const Result partial = run(cut);
  EXPECT_EQ(partial.code, 1) << partial.out << partial.err;
  EXPECT_NE(partial.out.find("not run"), std::string::npos) << partial.out;
  EXPECT_NE(slurp(dir + "/cut/report.md").find("not run"), std::string::npos);
  EXPECT_NE(slurp(dir + "/cut/fuzz.json").find("\"not_run\""), std::string::npos);
  const Result gated = run("gate --baseline " + dir + "/base.json " + dir + "/cut/fuzz.json");
  EXPECT_EQ(gated.code, 1) << gated.out << gated.err;
  EXPECT_NE(gated.out.find("not run"), std::string::npos) << gated.out;
  EXPECT_EQ(run("gate --allow-missing --baseline " + dir + "/base.json " + dir + "/cut/fuzz.json").code, 0);
  EXPECT_EQ(run(cut + "2 --allow-partial").code, 0);
}

// A failing case fails the gate even where the baseline has nothing to compare it with.
TEST(Cli, GateFailsOnAnyFailingCase) {
  const std::string dir = tmp_dir("gate_failing");
  const std::string plugin = std::string("--plugin ") + PLANTED_PLUGIN;
  ASSERT_EQ(run(kSmallCampaign + " --cases 2 --out " + dir + "/base").code, 0);
  ASSERT_EQ(run("baseline update --out " + dir + "/base.json " + dir + "/base/fuzz.json").code, 0);
  const Result crash = run(plugin + " " + kSmallCampaign + " --kernel planted.segfault --dtype fp32 --cases 2 --timeout 5 --out " +
                           dir + "/crash");
  EXPECT_EQ(crash.code, 1) << crash.out << crash.err;
  const Result g = run("gate --allow-different-campaign --baseline " + dir + "/base.json " + dir + "/crash/fuzz.json");
  EXPECT_EQ(g.code, 1) << g.out << g.err;
  EXPECT_NE(g.out.find("planted.segfault"), std::string::npos) << g.out;
}

// Every failing case is saved, and its reproducer, typed as shown, reruns it (with the
// plugin it needs); a passing case's reproducer is a fuzz command that regenerates it.
TEST(Cli, ReproducersReproduce) {
  const std::string dir = tmp_dir("reproducers");
  const std::string plugin = std::string("--plugin ") + PLANTED_PLUGIN;
  const Result f = run(kSmallCampaign + " " + plugin + " --kernel planted.segfault --dtype fp32 --cases 3 --timeout 5 --out " + dir);
  EXPECT_EQ(f.code, 1) << f.out << f.err;
  const std::string record = slurp(dir + "/fuzz.json");
  const std::string prefix = "ulpgate " + plugin + " replay ";
  int replays = 0;
  for (std::size_t at = record.find("\"reproducer\": \"" + prefix); at != std::string::npos;
       at = record.find("\"reproducer\": \"" + prefix, at + 1)) {
    const std::size_t start = at + std::string("\"reproducer\": \"ulpgate ").size();
    const std::string cmd = record.substr(start, record.find('"', start) - start);
    const Result r = run(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("SIGSEGV"), std::string::npos) << cmd << "\n" << r.out;
    ++replays;
  }
  EXPECT_GE(replays, 3) << record.substr(0, 2000);  // every generated case of the target failed
  // A passing case: its fuzz command carries every flag that shapes the case stream.
  const std::string ok = dir + "_ok";
  ASSERT_EQ(run(kSmallCampaign + " --cases 3 --seed 9 --out " + ok).code, 0);
  const std::string rec = slurp(ok + "/fuzz.json");
  const std::size_t at = rec.find("\"reproducer\": \"ulpgate ");
  ASSERT_NE(at, std::string::npos);
  const std::size_t start = at + std::string("\"reproducer\": \"ulpgate ").size();
  std::string cmd = rec.substr(start, rec.find('"', start) - start);
  EXPECT_NE(cmd.find("--max-k 32"), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--seed 9"), std::string::npos) << cmd;
  const Result again = run(cmd + " --no-html --out " + ok + "_again");
  EXPECT_EQ(again.code, 0) << cmd << again.out << again.err;
  const std::size_t id_at = rec.find("\"id\": \"");
  ASSERT_NE(id_at, std::string::npos);
  EXPECT_NE(slurp(ok + "_again/fuzz.json").find(rec.substr(id_at, 26)), std::string::npos) << "case not regenerated";
}

// Global options (--plugin) are accepted before or after the verb.
TEST(Cli, GlobalOptionsBeforeOrAfterTheVerb) {
  const std::string plugin = std::string("--plugin ") + EXAMPLE_PLUGIN;
  const Result before = run(plugin + " list");
  const Result after = run("list " + plugin);
  EXPECT_EQ(before.code, 0) << before.err;
  EXPECT_EQ(after.code, 0) << after.err;
  EXPECT_EQ(before.out, after.out);
  EXPECT_NE(before.out.find("example."), std::string::npos) << before.out;
}

// ---- Bad input is exit 2 with one line, never a crash or an internal error ----

namespace {

std::string write_text(const std::string& path, const std::string& text) {
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  return path;
}

// Exit 2, one line "ulpgate: error: ..." holding `what`.
void expect_input_error(const Result& r, const std::string& what, const std::string& context) {
  EXPECT_EQ(r.code, 2) << context << "\n" << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << context << "\n" << r.err;
  EXPECT_EQ(r.err.rfind("ulpgate: error: ", 0), 0u) << context << "\n" << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << context << ": expected '" << what << "' in\n" << r.err;
}

const std::string kSmallCase =
    R"({"ulpgate_case": 1, "op": "gemm", "kernel": "cpu.fp32_seq", "gemm": {"m": 10, "n": 7, "k": 5},
        "types": {"A": "fp32", "B": "fp32", "D": "fp32", "compute": "fp32"}, "seed": 1})";

}  // namespace

// A case file nested 100000 levels deep overflowed the stack while the error was built (139).
TEST(CliBadInput, DeeplyNestedJsonIsRefused) {
  const std::string dir = tmp_dir("nested");
  std::system(("mkdir -p " + dir).c_str());
  const std::string deep = write_text(dir + "/n.json", std::string(100000, '[') + std::string(100000, ']') + "\n");
  for (const std::string& verb : std::vector<std::string>{"replay --in-process ", "replay ", "report ",
                                                          "gate --baseline " + deep + " ",
                                                          "baseline update --out " + dir + "/b.json "})
    expect_input_error(run(verb + deep), deep + ": JSON nested deeper than 64 levels at byte 65", verb);
}

// 1e400 is valid JSON but no double: exit 3 with the JSON library's raw message before.
TEST(CliBadInput, NumberBeyondDoubleNamesTheField) {
  const std::string dir = tmp_dir("bignum");
  std::system(("mkdir -p " + dir).c_str());
  std::string text = kSmallCase;
  text.replace(text.find("\"seed\": 1"), 9, "\"alpha\": 1e400");
  const std::string c = write_text(dir + "/case.json", text);
  expect_input_error(run("replay " + c), c + ": alpha: number 1e400 is out of range", "case");
  const std::string r = write_text(dir + "/run.json", R"({"ulpgate_record": 2, "kind": "fuzz", "seed": 1e400})");
  expect_input_error(run("report " + r), r + ": seed: number 1e400 is out of range", "record");
}

// A plugin reporting five kernels and a NULL list: every verb segfaulted reading it.
TEST(CliBadInput, PluginWithANullKernelListIsRefusedByName) {
  const std::string plugin = std::string(" --plugin ") + PLANTED_NULL_LIST;
  const std::string dir = tmp_dir("null_list");
  std::system(("mkdir -p " + dir).c_str());
  const std::string c = write_text(dir + "/case.json", kSmallCase);
  for (const std::string& verb : std::vector<std::string>{
           "list", "replay " + c, "replay --in-process " + c, "sweep --kernel cpu.fp32_seq --vary K=4:8 --mn 2",
        "fuzz --kernel cpu.fp32_seq --dtype fp16 --cases 1 --no-html --out " + dir + "/out"})
    expect_input_error(run(verb + plugin),
                       std::string("--plugin ") + PLANTED_NULL_LIST + ": reports 5 kernels but no kernel list (NULL)", verb);
}

// A plugin's message without a terminating NUL was read past its buffer: at most the
// buffer is read (1023 characters of run()'s 1024-byte buffer, 511 of supports()' 512).
TEST(CliBadInput, PluginMessagesWithoutANulAreCutAtTheirBuffer) {
  const std::string plugin = std::string(" --plugin ") + PLANTED_EDGE_PLUGIN;
  const std::string dir = tmp_dir("unterminated");
  std::system(("mkdir -p " + dir).c_str());
  std::string text = kSmallCase;
  text.replace(text.find("cpu.fp32_seq"), 12, "planted_edge.unterminated");
  const std::string c = write_text(dir + "/case.json", text);
  for (const std::string mode : {"", "--in-process "}) {
    const Result r = run("replay " + mode + c + plugin);
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    const std::string message = "plugin kernel planted_edge.unterminated returned 7: " + std::string(1023, 'E');
    const std::size_t at = r.out.find(message);
    ASSERT_NE(at, std::string::npos) << mode << r.out;
    EXPECT_EQ(r.out[at + message.size()], '\n') << mode << "read past the buffer: " << r.out.substr(at + message.size(), 80);
  }
  std::string half = text;
  half.replace(half.find("\"A\": \"fp32\""), 11, "\"A\": \"fp16\"");
  half.replace(half.find("\"B\": \"fp32\""), 11, "\"B\": \"fp16\"");
  const Result r = run("replay --in-process " + write_text(dir + "/half.json", half) + plugin);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const std::string why = "not_supported, verdict pass\n  " + std::string(511, 'W') + "\n";
  EXPECT_NE(r.out.find(why), std::string::npos) << r.out;
}

// A device-memory plugin kernel on a machine without a CUDA device failed every case
// ("cudaMalloc ... driver version is insufficient", or "built without CUDA"): it is not
// runnable here, and says why.
TEST(CliBadInput, DeviceKernelsWithoutADeviceAreNotSupported) {
  if (run("list").out.find("(device: NVIDIA") != std::string::npos) GTEST_SKIP() << "a CUDA device is here";
  const std::string plugin = std::string(" --plugin ") + PLANTED_EDGE_PLUGIN;
  const std::string dir = tmp_dir("device");
  std::system(("mkdir -p " + dir).c_str());
  std::string text = kSmallCase;
  text.replace(text.find("cpu.fp32_seq"), 12, "planted_edge.device");
  const std::string c = write_text(dir + "/case.json", text);
  for (const std::string mode : {"", "--in-process "}) {
    const Result r = run("replay " + mode + c + plugin);
    EXPECT_EQ(r.code, 0) << mode << r.out << r.err;
    EXPECT_NE(r.out.find("not_supported, verdict pass\n  needs a CUDA device; none here"), std::string::npos) << mode << r.out;
  }
  const Result f = run("fuzz --kernel planted_edge.device --dtype fp32 --cases 1 --no-html --out " + dir + "/out" + plugin);
  expect_input_error(f, "--kernel 'planted_edge.device': no target here: it refused the basic case of every dtype asked: "
                        "needs a CUDA device; none here (fp32 gemm to fp32, bf16, fp16; fp32 attention to", "fuzz");
  const Result s = run("sweep --kernel planted_edge.device --vary K=4:8 --mn 2" + plugin);
  expect_input_error(s, "planted_edge.device fp32: not supported (needs a CUDA device; none here)", "sweep");
}

// --out naming a file, an unwritable directory or "" was "internal error: filesystem error"
// (exit 3), some of it after the campaign had run.
TEST(CliBadInput, UnusableOutDirectoryIsRefusedBeforeTheCampaign) {
  const std::string dir = tmp_dir("badout");
  std::system(("mkdir -p " + dir + "/locked && chmod 500 " + dir + "/locked").c_str());
  const std::string file = write_text(dir + "/file", "x");
  const std::string campaign = "fuzz --kernel cpu.fp32_seq --dtype fp16 --cases 1 --no-html --out ";
  expect_input_error(run(campaign + file), "--out " + file + ": not a directory", "file");
  expect_input_error(run(campaign + file + "/sub"), "--out " + file + "/sub: cannot create the directory", "under a file");
  expect_input_error(run(campaign + "''"), "--out: empty path", "empty");
  expect_input_error(run("sweep --kernel cpu.fp32_seq --vary K=4:8 --mn 2 --out " + file), "--out " + file + ": not a directory",
                     "sweep");
  if (::geteuid() != 0) {  // root writes anywhere
    expect_input_error(run(campaign + dir + "/locked"), "--out " + dir + "/locked: cannot write there", "unwritable");
    expect_input_error(run(campaign + dir + "/locked/sub"), "--out " + dir + "/locked/sub: cannot create the directory",
                       "under an unwritable directory");
  }
  EXPECT_EQ(slurp(file), "x");
}

namespace {

// Starts ulpgate with args (a vector, no shell), stdout and stderr to files; returns its pid.
pid_t spawn_ulpgate(const std::vector<std::string>& args, const std::string& out, const std::string& err,
                    const std::vector<std::string>& env = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    if (std::freopen(out.c_str(), "w", stdout) == nullptr || std::freopen(err.c_str(), "w", stderr) == nullptr) ::_exit(120);
    std::vector<char*> argv{const_cast<char*>(ULPGATE_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(ULPGATE_BIN, argv.data());
    ::_exit(127);
  }
  return pid;
}

// The exit code, or 128 + the signal that ended it.
int wait_code(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Whether pid runs (a zombie does not).
bool running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// Waits up to `seconds` for cond().
template <class Cond>
bool wait_for(Cond cond, double seconds) {
  for (int i = 0; i < seconds * 50; ++i) {
    if (cond()) return true;
    ::usleep(20000);
  }
  return cond();
}

}  // namespace

// Ctrl-C during fuzz: exit 130 with one line saying what was kept and how to go on; the
// worker and what it started are gone. Rerun without --resume, the journal was truncated.
TEST(CliBadInput, InterruptedCampaignSaysHowToResumeAndKeepsItsJournal) {
  const std::string dir = tmp_dir("interrupt");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string out = dir + "/out", pid_file = dir + "/child.pid";
  const std::vector<std::string> args = {"--plugin", PLANTED_EDGE_PLUGIN, "fuzz", "--kernel", "cpu.fp32_seq", "--kernel",
                                         "planted_edge.forks_and_hangs", "--dtype", "fp32", "--cases", "3", "--max-k", "16",
                                         "--timeout", "60", "--time", "0", "--no-html", "--out", out};
  for (int signal : {SIGINT, SIGTERM}) {
    std::system(("rm -rf " + out + " " + pid_file).c_str());
    const pid_t pid = spawn_ulpgate(args, dir + "/stdout", dir + "/stderr", {"PLANTED_CHILD_PID_FILE=" + pid_file});
    ASSERT_TRUE(wait_for([&] { return !slurp(pid_file).empty(); }, 60)) << slurp(dir + "/stderr");
    const pid_t child = std::stoi(slurp(pid_file));
    const std::string stat = slurp("/proc/" + std::to_string(child) + "/stat");
    int worker = 0;
    ASSERT_EQ(std::sscanf(stat.c_str() + stat.rfind(')') + 2, "%*c %d", &worker), 1) << stat;
    ASSERT_EQ(::kill(pid, signal), 0);
    EXPECT_EQ(wait_code(pid), 130) << signal;
    const std::string err = slurp(dir + "/stderr");
    EXPECT_NE(err.find("interrupted: 3 cases journaled in " + out +
                       "/journal.jsonl; rerun the same command with --resume to continue\n"),
              std::string::npos)
        << err;
    EXPECT_TRUE(wait_for([&] { return !running(worker) && !running(child); }, 10))
        << "worker " << worker << " or its child " << child << " outlived the campaign";
  }
  // The same campaign again without --resume: refused, the journal untouched.
  const std::string journal = slurp(out + "/journal.jsonl");
  std::string rerun = "--plugin " + std::string(PLANTED_EDGE_PLUGIN);
  for (std::size_t i = 2; i < args.size(); ++i) rerun += " " + args[i];
  expect_input_error(run(rerun), out + "/journal.jsonl holds an unfinished campaign (3 cases journaled): --resume continues it, "
                                       "or remove it / choose another --out", "rerun");
  EXPECT_EQ(slurp(out + "/journal.jsonl"), journal);
  // A finished campaign's journal may be replaced.
  const std::string done = dir + "/done";
  ASSERT_EQ(run(kSmallCampaign + " --cases 2 --out " + done).code, 0);
  const Result again = run(kSmallCampaign + " --cases 2 --out " + done);
  EXPECT_EQ(again.code, 0) << again.out << again.err;
}

// Sizes had no cap and padding is really allocated: K = 1e9 and the like ended in
// bad_alloc ("evaluation threw", exit 1 or 3), a 10 x 7 GEMM with ldc = 2^24 took 2 GB.
// Now each size is capped (case validation) and a case is refused before anything is
// allocated when it needs more than --max-memory (default: half the machine's memory).
TEST(CliBadInput, CasesTooLargeForMemoryAreRefusedBeforeAllocating) {
  const std::string dir = tmp_dir("memory");
  std::system(("mkdir -p " + dir).c_str());
  const auto with = [&](const std::string& name, const std::string& gemm_fields, const std::string& extra = "") {
    std::string text = kSmallCase;
    text.replace(text.find("\"k\": 5}"), 7, "\"k\": 5, " + gemm_fields + "}");
    if (!extra.empty()) text.replace(text.find("\"seed\": 1"), 9, extra + ", \"seed\": 1");
    return write_text(dir + "/" + name + ".json", text);
  };
  const std::string k = with("k", R"("k": 1000000000)");
  const std::string huge = with("mnk", R"("m": 1000000000, "n": 1000000000, "k": 1000000000)");
  const std::string lda = with("lda", R"("lda": 1099511627776)");
  const std::string batch = with("batch", R"("batch": 1000000000000)");
  const std::string ldc = with("ldc", R"("ldc": 16777216)", R"("beta": 1, "types": {"A": "fp32", "B": "fp32", "C": "fp32", "D": "fp32", "compute": "fp32"})");
  // the duplicate "types" key: nlohmann keeps the last one
  for (const std::string mode : {"", "--in-process "}) {
    expect_input_error(run("replay " + mode + k), k + ": case needs ", mode + "K = 1e9");
    EXPECT_NE(run("replay " + mode + k).err.find("(A is 10 x 1000000000 fp32), above --max-memory "), std::string::npos)
        << run("replay " + mode + k).err;
    expect_input_error(run("replay " + mode + huge), "case.gemm: A holds 1000000000000000000 elements", mode + "M = N = K = 1e9");
    expect_input_error(run("replay " + mode + lda), "case.gemm.lda: must be at most 2147483647, got 1099511627776", mode + "lda");
    expect_input_error(run("replay " + mode + batch), "case.gemm.batch: must be at most 2147483647", mode + "batch");
    expect_input_error(run("replay " + mode + ldc + " --max-memory 1GB"),
                       ldc + ": case needs 2 GB (ldc = 16777216 pads C), above --max-memory 1 GB", mode + "ldc");
  }
  const std::string small_ldc =
      with("small_ldc", R"("ldc": 1048576)", R"("beta": 1, "types": {"A": "fp32", "B": "fp32", "C": "fp32", "D": "fp32", "compute": "fp32"})");
  const Result fits = run("replay " + small_ldc + " --max-memory 256MB");  // 126 MB: runs
  EXPECT_EQ(fits.code, 0) << fits.out << fits.err;
  // sweep: every point is checked before the first runs.
  const Result s = run("sweep --kernel cpu.fp32_seq --mn 64 --vary K=64:100000000 --max-memory 1G");
  expect_input_error(s, "sweep point K = 100000000: case needs ", "sweep");
  EXPECT_EQ(s.out.find("growth exponent"), std::string::npos) << "a series ran: " << s.out;
  // --max-memory itself
  expect_input_error(run("replay " + k + " --max-memory lots"), "--max-memory 'lots': expected a size such as 12GB, 512MiB or 1e9",
                     "bad size");
  expect_input_error(run("replay " + k + " --max-memory 1k"), "--max-memory 1k: below the least a case needs here (256 MB)",
                     "tiny");
  // fuzz: the corpus is checked before the campaign starts.
  const std::string out = dir + "/fuzz";
  std::system(("mkdir -p " + out + "/corpus && cp " + ldc + " " + out + "/corpus/").c_str());
  const Result f = run(kSmallCampaign + " --kernel cpu.fp32_seq --dtype fp32 --cases 1 --max-memory 1GB --out " + out);
  expect_input_error(f, out + "/corpus/ldc.json: case needs 2 GB", "fuzz corpus");
  EXPECT_EQ(slurp(out + "/journal.jsonl"), "") << "the campaign started";
  // --cases 3000000000 reserved memory for every case (std::length_error, exit 3).
  expect_input_error(run("fuzz --kernel cpu.fp32_seq --dtype fp16 --no-html --time 20 --cases 3000000000 --out " + dir + "/many"),
                     "--cases 3000000000: at most 1000000000 cases per target", "cases");
}

// Flags that were silently reinterpreted: --seed -1 and an overflowing seed became
// 18446744073709551615, --time -5 or nan became "no budget", --dtype fp8 said no kernel
// supports it, --plugin foo.so in the current directory was not found (dlopen searches the
// library path), --plugin '' loaded the program itself.
TEST(CliBadInput, FlagsAreCheckedNotReinterpreted) {
  const std::string dir = tmp_dir("flags");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string fuzz = "fuzz --kernel cpu.fp32_seq --dtype fp16 --cases 1 --no-html --out " + dir + "/out ";
  const std::string sweep = "sweep --kernel cpu.fp32_seq --vary K=4:8 --mn 2 ";
  for (const std::string& verb : {fuzz, sweep}) {
    expect_input_error(run(verb + "--seed -1"), "--seed -1: expected an integer from 0 to 18446744073709551615", verb);
    expect_input_error(run(verb + "--seed 18446744073709551616"), "--seed 18446744073709551616: expected an integer", verb);
    expect_input_error(run(verb + "--seed 1x"), "--seed 1x: expected an integer", verb);
    expect_input_error(run(verb + "--timeout nan"), "--timeout nan: must be a finite number of seconds >= 1", verb);
  }
  EXPECT_NE(run(fuzz + "--seed 18446744073709551615").out.find("seed 18446744073709551615"), std::string::npos);
  expect_input_error(run(fuzz + "--time -5"), "--time -5: must be a finite number of seconds >= 0 (0: no budget)", "time");
  expect_input_error(run(fuzz + "--time nan"), "--time nan: must be a finite number of seconds >= 0", "time nan");
  expect_input_error(run(fuzz + "--time inf"), "--time inf: must be a finite number of seconds >= 0", "time inf");
  expect_input_error(run(fuzz + "--dtype fp8"), "unknown dtype 'fp8' (one of fp64, fp32, tf32, fp16, bf16, e4m3, e5m2)", "dtype");
  expect_input_error(run(sweep + "--dtype fp8"), "unknown dtype 'fp8' (one of fp64, fp32, tf32, fp16, bf16, e4m3, e5m2)", "sweep");
  expect_input_error(run("replay x.json --timeout -1"), "--timeout -1: must be a finite number of seconds >= 1", "replay");
  expect_input_error(run("list --plugin ''"), "--plugin: empty path", "plugin ''");
  // A plugin named without '/' that exists here is loaded from here, in the worker too,
  // and reproducers name it so.
  std::system(("cp " + std::string(EXAMPLE_PLUGIN) + " " + dir + "/example_plugin.so").c_str());
  const std::string here = "cd " + dir + " && ";
  const std::string bin = std::string(ULPGATE_BIN);
  const auto run_here = [&](const std::string& args) {
    const int code = std::system((here + bin + " " + args + " >" + dir + "/here.out 2>" + dir + "/here.err").c_str());
    return Result{WIFEXITED(code) ? WEXITSTATUS(code) : -1, slurp(dir + "/here.out"), slurp(dir + "/here.err")};
  };
  const Result list = run_here("list --plugin example_plugin.so");
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find("example.host_sgemm"), std::string::npos) << list.out;
  const Result f = run_here("--plugin example_plugin.so fuzz --kernel example.host_sgemm --dtype fp32 --cases 1 --max-k 16 "
                            "--no-html --out fuzz-here");
  EXPECT_EQ(f.code, 0) << f.out << f.err;
  EXPECT_NE(slurp(dir + "/fuzz-here/fuzz.json").find("--plugin ./example_plugin.so"), std::string::npos);
}

// A chained forward + backward campaign: the forward kernel is named in every case, the
// campaign and the reproducer; a forward kernel that does not exist, or a campaign without a
// backward target, is refused before anything runs.
TEST(CliBadInput, ForwardKernelIsChainedIntoBackwardCases) {
  const std::string dir = tmp_dir("forward_kernel");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string fuzz = "fuzz --dtype fp16 --cases 2 --max-k 64 --sizes small --no-html --out " + dir + "/out ";
  expect_input_error(run(fuzz + "--kernel cpu.attn_bwd_naive --forward-kernel no.such"),
                     "--forward-kernel 'no.such': no such kernel here", "unknown");
  expect_input_error(run(fuzz + "--kernel cpu.attn_naive --forward-kernel cpu.attn_naive"),
                     "--forward-kernel cpu.attn_naive: no attention_backward target", "no backward target");
  const Result r = run(fuzz + "--kernel cpu.attn_bwd_naive --forward-kernel cpu.attn_flash:block=16,p=fp16");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const ulpgate::RunRecord rec = ulpgate::read_record_file(dir + "/out/fuzz.json");
  EXPECT_EQ(rec.campaign.forward_kernel, "cpu.attn_flash:block=16,p=fp16");
  ASSERT_FALSE(rec.cases.empty());
  for (const ulpgate::CaseResult& c : rec.cases) {
    EXPECT_EQ(c.spec.forward_kernel, "cpu.attn_flash:block=16,p=fp16");
    EXPECT_TRUE(c.notes.count("forward")) << c.kernel;
  }
}

// A gnuplot that fails (no svg terminal, a broken install) was an internal error with an
// empty message (exit 3): it is this machine's gnuplot, named with what it printed.
TEST(CliBadInput, FailingGnuplotIsNamedWithWhatItPrinted) {
  const std::string dir = tmp_dir("gnuplot");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  ASSERT_EQ(run(kSmallCampaign + " --cases 1 --out " + dir + "/run").code, 0);
  const std::string record = dir + "/run/fuzz.json";
  const std::string noisy = write_text(dir + "/noisy-gnuplot", "#!/bin/sh\necho 'line 3: unknown terminal type' >&2\nexit 1\n");
  std::system(("chmod +x " + noisy).c_str());
  const std::string html = " --html " + dir + "/report.html";
  expect_input_error(run("report " + record + html, "ULPGATE_GNUPLOT=/bin/false"),
                     "gnuplot '/bin/false' failed (exit 1) and printed nothing", "false");
  expect_input_error(run("report " + record + html, "ULPGATE_GNUPLOT=" + noisy),
                     "gnuplot '" + noisy + "' failed (exit 1): line 3: unknown terminal type", "noisy");
  expect_input_error(run("report " + record + html, "ULPGATE_GNUPLOT=/bin/true"),
                     "gnuplot '/bin/true' wrote no plot (printed nothing)", "true");
  EXPECT_EQ(slurp(dir + "/report.html"), "");
  // A campaign checks gnuplot before it starts (kSmallCampaign has --no-html).
  const std::string with_html = "fuzz --kernel cpu.fp32_seq --dtype fp16 --max-k 32 --time 0 --cases 1 --out " + dir + "/html";
  expect_input_error(run(with_html, "ULPGATE_GNUPLOT=/bin/false"), "gnuplot '/bin/false' failed (exit 1)", "fuzz with html");
  EXPECT_EQ(slurp(dir + "/html/journal.jsonl"), "");
}

// A baseline version of 2^32 + 2 was read through an int (wrapping to 2, the current one) and
// accepted.
TEST(CliBadInput, BaselineVersionIsReadWithoutWrapping) {
  const std::string dir = tmp_dir("baseline_version");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  ASSERT_EQ(run(kSmallCampaign + " --cases 1 --out " + dir + "/run").code, 0);
  ASSERT_EQ(run("baseline update --out " + dir + "/b.json " + dir + "/run/fuzz.json").code, 0);
  std::string text = slurp(dir + "/b.json");
  const std::size_t at = text.find("\"ulpgate_baseline\": ");
  ASSERT_NE(at, std::string::npos) << text.substr(0, 200);
  const std::size_t end = text.find_first_of(",\n}", at);
  const std::string version = text.substr(at + 20, end - at - 20);  // 2 today: 2^32 + 2 wraps to it
  text.replace(at, end - at, "\"ulpgate_baseline\": " + std::to_string((std::uint64_t{1} << 32) + std::stoull(version)));
  const std::string b = write_text(dir + "/wrapped.json", text);
  expect_input_error(run("gate --baseline " + b + " " + dir + "/run/fuzz.json"),
                     b + ": baseline.ulpgate_baseline: unsupported version 429496729", "version");
}

// `ulpgate probe`: a block-FMA model's parameters back (exit 0), with the alignment and the
// validation counts by class, a tree that is no block-FMA unit reported (exit 1), an
// unknown kernel refused (exit 2, one line).
TEST(Cli, ProbeReportsHowAKernelAccumulates) {
  const Result ok = run("probe --kernel cpu.blockfma:block=4,frac=23,round=rz");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.out, "cpu.blockfma:block=4,frac=23,round=rz (fp32 inputs): block 4, 23 fraction bits (aligned by each "
                    "product), rz; the model agrees on 1000 random dot products (338 normal, 318 cancelling, 344 with "
                    "subnormal inputs)\n");
  // The same model through BF16 inputs (each product split into two BF16 values).
  const Result bf16 = run("probe --kernel cpu.blockfma:block=4,frac=23,round=rz --dtype bf16");
  EXPECT_EQ(bf16.code, 0) << bf16.err;
  EXPECT_EQ(bf16.out, "cpu.blockfma:block=4,frac=23,round=rz (bf16 inputs): block 4, 23 fraction bits (aligned by "
                      "each product), rz; the model agrees on 1000 random dot products (338 normal, 318 cancelling, 344 "
                      "with subnormal inputs)\n");
  // A model aligned by its factors' exponents (the H200's mma.sync) is told apart.
  const Result aligned = run("probe --kernel cpu.blockfma:block=16,frac=25,round=rz,align=fp16 --dtype fp16 --mn 16");
  EXPECT_EQ(aligned.code, 0) << aligned.err;
  EXPECT_NE(aligned.out.find("block 16, 25 fraction bits (aligned by the factors' exponents)"), std::string::npos) << aligned.out;
  EXPECT_EQ(run("probe --kernel cpu.fp32_seq --dtype fp8").code, 2);
  const Result tree = run("probe --kernel cpu.fp32_pairwise");
  EXPECT_EQ(tree.code, 1);
  EXPECT_NE(tree.out.find("cpu.fp32_pairwise: not a block-FMA unit"), std::string::npos) << tree.out;
  const Result bad = run("probe --kernel nope");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "ulpgate: error: unknown kernel 'nope' (see ulpgate list)\n");
}

// `ulpgate bench`: the baseline timed first and the others' % of it, every timed output
// checked (exit 0), the Markdown table on stdout and the JSON record; bad input is one line
// and exit 2; a kernel whose output fails its check makes the exit 1.
TEST(Cli, BenchTimesAndChecksEveryKernel) {
  const std::string dir = tmp_dir("bench");
  std::filesystem::create_directories(dir);
  const Result ok = run("bench --kernel cpu.fp32_seq --kernel cpu. --baseline cpu.fp32_pairwise --gemm 16x24x40 --reps 3 "
                        "--warmup 1 --json " + dir + "/b.json --md " + dir + "/b.md --html " + dir + "/b.html");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("| cpu.fp32_pairwise | 16x24x40 fp32 |"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("| % of cpu.fp32_pairwise |"), std::string::npos) << ok.out;
  EXPECT_EQ(ok.out, slurp(dir + "/b.md"));
  const std::string json = slurp(dir + "/b.json");
  for (const char* key : {"\"ulpgate_bench\": 1", "\"tflops\"", "\"percent_of_baseline\"", "\"same_bits_as_timed\": true",
                          "\"effective_bits\"",
                          "\"max_normalised\"", "\"reps\": 3", "\"timer\": \"steady clock\""})
    EXPECT_NE(json.find(key), std::string::npos) << key;
  EXPECT_NE(ok.err.find("bench: 1/"), std::string::npos) << ok.err;  // progress
  const std::string html = slurp(dir + "/b.html");  // the speed-vs-size plot and the table
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("GEMM: speed vs size"), std::string::npos);
  EXPECT_NE(html.find("<td>cpu.fp32_pairwise</td><td>16x24x40 fp32</td>"), std::string::npos);
  // `ulpgate report` renders the JSON again: the same Markdown, HTML with the plot; JUnit
  // and a damaged report are one-line input errors.
  const Result again = run("report " + dir + "/b.json --html " + dir + "/again.html");
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(run("report " + dir + "/b.json").out, slurp(dir + "/b.md"));
  EXPECT_EQ(slurp(dir + "/again.html"), html);
  expect_input_error(run("report " + dir + "/b.json --junit " + dir + "/j.xml"), "is a bench report, which has no test cases", "junit");
  std::string damaged = json;
  damaged.replace(damaged.find("\"median\""), 8, "\"medi4n\"");
  { std::FILE* f = std::fopen((dir + "/damaged.json").c_str(), "w"); std::fputs(damaged.c_str(), f); std::fclose(f); }
  expect_input_error(run("report " + dir + "/damaged.json"), "/damaged.json: rows[0]: ", "damaged");
  // Attention, causal.
  const Result attn = run("bench --kernel cpu.attn_naive --attention 1x2x8x8x16 --causal --dtype fp16 --reps 2");
  EXPECT_EQ(attn.code, 0) << attn.err;
  EXPECT_NE(attn.out.find("| cpu.attn_naive | B1 H2 Sq8 Skv8 D16 causal fp16 |"), std::string::npos) << attn.out;
  // The split-KV combine, checked; its planted no-max-shift bug fails where exp(LSE) overflows.
  const Result combine = run("bench --kernel cpu.attn_combine --combine 2x3x1x64x16 --lse-base 2 --dtype fp32 --reps 2");
  EXPECT_EQ(combine.code, 0) << combine.err;
  EXPECT_NE(combine.out.find("| cpu.attn_combine | B2 H3 Sq1 D64 splits 16 LSE base 2 fp32 |"), std::string::npos) << combine.out;
  // A planted bug fails its check: exit 1, the row says so.
  const Result bug = run("bench --kernel cpu.attn_online:block=4,rescale=off --attention 1x1x16x64x16 --dtype fp32 --reps 2 "
                         "--seed 3");
  EXPECT_EQ(bug.code, 1) << bug.out << bug.err;
  EXPECT_NE(bug.out.find("**FAIL**"), std::string::npos) << bug.out;
  // Bad input: one line, exit 2.
  for (const auto& [args, message] :
       std::vector<std::pair<std::string, std::string>>{{"bench --kernel nope --gemm 8x8x8", "unknown kernel 'nope' (see ulpgate list)"},
                                                        {"bench --kernel cpu.fp32_seq --gemm 8x8", "--gemm '8x8': expected MxNxK"},
                                                        {"bench --kernel cpu.fp32_seq --gemm 8x0x8", "--gemm '8x0x8': expected MxNxK (positive integers)"},
                                                        {"bench --kernel cpu.fp32_seq", "bench: give --gemm MxNxK, --shapes square|llm, --attention BxHxSqxSkvxD or --combine BxHxSqxDxSPLITS"},
                                                        {"bench --kernel cpu.attn_combine --combine 1x2x1x64", "--combine '1x2x1x64': expected BxHxSqxDxSPLITS"},
                                                        {"bench --kernel cpu.attn_combine --combine 1x2x1x64x4 --lse-base 10", "--lse-base '10': e or 2"},
                                                        {"bench --kernel cpu.attn_combine --combine 1x2x1x64x4 --gemm 8x8x8", "bench: one kind of shape per run (GEMM, attention or combine)"}}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err, "ulpgate: error: " + message + "\n") << args;
  }
}

// A job array: `fuzz --shard i/N` per task, `merge` of the shards' records gives the
// unsharded campaign's cases; a shard missing, or a bad --shard, is a one-line input error.
TEST(Cli, ShardedCampaignMergesToTheWholeOne) {
  const std::string dir = testing::TempDir() + "ulpgate_cli_shards_" + std::to_string(getpid());
  const std::string common = " --kernel cpu.fp32_seq --kernel cpu.fp32_pairwise --kernel cpu.attn_naive --dtype fp16"
                             " --cases 3 --max-k 64 --in-process --no-html --time 0 --out ";
  const Result whole = run("fuzz" + common + dir + "/whole");
  ASSERT_EQ(whole.code, 0) << whole.out << whole.err;
  std::string shards;
  for (int i = 0; i < 2; ++i) {
    const Result s = run("fuzz --shard " + std::to_string(i) + "/2" + common + dir + "/s" + std::to_string(i));
    ASSERT_EQ(s.code, 0) << s.out << s.err;
    EXPECT_NE(s.out.find("shard " + std::to_string(i) + " of 2"), std::string::npos) << s.out;
    shards += " " + dir + "/s" + std::to_string(i) + "/fuzz.json";
  }
  const Result m = run("merge" + shards + " --no-html --out " + dir + "/merged");
  ASSERT_EQ(m.code, 0) << m.out << m.err;
  EXPECT_NE(m.out.find("9 cases, 0 failed"), std::string::npos) << m.out;
  const auto cases_of = [](const std::string& path) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    for (auto& c : j["cases"]) c.erase("seconds");
    return j["cases"];
  };
  EXPECT_EQ(cases_of(dir + "/merged/fuzz.json"), cases_of(dir + "/whole/fuzz.json"));
  const Result missing = run("merge " + dir + "/s1/fuzz.json --no-html --out " + dir + "/m2");
  EXPECT_EQ(missing.code, 2);
  EXPECT_EQ(lines(missing.err), 1) << missing.err;
  EXPECT_NE(missing.err.find("shard 0/2 missing"), std::string::npos) << missing.err;
  const Result bad = run("fuzz --shard 2/2" + common + dir + "/bad");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(lines(bad.err), 1) << bad.err;
  EXPECT_NE(bad.err.find("--shard '2/2'"), std::string::npos) << bad.err;
}

// mpirun -n 3 ulpgate fuzz: the ranks claim runs of 16 cases as they become free
// and exchange their results; the record is the single-process run's (cases, order, shrunk
// cases, not-run list), with the corpus filled by the first run replayed in the second.
// 40 cases per target: three units each, failures with one signature in all three (only
// the first is shrunk, as in one process). Skipped when built without MPI.
#ifdef ULPGATE_MPIEXEC
namespace {
const std::string kMpirun = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 ") +
                            ULPGATE_MPIEXEC + " --oversubscribe -n 3";
// A record's cases and not-run list without timings, the output directory named OUT.
nlohmann::json comparable_record(const std::string& out) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(out + "/fuzz.json"));
  for (auto& c : j["cases"]) c.erase("seconds");
  std::string text = nlohmann::json{{"cases", j["cases"]}, {"not_run", j["not_run"]}, {"campaign", j["campaign"]}}.dump();
  for (std::size_t at; (at = text.find(out)) != std::string::npos;) text.replace(at, out.size(), "OUT");
  return nlohmann::json::parse(text);
}
}  // namespace
#endif

TEST(Cli, MpiRanksRunTheSingleProcessCampaign) {
#ifndef ULPGATE_MPIEXEC
  GTEST_SKIP() << "built without MPI (ULPGATE_MPI off)";
#else
  const std::string dir = tmp_dir("mpi");
  // Four targets of three units each over three ranks; planted.error_above_k8 fails every
  // case with K > 8: failures, shrinking and the corpus take part.
  const std::string common = std::string(" --plugin ") + PLANTED_PLUGIN +
                             " fuzz --kernel cpu.fp32_seq --kernel planted.error_above_k8 --kernel cpu.attn_naive"
                             " --kernel cpu.fp32_pairwise --dtype fp32 --cases 40 --sizes small --max-k 64 --jobs 1"
                             " --seed 11 --no-html --time 0 --out ";
  for (int round = 0; round < 2; ++round) {  // the second replays the corpus the first filled
    SCOPED_TRACE(round);
    const Result whole = run(common + dir + "/whole");
    ASSERT_EQ(whole.code, 1) << whole.out << whole.err;
    const Result ranks = run(common + dir + "/ranks", kMpirun);
    ASSERT_EQ(ranks.code, 1) << ranks.out << ranks.err;
    for (int r = 0; r < 3; ++r)
      EXPECT_NE(ranks.out.find(fmt::format("MPI rank {} of 3: runs of 16 cases claimed as it goes", r)), std::string::npos)
          << ranks.out;
    EXPECT_NE(ranks.out.find("3 MPI ranks, work shared as they went"), std::string::npos) << ranks.out;
    const nlohmann::json a = comparable_record(dir + "/whole"), b = comparable_record(dir + "/ranks");
    EXPECT_EQ(a, b);
    EXPECT_GT(a["cases"].size(), 160u);  // the generated cases and a shrunk one (round 1: corpus replays too)
    const std::string text = a.dump();
    std::size_t shrunk = 0;
    for (std::size_t at = 0; (at = text.find("\"origin\":\"shrunk\"", at)) != std::string::npos; ++at) ++shrunk;
    EXPECT_GE(shrunk, 1u);
    if (round == 1)
      EXPECT_NE(a.dump().find("\"origin\":\"corpus\""), std::string::npos) << "no corpus case replayed";
    EXPECT_TRUE(std::filesystem::exists(dir + "/ranks/journal-rank-2.jsonl"));
    if (round == 0) {
      // A corpus case of a kernel outside this campaign: neither run replays it.
      for (const char* run_dir : {"/whole", "/ranks"}) {
        const std::string corpus = dir + run_dir + "/corpus";
        const std::string first = std::filesystem::directory_iterator(corpus)->path().string();
        nlohmann::json c = nlohmann::json::parse(std::ifstream(first));
        c["kernel"] = "cpu.blockfma:block=4,frac=23,round=rz";
        std::ofstream(corpus + "/zz_other_kernel.json") << c.dump();
      }
    }
  }
#endif
}

// A rank whose campaign fails (here: its journal is locked by another process) reports its
// error and claims no work: the other ranks run every case, rank 0 writes the whole record,
// and every rank exits 3. Each rank gets the (node-local rank mod count)-th CUDA device.
TEST(Cli, MpiRankThatFailsIsReported) {
#ifndef ULPGATE_MPIEXEC
  GTEST_SKIP() << "built without MPI (ULPGATE_MPI off)";
#else
  const std::string dir = tmp_dir("mpi_fail");
  std::filesystem::create_directories(dir);
  const int fd = ::open((dir + "/journal-rank-1.jsonl").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const Result r = run("fuzz --kernel cpu.fp32_seq --kernel cpu.fp32_pairwise --kernel cpu.attn_naive --dtype fp16"
                       " --cases 2 --sizes small --max-k 32 --in-process --seed 5 --no-html --time 0 --out " + dir,
                       "CUDA_VISIBLE_DEVICES=5,7 " + kMpirun);
  ::close(fd);
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("1 of 3 MPI ranks failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in use by another ulpgate process"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("rank 1 of 3: runs of 16 cases claimed as it goes, CUDA_VISIBLE_DEVICES=7"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 2 of 3: runs of 16 cases claimed as it goes, CUDA_VISIBLE_DEVICES=5"), std::string::npos) << r.out;
  const ulpgate::RunRecord rec = ulpgate::read_record_file(dir + "/fuzz.json");
  EXPECT_TRUE(rec.not_run.empty());
  EXPECT_EQ(rec.cases.size(), 6u);  // ranks 0 and 2 ran rank 1's share too
  // Under mpirun the ranks are the shards: --shard is bad input, reported once (rank 0).
  const Result shard = run("fuzz --shard 0/2 --kernel cpu.fp32_seq --dtype fp16 --cases 1 --in-process --no-html --out " + dir +
                           "/shard", kMpirun);
  EXPECT_EQ(shard.code, 2) << shard.out << shard.err;
  EXPECT_NE(shard.err.find("ulpgate: error: --shard 0/2: under mpirun the 3 ranks share the campaign themselves"), std::string::npos)
      << shard.err;
  EXPECT_EQ(shard.err.find("ulpgate: error"), shard.err.rfind("ulpgate: error")) << shard.err;
#endif
}

// An interrupted campaign resumes with any number of ranks: a rank finds a case in whichever
// rank's journal holds it, so the resumed run evaluates nothing again and its record is the
// first run's.
TEST(Cli, MpiResumeReusesEveryRanksJournal) {
#ifndef ULPGATE_MPIEXEC
  GTEST_SKIP() << "built without MPI (ULPGATE_MPI off)";
#else
  const std::string dir = tmp_dir("mpi_resume");
  const std::string common = " fuzz --kernel cpu.fp32_seq --kernel cpu.fp32_pairwise --dtype fp16 --cases 40 --sizes small"
                             " --max-k 32 --in-process --seed 9 --no-html --time 0 --out " + dir;
  const Result first = run(common, kMpirun);
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  const nlohmann::json a = comparable_record(dir);
  // Interrupted before the record was written: no "finished" line, no record.
  std::size_t journaled = 0;
  for (int r = 0; r < 3; ++r) {
    const std::string path = dir + fmt::format("/journal-rank-{}.jsonl", r);
    std::string text = slurp(path), kept;
    for (std::size_t at = 0, next; at < text.size(); at = next + 1) {
      next = text.find('\n', at);
      const std::string line = text.substr(at, next - at);
      if (line.find("\"finished\"") == std::string::npos) kept += line + "\n";
      journaled += line.find("\"result\"") != std::string::npos;
    }
    std::ofstream(path, std::ios::trunc) << kept;
  }
  EXPECT_EQ(journaled, 80u);
  std::filesystem::remove(dir + "/fuzz.json");
  std::string two = kMpirun;
  two.replace(two.rfind("-n 3"), 4, "-n 2");
  const Result again = run(common + " --resume", two);
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("resuming:"), std::string::npos) << again.out;
  EXPECT_EQ(comparable_record(dir), a);
  std::size_t after = 0;  // nothing evaluated again: no new entry in any journal
  for (int r = 0; r < 3; ++r) {
    const std::string text = slurp(dir + fmt::format("/journal-rank-{}.jsonl", r));
    for (std::size_t at = 0; (at = text.find("\"result\"", at)) != std::string::npos; ++at) ++after;
  }
  EXPECT_EQ(after, 80u);
#endif
}

// A rank killed mid-run (SIGKILL: no MPI can go on without it) takes the job down, but
// nothing finished is lost: every rank journaled its cases as it went, and `--resume` (here
// on 2 ranks) reruns only the cases no journal holds; the record is the single process's.
TEST(Cli, MpiRankKilledMidRunIsResumed) {
#ifndef ULPGATE_MPIEXEC
  GTEST_SKIP() << "built without MPI (ULPGATE_MPI off)";
#else
  const std::string dir = tmp_dir("mpi_killed");
  std::filesystem::create_directories(dir);
  const std::string common = " fuzz --kernel cpu.fp32_seq --kernel cpu.fp32_pairwise --kernel cpu.attn_naive --dtype fp32"
                             " --cases 64 --sizes small --max-k 64 --in-process --seed 21 --no-html --time 0 --out ";
  const Result whole = run(common + dir + "/whole");
  ASSERT_EQ(whole.code, 0) << whole.out << whole.err;
  std::system(("(" + kMpirun + " " + ULPGATE_BIN + common + dir + "/ranks > " + dir + "/first.log 2>&1; echo $? > " + dir +
               "/first.rc) &").c_str());
  // Once rank 1 has journaled a few cases, kill it.
  const auto journaled = [&](int rank) {  // complete entries
    const std::string text = slurp(dir + fmt::format("/ranks/journal-rank-{}.jsonl", rank));
    int n = 0;
    for (std::size_t at = 0; (at = text.find("\"result\"", at)) != std::string::npos; ++at) n += text.find('\n', at) != std::string::npos;
    return n;
  };
  int killed = 0;
  for (int wait = 0; wait < 600 && !killed && !std::filesystem::exists(dir + "/first.rc"); ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (journaled(1) < 5) continue;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string env = slurp(e.path().string() + "/environ"), cmd = slurp(e.path().string() + "/cmdline");
      if (env.find(std::string("OMPI_COMM_WORLD_RANK=1") + '\0') != std::string::npos && cmd.find(dir + "/ranks") != std::string::npos &&
          cmd.rfind(ULPGATE_BIN, 0) == 0)
        killed += ::kill(std::stoi(e.path().filename().string()), SIGKILL) == 0;
    }
  }
  ASSERT_EQ(killed, 1) << "rank 1 was not found running (the campaign ended too soon?)";
  for (int wait = 0; wait < 600 && !std::filesystem::exists(dir + "/first.rc"); ++wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_NE(slurp(dir + "/first.rc"), "0\n") << slurp(dir + "/first.log");
  EXPECT_FALSE(std::filesystem::exists(dir + "/ranks/fuzz.json"));
  const int before = journaled(0) + journaled(1) + journaled(2);
  EXPECT_GT(before, 5);
  EXPECT_LT(before, 192);
  std::string two = kMpirun;
  two.replace(two.rfind("-n 3"), 4, "-n 2");
  const Result again = run(common + dir + "/ranks --resume", two);
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  const nlohmann::json a = comparable_record(dir + "/whole");
  EXPECT_EQ(a["cases"].size(), 192u);
  EXPECT_EQ(a, comparable_record(dir + "/ranks"));
  EXPECT_EQ(journaled(0) + journaled(1) + journaled(2), 192) << "a case evaluated twice, or lost";
#endif
}

// mpirun -n 3 ulpgate probe: the ranks probe the units as they become free; rank 0 prints
// them in the order given and writes the JSON, the single process's output; the exit code
// is the worst unit's (1: a unit outside the block-FMA model).
TEST(Cli, MpiProbeSharesItsUnits) {
#ifndef ULPGATE_MPIEXEC
  GTEST_SKIP() << "built without MPI (ULPGATE_MPI off)";
#else
  const std::string dir = tmp_dir("mpi_probe");
  std::filesystem::create_directories(dir);
  const std::string args = " probe --kernel cpu.fp32_seq --kernel cpu.blockfma:block=16,frac=25,round=rz"
                           " --kernel cpu.fp32_pairwise --kernel cpu.blockfma:block=4,frac=30,round=rne --json ";
  const Result one = run(args + dir + "/one.json");
  const Result three = run(args + dir + "/three.json", kMpirun);
  EXPECT_EQ(one.code, 1) << one.out << one.err;  // cpu.fp32_pairwise is no block-FMA unit
  EXPECT_EQ(three.code, 1) << three.out << three.err;
  EXPECT_EQ(one.out, three.out);
  EXPECT_EQ(lines(three.out), 4u) << three.out;
  EXPECT_EQ(slurp(dir + "/one.json"), slurp(dir + "/three.json"));
#endif
}

// mpirun -n 3 ulpgate sweep: the ranks check the (series, point) units as they become free;
// rank 0 fits and reports, and the record is the single process's. A build without MPI
// refuses to run as one of several ranks (one line).
TEST(Cli, MpiSweepSharesItsPoints) {
#ifndef ULPGATE_MPIEXEC
  const Result r = run("sweep --kernel cpu.fp32_seq --vary K=16:32 --mn 4", "OMPI_COMM_WORLD_SIZE=2");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("one of 2 MPI ranks"), std::string::npos) << r.err;
#else
  const std::string dir = tmp_dir("mpi_sweep");
  const std::string args = " sweep --kernel cpu.fp32_seq --kernel cpu.fp32_pairwise --vary K=16:1024 --mn 8 --in-process --out ";
  const Result one = run(args + dir + "/one");
  ASSERT_EQ(one.code, 0) << one.out << one.err;
  const Result three = run(args + dir + "/three", kMpirun);
  ASSERT_EQ(three.code, 0) << three.out << three.err;
  EXPECT_NE(three.out.find("ulpgate sweep: 3 MPI ranks, 14 points shared as they went"), std::string::npos) << three.out;
  const auto points = [](const std::string& path) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    for (auto& c : j["cases"]) c.erase("seconds");
    return nlohmann::json{{"cases", j["cases"]}, {"sweeps", j["sweeps"]}};
  };
  EXPECT_EQ(points(dir + "/one/sweep.json"), points(dir + "/three/sweep.json"));
#endif
}

// Bring your own outputs: export a case's inputs, compute its output elsewhere (here a CPU
// model run on nothing but the exported files), check it; one element planted far off fails
// (exit 1), a file of the wrong size or name is bad input (exit 2, one line).
TEST(Cli, ExportThenCheckOutputsComputedElsewhere) {
  using namespace ulpgate;
  const std::string dir = tmp_dir("npy");
  std::system(("mkdir -p " + dir).c_str());
  Case g;
  g.op = Op::Gemm;
  g.gemm = {13, 7, 40, 2, Layout::ColMajor, true, false, 48, 0, 16, 16};
  g.types = {{"A", Format::BF16}, {"B", Format::BF16}, {"C", Format::BF16}, {"D", Format::BF16}, {"bias", Format::FP32},
             {"compute", Format::FP32}};
  g.beta = 0.5, g.epilogue = Epilogue::Bias, g.seed = 3;
  Case a;
  a.op = Op::Attention;
  a.attention.batch = 2, a.attention.heads = 2, a.attention.seq_q = 5, a.attention.seq_kv = 19, a.attention.head_dim = 16;
  a.attention.layout = AttentionLayout::BSHD, a.attention.causal = true;
  a.types = {{"Q", Format::FP16}, {"K", Format::FP16}, {"V", Format::FP16}, {"O", Format::FP16}, {"compute", Format::FP32}};
  a.seed = 4;
  Registry registry = builtin_registry();
  for (const auto& [c, kernel] : {std::pair{g, "cpu.fp32_seq"}, std::pair{a, "cpu.attn_naive"}}) {
    SCOPED_TRACE(kernel);
    const std::string ex = dir + "/" + std::string(name(c.op)), case_path = ex + ".json";
    write_case_file(case_path, c);
    const Result e = run("export " + case_path + " --dir " + ex);
    ASSERT_EQ(e.code, 0) << e.out << e.err;
    expect_input_error(run("export " + case_path + " --dir " + ex), "holds an export already", "export again");
    ASSERT_EQ(run("export " + case_path + " --dir " + ex + " --force").code, 0);

    // The kernel's side: the manifest and the .npy files only.
    const nlohmann::json m = read_json_file(ex + "/manifest.json");
    const Case exported = case_from_json(m.at("case"));
    std::map<std::string, Tensor> inputs;
    for (const auto& [op, d] : m.at("inputs").items())
      inputs[op] = read_npy_file(ex + "/" + d.at("file").get<std::string>(), *parse_format(d.at("format").get<std::string>()),
                                 d.at("elements").get<std::int64_t>());
    EXPECT_EQ(inputs.size(), c.inputs().size());
    ASSERT_EQ(m.at("outputs").size(), 1u);
    const std::string out = m.at("outputs").begin().key();
    RunOutcome computed = run_kernel(*registry.find(kernel), exported, inputs);
    ASSERT_EQ(computed.status, Disposition::Ok) << computed.message;
    Tensor& t = computed.outputs.at(out);
    EXPECT_EQ(static_cast<std::int64_t>(t.size()), m.at("outputs").at(out).at("elements").get<std::int64_t>());
    const std::string file = ex + "/" + out + ".npy";
    write_npy_file(file, t);

    const Result ok = run("check " + case_path + " --outputs " + file + " --out " + ex + "/check.json");
    EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
    EXPECT_NE(ok.out.find("external:" + file + " on "), std::string::npos) << ok.out;
    EXPECT_NE(ok.out.find("verdict pass"), std::string::npos) << ok.out;
    const RunRecord rec = read_record_file(ex + "/check.json");
    EXPECT_EQ(rec.kind, "check");
    ASSERT_EQ(rec.cases.size(), 1u);
    EXPECT_EQ(rec.cases[0].kernel, "external:" + file);
    EXPECT_EQ(rec.cases[0].reproducer, "ulpgate check " + case_path + " --outputs " + out + "=" + file);
    // --p-bits: an attention kernel that rounds P (here a correct FP32 one, which passes too).
    if (c.op == Op::Gemm) {
      expect_input_error(run("check " + case_path + " --outputs " + file + " --p-bits 8"),
                         "--p-bits: attention cases only (the precision P is rounded to before P V)", "--p-bits on a GEMM");
    } else {
      const Result p = run("check " + case_path + " --outputs " + file + " --p-bits 11 --out " + ex + "/check_p.json");
      EXPECT_EQ(p.code, 0) << p.out << p.err;
      EXPECT_EQ(read_record_file(ex + "/check_p.json").cases.at(0).reproducer,
                "ulpgate check " + case_path + " --outputs " + out + "=" + file + " --p-bits 11");
      expect_input_error(run("check " + case_path + " --outputs " + file + " --p-bits 30"),
                         "--p-bits 30: must be 0 (undeclared) or 2 to 24 bits", "--p-bits out of range");
    }

    const std::int64_t e5 = c.op == Op::Gemm ? gemm_view(c, "D").offset(1, 3, 2) : attention_view(c, "O").offset(1, 1, 2, 3);
    t.set_value(static_cast<std::size_t>(e5), t.value(static_cast<std::size_t>(e5)) + 1000);
    write_npy_file(ex + "/planted.npy", t);
    const Result bad = run("check " + case_path + " --outputs " + out + "=" + ex + "/planted.npy");
    EXPECT_EQ(bad.code, 1) << bad.out << bad.err;
    EXPECT_NE(bad.out.find("verdict FAIL"), std::string::npos) << bad.out;

    write_npy_file(ex + "/short.npy", Tensor(t.format(), t.size() - 1));
    expect_input_error(run("check " + case_path + " --outputs " + out + "=" + ex + "/short.npy"),
                       fmt::format("short.npy: shape ({},) holds {} elements, expected {}", t.size() - 1, t.size() - 1, t.size()),
                       "an output one element short");
    expect_input_error(run("check " + case_path + " --outputs " + ex + "/short.npy"), "'short' is not an output of this",
                       "a file not named by its output");
    write_npy_file(ex + "/fp64.npy", Tensor(Format::FP64, t.size()));
    expect_input_error(run("check " + case_path + " --outputs " + out + "=" + ex + "/fp64.npy"),
                       fmt::format("fp64.npy: dtype '<f8' is not {}'s '{}'", name(t.format()), npy_dtype(t.format())),
                       "an output of another dtype");
  }
}

// A plugin kernel of FP16 A, B and D only (no FP32 output) is a target of an FP16 campaign
// next to another kernel: the planning asks it about every output format the op allows for
// FP16 inputs, and the cases drawn for it keep the output it takes.
TEST(Cli, FuzzTargetsAKernelThatWritesOnlyFp16) {
  const std::string dir = tmp_dir("half_out");
  std::filesystem::remove_all(dir);
  const Result r = run(std::string("--plugin ") + HALF_GEMM_PLUGIN + " fuzz --kernel test.hgemm_fp16_out --kernel cpu.fp32_seq "
                       "--dtype fp16 --cases 4 --max-k 32 --no-html --time 0 --out " + dir);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(", 2 targets (kernel x dtype)"), std::string::npos) << r.out;
  int half = 0;
  for (const auto& c : ulpgate::read_record_file(dir + "/fuzz.json").cases) {
    if (c.kernel != "test.hgemm_fp16_out") continue;
    ++half;
    EXPECT_EQ(c.status, ulpgate::Disposition::Ok) << c.message;
    EXPECT_TRUE(c.verdict.passed) << c.family;
    EXPECT_EQ(c.spec.types.at("D"), ulpgate::Format::FP16) << c.family;
  }
  EXPECT_EQ(half, 4);
}

// A kernel named with --kernel that gets no target is bad input naming it and the basic
// cases it refused, not a campaign of the other kernels (exit 0).
TEST(Cli, FuzzRefusesANamedKernelWithoutATarget) {
  const std::string dir = tmp_dir("no_target");
  std::filesystem::remove_all(dir);
  const Result r = run(std::string("--plugin ") + HALF_GEMM_PLUGIN + " fuzz --kernel test.hgemm_fp16_out --kernel cpu.fp32_seq "
                       "--dtype fp32 --cases 2 --max-k 32 --no-html --time 0 --out " + dir);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("ulpgate: error: --kernel 'test.hgemm_fp16_out': no target", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("FP16 A, B, C and D, FP32 compute, no epilogue (fp32 gemm to fp32, bf16, fp16)"), std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/fuzz.json"));
}

// bench and probe run kernels in this process: a kernel that returns an error fails the
// bench (exit 1), and a kernel that crashes is named on one line (exit 1), not a death by
// signal.
TEST(Cli, BenchAndProbeNameAFailingOrCrashingKernel) {
  const std::string plugin = std::string("--plugin ") + PLANTED_PLUGIN;
  const Result error = run(plugin + " bench --kernel planted.error_above_k8 --gemm 16x16x16 --reps 1 --warmup 0");
  EXPECT_EQ(error.code, 1) << error.out << error.err;
  EXPECT_NE(error.out.find("failed: plugin kernel planted.error_above_k8 returned 5"), std::string::npos) << error.out;
  for (const std::string& verb : {plugin + " bench --gemm 16x16x16 --reps 1 --warmup 0 --kernel ", plugin + " probe --kernel "})
    for (const auto& [kernel, signal] : {std::pair<std::string, std::string>{"planted.segfault", "SIGSEGV"},
                                         {"planted.abort", "SIGABRT"}}) {
      const Result r = run(verb + kernel);
      EXPECT_EQ(r.code, 1) << verb << kernel << "\n" << r.out << r.err;
      EXPECT_EQ(lines(r.err.substr(r.err.find("ulpgate: error:") == std::string::npos ? 0 : r.err.find("ulpgate: error:"))), 1)
          << r.err;
      EXPECT_NE(r.err.find("ulpgate: error: kernel '" + kernel + "' crashed (" + signal), std::string::npos)
          << verb << kernel << "\n" << r.err;
    }
}

// A per-case timeout below a second is no timeout a worker can keep: bad usage, one line.
TEST(CliBadInput, TimeoutBelowASecondIsRefused) {
  const std::string dir = tmp_dir("tiny_timeout");
  const Result r = run(kSmallCampaign + " --cases 1 --timeout 1e-6 --out " + dir);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--timeout 1e-06: must be a finite number of seconds >= 1"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/fuzz.json"));
}

// report checks every output path before writing any: no .md and .xml left behind by an
// --html it cannot write.
TEST(CliBadInput, ReportWritesNothingWhenAnOutputCannotBeWritten) {
  const std::string dir = tmp_dir("report_paths");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(run(kSmallCampaign + " --cases 1 --out " + dir + "/run").code, 0);
  const Result r = run("report " + dir + "/run/fuzz.json --md " + dir + "/r.md --junit " + dir +
                       "/r.xml --html /nonexistent/dir/r.html");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--html /nonexistent/dir/r.html: no directory /nonexistent/dir"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/r.md"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/r.xml"));
}

// A sweep whose --vary does not fit its kernel's op is bad input before anything is
// written; a sweep whose every point crashed has no precision estimate (not "inf bits").
TEST(CliBadInput, SweepOfTheWrongOpWritesNothing) {
  const std::string dir = tmp_dir("sweep_mismatch");
  std::filesystem::remove_all(dir);
  for (const std::string& args : {std::string("--kernel cpu.attn_naive --vary K=16:32 --mn 4"),
                                  std::string("--kernel cpu.fp32_seq --vary seq_kv=16:32"),
                                  std::string("--kernel cpu.fp32_seq --kernel cpu.attn_naive --vary K=16:32 --mn 4")}) {
    const Result r = run("sweep " + args + " --out " + dir);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << "\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir + "/sweep.json")) << args;
  }
  const Result crash = run(std::string("sweep --plugin ") + PLANTED_PLUGIN +
                           " --kernel planted.segfault --vary K=16:32 --mn 4 --timeout 5");
  EXPECT_EQ(crash.code, 1) << crash.out << crash.err;
  EXPECT_EQ(crash.out.find("inf bits"), std::string::npos) << crash.out;
  EXPECT_NE(crash.out.find("effective accumulator precision: no estimate (no point gave a result)"), std::string::npos)
      << crash.out;
}

// The summary counts the campaign's cases: a shrunk minimal case is the minimal form of a
// failure, not one more case.
TEST(Cli, FuzzSummaryCountsCampaignCasesNotShrunkOnes) {
  const std::string dir = tmp_dir("shrunk_counts");
  std::filesystem::remove_all(dir);
  const Result r = run(std::string("--plugin ") + PLANTED_PLUGIN + " fuzz --kernel planted.segfault --dtype fp32 --cases 4 "
                       "--max-k 32 --no-html --time 0 --timeout 5 --out " + dir);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const ulpgate::RunRecord rec = ulpgate::read_record_file(dir + "/fuzz.json");
  std::size_t shrunk = 0, failed = 0;
  for (const auto& c : rec.cases) shrunk += c.origin == "shrunk", failed += c.origin != "shrunk" && !c.verdict.passed;
  ASSERT_GT(shrunk, 0u) << "nothing shrunk: the test shows nothing";
  EXPECT_EQ(failed, 4u);
  EXPECT_NE(r.out.find("\n4 cases, 4 failed"), std::string::npos) << r.out;
  EXPECT_NE(slurp(dir + "/report.md").find("4 of 4 cases failed"), std::string::npos);
  EXPECT_NE(slurp(dir + "/report.md").find("- shape: "), std::string::npos);
}

// Soft cap, ALiBi, sinks and pages on the command line: a benchmark of a CPU model with the
// first three is checked and passes, its case named with them, and so do a paged benchmark and
// a paged sweep; each malformed value is one line, exit 2.
TEST(CliBadInput, ServedVariantFlags) {
  const std::string dir = tmp_dir("served_variants");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string bench = "bench --kernel cpu.attn_naive --attention 1x12x16x64x32 --reps 1 --warmup 0 ";
  const Result ok = run(bench + "--softcap 30 --alibi flash --sinks 20,-inf,0,1,2,3,4,5,6,7,8,100 --md " + dir + "/b.md");
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  const std::string md = slurp(dir + "/b.md");
  EXPECT_NE(md.find("softcap(30) alibi(flash) sinks"), std::string::npos) << md;
  EXPECT_NE(md.find("| pass |"), std::string::npos) << md;
  expect_input_error(run(bench + "--softcap -1"), "--softcap '-1': one positive finite cap", "negative cap");
  expect_input_error(run(bench + "--softcap abc"), "--softcap 'abc': 'abc' is not a number", "cap text");
  expect_input_error(run(bench + "--alibi alibi"), "--alibi 'alibi': the form is flash or flashinfer", "form");
  expect_input_error(run(bench + "--alibi flashinfer:1,2"), "one value or one per query head (12), got 2", "slopes");
  expect_input_error(run(bench + "--sinks inf"), "--sinks 'inf': a sink is finite or -inf (none)", "sink inf");
  expect_input_error(run("bench --kernel cpu.attn_naive --gemm 16x16x16 --softcap 3"),
                     "--window, --softcap, --alibi, --sinks and --page-size apply to attention shapes", "gemm");
  expect_input_error(run("sweep --kernel cpu.fp32_seq --vary K=16:64 --out " + dir + "/s --alibi flash"),
                     "--window, --softcap, --alibi, --sinks and --page-size apply to attention sweeps", "gemm sweep");
  expect_input_error(run("bench --backward --kernel cpu.attn_bwd_naive --attention 1x2x16x64x32 --sinks 1"),
                     "forward-only for now", "backward");
  // paged K/V: pages of 100 keys (the last one partial), checked and passing; bad sizes exit 2
  const Result paged = run(bench + "--page-size 100 --md " + dir + "/p.md");
  EXPECT_EQ(paged.code, 0) << paged.out << paged.err;
  EXPECT_NE(slurp(dir + "/p.md").find("paged(2x100)"), std::string::npos) << slurp(dir + "/p.md");
  const Result swept = run("sweep --kernel cpu.attn_online --dtype fp16 --vary seq_kv=16:256:4 --page-size 7 --out " + dir + "/ps");
  EXPECT_EQ(swept.code, 0) << swept.out << swept.err;
  expect_input_error(run(bench + "--page-size 0"), "--page-size '0': a page size of at least 1 key", "page size 0");
  expect_input_error(run(bench + "--page-size 16k"), "--page-size '16k': a page size of at least 1 key", "page size text");
  expect_input_error(run("bench --backward --kernel cpu.attn_bwd_naive --attention 1x2x16x64x32 --page-size 16"),
                     "paged K/V is forward-only", "paged backward");
  // an FP8 K/V cache: a benchmark and a sweep of a CPU model pass; bad specs exit 2
  const Result fp8 = run(bench + "--kv-cache e4m3:0.5 --md " + dir + "/k.md");
  EXPECT_EQ(fp8.code, 0) << fp8.out << fp8.err;
  EXPECT_NE(slurp(dir + "/k.md").find("| pass |"), std::string::npos) << slurp(dir + "/k.md");
  const Result fp8_sweep = run("sweep --kernel cpu.attn_online --dtype bf16 --vary seq_kv=16:256:4 --kv-cache e5m2 --out " + dir + "/ks");
  EXPECT_EQ(fp8_sweep.code, 0) << fp8_sweep.out << fp8_sweep.err;
  expect_input_error(run(bench + "--kv-cache fp16"), "--kv-cache 'fp16': 'fp16' is not an FP8 format", "kv format");
  expect_input_error(run(bench + "--kv-cache e4m3:2"), "--kv-cache 'e4m3:2': '2' is not a fraction in (0, 1]", "kv frac");
  const Result per_head = run(bench + "--kv-cache e4m3:1:head --md " + dir + "/kh.md");
  EXPECT_EQ(per_head.code, 0) << per_head.out << per_head.err;
  EXPECT_NE(slurp(dir + "/kh.md").find("| pass |"), std::string::npos) << slurp(dir + "/kh.md");
  expect_input_error(run(bench + "--kv-cache e4m3:1:heads"), "--kv-cache 'e4m3:1:heads': 'heads' is not 'head'", "kv head");
  expect_input_error(run(bench + "--kv-cache e4m3:1:head:x"), "--kv-cache 'e4m3:1:head:x': too many ':' parts", "kv parts");
  expect_input_error(run("bench --backward --kernel cpu.attn_bwd_naive --attention 1x2x16x64x32 --kv-cache e4m3"),
                     "an FP8 K/V cache is for the attention forward", "kv backward");
}
