// The manual's front page in headless Chromium, as tests/reports/test_html_chromium.cpp opens
// the HTML report: the site (mkdocs build of this tree) must render — a screenshot with more
// than a few colours, every script and stylesheet the page names present in the site, and
// nothing on the console (a theme whose JavaScript is missing or broken logs an uncaught
// error there). A control page with a script error shows that the console check can fail.
#include <gtest/gtest.h>
#include <png.h>

#include <regex>
#include <set>

#include "tests/reports/chromium_page.hpp"

namespace ulpgate {
namespace {

using testing::open_in_chromium;
using testing::Page;
using testing::run_command;
using testing::shell_quote;

using SiteChromium = testing::ChromiumTest;

// The front page's first screen.
constexpr int kWindowHeight = 900;

// A blank page has one colour; a line of text a few dozen. The front page's first screen
// (navigation bar, headings, links, code) shows several hundred.
constexpr std::size_t kMinColours = 150;

TEST_F(SiteChromium, FrontPageRendersWithItsAssetsAndNoConsoleMessages) {
  testing::TempDir dir("site-chromium");
  const std::string site = dir.file("site");
  const auto build = run_command(fmt::format("{} build --strict --quiet --config-file {} --site-dir {} 2>&1",
                                             shell_quote(ULPGATE_MKDOCS),
                                             shell_quote(std::string(ULPGATE_SOURCE_DIR) + "/mkdocs.yml"),
                                             shell_quote(site)));
  ASSERT_EQ(build.exit_code, 0) << "mkdocs build failed (Debian package mkdocs):\n" << build.out;
  const std::string index = site + "/index.html";
  const std::string html = testing::read_file(index);
  ASSERT_NE(html.find("<h1"), std::string::npos) << "no heading on the front page";
  EXPECT_NE(html.find("Getting started"), std::string::npos) << "no link to the tutorial";

  // Every local script and stylesheet the page names is in the site: a theme packaged without
  // its JavaScript leaves the navigation dead without any build warning.
  const std::regex asset(R"re((?:src|href)="([^"#:?]+\.(?:js|css))")re");
  int assets = 0;
  for (std::sregex_iterator it(html.begin(), html.end(), asset), end; it != end; ++it, ++assets)
    EXPECT_TRUE(std::filesystem::exists(site + "/" + (*it)[1].str())) << "missing from the site: " << (*it)[1];
  EXPECT_GT(assets, 0);

  const Page page = open_in_chromium(dir, index, kWindowHeight);
  ASSERT_EQ(page.exit_code, 0) << page.log;
  EXPECT_TRUE(page.console.empty()) << fmt::format("{}", fmt::join(page.console, "\n"));
  EXPECT_GE(page.colours, kMinColours);
  std::printf("colours: front page %zu, %d assets\n", page.colours, assets);
}

TEST_F(SiteChromium, ControlPageWithAScriptErrorIsCaught) {
  testing::TempDir dir("site-chromium-control");
  const std::string html = dir.file("control.html");
  testing::write_file(html, "<!doctype html><title>c</title><p>text</p><script>undefined_function();</script>");
  const Page page = open_in_chromium(dir, html, kWindowHeight);
  ASSERT_EQ(page.exit_code, 0) << page.log;
  EXPECT_FALSE(page.console.empty()) << "a script error did not reach the console log:\n" << page.log;
  EXPECT_LT(page.colours, kMinColours);
}

}  // namespace
}  // namespace ulpgate
