#include "cli/startup.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ulpgate {

namespace {

// Whether the verb this command line names touches at most a few hundred megabytes (or no
// verb is named: --help, --version, bad usage). The first argument that is a verb's name
// decides.
bool light_command(int argc, char** argv) {
  static const char* const kHeavy[] = {"sweep", "fuzz", "replay", "check", "probe", "bench", "worker"};
  static const char* const kLight[] = {"list", "merge", "export", "gate", "baseline", "report"};
  for (int i = 1; i < argc; ++i) {
    for (const char* v : kHeavy)
      if (std::strcmp(argv[i], v) == 0) return false;
    for (const char* v : kLight)
      if (std::strcmp(argv[i], v) == 0) return true;
  }
  return true;
}

}  // namespace

// glibc reads its tunables once, at start-up, hence the restart. A 4096^2 sweep point
// touches gigabytes of fresh memory; in 4 KiB pages the faults alone took a third of its
// time. A restart costs a second start of the process (cuBLASLt's initialisers alone take
// about 0.3 s), so the light verbs, which the PyTorch loops and scripts call per case, skip it.
void restart_with_huge_pages(int argc, char** argv) {
  if (std::getenv("ULPGATE_NO_REEXEC") || light_command(argc, argv)) return;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.hugetlb")) return;
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return;
  char mode[128] = {};
  const bool madvise = std::fgets(mode, sizeof mode, f) && std::strstr(mode, "[madvise]");
  std::fclose(f);
  if (!madvise) return;
  const std::string value = tunables && *tunables ? std::string(tunables) + ":glibc.malloc.hugetlb=1" : "glibc.malloc.hugetlb=1";
  if (::setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
}

}  // namespace ulpgate
