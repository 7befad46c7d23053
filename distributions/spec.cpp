#include "distributions/spec.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace ulpgate {
namespace {

constexpr double kBig = 1e300;

std::vector<FamilyInfo> make_families() {
  using P = ParamInfo;
  return {
      {"uniform", {P{"lo", -1, -kBig, kBig, false, "lower end"}, P{"hi", 1, -kBig, kBig, false, "upper end"}},
       "uniform on [lo, hi)"},
      {"normal", {P{"mean", 0, -kBig, kBig, false, ""}, P{"std", 1, 0, kBig, false, ""}},
       "normal (Gaussian)"},
      {"lognormal", {P{"mu", 0, -700, 700, false, "mean of log"}, P{"sigma", 1, 0, 100, false, "std of log"}},
       "exp(normal(mu, sigma)): all positive, heavy right tail"},
      {"student_t", {P{"nu", 3, 0.1, 1e6, false, "degrees of freedom"}, P{"scale", 1, 0, kBig, false, ""}},
       "Student-t with nu degrees of freedom (heavy tails; variance nu/(nu-2) for nu > 2)"},
      {"cauchy", {P{"loc", 0, -kBig, kBig, false, ""}, P{"scale", 1, 0, kBig, false, ""}},
       "Cauchy (no mean, no variance)"},
      {"activations",
       {P{"std", 1, 0, kBig, false, ""}, P{"rate", 0.01, 0, 1, false, "fraction of outlier channels"},
        P{"scale", 20, 0, kBig, false, "outlier channel magnitude factor"}},
       "LLM activations: normal(0, std) with a fraction `rate` of feature channels scaled by `scale`"},
      {"weights",
       {P{"gain", 1, 0, kBig, false, ""}, P{"fan_in", 0, 0, 1e12, true, "0: the reduction length"}},
       "layer weights: normal(0, gain / sqrt(fan_in))"},
      {"softmax", {P{"std", 2, 0, 30, false, "std of the logits"}},
       "post-softmax probabilities: softmax of normal(0, std) logits along the reduction axis"},
      {"sparse", {P{"density", 0.1, 0, 1, false, "fraction of nonzeros"}, P{"std", 1, 0, kBig, false, ""}},
       "sparse: normal(0, std) with probability density, else 0"},
      {"relu", {P{"mean", 0, -kBig, kBig, false, ""}, P{"std", 1, 0, kBig, false, ""}},
       "ReLU-like: max(0, normal(mean, std))"},
      {"positive", {P{"std", 1, 0, kBig, false, ""}},
       "all positive: |normal(0, std)| (half-normal)"},
      {"gendot",
       {P{"cond", 1e12, 2, 1e300, false, "condition number 2 sum|a b| / |a.b|"},
        P{"pairs", 1, 1, 4096, true, "distinct row/column pairs per batch"}},
       "ill-conditioned GEMM (Ogita-Rump-Oishi GenDot): op(A) row i and op(B) column j built "
       "together; dot products with i = j mod pairs hit cond (pairs=1: all of them)",
       false, Scope::GemmAB},
      {"near_overflow",
       {P{"lo", 0.25, 0, 1, false, "fraction of max finite"}, P{"hi", 1, 0, 1, false, "fraction of max finite"}},
       "magnitudes uniform in [lo, hi] x the operand format's max finite, random sign"},
      {"subnormal", {P{"rate", 0.5, 0, 1, false, "fraction of subnormals"}},
       "subnormal-heavy: uniform subnormal codes of the operand format w.p. rate, else in [min normal, 16 min normal)"},
      {"specials",
       {P{"nan", 1e-4, 0, 1, false, "NaN rate"}, P{"inf", 1e-4, 0, 1, false, "+-Inf rate (0 for e4m3)"},
        P{"negzero", 0.01, 0, 1, false, "-0 rate"}},
       "special-value injection into base: NaN, +-Inf, -0 at the given rates", true},
      {"outliers",
       {P{"rate", 0.001, 0, 1, false, "fraction of elements"}, P{"scale", 100, 0, kBig, false, "factor"}},
       "base with a fraction `rate` of elements multiplied by `scale`", true},
      {"amax",
       {P{"frac", 1, 1e-30, 1, false, "target max as a fraction of the format's max finite"},
        P{"per_head", 0, 0, 1, true, "1: a scale per K/V head (attention K, V; case.head_scales)"},
        P{"spread", 0, 0, 30, false, "per_head=1: head h's values times 2^(spread u_h), u_h uniform in [-1, 1) by the seed"}},
       "FP8 amax scaling of base: stored = value / scale with max |stored| = "
       "frac x max finite; scale goes to case.scales (stored x scale = value, as cuBLASLt), "
       "or one per K/V head to case.head_scales with per_head=1 (heads of ranges up to 2^spread apart). "
       "On a non-FP8 operand: base itself, unscaled (scales are FP8-only)",
       true, Scope::GemmABC},
      {"logits", {P{"std", 1, 0, 1e6, false, "std of the scaled logits"}},
       "attention Q and K: normal, scaled so the logits softmax_scale * q.k have std `std` (temperature)",
       false, Scope::AttnQK},
      {"sink",
       {P{"logit", 16, -1e6, 1e6, false, "sink logit"}, P{"key", 0, 0, 1e12, true, "sink key position"},
        P{"std", 1, 0, 1e6, false, "std of the other logits"}},
       "attention sink: logits(std) plus one key whose logit with every query is about `logit`",
       false, Scope::AttnQK},
      {"masked",
       {P{"frac", 0.25, 0, 1, false, "fraction of batches fully masked (at least one)"},
        P{"std", 1, 0, 1e6, false, "std of the logits"}},
       "fully masked rows: logits(std), and case kv_lengths set to 0 for a fraction of batches",
       false, Scope::AttnQK},
      {"lse",
       {P{"mean", 4, -1e6, 1e6, false, ""}, P{"std", 4, 0, 1e6, false, ""},
        P{"empty", 0.1, 0, 1, false, "fraction of -inf (empty splits)"},
        P{"step", 0, 0, 1e6, false, "round to multiples of step (equal LSEs across splits); 0: none"}},
       "attention_combine LSE_part: partial log-sum-exps, normal(mean, std), -inf for a fraction `empty`", false,
       Scope::CombineLse},
      {"exact",
       {P{"max", 0, 0, 0x1p53, true, "largest |integer|; 0: auto (exact sums, docs/concepts/cases.md)"},
        P{"frac", 0, 0, 60, true, "fraction bits"}},
       "exact by construction: integers in [-max, max] times 2^-frac, so any correct kernel is bit-exact"},
  };
}

[[noreturn]] void bad(std::string_view text, const std::string& what) {
  throw InputError(fmt::format("dist \"{}\": {}", text, what));
}

bool is_name_char(char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; }

// Recursive-descent parser over the whole text; `full` is kept for messages.
class Parser {
 public:
  explicit Parser(std::string_view full) : full_(full) {}

