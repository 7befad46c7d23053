#include "reports/common.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/format.hpp"

namespace ulpgate::report {

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    int len = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) len = 1, cp = c;
    else if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      ok = (p[i + k] & 0xc0) == 0x80;
      cp = cp << 6 | (p[i + k] & 0x3f);
    }
    // Overlong forms, surrogates and values above U+10FFFF are not UTF-8 either.
    static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

std::string escape_html(std::string_view s) {
  std::string out;
  for (char c : valid_utf8(s)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string escape_xml(std::string_view s) {
  std::string out;
  for (char c : valid_utf8(s)) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      // Newlines in attribute values would be normalised to spaces by XML parsers; as
      // character references they survive.
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      case '\t': out += "&#9;"; break;
      default:
        if (u < 0x20 || u == 0x7f) out += "\xef\xbf\xbd";
        else out += c;
    }
  }
  return out;
}

std::string escape_markdown(std::string_view s) {
  std::string out;
  for (char c : valid_utf8(s)) {
    if (c == '\n' || c == '\r' || c == '\t') {
      out += ' ';
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += "\xef\xbf\xbd";
    } else if (std::string_view("\\`*_[]<>!|~&").find(c) != std::string_view::npos) {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  return out;
}

std::string markdown_code(std::string_view s, bool in_table) {
  std::string body;
  std::size_t run = 0, longest = 0;
  for (char c : valid_utf8(s)) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    if (in_table && c == '|') body += '\\';
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      body += "\xef\xbf\xbd";
      continue;
    }
    body += c;
  }
  if (body.empty()) return "";
  const std::string fence(longest + 1, '`');
  // A space on each side keeps a leading or trailing backtick of s out of the fence.
  return fence + " " + body + " " + fence;
}

std::string number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return fmt::format("{:.3g}", x);
}

Outcome outcome(const CaseResult& c) {
  switch (c.status) {
    case Disposition::NotSupported: return Outcome::Skipped;
    case Disposition::Failed:
    case Disposition::Crashed:
    case Disposition::TimedOut: return Outcome::Error;
    case Disposition::Ok: break;
  }
  return c.verdict.passed ? Outcome::Passed : Outcome::Failure;
}

std::string_view name(Outcome o) {
  switch (o) {
    case Outcome::Error: return "error";
    case Outcome::Failure: return "failed";
    case Outcome::Skipped: return "skipped";
    case Outcome::Passed: return "passed";
  }
  return "?";
}

CaseFigures figures(const CaseResult& c) {
  CaseFigures f;
  // NaN metrics must show, not vanish in a max: fmax would drop them.
  const auto worse = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); };
  for (const auto& m : c.metrics) {
    f.max_normalised = f.any_metrics ? worse(f.max_normalised, m.max_normalised) : m.max_normalised;
    f.max_ulp = f.any_metrics ? worse(f.max_ulp, m.max_ulp) : m.max_ulp;
    f.max_ulp_distance = std::max(f.max_ulp_distance, m.max_ulp_distance);
    f.unexpected_nan += m.unexpected_nan;
    f.unexpected_inf += m.unexpected_inf;
    f.missed_nonfinite += m.missed_nonfinite;
    f.mismatched_nonfinite += m.mismatched_nonfinite;
    f.overflowed += m.overflowed;
    f.expected_nonfinite += m.expected_nonfinite;
    f.any_metrics = true;
  }
  return f;
}

std::string nonfinite_summary(const CaseFigures& f) {
  std::vector<std::string> parts;
  if (f.unexpected_nan) parts.push_back(fmt::format("{} unexpected NaN", f.unexpected_nan));
  if (f.unexpected_inf) parts.push_back(fmt::format("{} unexpected Inf", f.unexpected_inf));
  if (f.missed_nonfinite) parts.push_back(fmt::format("{} missed", f.missed_nonfinite));
  if (f.mismatched_nonfinite) parts.push_back(fmt::format("{} mismatched", f.mismatched_nonfinite));
  if (f.overflowed) parts.push_back(fmt::format("{} overflowed (NaN, max finite or zeroed)", f.overflowed));
  if (f.expected_nonfinite) parts.push_back(fmt::format("{} expected", f.expected_nonfinite));
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

std::vector<std::size_t> failures_first(const RunRecord& r) {
  std::vector<std::size_t> order(r.cases.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return static_cast<int>(outcome(r.cases[a])) < static_cast<int>(outcome(r.cases[b]));
  });
  return order;
}

std::string counts_line(const RunRecord& r) {
  std::int64_t n[4] = {}, cases = 0;
  for (const auto& c : r.cases)
    if (!c.shrunk()) ++n[static_cast<int>(outcome(c))], ++cases;
  return fmt::format("{} case{}: {} passed, {} failed, {} skipped (not supported), {} error{} (failed to run, "
                     "crashed or timed out)",
                     cases, cases == 1 ? "" : "s", n[3], n[1], n[2], n[0], n[0] == 1 ? "" : "s");
}

