// The campaign journal: round trip, resume after a truncated write, damaged lines, and a
// campaign process killed with SIGKILL mid-way that resumes to the uninterrupted result.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "campaign/journal.hpp"
#include "isolate_test_util.hpp"
#include "kernels/builtin.hpp"

extern char** environ;

namespace ulpgate {
namespace {

using json = nlohmann::json;
using test::timeless;
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::path(testing::TempDir()) / ("ulpgate_journal_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

const json kCampaign = {{"test", "journal"}, {"seed", 42}};

// The campaign the in-process tests run: CPU models on a few seeds, one case twice.
struct CampaignCase {
  std::string kernel;
  Case c;
};
std::vector<CampaignCase> small_campaign() {
  const char* kernels[] = {"cpu.fp32_seq", "cpu.fp32_pairwise", "cpu.blockfma:block=8,frac=13,round=rz"};
  std::vector<CampaignCase> out;
  for (int i = 0; i < 8; ++i) {
    Case c = dtype_gemm_case(i % 2 ? "fp32" : "bf16", 8, 8, 16 + 16 * i);
    c.seed = 1000 + static_cast<std::uint64_t>(i);
    out.push_back({kernels[i % 3], c});
  }
  out.push_back(out[2]);  // the same evaluation again: the journal must keep both
  return out;
}

// Runs the campaign through the journal, stopping after `stop_after` cases (a simulated
// kill); returns how many evaluations it did (not taken from the journal).
int run_campaign(Journal& journal, std::size_t stop_after = SIZE_MAX) {
  Registry registry = builtin_registry();
  int evaluated = 0;
  std::size_t i = 0;
  for (const CampaignCase& next : small_campaign()) {
    if (i++ == stop_after) break;
    journal.resume_or_run(next.kernel, next.c, [&] {
      ++evaluated;
      Kernel* k = registry.resolve(next.kernel);
      Case c = next.c;
      const Evaluation ev = evaluate(*k, c, {}, &registry);
      return to_case_result(*k, c, ev, case_family(c));
    });
  }
  return evaluated;
}

std::vector<json> timeless_cases(const std::vector<CaseResult>& cases) {
  std::vector<json> out;
  for (const auto& c : cases) out.push_back(timeless(c));
  return out;
}

TEST(Journal, RoundTripKeepsEveryResultBitForBit) {
  const std::string path = fresh_dir("roundtrip") + "/journal.jsonl";
  std::vector<CaseResult> first;
  {
    Journal j(path, kCampaign, /*resume=*/false);
    EXPECT_EQ(run_campaign(j), 9);
    first = j.campaign_cases();
    EXPECT_EQ(j.entries().size(), 9u);
  }
  EXPECT_EQ(lines_of(read_text(path)).size(), 10u);  // header + one line per case
  Journal j(path, kCampaign, /*resume=*/true);
  EXPECT_EQ(j.loaded(), 9u);
  EXPECT_TRUE(j.notes().empty());
  const auto campaign = small_campaign();
  EXPECT_NE(j.find(campaign[0].kernel, campaign[0].c), nullptr);
  EXPECT_EQ(j.find("cpu.fp32_seq", test::tiny_case(999)), nullptr);
  EXPECT_EQ(run_campaign(j), 0);  // everything comes from the journal
  EXPECT_EQ(j.reused(), 9u);
  const auto again = j.campaign_cases();
  ASSERT_EQ(again.size(), first.size());
  for (std::size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(case_result_to_json(again[i]), case_result_to_json(first[i])) << i;  // seconds too
  // Nothing was appended by the second run.
  EXPECT_EQ(lines_of(read_text(path)).size(), 10u);
}

TEST(Journal, ResumeAfterATruncatedLastLineEqualsAnUninterruptedRun) {
  const std::string dir = fresh_dir("truncated");
  std::vector<json> uninterrupted;
  {
    Journal j(dir + "/a.jsonl", kCampaign, false);
    run_campaign(j);
    uninterrupted = timeless_cases(j.campaign_cases());
  }
  const std::string path = dir + "/b.jsonl";
  {
    Journal j(path, kCampaign, false);
    EXPECT_EQ(run_campaign(j, 5), 5);
  }
  // A SIGKILL in the middle of the fifth case's write: half its line is on disk.
  const std::string text = read_text(path);
  const std::size_t last_start = text.rfind('\n', text.size() - 2) + 1;
  const std::size_t cut = last_start + (text.size() - last_start) / 2;
  fs::resize_file(path, cut);
  {
    Journal j(path, kCampaign, true);
    EXPECT_EQ(j.loaded(), 4u);
    ASSERT_EQ(j.notes().size(), 1u);
    EXPECT_CONTAINS(j.notes()[0], "ignored a truncated last line");
    EXPECT_CONTAINS(j.notes()[0], fmt::format("({} bytes;", cut - last_start));
    EXPECT_EQ(run_campaign(j), 5);  // the cut case and the four never started
    EXPECT_EQ(j.reused(), 4u);
    EXPECT_EQ(timeless_cases(j.campaign_cases()), uninterrupted);
  }
  // The truncated bytes are gone: the file reads clean.
  const JournalContents contents = read_journal(path);
  EXPECT_FALSE(contents.truncated_tail);
  EXPECT_EQ(contents.entries.size(), 9u);
  EXPECT_EQ(contents.campaign, kCampaign);
  Journal j(path, kCampaign, true);
  EXPECT_TRUE(j.notes().empty());
}

TEST(Journal, DamagedLineInTheMiddleIsAnInputErrorNamingFileAndLine) {
  const std::string dir = fresh_dir("damaged");
  const std::string path = dir + "/journal.jsonl";
  {
    Journal j(path, kCampaign, false);
    run_campaign(j, 4);
  }
  const std::vector<std::string> lines = lines_of(read_text(path));
  const auto with_line = [&](std::size_t index, const std::string& replacement) {
    std::string text;
    for (std::size_t i = 0; i < lines.size(); ++i) text += (i == index ? replacement : lines[i]) + "\n";
    write_text(path, text);
  };
  const auto error_of = [&] {
    try {
      Journal j(path, kCampaign, true);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  with_line(2, lines[2].substr(0, 40));  // line 3 cut short but followed by more lines
  EXPECT_CONTAINS(error_of(), path + ":3: not valid JSON");
  json bad = json::parse(lines[3]);
  bad["result"]["status"] = "meh";
  with_line(3, bad.dump());
  EXPECT_CONTAINS(error_of(), path + ":4: result.status: unknown status 'meh'");
  with_line(1, "");
  EXPECT_CONTAINS(error_of(), path + ":2: empty line");
  with_line(0, R"({"ulpgate_journal": 9})");
  EXPECT_CONTAINS(error_of(), path + ":1: unsupported journal version 9");
  write_text(path, "{\"not\": \"a journal\"}\n");
  EXPECT_CONTAINS(error_of(), path + ":1: not an ulpgate journal");
  // The damage was refused, not repaired: the file is as the test left it.
  EXPECT_EQ(read_text(path), "{\"not\": \"a journal\"}\n");
}

TEST(Journal, SecondWriterIsRefused) {
  const std::string path = fresh_dir("campaign") + "/journal.jsonl";
  Journal j(path, kCampaign, false);
  run_campaign(j, 2);
  try {
    Journal other(path + "", json{{"test", "other"}}, true);
    FAIL() << "a second journal on the same file opened";
  } catch (const InputError& e) {
    EXPECT_CONTAINS(e.what(), "cannot lock the journal (in use by another ulpgate process)");
  }
}

TEST(Journal, ResumeRefusesAJournalOfAnotherCampaign) {
  const std::string path = fresh_dir("other") + "/journal.jsonl";
  {
    Journal j(path, kCampaign, false);
    run_campaign(j, 2);
  }
  try {
    Journal other(path, json{{"test", "other"}}, true);
    FAIL() << "resumed another campaign's journal";
  } catch (const InputError& e) {
    EXPECT_CONTAINS(e.what(), path + ": journal of another campaign");
  }
  EXPECT_EQ(read_journal(path).entries.size(), 2u);  // untouched
}

TEST(Journal, NewJournalReplacesAndMissingFileStartsOne) {
  const std::string dir = fresh_dir("new");
  {
    Journal j(dir + "/j.jsonl", kCampaign, false);
    run_campaign(j, 3);
  }
  mark_journal_finished(dir + "/j.jsonl");
  {
    Journal j(dir + "/j.jsonl", kCampaign, false);  // not a resume: starts over
    EXPECT_EQ(j.loaded(), 0u);
  }
  EXPECT_EQ(lines_of(read_text(dir + "/j.jsonl")).size(), 1u);
  Journal fresh(dir + "/none.jsonl", kCampaign, true);
  EXPECT_EQ(fresh.loaded(), 0u);
  ASSERT_EQ(fresh.notes().size(), 1u);
  EXPECT_CONTAINS(fresh.notes()[0], "starting a new journal");
  EXPECT_THROW(Journal(dir, kCampaign, true), InputError);  // a directory
  EXPECT_THROW(Journal(dir + "/no/such/dir/j.jsonl", kCampaign, false), InputError);
}

// Rerunning a campaign without --resume after an interruption must not truncate the
// journal, and with it every result so far. A finished campaign's journal may be replaced.
TEST(Journal, AnUnfinishedCampaignIsNotReplacedWithoutResume) {
  const std::string dir = fresh_dir("unfinished");
  const std::string path = dir + "/journal.jsonl";
  {
    Journal j(path, kCampaign, false);
    run_campaign(j, 3);  // interrupted after three cases
  }
  const std::string before = read_text(path);
  EXPECT_EQ(unfinished_journal_cases(path), 3u);
  try {
    Journal again(path, kCampaign, false);
    FAIL() << "an unfinished campaign's journal was replaced";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), path + " holds an unfinished campaign (3 cases journaled): --resume continues it, "
                                            "or remove it / choose another --out");
  }
  EXPECT_EQ(read_text(path), before);  // untouched
  {
    Journal resumed(path, kCampaign, true);  // --resume continues it
    EXPECT_EQ(resumed.loaded(), 3u);
    run_campaign(resumed);
  }
  mark_journal_finished(path);
  EXPECT_EQ(unfinished_journal_cases(path), 0u);
  EXPECT_TRUE(read_journal(path).finished);
  EXPECT_EQ(read_journal(path).entries.size(), 9u);
  {
    // Resuming a finished campaign reuses everything and leaves it unfinished until the
    // campaign marks it again.
    Journal j(path, kCampaign, true);
    EXPECT_EQ(j.loaded(), 9u);
    EXPECT_EQ(run_campaign(j), 0);
  }
  EXPECT_EQ(unfinished_journal_cases(path), 9u);
  mark_journal_finished(path);
  {
    Journal j(path, kCampaign, false);  // finished: replaced
    EXPECT_EQ(j.loaded(), 0u);
  }
  // A journal with a header and no case (a campaign stopped before its first case) holds
  // nothing to lose.
  EXPECT_EQ(unfinished_journal_cases(path), 0u);
  Journal replaced(path, kCampaign, false);
  EXPECT_EQ(unfinished_journal_cases(dir + "/none.jsonl"), 0u);
}

// Journal lines get the limits of every JSON reader (core/file_io.hpp): nesting and numbers.
TEST(Journal, DeepOrHugeLinesAreInputErrorsNamingFileAndLine) {
  const std::string path = fresh_dir("limits") + "/journal.jsonl";
  {
    Journal j(path, kCampaign, false);
    run_campaign(j, 2);
  }
  const std::vector<std::string> lines = lines_of(read_text(path));
  const auto error_with_line = [&](const std::string& line) {
    write_text(path, lines[0] + "\n" + lines[1] + "\n" + line + "\n" + lines[2] + "\n");
    try {
      Journal j(path, kCampaign, true);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_with_line(std::string(100000, '[') + std::string(100000, ']')),
            path + ":3: JSON nested deeper than 64 levels at byte 65");
  EXPECT_EQ(error_with_line(R"({"kernel": "k", "case": {"alpha": 1e400}})"),
            path + ":3: case.alpha: number 1e400 is out of range (beyond +-1.8e308)");
}

TEST(Journal, RepeatedEvaluationsAreTakenInOrder) {
  const std::string path = fresh_dir("repeat") + "/journal.jsonl";
  const Case c = small_campaign()[0].c;
  CaseResult r1, r2;
  r1.kernel = r2.kernel = "k";
  r1.spec = r2.spec = c;
  r1.message = "first", r2.message = "second";
  {
    Journal j(path, kCampaign, false);
    EXPECT_EQ(j.find("k", c), nullptr);
    j.append("k", c, r1);
    EXPECT_EQ(j.find("k", c), nullptr);  // this run's own entry is visited already
    j.append("k", c, r2);
  }
  Journal j(path, kCampaign, true);
  ASSERT_NE(j.find("k", c), nullptr);
  EXPECT_EQ(j.find("k", c)->message, "first");
  EXPECT_EQ(j.take("k", c)->message, "first");
  EXPECT_EQ(j.take("k", c)->message, "second");
  EXPECT_FALSE(j.take("k", c).has_value());
  EXPECT_EQ(j.find("other", c), nullptr);
}

// --- A real process, killed with SIGKILL ---------------------------------------------------

// Starts the campaign driver with stdout and stderr to files.
pid_t spawn_driver(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  std::vector<std::string> all = {JOURNAL_CAMPAIGN};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(rc, 0) << std::strerror(rc);
  return pid;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<json> record_cases(const std::string& path) {
  return timeless_cases(read_record_file(path).cases);
}

TEST(Journal, CampaignKilledWithSigkillResumesToTheUninterruptedResult) {
  const std::string dir = fresh_dir("sigkill");
  // The uninterrupted run.
  const pid_t whole = spawn_driver({dir + "/a.jsonl", dir + "/a.json"}, dir + "/a.out", dir + "/a.err");
  ASSERT_EQ(wait_exit_code(whole), 0) << read_text(dir + "/a.err");
  // The repeated case is evaluated again (a repeatability check), not taken from this run.
  EXPECT_EQ(read_text(dir + "/a.out"), "evaluated 10 reused 0\n");
  ASSERT_EQ(record_cases(dir + "/a.json").size(), 10u);

  // The same campaign, slowed down and killed once four cases are journaled.
  const std::string journal = dir + "/b.jsonl";
  const pid_t victim = spawn_driver({journal, dir + "/b.json", "--pause-ms", "250", "--pid-file", dir + "/worker.pid"},
                                    dir + "/b1.out", dir + "/b1.err");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (lines_of(read_text(journal)).size() < 5 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_EQ(wait_exit_code(victim), 128 + SIGKILL);
  const std::size_t journaled = lines_of(read_text(journal)).size() - 1;
  ASSERT_GE(journaled, 4u);
  ASSERT_LT(journaled, 10u) << "the campaign finished before the kill";
  EXPECT_FALSE(fs::exists(dir + "/b.json"));
  // Its worker does not outlive it (PR_SET_PDEATHSIG).
  const pid_t worker = std::stoi(read_text(dir + "/worker.pid"));
  while (test::running(worker) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(test::running(worker)) << "worker " << worker << " outlived its campaign";

  // Resume: only what is missing is evaluated, and the record equals the uninterrupted one.
  const pid_t resumed = spawn_driver({journal, dir + "/b.json", "--resume"}, dir + "/b2.out", dir + "/b2.err");
  ASSERT_EQ(wait_exit_code(resumed), 0) << read_text(dir + "/b2.err");
  const std::string out = read_text(dir + "/b2.out");
  int evaluated = -1;
  std::size_t reused = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "evaluated %d reused %zu", &evaluated, &reused), 2) << out;
  EXPECT_EQ(reused, journaled);
  EXPECT_EQ(static_cast<std::size_t>(evaluated), 10 - journaled);
  EXPECT_EQ(record_cases(dir + "/b.json"), record_cases(dir + "/a.json"));
  EXPECT_EQ(read_journal(journal).entries.size(), 10u);
}

}  // namespace
}  // namespace ulpgate

namespace ulpgate {

// The campaign passes the worker's own JSON text of a result and a case (dumped off the
// campaign thread): the line is the one the structs give, byte for byte, and reads back.
TEST(Journal, PreparedJsonTextGivesTheSameLine) {
  const std::string dir = fresh_dir("prepared");
  Registry registry = builtin_registry();
  const CampaignCase next = small_campaign()[1];
  Kernel* k = registry.resolve(next.kernel);
  Case c = next.c;
  const Evaluation ev = evaluate(*k, c, {}, &registry);
  const CaseResult r = to_case_result(*k, c, ev, case_family(c));
  const auto text = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  {
    Journal a(dir + "/a.jsonl", kCampaign, false), b(dir + "/b.jsonl", kCampaign, false);
    a.append(next.kernel, next.c, r);
    b.append(next.kernel, next.c, r, text(to_json(next.c)), text(case_result_to_json(r)));
  }
  EXPECT_EQ(read_text(dir + "/a.jsonl"), read_text(dir + "/b.jsonl"));
  Journal back(dir + "/b.jsonl", kCampaign, true);
  ASSERT_EQ(back.loaded(), 1u);
  EXPECT_EQ(case_result_to_json(back.entries()[0].result), case_result_to_json(r));
}

}  // namespace ulpgate
