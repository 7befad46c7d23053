#include "cli/memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "check/runner.hpp"

namespace ulpgate {
namespace {

// An operand buffer as the runner allocates it.
struct Buffer {
  std::uint64_t bytes = 0, logical = 0;  // all elements (padding included), logical elements
  std::string description;               // "ldc = 16777216 pads C" or "C is 10 x 7 fp32"
};

Buffer buffer_of(const Case& c, const std::string& op) {
  Buffer b;
  const Format f = c.types.at(op);
  if (c.op == Op::Gemm) {
    const MatrixView v = gemm_view(c, op);
    const std::int64_t packed = v.layout == Layout::RowMajor ? v.cols : v.rows;
    b.bytes = static_cast<std::uint64_t>(v.elements()) * storage_bytes(f);
    b.logical = static_cast<std::uint64_t>(v.batch * v.rows * v.cols);
    const std::string shape =
        v.batch > 1 ? fmt::format("{} x {} x {}", v.batch, v.rows, v.cols) : fmt::format("{} x {}", v.rows, v.cols);
    // Padding that makes up most of the buffer is what the message names.
    b.description = op != "bias" && v.ld > 2 * packed
                        ? fmt::format("ld{} = {} pads {}", static_cast<char>(std::tolower(op[0])), v.ld, op)
                        : fmt::format("{} is {} {}", op, shape, name(f));
  } else {
    const AttentionView v = attention_view(c, op);
    b.bytes = static_cast<std::uint64_t>(v.elements()) * storage_bytes(f);
    b.logical = static_cast<std::uint64_t>(v.elements());
    b.description = fmt::format("{} is {} x {} x {} x {} {}", op, v.batch, v.heads, v.seq, v.dim, name(f));
  }
  return b;
}

// Bytes per output element of the reference and the comparison: the exact value (a
// 130-bit MPFR midpoint), the condition, magnitude and bound doubles, the codes compared.
constexpr std::uint64_t kReferenceBytesPerOutput = 128;

}  // namespace

MemoryNeed memory_need(const Case& c) {
  std::vector<Buffer> in, out;
  for (const auto& op : c.inputs()) in.push_back(buffer_of(c, op));
  for (const auto& op : outputs_of(c)) out.push_back(buffer_of(c, op));
  std::uint64_t in_bytes = 0, out_bytes = 0, out_logical = 0, fill_scratch = 0;
  const Buffer* largest = nullptr;
  for (const Buffer& b : in) {
    in_bytes += b.bytes;
    fill_scratch = std::max<std::uint64_t>(fill_scratch, 8 * b.logical);
    if (!largest || b.bytes > largest->bytes) largest = &b;
  }
  for (const Buffer& b : out) {
    out_bytes += b.bytes, out_logical += b.logical;
    if (!largest || b.bytes > largest->bytes) largest = &b;
  }
  std::uint64_t reference = kReferenceBytesPerOutput * out_logical;
  if (c.op == Op::Gemm) {
    // op(A) rows and op(B) columns packed for the exact dot products: float, or double
    // when an operand is FP64.
    const auto& g = c.gemm;
    const bool fp64 = c.types.at("A") == Format::FP64 || c.types.at("B") == Format::FP64;
    reference += static_cast<std::uint64_t>(g.batch) * static_cast<std::uint64_t>(g.m + g.n) *
                 static_cast<std::uint64_t>(g.k) * (fp64 ? 8 : 4);
  } else {
    // One row of scores (MPFR values, about 64 bytes each) per thread.
    reference += 64ull * static_cast<std::uint64_t>(c.attention.seq_kv) * default_threads();
  }
  MemoryNeed need;
  need.host = 3 * in_bytes + 3 * out_bytes + fill_scratch + reference;
  need.device = in_bytes + out_bytes;
  if (largest) need.largest = largest->description;
  return need;
}

void check_memory_need(const Case& c, std::uint64_t limit) {
  const MemoryNeed need = memory_need(c);
  if (need.host <= limit) return;
  throw InputError(fmt::format("case needs {} ({}), above --max-memory {}", format_bytes(need.host), need.largest,
                               format_bytes(limit)));
}

Case read_case_within(const std::string& path, std::uint64_t limit) {
  Case c = read_case_file(path);
  try {
    check_memory_need(c, limit);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
  return c;
}

std::uint64_t default_max_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 8'000'000'000;  // unknown: a small machine's half
  return std::max<std::uint64_t>(kMinMaxMemory, static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2);
}

std::uint64_t parse_memory_size(const std::string& text) {
  const auto bad = [&] {
    return InputError(fmt::format("--max-memory '{}': expected a size such as 12GB, 512MiB or 1e9", text));
  };
  const char* begin = text.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(number) || number < 0 || std::isspace(static_cast<unsigned char>(text[0]))) throw bad();
  std::string unit(end);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (!unit.empty() && unit[0] == ' ') unit.erase(0, 1);
  double scale = 0;
  const std::pair<const char*, double> units[] = {
      {"", 1},        {"b", 1},         {"k", 1e3},         {"kb", 1e3},        {"m", 1e6},          {"mb", 1e6},
      {"g", 1e9},     {"gb", 1e9},      {"t", 1e12},        {"tb", 1e12},       {"kib", 1024.0},     {"mib", 1048576.0},
      {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [u, s] : units)
    if (unit == u) scale = s;
  if (scale == 0) throw bad();
  const double bytes = number * scale;
  if (bytes >= 1.8e19) throw bad();  // beyond 64 bits
  if (bytes < static_cast<double>(kMinMaxMemory))
    throw InputError(fmt::format("--max-memory {}: below the least a case needs here ({})", text, format_bytes(kMinMaxMemory)));
  return static_cast<std::uint64_t>(bytes);
}

std::string format_bytes(std::uint64_t bytes) {
  if (bytes < 1000) return fmt::format("{} bytes", bytes);
  const char* units[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  double x = static_cast<double>(bytes);
  int u = -1;
  while (x >= 1000 && u < 5) x /= 1000, ++u;
  std::string number = x < 10 ? fmt::format("{:.1f}", x) : fmt::format("{:.0f}", x);
  if (number.size() > 2 && number.compare(number.size() - 2, 2, ".0") == 0) number.resize(number.size() - 2);
  return number + " " + units[u];
}

}  // namespace ulpgate
