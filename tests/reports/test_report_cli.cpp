// `ulpgate report`: Markdown on stdout without flags, the three files with them, exit 2
// with one line on stderr for bad input.
#include <gtest/gtest.h>

#include "campaign/record.hpp"
#include "tests/campaign/record_samples.hpp"
#include "tests/reports/report_test_util.hpp"

namespace ulpgate {
namespace {

using testing::run_command;
using testing::shell_quote;

TEST(ReportCli, MarkdownOnStdoutWithoutFlags) {
  testing::TempDir dir("report-cli-md");
  const std::string run = dir.file("run.json");
  write_record_file(run, samples::record());
  const auto r = run_command(std::string(ULPGATE_BIN) + " report " + shell_quote(run));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("# ulpgate fuzz run\n", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("6 cases: 2 passed, 1 failed"), std::string::npos);
}

TEST(ReportCli, WritesEachRequestedFile) {
  testing::TempDir dir("report-cli-files");
  const std::string run = dir.file("run.json");
  write_record_file(run, samples::record());
  const auto r = run_command(fmt::format("{} report {} --md {} --junit {} --html {}", ULPGATE_BIN, shell_quote(run),
                                         shell_quote(dir.file("r.md")), shell_quote(dir.file("r.xml")),
                                         shell_quote(dir.file("r.html"))));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(testing::read_file(dir.file("r.md")).rfind("# ulpgate fuzz run", 0), 0u);
  EXPECT_EQ(testing::read_file(dir.file("r.xml")).rfind("<?xml", 0), 0u);
  EXPECT_NE(testing::read_file(dir.file("r.html")).find("<svg"), std::string::npos);
}

TEST(ReportCli, BadInputIsExitTwoWithOneLine) {
  testing::TempDir dir("report-cli-bad");
  const std::string bad = dir.file("bad.json");
  testing::write_file(bad, "{\"ulpgate_record\": 1, \"kind\": ");
  const auto r = run_command(fmt::format("{} report {} 2>&1 >/dev/null", ULPGATE_BIN, shell_quote(bad)));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out.rfind("ulpgate: error: " + bad + ": not valid JSON at byte ", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;

  const auto missing = run_command(fmt::format("{} report {} 2>&1", ULPGATE_BIN, shell_quote(dir.file("none.json"))));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.out.find("cannot open"), std::string::npos) << missing.out;

  const std::string run = dir.file("run.json");
  write_record_file(run, samples::record());
  const auto unwritable = run_command(fmt::format("{} report {} --md {} 2>&1", ULPGATE_BIN, shell_quote(run),
                                                  shell_quote(dir.file("no/such/dir/r.md"))));
  EXPECT_EQ(unwritable.exit_code, 2);
  EXPECT_NE(unwritable.out.find("r.md: no directory "), std::string::npos) << unwritable.out;

  const auto no_run = run_command(fmt::format("{} report 2>&1", ULPGATE_BIN));
  EXPECT_EQ(no_run.exit_code, 2) << no_run.out;
}

}  // namespace
}  // namespace ulpgate
