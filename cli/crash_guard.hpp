// bench and probe call kernels in this process (timing and the probe's many small runs
// would not survive a worker round trip each): a kernel that crashes it is named on one
// line, exit 1 (a kernel failure, README "exit codes"), instead of a death by signal.
#pragma once

#include <string>

namespace ulpgate {

/// While alive, SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT print "ulpgate: error: kernel
/// 'NAME' crashed (SIGSEGV) during VERB; ..." and exit 1. Restores the previous handlers.
class KernelCrashGuard {
 public:
  KernelCrashGuard(const std::string& verb, const std::string& kernel);
  ~KernelCrashGuard();
  KernelCrashGuard(const KernelCrashGuard&) = delete;
  KernelCrashGuard& operator=(const KernelCrashGuard&) = delete;
};

}  // namespace ulpgate
