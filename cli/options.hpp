// Checks of the flags fuzz, sweep and replay share, each an InputError (exit 2) with one
// line naming the flag and what is wrong, run before anything starts or is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ulpgate {

/// --seed: a decimal integer in [0, 2^64 - 1]; "-1" or an overflowing one is an error
/// (strtoull would wrap both to 18446744073709551615).
std::uint64_t parse_seed(const std::string& text);

/// --time: finite and >= 0 (0: no budget); -5 and nan are errors, not "no budget".
void check_budget(double seconds);
/// The shortest --timeout: a shorter one would time out cases on a worker's own round trip
/// (inputs, reference, analysis), not on a hung kernel.
inline constexpr double kMinTimeoutSeconds = 1;
/// --timeout: finite and >= kMinTimeoutSeconds.
void check_timeout(double seconds);

/// --dtype: one of the formats (ulpgate list); "unknown dtype 'fp8' (one of fp64, ...)".
void check_dtype(const std::string& dtype);

/// --cases: 1 to kMaxCasesPerTarget.
inline constexpr std::int64_t kMaxCasesPerTarget = 1'000'000'000;
void check_cases(std::int64_t cases);

/// An output directory (--out of fuzz and sweep), checked before anything runs: an error
/// when the path is empty or names something that is not a directory, or when it (or the
/// nearest existing directory above it, where it is missing) is not writable. Creates
/// nothing.
void check_out_dir(const std::string& dir);
/// Creates it (and what is missing above it), as an InputError naming it when that fails.
void create_out_dir(const std::string& dir);

/// An output file (replay --out): an error when the path is empty or a directory, or when
/// its directory is missing or not writable. Nothing is written.
void check_output_file(const std::string& flag, const std::string& path);

/// --plugin paths as loaded and as reproducers name them: each checked and resolved
/// (kernels/plugin/loader.hpp, resolve_plugin_path).
std::vector<std::string> resolve_plugins(const std::vector<std::string>& plugins);

}  // namespace ulpgate
