#include "check/result.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/hash.hpp"

namespace ulpgate {

std::string case_id(const std::string& kernel, const Case& c) {
  return fmt::format("{:016x}", fnv1a64(kernel + "\n" + to_json(c).dump()));
}

void stamp(CaseResult& r) {
  r.id = case_id(r.kernel, r.spec);
  r.signature = failure_signature(r.verdict);
}

}  // namespace ulpgate