  DistSpec parse_top() {
    DistSpec s = parse_spec(0);
    skip_ws();
    if (pos_ != full_.size())
      bad(full_, fmt::format("unexpected \"{}\" after the spec", full_.substr(pos_)));
    return s;
  }

 private:
  void skip_ws() {
    while (pos_ < full_.size() && std::isspace(static_cast<unsigned char>(full_[pos_]))) ++pos_;
  }

  // Levels 0..kMaxDepth, default bases included: a spec's canonical text (which spells the
  // default base out) must parse back, so a wrapper may not sit at the deepest level.
  static constexpr int kMaxDepth = 4;

  DistSpec parse_spec(int depth) {
    if (depth > kMaxDepth) bad(full_, "specs nested too deeply");
    skip_ws();
    const std::size_t start = pos_;
    while (pos_ < full_.size() && is_name_char(full_[pos_])) ++pos_;
    const std::string name(full_.substr(start, pos_ - start));
    if (name.empty()) {
      if (depth == 0) bad(full_, "expected a distribution name");
      bad(full_, "expected a distribution name after base=");
    }
    const FamilyInfo* fam = find_family(name);
    if (!fam) throw InputError(fmt::format("unknown distribution \"{}\" (see ulpgate list)", name));

    DistSpec spec;
    spec.family = name;
    std::map<std::string, double> given;
    bool named_seen = false;
    skip_ws();
    if (pos_ < full_.size() && full_[pos_] == '(') {
      ++pos_;
      skip_ws();
      if (pos_ < full_.size() && full_[pos_] == ')') {
        ++pos_;
      } else {
        for (int arg = 1;; ++arg) {
          parse_arg(*fam, arg, given, spec, depth, named_seen);
          skip_ws();
          if (pos_ >= full_.size()) bad(full_, "missing \")\"");
          if (full_[pos_] == ',') {
            ++pos_;
            continue;
          }
          if (full_[pos_] == ')') {
            ++pos_;
            break;
          }
          bad(full_, fmt::format("unexpected \"{}\" in argument {}", full_.substr(pos_, 1), arg));
        }
      }
    }
    for (const ParamInfo& p : fam->params) {
      auto it = given.find(std::string(p.name));
      const double v = it == given.end() ? p.default_value : it->second;
      if (!(v >= p.min && v <= p.max))
        bad(full_, fmt::format("{} must be in [{:g}, {:g}], got {:g}", p.name, p.min, p.max, v));
      if (p.integer && v != std::floor(v))
        bad(full_, fmt::format("{} must be a whole number, got {:g}", p.name, v));
      spec.params[std::string(p.name)] = v;
    }
    check_relations(spec);
    if (fam->takes_base && !spec.base && depth == kMaxDepth)
      bad(full_, fmt::format("specs nested too deeply ({} at level {} needs a base at level {}; at most {})",
                             name, depth + 1, depth + 2, kMaxDepth + 1));
    if (fam->takes_base && !spec.base)
      spec.base = std::make_shared<const DistSpec>(parse_dist(kDefaultDist));
    return spec;
  }

