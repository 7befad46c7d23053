// The process's first step: malloc asked for transparent huge pages where the kernel gives
// them on request.
#pragma once

namespace ulpgate {

/// Where transparent huge pages are given on request (madvise mode), starts this program
/// again once with glibc's malloc asking for them; ULPGATE_NO_REEXEC=1 keeps the first
/// process (debuggers, valgrind). Returns where nothing is to be done or the restart fails.
/// main calls it once the command line names a verb that may touch gigabytes
/// (Verb::large_memory): a restart costs a second start (cuBLASLt's initialisers alone take
/// about 0.3 s).
void restart_with_huge_pages(char** argv);

}  // namespace ulpgate
