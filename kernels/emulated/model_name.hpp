// The names of the CPU models ("base:key=value,flag,..."): their base, their parameters in
// order, and the integer check every model's parser shares. docs/kernels/cpu-models.md.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"

namespace ulpgate::model_name {

struct Param {
  std::string text;   ///< as written, "block=64" or "exp2"
  std::string key;    ///< before '=' (the whole text for a flag)
  std::string value;  ///< after '=' ("" for a flag)
  bool flag = false;  ///< no '='
};

/// What comes before the ':' (the whole name without one).
inline std::string base(const std::string& name) { return name.substr(0, name.find(':')); }

/// The comma-separated parameters after the ':', in order.
inline std::vector<Param> params(const std::string& name) {
  std::vector<Param> out;
  const auto colon = name.find(':');
  std::string rest = colon == std::string::npos ? "" : name.substr(colon + 1);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    Param p;
    p.text = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    const auto eq = p.text.find('=');
    p.key = p.text.substr(0, eq);
    p.flag = eq == std::string::npos;
    p.value = p.flag ? "" : p.text.substr(eq + 1);
    out.push_back(std::move(p));
  }
  return out;
}

/// p's value as an integer in [lo, hi]; InputError naming the model and the key otherwise.
inline int integer(const std::string& name, const Param& p, int lo, int hi) {
  char* end = nullptr;
  const long v = std::strtol(p.value.c_str(), &end, 10);
  if (p.value.empty() || *end || v < lo || v > hi)
    throw InputError(fmt::format("kernel '{}': {} must be an integer in [{}, {}], got '{}'", name, p.key, lo, hi, p.value));
  return static_cast<int>(v);
}

}  // namespace ulpgate::model_name
