// Opens the HTML report in headless Chromium: it must render (a screenshot with plots in
// it, not a blank page) and log nothing to the console. A control page with a script
// error shows that the console check and the blank-page check can fail. In a 1280 px wide
// window the page must not scroll sideways and must show its verdict at the top.
#include <gtest/gtest.h>
#include <png.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>

#include "reports/report.hpp"
#include "tests/campaign/record_samples.hpp"
#include "tests/reports/chromium_page.hpp"

namespace ulpgate {
namespace {

using testing::open_in_chromium;
using testing::Page;
using testing::run_command;
using testing::shell_quote;

using Chromium = testing::ChromiumTest;

// The report is judged on its first 2000 pixels.
constexpr int kWindowHeight = 2000;

// A blank page has one colour and the control page (a line of text) a few dozen from
// anti-aliasing (42 here); the report's first 2000 pixels (verdict, summary, the failure's
// plots) show about 2800, the page of plots about 1800. The thresholds leave room for other fonts.
constexpr std::size_t kMinColours = 200;

TEST_F(Chromium, ReportRendersWithPlotsAndNoConsoleMessages) {
  testing::TempDir dir("chromium-report");
  const std::string html = dir.file("report.html");
  testing::write_file(html, render_html(samples::record(true)));
  const Page page = open_in_chromium(dir, html, kWindowHeight);
  ASSERT_EQ(page.exit_code, 0) << page.log;
  EXPECT_TRUE(page.console.empty()) << fmt::format("{}", fmt::join(page.console, "\n"));
  EXPECT_GE(page.colours, kMinColours);
  std::printf("colours: report %zu\n", page.colours);
}

TEST_F(Chromium, PlotsRender) {
  // Sweeps only: the plots come right after the verdict and the (empty) summary.
  RunRecord r = samples::record();
  r.cases.clear();
  testing::TempDir dir("chromium-plots");
  const std::string html = dir.file("plots.html");
  testing::write_file(html, render_html(r));
  const Page page = open_in_chromium(dir, html, kWindowHeight);
  ASSERT_EQ(page.exit_code, 0) << page.log;
  EXPECT_TRUE(page.console.empty()) << fmt::format("{}", fmt::join(page.console, "\n"));
  EXPECT_GE(page.colours, 2 * kMinColours);
  std::printf("colours: plots page %zu\n", page.colours);
}

// Pixels of exactly this colour (0xRRGGBB) in the first `rows` rows of a PNG, and its width;
// {0, 0} if it cannot be read.
std::pair<std::size_t, std::uint32_t> pixels_of_colour(const std::string& png_path, std::uint32_t rgb,
                                                       std::uint32_t rows) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, png_path.c_str())) return {0, 0};
  image.format = PNG_FORMAT_RGB;
  std::vector<std::uint8_t> pixels(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr)) {
    png_image_free(&image);
    return {0, 0};
  }
  std::size_t n = 0;
  const std::size_t end = static_cast<std::size_t>(std::min(rows, image.height)) * image.width * 3;
  for (std::size_t i = 0; i < end; i += 3)
    n += (static_cast<std::uint32_t>(pixels[i]) << 16 | pixels[i + 1] << 8 | pixels[i + 2]) == rgb;
  return {n, image.width};
}

// Measures the page as laid out in a 1280 x 900 window. The report has no script, so the
// test appends one to a copy of it: it reads the widths and the verdict's position, opens
// every <details> (the full case table must scroll inside its own box, not widen the page)
// and measures again, then writes the numbers into the DOM, which --dump-dom prints.
// Elements reaching past the viewport's right edge are named, for the failure message.
constexpr const char* kMeasureScript = R"js(<script>
(function () {
  var d = document.documentElement, out = [];
  function wide() {
    var names = [];
    document.querySelectorAll('body *').forEach(function (e) {
      var b = e.getBoundingClientRect();
      if (b.right > d.clientWidth + 0.5 && names.length < 8)
        names.push(e.tagName + (e.id ? '#' + e.id : '') +
                   (e.className && e.className.baseVal === undefined ? '.' + e.className : '') + ':' +
                   Math.round(b.right));
    });
    return names.join(',') || '-';
  }
  var ve = document.getElementById('verdict'), v = ve ? ve.getBoundingClientRect() : {top: -1, bottom: -1};
  out.push('inner=' + window.innerWidth, 'client=' + d.clientWidth, 'scroll=' + d.scrollWidth,
           'verdict_top=' + Math.round(v.top), 'verdict_bottom=' + Math.round(v.bottom), 'wide=' + wide());
  document.querySelectorAll('details').forEach(function (e) { e.open = true; });
  out.push('open_scroll=' + d.scrollWidth, 'open_wide=' + wide());
  var p = document.createElement('pre');
  p.id = 'ulpgate-measure';
  p.textContent = 'MEASURE ' + out.join(' ') + ' END';
  document.body.appendChild(p);
})();
</script>)js";

