// The process's first step: malloc asked for transparent huge pages where the kernel gives
// them on request.
#pragma once

namespace ulpgate {

/// Where transparent huge pages are given on request (madvise mode), starts this program
/// again once with glibc's malloc asking for them, for the verbs that may touch gigabytes
/// (sweep, fuzz, replay, check, probe, bench and the worker); ULPGATE_NO_REEXEC=1 keeps the
/// first process (debuggers, valgrind). Returns where nothing is to be done or the restart
/// fails.
void restart_with_huge_pages(int argc, char** argv);

}  // namespace ulpgate
