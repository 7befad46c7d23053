#include "cli/options.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format.hpp"
#include "kernels/plugin/loader.hpp"

namespace ulpgate {

std::uint64_t parse_seed(const std::string& text) {
  const auto bad = [&] {
    return InputError(fmt::format("--seed {}: expected an integer from 0 to 18446744073709551615", text.empty() ? "''" : text));
  };
  if (text.empty() || text.size() > 20) throw bad();
  std::uint64_t x = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') throw bad();
    const std::uint64_t digit = static_cast<std::uint64_t>(ch - '0');
    if (x > (UINT64_MAX - digit) / 10) throw bad();
    x = 10 * x + digit;
  }
  return x;
}

void check_budget(double seconds) {
  if (!(std::isfinite(seconds) && seconds >= 0))
    throw InputError(fmt::format("--time {}: must be a finite number of seconds >= 0 (0: no budget)", seconds));
}

void check_timeout(double seconds) {
  if (!(std::isfinite(seconds) && seconds >= kMinTimeoutSeconds))
    throw InputError(fmt::format("--timeout {}: must be a finite number of seconds >= {:g}", seconds, kMinTimeoutSeconds));
}

void check_dtype(const std::string& dtype) {
  if (parse_format(dtype)) return;
  std::string all;
  for (Format f : kAllFormats) all += (all.empty() ? "" : ", ") + std::string(name(f));
  throw InputError(fmt::format("unknown dtype '{}' (one of {})", dtype, all));
}

void check_cases(std::int64_t cases) {
  if (cases < 1) throw InputError(fmt::format("--cases {}: must be >= 1", cases));
  if (cases > kMaxCasesPerTarget)
    throw InputError(fmt::format("--cases {}: at most {} cases per target (--time bounds a long campaign)", cases,
                                 kMaxCasesPerTarget));
}

void check_out_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (dir.empty()) throw InputError("--out: empty path (name a directory)");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) throw InputError(fmt::format("--out {}: not a directory", dir));
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
      throw InputError(fmt::format("--out {}: cannot write there ({})", dir, std::strerror(errno)));
    return;
  }
  // Missing: the nearest existing path above it must be a writable directory.
  fs::path above = fs::absolute(fs::path(dir), ec).parent_path();
  while (!above.empty() && !fs::exists(above, ec) && above != above.root_path()) above = above.parent_path();
  if (!fs::is_directory(above, ec))
    throw InputError(fmt::format("--out {}: cannot create the directory ({} is not a directory)", dir, above.string()));
  if (::access(above.c_str(), W_OK | X_OK) != 0)
    throw InputError(fmt::format("--out {}: cannot create the directory ({}: {})", dir, above.string(), std::strerror(errno)));
}

void create_out_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("--out {}: cannot create the directory ({})", dir, ec.message()));
}

void check_output_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw InputError(flag + ": empty path (name a file)");
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw InputError(fmt::format("{} {}: is a directory, not a file", flag, path));
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(dir, ec)) throw InputError(fmt::format("{} {}: no directory {}", flag, path, dir));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(fmt::format("{} {}: cannot write in {} ({})", flag, path, dir, std::strerror(errno)));
}

std::vector<std::string> resolve_plugins(const std::vector<std::string>& plugins) {
  std::vector<std::string> out;
  for (const auto& p : plugins) out.push_back(resolve_plugin_path(p));
  return out;
}

}  // namespace ulpgate