// "key=value" from the measurement line.
std::string measured(const std::string& line, const std::string& key) {
  const std::size_t at = line.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const std::size_t from = at + key.size() + 2;
  return line.substr(from, line.find(' ', from) - from);
}
int measured_int(const std::string& line, const std::string& key) {
  const std::string v = measured(line, key);
  return v.empty() ? -1 : std::atoi(v.c_str());
}

// The verdict badge's colour for FAIL (reports/html.cpp, .verdict.fail).
constexpr std::uint32_t kFailColour = 0xb00020;

TEST_F(Chromium, FitsA1280PxWindowWithTheVerdictOnTheFirstScreen) {
  const auto start = std::chrono::steady_clock::now();
  testing::TempDir dir("chromium-1280");
  const std::string report = render_html(samples::campaign_record());
  const std::size_t body_end = report.rfind("</body>");
  ASSERT_NE(body_end, std::string::npos);
  const std::string measure = dir.file("measure.html");
  testing::write_file(measure, report.substr(0, body_end) + kMeasureScript + report.substr(body_end));
  const auto dom = run_command(fmt::format(
      "timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir={} --window-size=1280,900 "
      "--dump-dom {} 2>/dev/null",
      shell_quote(dir.file("profile-dom")), shell_quote("file://" + measure)));
  ASSERT_EQ(dom.exit_code, 0);
  const std::string tag = "<pre id=\"ulpgate-measure\">MEASURE";
  const std::size_t m = dom.out.find(tag), e = dom.out.find(" END", m);
  ASSERT_TRUE(m != std::string::npos && e != std::string::npos)
      << dom.out.substr(dom.out.size() - std::min<std::size_t>(dom.out.size(), 3000));
  const std::string line = dom.out.substr(m + tag.size(), e - m - tag.size()) + " ";
  std::printf("1280 px window: %s\n", line.c_str());
  // The window really is 1280 px wide (less a vertical scroll bar, where one is drawn).
  EXPECT_EQ(measured_int(line, "inner"), 1280) << line;
  const int client = measured_int(line, "client");
  EXPECT_GE(client, 1250) << line;
  // No horizontal scrolling: nothing is wider than the window, closed or open.
  EXPECT_LE(measured_int(line, "scroll"), client) << line;
  EXPECT_EQ(measured(line, "wide"), "-") << line;
  EXPECT_LE(measured_int(line, "open_scroll"), client) << line;
  EXPECT_EQ(measured(line, "open_wide"), "-") << line;
  // The verdict is on the first screen, at its top.
  EXPECT_GE(measured_int(line, "verdict_top"), 0) << line;
  EXPECT_LE(measured_int(line, "verdict_bottom"), 450) << line;

  // And it shows: the screenshot of the report itself (no script) has the FAIL colour in its
  // top rows. $ULPGATE_KEEP_SCREENSHOT names a file to keep the screenshot in (and the page
  // beside it, with ".html" appended), to look at the layout.
  const std::string html = dir.file("report.html"), png = dir.file("report.png");
  testing::write_file(html, report);
  const auto shot = run_command(fmt::format(
      "timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir={} "
      "--screenshot={} --window-size=1280,1000 {} >/dev/null 2>&1",
      shell_quote(dir.file("profile-shot")), shell_quote(png), shell_quote("file://" + html)));
  ASSERT_EQ(shot.exit_code, 0);
  const auto [top, width] = pixels_of_colour(png, kFailColour, 300);
  EXPECT_EQ(width, 1280u);
  EXPECT_GE(top, 2000u) << "the verdict's colour should fill its badge and border in the first 300 rows";
  EXPECT_EQ(pixels_of_colour(png, kFailColour, 1000).first, top) << "the colour belongs to the verdict alone";
  if (const char* keep = std::getenv("ULPGATE_KEEP_SCREENSHOT")) {
    std::filesystem::copy_file(png, keep, std::filesystem::copy_options::overwrite_existing);
    testing::write_file(std::string(keep) + ".html", report);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fit test: %zu verdict-coloured pixels in the top 300 rows, %.1f s\n", top, seconds);
  EXPECT_LT(seconds, 30.0);
}

TEST_F(Chromium, ControlPageWithAScriptErrorIsCaught) {
  testing::TempDir dir("chromium-control");
  const std::string html = dir.file("control.html");
  testing::write_file(html, "<!DOCTYPE html><html><body><p>x</p><script>undefined_function();</script></body></html>");
  const Page page = open_in_chromium(dir, html, kWindowHeight);
  ASSERT_EQ(page.exit_code, 0) << page.log;
  ASSERT_FALSE(page.console.empty()) << page.log;
  EXPECT_NE(page.console[0].find("Uncaught ReferenceError"), std::string::npos) << page.console[0];
  EXPECT_GT(page.colours, 0u);  // the screenshot was read
  EXPECT_LT(page.colours, kMinColours / 2);
  std::printf("colours: control page %zu\n", page.colours);
}

}  // namespace
}  // namespace ulpgate
