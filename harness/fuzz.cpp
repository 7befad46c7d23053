#include "harness/fuzz.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>
#include <rapidcheck/detail/TestListenerAdapter.h>

#include "distributions/case_gen.hpp"
#include "distributions/fill.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "harness/isolate.hpp"
#include "harness/journal.hpp"

namespace rc::detail {
// Defined in librapidcheck (detail/Configuration.cpp) but not declared in its headers:
// the string RC_PARAMS="reproduce=..." takes.
std::string reproduceMapToString(const std::unordered_map<std::string, Reproduce>& reproduceMap);
}  // namespace rc::detail

namespace ulpgate {
namespace {

constexpr int kMaxShrinkSteps = 400;
constexpr const char* kDtypes[] = {"fp32", "tf32", "fp16", "bf16", "e4m3", "e5m2", "fp64"};

// A generated case for the target: shapes on tile edges, layouts, padding, scalars and
// epilogues as distributions/case_gen.hpp draws them, each choice kept only if the kernel
// supports it (so library restrictions such as FP8's "TN" form do not waste the budget),
// then input distributions drawn for the final types.
rc::Gen<Case> target_case(const FuzzTarget& t, const Kernel& k, std::int64_t max_k, bool gelu) {
  return rc::gen::exec([t, &k, max_k, gelu]() {
    Case c = dtype_gemm_case(t.dtype, 1, 1, 1);
    c.kernel = k.name();
    auto keep_if_supported = [&](auto apply, auto revert) {
      apply();
      if (k.unsupported(c)) revert();
    };
    auto& g = c.gemm;
    g.k = *gen::dim(max_k);
    if (t.dtype == "e4m3" || t.dtype == "e5m2") g.k = std::max<std::int64_t>(16, (g.k + 15) / 16 * 16);
    const std::int64_t side = std::max<std::int64_t>(1, std::min<std::int64_t>(96, gen::kElementBudget / g.k));
    g.m = *gen::dim(side);
    g.n = *gen::dim(side);
    g.batch = *gen::dim(std::max<std::int64_t>(1, std::min<std::int64_t>(3, gen::kElementBudget / (g.k * std::max(g.m, g.n)))));
    const Layout layout = *gen::pick(std::vector<Layout>{Layout::RowMajor, Layout::ColMajor});
    const bool ta = *gen::pick(std::vector<bool>{false, true}), tb = *gen::pick(std::vector<bool>{true, false});
    keep_if_supported([&] { g.layout = layout, g.trans_a = ta, g.trans_b = tb; },
                      [&] { g.layout = Layout::RowMajor, g.trans_a = false, g.trans_b = true; });
    const std::vector<std::int64_t> pads{0, 1, 3, 16, 64};
    const std::int64_t pa = *gen::pick(pads), pb = *gen::pick(pads), pd = *gen::pick(pads);
    keep_if_supported([&] { g.lda = pa ? g.packed_ld(g.a_rows(), g.a_cols()) + pa : 0; }, [&] { g.lda = 0; });
    keep_if_supported([&] { g.ldb = pb ? g.packed_ld(g.b_rows(), g.b_cols()) + pb : 0; }, [&] { g.ldb = 0; });
    keep_if_supported([&] { g.ldd = pd ? g.packed_ld(g.m, g.n) + pd : 0; }, [&] { g.ldd = 0; });
    const Format d0 = c.types.at("D");
    const Format d = *gen::pick(std::vector<Format>{d0, Format::BF16, Format::FP16, c.types.at("A")});
    keep_if_supported([&] { c.types["D"] = d; }, [&] { c.types["D"] = d0; });
    const double alpha = *gen::pick(std::vector<double>{1, 0.5, -1, 2, 0.1, 0});
    keep_if_supported([&] { c.alpha = alpha; }, [&] { c.alpha = 1; });
    const double beta = *gen::pick(std::vector<double>{0, 1, -0.5, 2});
    keep_if_supported([&] { c.beta = beta, c.types["C"] = c.types.at("D"); },
                      [&] { c.beta = 0, c.types.erase("C"); });
    if (c.beta == 0) c.types.erase("C");
    std::vector<Epilogue> epilogues{Epilogue::None, Epilogue::Relu, Epilogue::Bias, Epilogue::BiasRelu};
    if (gelu) epilogues.insert(epilogues.end(), {Epilogue::GeluTanh, Epilogue::Gelu, Epilogue::BiasGeluTanh, Epilogue::BiasGelu});
    const Epilogue e = *gen::pick(epilogues);
    const bool fp8 = t.dtype == "e4m3" || t.dtype == "e5m2";
    const Format bias_type = fp8 ? (c.types.at("D") == Format::FP16 ? Format::FP16 : Format::BF16) : c.types.at("D");
    keep_if_supported([&] { c.epilogue = e; if (has_bias(e)) c.types["bias"] = bias_type; },
                      [&] { c.epilogue = Epilogue::None, c.types.erase("bias"); });
    c.dist["A"] = *gen::dist_spec(c, "A", true);
    if (c.dist["A"].rfind("gendot", 0) != 0) c.dist["B"] = *gen::dist_spec(c, "B", false);
    if (c.beta != 0) c.dist["C"] = *gen::dist_spec(c, "C", false);
    if (has_bias(c.epilogue)) c.dist["bias"] = *gen::dist_spec(c, "bias", false);
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

// The transposed problem on the same memory: D^T = op(B)^T op(A)^T in the other layout
// (for cases without a bias).
Case transposed(const Case& c) {
  Case t = c;
  auto& g = t.gemm;
  g.layout = c.gemm.layout == Layout::RowMajor ? Layout::ColMajor : Layout::RowMajor;
  g.m = c.gemm.n, g.n = c.gemm.m;
  g.trans_a = c.gemm.trans_b, g.trans_b = c.gemm.trans_a;
  g.lda = gemm_view(c, "B").ld, g.ldb = gemm_view(c, "A").ld;
  g.ldc = c.beta != 0 ? gemm_view(c, "C").ld : 0;
  g.ldd = gemm_view(c, "D").ld;
  std::swap(t.types["A"], t.types["B"]);
  if (c.scales.count("A") || c.scales.count("B")) {
    const double sa = c.scales.count("A") ? c.scales.at("A") : 1.0, sb = c.scales.count("B") ? c.scales.at("B") : 1.0;
    t.scales["A"] = sb, t.scales["B"] = sa;
  }
  t.dist.clear();  // the inputs are given, not drawn
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.size_bytes() == b.size_bytes() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Whether doubling A keeps every value, product and sum away from underflow and overflow,
// so that a kernel whose operations all round the same way at any scale (floating point
// without subnormals or overflow) must double D exactly. The products are checked with and
// without the scales and alpha (a kernel may apply them to each product or to the sum);
// sums of normal numbers that fall below the normal range are exact, so only the top needs
// a bound: K times the largest product.
bool scaling_applies(const Case& c, const std::map<std::string, Tensor>& in) {
  if (c.beta != 0 || has_bias(c.epilogue) || !(c.epilogue == Epilogue::None || c.epilogue == Epilogue::Relu)) return false;
  double lo[2] = {INFINITY, INFINITY}, hi[2] = {0, 0};
  int i = 0;
  for (const char* op : {"A", "B"}) {
    const Tensor& t = in.at(op);
    const MatrixView v = gemm_view(c, op);
    const double max = info(t.format()).max_finite();
    for (std::size_t e = 0; e < t.size(); ++e) {
      if (v.is_padding(static_cast<std::int64_t>(e))) continue;
      const double x = std::fabs(t.value(e));
      if (!std::isfinite(x) || 2 * x > max) return false;
      if (x != 0) lo[i] = std::min(lo[i], x), hi[i] = std::max(hi[i], x);
    }
    ++i;
  }
  if (hi[0] == 0 || hi[1] == 0) return true;  // D = 0 either way
  const auto scale = [&](const char* op) { return c.scales.count(op) ? c.scales.at(op) : 1.0; };
  const double s = std::fabs(c.alpha) * scale("A") * scale("B");
  const Format compute = c.types.at("compute") == Format::TF32 ? Format::FP32 : c.types.at("compute");
  const double tiny = 0x1p24 * info(compute).min_normal(), big = info(compute).max_finite() / 4;
  const double pmin = lo[0] * lo[1] * std::min(1.0, s), pmax = 2 * hi[0] * hi[1] * std::max(1.0, s);
  return pmin >= tiny && pmax * static_cast<double>(c.gemm.k) <= big;
}

std::string short_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

// Evaluates one generated case (in the worker when isolated) and, when it ran and passed,
// the metamorphic relations in this process. Returns the record entry with every problem
// in its verdict.
CaseResult check_case(Registry& registry, Kernel& k, const Case& generated, const FuzzOptions& o,
                      IsolatedEvaluator* isolated) {
  Case c = generated;
  auto inputs = fill_inputs(c);
  CaseResult r;
  std::optional<Evaluation> ev;
  if (isolated) {
    r = isolated->evaluate(k.name(), generated, o.evaluation);
  } else {
    ev = evaluate_with_inputs(k, c, inputs, o.evaluation, &registry);
    r = to_case_result(k, c, *ev, case_family(c));
  }
  if (!o.metamorphic || r.status != Disposition::Ok || !r.verdict.passed) return r;
  if (!ev) ev = evaluate_with_inputs(k, c, inputs, o.evaluation, &registry);  // outputs for the relations
  if (ev->run.status != Disposition::Ok) return r;
  std::vector<std::string> problems;
  const Tensor& d = ev->run.outputs.at("D");
  if (k.traits().deterministic) {
    const RunOutcome again = run_kernel(k, c, inputs);
    if (again.status != Disposition::Ok || !same_bits(again.outputs.at("D"), d))
      problems.push_back("not bitwise repeatable: a second run gave other bits");
  }
  if (scaling_applies(c, inputs)) {
    auto scaled = inputs;
    Tensor& a = scaled.at("A");
    const MatrixView av = gemm_view(c, "A");
    for (std::size_t e = 0; e < a.size(); ++e)
      if (!av.is_padding(static_cast<std::int64_t>(e))) a.set_value(e, 2 * a.value(e));
    const RunOutcome s = run_kernel(k, c, scaled);
    const MatrixView dv = gemm_view(c, "D");
    const Format fd = c.types.at("D");
    std::int64_t off = 0;
    if (s.status == Disposition::Ok)
      for (std::int64_t b = 0; b < c.gemm.batch; ++b)
        for (std::int64_t i = 0; i < c.gemm.m; ++i)
          for (std::int64_t j = 0; j < c.gemm.n; ++j) {
            const double x = decode(fd, d.code(dv.offset(b, i, j)));
            const double y = decode(fd, s.outputs.at("D").code(dv.offset(b, i, j)));
            // only where doubling x is exact in D's format (normal, no overflow); x above the
            // smallest normal, as the unrounded value of an x equal to it may be subnormal
            if (std::isfinite(x) && std::fabs(x) > info(fd).min_normal() && 2 * std::fabs(x) <= info(fd).max_finite() &&
                y != 2 * x)
              ++off;
          }
    if (off) problems.push_back(fmt::format("scaling A by 2 did not double D exactly in {} elements", off));
  }
  // (A bias runs along D's columns, which transposition turns into rows: no relation then.)
  const Case tc = transposed(c);
  std::map<std::string, Tensor> tin{{"A", inputs.at("B")}, {"B", inputs.at("A")}};
  if (c.beta != 0) tin.emplace("C", inputs.at("C"));
  if (!has_bias(c.epilogue) && k.supports(tc)) {
    const Evaluation tev = evaluate_with_inputs(k, tc, tin, o.evaluation, &registry);
    if (tev.run.status == Disposition::Ok && !tev.verdict.passed)
      problems.push_back("the transposed problem (other layout, A and B swapped) fails: " + tev.verdict.reasons.front());
  }
  if (!problems.empty()) {
    r.verdict.passed = false;
    r.verdict.reasons.insert(r.verdict.reasons.end(), problems.begin(), problems.end());
  }
  return r;
}

}  // namespace

std::vector<FuzzTarget> all_targets(const Registry& registry) {
  std::vector<FuzzTarget> out;
  for (const auto& k : registry.all())
    for (const char* dt : kDtypes)
      if (k->supports(dtype_gemm_case(dt, 16, 16, 16))) out.push_back({k->name(), dt});
  return out;
}

CaseResult replay_case(Registry& registry, Case c, const EvaluationOptions& options) {
  Kernel* k = registry.resolve(c.kernel);
  if (!k) throw InputError(fmt::format("case.kernel: '{}' is not a kernel here (see ulpgate list)", c.kernel));
  const Evaluation ev = evaluate(*k, c, options, &registry);
  return to_case_result(*k, c, ev, case_family(c));
}

RunRecord run_fuzz(Registry& registry, const FuzzOptions& o, const std::function<void(const FuzzProgress&)>& progress,
                   const std::function<void(const std::string&)>& log) {
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  // RC_PARAMS="reproduce=..." (printed with each failure) replays that shrunk failure.
  std::unordered_map<std::string, rc::detail::Reproduce> reproduce;
  if (const char* env = std::getenv("RC_PARAMS")) {
    try {
      reproduce = rc::detail::configFromString(env).reproduce;
    } catch (const rc::detail::ConfigurationException& e) {
      throw InputError(fmt::format("RC_PARAMS: {}", e.what()));
    }
  }
  RunRecord record;
  record.kind = "fuzz";
  record.seed = o.seed;
  record.environment = capture_environment();
  if (o.evaluation.tolerance) record.tolerance = *o.evaluation.tolerance;
  if (o.evaluation.baseline) record.baseline = *o.evaluation.baseline;
  const std::vector<FuzzTarget> targets = o.targets.empty() ? all_targets(registry) : o.targets;
  FuzzProgress p;
  p.total = static_cast<std::int64_t>(targets.size()) * o.cases;
  std::unique_ptr<IsolatedEvaluator> isolated;
  if (o.isolation) isolated = std::make_unique<IsolatedEvaluator>(*o.isolation);
  std::unique_ptr<Journal> journal;
  if (!o.journal_path.empty()) {
    nlohmann::json campaign = {{"seed", o.seed}, {"cases", o.cases}, {"max_k", o.max_k}, {"metamorphic", o.metamorphic}};
    for (const auto& t : targets) campaign["targets"].push_back(t.kernel + " " + t.dtype);
    journal = std::make_unique<Journal>(o.journal_path, campaign, o.resume);
    if (journal->loaded()) say(fmt::format("resuming: {} cases from {}", journal->loaded(), o.journal_path));
    for (const auto& n : journal->notes()) say(n);
  }

  // The corpus first: every saved failure of a kernel in this campaign is rerun.
  if (!o.corpus_dir.empty() && std::filesystem::is_directory(o.corpus_dir)) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(o.corpus_dir))
      if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      Case c = read_case_file(f.string());
      const bool wanted = std::any_of(targets.begin(), targets.end(), [&](const FuzzTarget& t) { return t.kernel == c.kernel; });
      if (!wanted || !registry.resolve(c.kernel)) continue;
      CaseResult r = o.isolation ? IsolatedEvaluator(*o.isolation).evaluate(c.kernel, c, o.evaluation)
                                 : replay_case(registry, c, o.evaluation);
      r.family = "corpus " + r.family;
      r.reproducer = "ulpgate replay " + f.string();
      if (!r.verdict.passed) ++p.failures;
      say(fmt::format("corpus {}: {}", f.filename().string(), r.verdict.passed ? "passes now" : "still fails"));
      record.cases.push_back(std::move(r));
    }
  }

  for (std::size_t ti = 0; ti < targets.size(); ++ti) {
    const FuzzTarget& t = targets[ti];
    Kernel* k = registry.resolve(t.kernel);
    if (!k) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", t.kernel));
    if (o.seconds > 0 && elapsed() > o.seconds) {
      say(fmt::format("time budget spent: {} {} not fuzzed", t.kernel, t.dtype));
      continue;
    }
    // State shared with the property: results of the first pass, and the last failure
    // (RapidCheck calls the property again while shrinking; the last failing call is the
    // minimal counterexample).
    std::vector<CaseResult> results;
    bool shrinking = false;
    int shrink_steps = 0;
    std::optional<CaseResult> minimal;
    auto property = [&]() {
      const Case generated = *target_case(t, *k, o.max_k, o.gelu);
      if (!shrinking && o.seconds > 0 && elapsed() > o.seconds) return;  // budget spent: pass quietly
      // Shrinking can try thousands of candidates; past kMaxShrinkSteps, or once the time
      // budget is spent, the smallest failure found so far is the one reported (later
      // candidates pass, which ends the search).
      if (shrinking && (++shrink_steps > kMaxShrinkSteps || (o.seconds > 0 && elapsed() > o.seconds))) return;
      const auto run_case = [&] {
        try {
          return check_case(registry, *k, generated, o, isolated.get());
        } catch (const std::exception& e) {
          // A generated case the harness itself cannot handle: recorded as a failure so that
          // it is seen and shrunk like any other.
          CaseResult r;
          r.kernel = k->name();
          r.spec = generated;
          r.family = case_family(generated);
          r.status = Disposition::Failed;
          r.message = std::string("harness error: ") + e.what();
          r.verdict.passed = false;
          r.verdict.reasons = {r.message};
          return r;
        }
      };
      CaseResult r = journal ? journal->resume_or_run(k->name(), generated, run_case) : run_case();
      if (!shrinking) {
        ++p.cases;
        p.elapsed = elapsed();
        if (!r.verdict.passed) ++p.failures;
        if (progress) progress(p);
        results.push_back(r);
      }
      if (!r.verdict.passed) {
        shrinking = true;
        minimal = r;
        RC_FAIL(fmt::format("{} on {}: {}", k->name(), r.family, r.verdict.reasons.front()));
      }
    };
    rc::detail::TestParams params;
    params.seed = low64(random_block(o.seed, 0xF022u, ti));  // one seed per target, from the campaign seed
    params.maxSuccess = static_cast<int>(o.cases);
    params.maxSize = 100;
    rc::detail::TestMetadata meta;
    meta.id = meta.description = fmt::format("{} {}", t.kernel, t.dtype);
    // A listener and parameters of our own: RapidCheck's defaults read RC_PARAMS, print
    // "Using configuration" with a seed that plays no part here, and print every reproduce
    // string again at exit; the campaign seeds and reports everything itself.
    rc::detail::TestListenerAdapter quiet;
    const rc::detail::TestResult result =
        rc::detail::checkProperty(rc::detail::toProperty(property), meta, params, quiet, reproduce);
    for (auto& r : results) {
      r.reproducer = fmt::format("ulpgate fuzz --kernel {} --dtype {} --seed {} --cases {}", t.kernel, t.dtype, o.seed, o.cases);
      record.cases.push_back(std::move(r));
    }
    rc::detail::FailureResult failure;
    if (result.match(failure) && minimal) {
      CaseResult m = *minimal;
      m.family = "shrunk " + m.family;
      const std::string reproduce =
          rc::detail::reproduceMapToString({{meta.id, failure.reproduce}});
      m.notes["rapidcheck_reproduce"] = fmt::format("RC_PARAMS=\"reproduce={}\"", reproduce);
      if (!o.corpus_dir.empty()) {
        std::filesystem::create_directories(o.corpus_dir);
        const std::string stem = fmt::format("{}-{}", t.kernel, short_hash(to_json(m.spec).dump()));
        std::string file;
        for (char ch : stem) file += std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.' ? ch : '_';
        const auto path = std::filesystem::path(o.corpus_dir) / (file + ".json");
        write_case_file(path.string(), m.spec);
        m.reproducer = "ulpgate replay " + path.string();
        say(fmt::format("FAIL {} {}: {} (minimal case: {}; {})", t.kernel, t.dtype, m.verdict.reasons.front(),
                        path.string(), m.notes["rapidcheck_reproduce"]));
      } else {
        say(fmt::format("FAIL {} {}: {}", t.kernel, t.dtype, m.verdict.reasons.front()));
      }
      record.cases.push_back(std::move(m));
    }
  }
  return record;
}

}  // namespace ulpgate