std::int64_t not_run_cases(const RunRecord& r) {
  std::int64_t n = 0;
  for (const auto& x : r.not_run) n += x.planned - x.run;
  return n;
}

std::vector<DistinctFailure> distinct_failures(const RunRecord& r) {
  std::vector<DistinctFailure> out;
  for (std::size_t i = 0; i < r.cases.size(); ++i) {
    const CaseResult& c = r.cases[i];
    if (c.verdict.passed || c.shrunk()) continue;
    const std::string sig = c.signature.empty() ? failure_signature(c.verdict) : c.signature;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const DistinctFailure& d) { return d.kernel == c.kernel && same_failure(d.signature, sig); });
    if (it == out.end()) {
      out.push_back({c.kernel, sig, {}, i, std::nullopt});
      it = out.end() - 1;
    }
    it->cases.push_back(i);
  }
  for (std::size_t i = 0; i < r.cases.size(); ++i) {
    const CaseResult& c = r.cases[i];
    const auto from = c.notes.find("shrunk_from");
    if (!c.shrunk() || from == c.notes.end()) continue;
    for (auto& d : out)
      for (std::size_t k : d.cases)
        if (r.cases[k].id == from->second && !d.shrunk) d.shrunk = i;
  }
  return out;
}

Headline headline(const RunRecord& r) {
  std::int64_t failed = 0, cases = 0;
  for (const auto& c : r.cases)
    if (!c.shrunk()) failed += !c.verdict.passed, ++cases;
  const std::int64_t missing = not_run_cases(r);
  Headline h;
  std::vector<std::string> parts;
  if (failed) {
    const auto distinct = distinct_failures(r).size();
    parts.push_back(fmt::format("{} of {} cases failed ({} distinct failure{})", failed, cases, distinct,
                                distinct == 1 ? "" : "s"));
  } else {
    parts.push_back(fmt::format("{} case{}, none failed", cases, cases == 1 ? "" : "s"));
  }
  if (missing)
    parts.push_back(fmt::format("{} planned cases not run ({} target{} cut short: {})", missing, r.not_run.size(),
                                r.not_run.size() == 1 ? "" : "s", r.not_run.front().reason));
  h.verdict = failed ? "FAIL" : missing ? "PARTIAL" : "PASS";
  h.text = fmt::format("{}", fmt::join(parts, "; "));
  return h;
}

std::vector<TargetSummary> target_summaries(const RunRecord& r) {
  std::vector<TargetSummary> out;
  std::vector<std::int64_t> biased;  // cases with metrics, per row
  const auto row = [&](const std::string& kernel, const std::string& dtype) -> TargetSummary& {
    for (std::size_t i = 0; i < out.size(); ++i)
      if (out[i].kernel == kernel && out[i].dtype == dtype) return out[i];
    out.push_back({kernel, dtype});
    biased.push_back(0);
    return out.back();
  };
  const auto dtype_of = [](const std::string& target) {
    const auto a = target.rfind(' ');
    const auto b = a == std::string::npos ? std::string::npos : target.rfind(' ', a - 1);
    return b == std::string::npos ? std::string() : target.substr(b + 1, a - b - 1);
  };
  for (const auto& t : r.campaign.targets) row(t.substr(0, t.rfind(' ', t.rfind(' ') - 1)), dtype_of(t));
  for (const auto& c : r.cases) {
    if (c.shrunk()) continue;  // the minimal form of a failure counted already
    std::string dtype = dtype_of(c.target);
    if (dtype.empty()) {
      const auto t = c.spec.types.find(primary_input(c.spec.op));
      dtype = t == c.spec.types.end() ? "?" : std::string(name(t->second));
    }
    TargetSummary& s = row(c.kernel, dtype);
    const std::size_t at = static_cast<std::size_t>(&s - out.data());
    ++s.cases;
    s.failed += !c.verdict.passed;
    double bias = 0;
    for (const auto& m : c.metrics) {
      if (m.compared == 0) continue;
      s.worst_normalised = std::max(s.worst_normalised, m.max_normalised);
      s.worst_ulp = std::max(s.worst_ulp, m.max_ulp);
      bias += m.bias_ulp / static_cast<double>(c.metrics.size());
    }
    if (!c.metrics.empty()) {
      ++biased[at];
      s.bias_ulp += (bias - s.bias_ulp) / static_cast<double>(biased[at]);
    }
  }
  for (const auto& n : r.not_run) row(n.target.substr(0, n.target.rfind(' ', n.target.rfind(' ') - 1)), dtype_of(n.target)).not_run += n.planned - n.run;
  return out;
}

double unit_roundoff(std::string_view format) {
  const auto f = parse_format(format);
  return f ? std::ldexp(1.0, -(info(*f).frac_bits + 1)) : 0.0;
}

}  // namespace ulpgate::report
