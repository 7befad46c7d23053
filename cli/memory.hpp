// --max-memory: what a case needs in memory, found before anything is allocated, and the
// limit fuzz, sweep and replay hold every case to (README, "What ulpgate promises on bad
// input").
#pragma once

#include <cstdint>
#include <string>

#include "core/case.hpp"

namespace ulpgate {

/// What evaluating a case takes in memory, as check/runner.cpp, distributions/fill.cpp
/// and the references allocate it. Host: the input buffers (padding included) and the
/// fill's scratch (the values as doubles), the copies a run makes (a host kernel's inputs,
/// a device kernel's read-back), the outputs of the run, the repeat and a relation's run,
/// the relations' scaled inputs, and the reference's scratch (op(A) and op(B) packed, and
/// about 128 bytes per output element). Device: the buffers a device kernel gets.
struct MemoryNeed {
  std::uint64_t host = 0, device = 0;
  /// What dominates, for messages: "ldc = 16777216 pads C", "A is 10 x 1000000000 fp32".
  std::string largest;
};
/// c must be valid (validate(): its buffers are capped, so nothing overflows here).
MemoryNeed memory_need(const Case& c);

/// The least --max-memory accepted: a fuzz case (generated within distributions/case_gen's
/// element budget, --max-k up to 2^20) needs well below it, so the limit never stops one.
inline constexpr std::uint64_t kMinMaxMemory = 256'000'000;

/// Refuses a case whose memory_need().host is above limit bytes: InputError "case needs
/// 2.6 GB (ldc = 16777216 pads C), above --max-memory 1 GB".
void check_memory_need(const Case& c, std::uint64_t limit);

/// read_case_file, then check_memory_need with the path in front of its message.
Case read_case_within(const std::string& path, std::uint64_t limit);

/// Half the machine's physical memory (sysconf), the default --max-memory.
std::uint64_t default_max_memory();

/// Parses --max-memory: bytes ("1e9", "123456"), or with a unit: kB/MB/GB/TB (K, M, G, T:
/// powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024). InputError for anything else and
/// below kMinMaxMemory.
std::uint64_t parse_memory_size(const std::string& text);

/// "2.6 GB", "512 MB", "12 GB", "100 bytes": decimal units, one decimal below 10.
std::string format_bytes(std::uint64_t bytes);

}  // namespace ulpgate
