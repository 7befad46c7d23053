// Distribution specs: the text form of an input distribution, as used in case JSON
// ("dist": {"A": "normal(0,1)"}) and on the command line. A malformed spec throws InputError
// with one line naming the bad part. Grammar and families: see docs/concepts/cases.md.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ulpgate {

/// One parameter of a family: its name, default, allowed range and meaning.
struct ParamInfo {
  std::string_view name;
  double default_value;
  double min, max;        ///< allowed range, inclusive
  bool integer = false;   ///< must be a whole number
  std::string_view help;
};

/// Where a family may be used.
enum class Scope : unsigned char {
  Any,        ///< any input operand
  GemmAB,     ///< GEMM A and B only (gendot builds them together)
  GemmABC,    ///< GEMM A, B, C and attention K, V (amax scaling writes case.scales, which has no Q/bias)
  AttnQK,     ///< attention Q and K (built together)
  CombineLse, ///< attention_combine's LSE_part (partial log-sum-exps)
};

/// A distribution family: its name, parameters in positional order, a one-line description.
struct FamilyInfo {
  std::string_view name;
  std::vector<ParamInfo> params;
  std::string_view description;
  bool takes_base = false;  ///< wraps another spec, given as base=<spec> (default normal(0,1))
  Scope scope = Scope::Any;
};

/// Every family, in the order `ulpgate list` shows them.
const std::vector<FamilyInfo>& all_families();
/// The family called `name`, or nullptr.
const FamilyInfo* find_family(std::string_view name);

/// A parsed, validated spec: every parameter present (defaults filled in).
struct DistSpec {
  std::string family;
  std::map<std::string, double> params;
  std::shared_ptr<const DistSpec> base;  ///< wrappers only; never null for them
  std::string text;                      ///< the text it was parsed from (for messages)

  double operator[](const std::string& key) const { return params.at(key); }
  /// Canonical text: name(key=value, ...) with every parameter, %.17g numbers.
  std::string canonical() const;
};

/// The spec used for an input without one.
inline constexpr std::string_view kDefaultDist = "normal(0,1)";

/// Parses and validates a spec; throws InputError (one line, naming the bad part).
DistSpec parse_dist(std::string_view text);

/// Prints the family table for `ulpgate list`: name, parameters with defaults, description.
std::string describe_families();

}  // namespace ulpgate
