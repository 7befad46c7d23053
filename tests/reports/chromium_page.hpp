// A page opened in headless Chromium, as the HTML report's and the manual's rendering tests
// open theirs: exit code, Chromium's log, the console messages, the screenshot's colours.
#pragma once

#include <gtest/gtest.h>
#include <png.h>

#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tests/reports/report_test_util.hpp"

namespace ulpgate::testing {

struct Page {
  int exit_code = -1;
  std::string log;                   // Chromium's stderr
  std::size_t colours = 0;           // distinct RGBA values in the screenshot
  std::vector<std::string> console;  // console messages and uncaught exceptions
};

// Distinct colours of a PNG (0 if it cannot be read).
inline std::size_t distinct_colours(const std::string& png_path) {
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

// The command the tests run (also in docs/concepts/reports.md): --no-sandbox because CI runs
// as root, a private profile so nothing outside the temporary folder is touched, and
// console messages logged to stderr, where Chromium writes them as "...:CONSOLE..." lines.
// The window is 1280 px wide and `height` px tall (what the screenshot shows).
inline Page open_in_chromium(const TempDir& dir, const std::string& html_path, int height) {
  Page page;
  const std::string png = dir.file("screenshot.png"), log = dir.file("chromium.log");
  const std::string command = fmt::format(
      "timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir={} "
      "--screenshot={} --window-size=1280,{} --enable-logging=stderr --v=0 {} >/dev/null 2>{}",
      shell_quote(dir.file("profile")), shell_quote(png), height, shell_quote("file://" + html_path),
      shell_quote(log));
  page.exit_code = run_command(command).exit_code;
  page.log = read_file(log);
  std::istringstream lines(page.log);
  for (std::string line; std::getline(lines, line);)
    if (line.find(":CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos)
      page.console.push_back(line);
  page.colours = distinct_colours(png);
  return page;
}

// Tests that need chromium fail (not skip) without it: .ci/install-deps installs it.
class ChromiumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(run_command("command -v chromium >/dev/null").exit_code, 0)
        << "chromium is needed (Debian package chromium; .ci/install-deps installs it)";
  }
};

}  // namespace ulpgate::testing
