// Error types that the CLI maps to exit codes (README, Exit codes).
#pragma once

#include <stdexcept>
#include <string>

namespace ulpgate {

/// Bad usage or bad input (a malformed case, spec, flag or file): exit code 2.
/// The message is one line that names what is wrong, e.g.
/// "case.gemm.m: must be a positive integer, got -3".
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ulpgate