  void parse_arg(const FamilyInfo& fam, int arg, std::map<std::string, double>& given, DistSpec& spec,
                 int depth, bool& named_seen) {
    skip_ws();
    // key=value?
    std::size_t p = pos_;
    while (p < full_.size() && is_name_char(full_[p])) ++p;
    std::size_t q = p;
    while (q < full_.size() && std::isspace(static_cast<unsigned char>(full_[q]))) ++q;
    std::string key;
    if (p > pos_ && q < full_.size() && full_[q] == '=') {
      key = std::string(full_.substr(pos_, p - pos_));
      pos_ = q + 1;
      skip_ws();
    }
    if (key == "base") {
      if (!fam.takes_base) bad(full_, fmt::format("{} takes no base distribution", fam.name));
      if (spec.base) bad(full_, "base given twice");
      DistSpec b = parse_spec(depth + 1);
      const FamilyInfo* bf = find_family(b.family);
      if (bf->scope != Scope::Any || b.family == "amax")
        bad(full_, fmt::format("{} cannot be a base (it is built at the case level)", b.family));
      spec.base = std::make_shared<const DistSpec>(std::move(b));
      return;
    }
    // The value: a number up to the next ',' or ')'.
    std::size_t end = pos_;
    while (end < full_.size() && full_[end] != ',' && full_[end] != ')') ++end;
    std::string value(full_.substr(pos_, end - pos_));
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) value.pop_back();
    if (value.empty()) {
      if (!key.empty()) bad(full_, fmt::format("empty value for {}", key));
      bad(full_, fmt::format("empty argument {}", arg));
    }
    char* stop = nullptr;
    errno = 0;
    const double v = std::strtod(value.c_str(), &stop);
    if (stop != value.c_str() + value.size() || !std::isfinite(v) || errno == ERANGE) {
      if (key.empty()) bad(full_, fmt::format("argument {} \"{}\" is not a finite number", arg, value));
      bad(full_, fmt::format("{} \"{}\" is not a finite number", key, value));
    }
    pos_ = end;
    if (key.empty()) {
      // Positional: the arg-th parameter (base never counts).
      if (named_seen)
        bad(full_, fmt::format("positional argument {} after a named one", arg));
      if (static_cast<std::size_t>(arg) > fam.params.size())
        bad(full_, fmt::format("{} takes at most {} argument{}, got {}", fam.name, fam.params.size(),
                               fam.params.size() == 1 ? "" : "s", arg));
      key = std::string(fam.params[arg - 1].name);
    } else {
      named_seen = true;
      bool known = false;
      std::string names;
      for (const ParamInfo& pi : fam.params) {
        known |= pi.name == key;
        names += (names.empty() ? "" : ", ") + std::string(pi.name);
      }
      if (fam.takes_base) names += ", base";
      if (!known)
        bad(full_, fmt::format("unknown parameter \"{}\" ({} takes {})", key, fam.name,
                               names.empty() ? "no parameters" : names));
    }
    if (given.count(key)) bad(full_, fmt::format("{} given twice", key));
    given[key] = v;
  }

