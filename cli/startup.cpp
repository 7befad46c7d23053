#include "cli/startup.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ulpgate {

// glibc reads its tunables once, at start-up, hence the restart. A 4096^2 sweep point
// touches gigabytes of fresh memory; in 4 KiB pages the faults alone took a third of its
// time.
void restart_with_huge_pages(char** argv) {
  if (std::getenv("ULPGATE_NO_REEXEC")) return;
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
