// The CLI contract: exit codes and one-line errors.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

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
// recorded, and the command goes on (planted kernels: tests/harness/planted).
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
// with another seed or case count compared nothing and passed before (issue 13).
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

// ---- Issue 14: bad input is exit 2 with one line, never a crash or an internal error ----

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
