// ulpgate's exit codes, one set for every verb (README, "Exit codes").
#pragma once

namespace ulpgate {

enum class Exit : int {
  Ok = 0,        ///< everything asked passed
  Failed = 1,    ///< a check failed, a kernel failed or crashed, or the gate found a regression
  Usage = 2,     ///< bad usage or bad input, told in one line on stderr
  Internal = 3,  ///< an internal error: a bug of ulpgate or a broken environment
};

/// The process exit status of e.
constexpr int code(Exit e) { return static_cast<int>(e); }

/// The more serious of two outcomes (their codes ordered as above).
constexpr Exit worst(Exit a, Exit b) { return code(a) >= code(b) ? a : b; }

/// Ctrl-C or SIGTERM ended a campaign: the shell's 128 + SIGINT, exited with from the
/// signal handler only, so it is not an outcome a verb returns.
inline constexpr int kInterruptedStatus = 130;

}  // namespace ulpgate
