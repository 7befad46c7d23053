// Opens the HTML report in headless Chromium: it must render (a screenshot with plots in
// it, not a blank page) and log nothing to the console. A control page with a script
// error shows that the console check and the blank-page check can fail.
#include <gtest/gtest.h>
#include <png.h>

#include <memory>
#include <set>

#include "reports/report.hpp"
#include "tests/harness/record_samples.hpp"
#include "tests/reports/report_test_util.hpp"

namespace ulpgate {
namespace {

using testing::run_command;
using testing::shell_quote;

struct Page {
  int exit_code = -1;
  std::string log;                // Chromium's stderr
  std::size_t colours = 0;        // distinct RGBA values in the screenshot
  std::vector<std::string> console;  // console messages and uncaught exceptions
};

// Distinct colours of a PNG (0 if it cannot be read).
std::size_t distinct_colours(const std::string& png_path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, png_path.c_str())) return 0;
  image.format = PNG_FORMAT_RGBA;
  std::vector<std::uint32_t> pixels(static_cast<std::size_t>(image.width) * image.height);
  if (!png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr)) {
    png_image_free(&image);
    return 0;
  }
  return std::set<std::uint32_t>(pixels.begin(), pixels.end()).size();
}

// The command the test runs (also in README.md, "Reports"): --no-sandbox because CI runs
// as root, a private profile so nothing outside the temporary folder is touched, and
// console messages logged to stderr, where Chromium writes them as "...:CONSOLE..." lines.
Page open_in_chromium(const testing::TempDir& dir, const std::string& html_path) {
  Page page;
  const std::string png = dir.file("screenshot.png"), log = dir.file("chromium.log");
  const std::string command = fmt::format(
      "timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir={} "
      "--screenshot={} --window-size=1280,2000 --enable-logging=stderr --v=0 {} >/dev/null 2>{}",
      shell_quote(dir.file("profile")), shell_quote(png), shell_quote("file://" + html_path), shell_quote(log));
  page.exit_code = run_command(command).exit_code;
  page.log = testing::read_file(log);
  std::istringstream lines(page.log);
  for (std::string line; std::getline(lines, line);)
    if (line.find(":CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos)
      page.console.push_back(line);
  page.colours = distinct_colours(png);
  return page;
}

class Chromium : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(run_command("command -v chromium >/dev/null").exit_code, 0)
        << "chromium is needed (Debian package chromium; .ci/install-deps installs it)";
  }
};

// A blank page has one colour and the control page (a line of text) a few dozen from
// anti-aliasing (42 here); the report's first 2000 pixels (tables, coloured row marks)
// showed 420, the page of plots 1059. The thresholds leave room for other fonts.
constexpr std::size_t kMinColours = 200;

TEST_F(Chromium, ReportRendersWithPlotsAndNoConsoleMessages) {
  testing::TempDir dir("chromium-report");
  const std::string html = dir.file("report.html");
  testing::write_file(html, render_html(samples::record(true)));
  const Page page = open_in_chromium(dir, html);
  ASSERT_EQ(page.exit_code, 0) << page.log;
  EXPECT_TRUE(page.console.empty()) << fmt::format("{}", fmt::join(page.console, "\n"));
  EXPECT_GE(page.colours, kMinColours);
  std::printf("colours: report %zu\n", page.colours);
}

TEST_F(Chromium, PlotsRender) {
  // Sweeps only: the plots come right after the environment, inside the screenshot.
  RunRecord r = samples::record();
  r.cases.clear();
  testing::TempDir dir("chromium-plots");
  const std::string html = dir.file("plots.html");
  testing::write_file(html, render_html(r));
  const Page page = open_in_chromium(dir, html);
  ASSERT_EQ(page.exit_code, 0) << page.log;
  EXPECT_TRUE(page.console.empty()) << fmt::format("{}", fmt::join(page.console, "\n"));
  EXPECT_GE(page.colours, 2 * kMinColours);
  std::printf("colours: plots page %zu\n", page.colours);
}

TEST_F(Chromium, ControlPageWithAScriptErrorIsCaught) {
  testing::TempDir dir("chromium-control");
  const std::string html = dir.file("control.html");
  testing::write_file(html, "<!DOCTYPE html><html><body><p>x</p><script>undefined_function();</script></body></html>");
  const Page page = open_in_chromium(dir, html);
  ASSERT_EQ(page.exit_code, 0) << page.log;
  ASSERT_FALSE(page.console.empty()) << page.log;
  EXPECT_NE(page.console[0].find("Uncaught ReferenceError"), std::string::npos) << page.console[0];
  EXPECT_GT(page.colours, 0u);  // the screenshot was read
  EXPECT_LT(page.colours, kMinColours / 2);
  std::printf("colours: control page %zu\n", page.colours);
}

}  // namespace
}  // namespace ulpgate
