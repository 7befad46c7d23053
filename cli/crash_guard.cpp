#include "cli/crash_guard.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "campaign/isolate.hpp"
#include "cli/exit.hpp"

namespace ulpgate {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
struct sigaction g_previous[sizeof kSignals / sizeof kSignals[0]];
// Written before the kernel runs: the handler may only write() and _exit().
char g_head[512], g_tail[512];
// The handler's own stack, so that a kernel that overflows its stack is named too.
char g_stack[1 << 16];

void write_str(const char* s) {
  for (std::size_t n = std::strlen(s); n > 0;) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= static_cast<std::size_t>(w);
  }
}

void on_crash(int sig) {
  const char* name = known_signal_name(sig);
  write_str(g_head);
  write_str(name ? name : "a signal");
  write_str(g_tail);
  ::_exit(code(Exit::Failed));  // a kernel crash is the kernel's failure, not ulpgate's
}

}  // namespace

KernelCrashGuard::KernelCrashGuard(const std::string& verb, const std::string& kernel) {
  std::snprintf(g_head, sizeof g_head, "ulpgate: error: kernel '%s' crashed (", kernel.c_str());
  std::snprintf(g_tail, sizeof g_tail, ") during %s, in this process; 'ulpgate fuzz --kernel %s' checks it in a worker "
                "process\n", verb.c_str(), kernel.c_str());
  stack_t ss{};
  ss.ss_sp = g_stack;
  ss.ss_size = sizeof g_stack;
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) ::sigaction(kSignals[i], &sa, &g_previous[i]);
}

KernelCrashGuard::~KernelCrashGuard() {
  for (std::size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
}

}  // namespace ulpgate
