#include "reports/gnuplot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "reports/common.hpp"

extern char** environ;

namespace ulpgate::report {
namespace {

namespace fs = std::filesystem;

// A private temporary folder, removed with everything in it when the render is done.
class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "ulpgate-plot-XXXXXX").string();
    if (!::mkdtemp(templ.data())) throw std::runtime_error(fmt::format("mkdtemp: {}", std::strerror(errno)));
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Gives every id in one SVG a prefix (and every reference to it: href='#id', url(#id)),
// so that several gnuplot SVGs in one page do not share ids such as gpPt0 or gpclip.
std::string prefix_ids(std::string svg, const std::string& prefix) {
  std::vector<std::string> ids;
  for (std::size_t p = 0; (p = svg.find(" id=", p)) != std::string::npos; p += 4) {
    const char q = svg[p + 4];
    if (q != '\'' && q != '"') continue;
    const std::size_t end = svg.find(q, p + 5);
    if (end == std::string::npos) break;
    ids.push_back(svg.substr(p + 5, end - p - 5));
  }
  std::string out;
  out.reserve(svg.size() + ids.size() * 16);
  // One pass over the text: an id declaration or reference is rewritten where it appears.
  for (std::size_t i = 0; i < svg.size();) {
    bool done = false;
    for (const char* lead : {" id='", " id=\"", "#"}) {
      const std::size_t n = std::strlen(lead);
      if (svg.compare(i, n, lead) != 0) continue;
      for (const auto& id : ids) {
        if (svg.compare(i + n, id.size(), id) != 0) continue;
        const char after = i + n + id.size() < svg.size() ? svg[i + n + id.size()] : '\0';
        if (after != '\'' && after != '"' && after != ')') continue;
        out.append(lead).append(prefix).append(id);
        i += n + id.size();
        done = true;
        break;
      }
      if (done) break;
    }
    if (!done) out += svg[i++];
  }
  return out;
}

std::string strip_prolog(const std::string& svg) {
  const std::size_t start = svg.find("<svg");
  if (start == std::string::npos) throw std::runtime_error("gnuplot wrote no <svg> element");
  return svg.substr(start);
}

}  // namespace

std::string gnuplot_string(std::string_view s) {
  std::string out = "'";
  for (char c : valid_utf8(s)) {
    if (c == '\'') out += "''";
    else if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) out += c;
  }
  return out + "'";
}

std::vector<std::string> render_svgs(const std::vector<Plot>& plots) {
  if (plots.empty()) return {};
  const TempDir dir;
  std::string script = "set termoption noenhanced\n";
  for (std::size_t i = 0; i < plots.size(); ++i) {
    // dynamic: the SVG scales to its container; noenhanced: '_' and '^' in names stay text.
    script += fmt::format(
        "reset\nset terminal svg size {},{} dynamic noenhanced font 'sans,11' background rgb 'white'\n"
        "set output {}\n{}\nunset output\n",
        plots[i].width, plots[i].height, gnuplot_string((dir.path() / fmt::format("{}.svg", i)).string()),
        plots[i].script);
  }
  const fs::path script_path = dir.path() / "plots.gp", log_path = dir.path() / "gnuplot.log";
  {
    std::ofstream f(script_path);
    f << script;
    if (!f.flush()) throw std::runtime_error("cannot write the gnuplot script to " + script_path.string());
  }
  const char* env_program = std::getenv("ULPGATE_GNUPLOT");
  const std::string program = env_program && *env_program ? env_program : "gnuplot";

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::string arg0 = program, arg1 = script_path.string();
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw InputError(fmt::format("the HTML report needs gnuplot, and '{}' cannot be run ({}); install it "
                                 "(Debian: apt-get install gnuplot-nox) or set ULPGATE_GNUPLOT",
                                 program, std::strerror(rc)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(fmt::format("waitpid(gnuplot): {}", std::strerror(errno)));
  const std::string log = read_all(log_path);
  // A gnuplot that fails here is this machine's gnuplot (no svg terminal, a broken
  // install): bad input to ulpgate (exit 2), named with what it printed, on one line.
  std::string printed = log.substr(0, log.find_last_not_of(" \n") + 1);
  for (char& c : printed)
    if (c == '\n' || c == '\r') c = ' ';
  if (printed.size() > 400) printed = printed.substr(0, 400) + "...";
  printed = valid_utf8(printed);
  const std::string said = printed.empty() ? " and printed nothing" : ": " + printed;
  const std::string advice = "; the HTML report needs a working gnuplot with the svg terminal (ULPGATE_GNUPLOT names "
                             "another; fuzz --no-html skips the report)";
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw InputError(fmt::format("gnuplot '{}' failed ({}){}{}", program,
                                 WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                                                   : fmt::format("signal {}", WTERMSIG(status)),
                                 said, advice));
  std::vector<std::string> svgs;
  for (std::size_t i = 0; i < plots.size(); ++i) {
    const fs::path p = dir.path() / fmt::format("{}.svg", i);
    if (!fs::exists(p))
      throw InputError(fmt::format("gnuplot '{}' wrote no plot{}{}", program, printed.empty() ? " (printed nothing)" : said,
                                   advice));
    svgs.push_back(prefix_ids(strip_prolog(read_all(p)), fmt::format("p{}_", i)));
  }
  return svgs;
}

void check_gnuplot() { render_svgs({Plot{"plot x", 100, 100}}); }

}  // namespace ulpgate::report
