// The CLI contract: exit codes and one-line errors.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>
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