  void check_relations(const DistSpec& s) {
    if ((s.family == "uniform" || s.family == "near_overflow") && s["lo"] > s["hi"])
      bad(full_, fmt::format("lo must be <= hi, got lo={:g} hi={:g}", s["lo"], s["hi"]));
    if (s.family == "specials" && s["nan"] + s["inf"] + s["negzero"] > 1.0)
      bad(full_, "nan + inf + negzero must be <= 1");
  }

  std::string_view full_;
  std::size_t pos_ = 0;
};

}  // namespace

const std::vector<FamilyInfo>& all_families() {
  static const std::vector<FamilyInfo> families = make_families();
  return families;
}

const FamilyInfo* find_family(std::string_view name) {
  for (const FamilyInfo& f : all_families())
    if (f.name == name) return &f;
  return nullptr;
}

DistSpec parse_dist(std::string_view text) {
  // A control character (NUL included) is never part of a spec; the message shows it
  // escaped rather than writing it raw into a one-line error.
  if (const std::string problem = control_character_problem(text); !problem.empty())
    throw InputError("dist: " + problem);
  DistSpec s = Parser(text).parse_top();
  s.text = std::string(text);
  return s;
}

std::string DistSpec::canonical() const {
  std::string out = family + "(";
  bool first = true;
  for (const ParamInfo& p : find_family(family)->params) {
    out += fmt::format("{}{}={:.17g}", first ? "" : ",", p.name, params.at(std::string(p.name)));
    first = false;
  }
  if (base) out += fmt::format("{}base={}", first ? "" : ",", base->canonical());
  return out + ")";
}

std::string describe_families() {
  std::string out = "distributions (spec: name(args), positional or key=value; default normal(0,1)):\n";
  for (const FamilyInfo& f : all_families()) {
    std::string params;
    for (const ParamInfo& p : f.params)
      params += fmt::format("{}{}={:g}", params.empty() ? "" : ", ", p.name, p.default_value);
    if (f.takes_base) params += std::string(params.empty() ? "" : ", ") + "base=normal(0,1)";
    const char* where = f.scope == Scope::GemmAB    ? " [GEMM A+B]"
                        : f.scope == Scope::GemmABC ? " [GEMM A, B, C; attention K, V]"
                        : f.scope == Scope::AttnQK  ? " [attention Q+K]"
                                                    : "";
    out += fmt::format("  {}({})\n      {}{}\n", f.name, params, f.description, where);
  }
  return out;
}

}  // namespace ulpgate
