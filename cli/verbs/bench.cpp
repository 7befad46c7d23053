// `ulpgate bench`: the cases from the shapes given, every kernel (and the baseline first) on
// each, a Markdown table on stdout (and --md), JSON with --json. Exit 0, 1 when a kernel
// returns an error, crashes (crash_guard.hpp) or its timed output fails its check, 2 for
// bad input.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "campaign/bench.hpp"
#include "check/check.hpp"
#include "check/ops/attention.hpp"
#include "check/ops/attention_backward.hpp"
#include "check/ops/attention_combine.hpp"
#include "check/ops/gemm.hpp"
#include "cli/crash_guard.hpp"
#include "cli/options.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "kernels/device.hpp"
#include "reports/gnuplot.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

/// Kernels by name (a name ending in '.' is a prefix), cases by GEMM shape or attention
/// shape, one input type.
struct BenchArgs {
  std::vector<std::string> kernels, gemm_shapes, attention_shapes, combine_shapes;
  std::string lse_base = "e";  ///< --lse-base of --combine shapes
  std::string baseline, shapes_preset, dtype, layout, forward_kernel, json, md, html, seed = "1";
  ServedVariantSpecs variants;  ///< --window, --softcap, --alibi, --sinks, --page-size
  std::string kv_cache;         ///< --kv-cache FORMAT[:FRAC][:head]
  bool causal = false, backward = false, no_flush = false, no_check = false;
  int reps = 20, warmup = 3;
};

std::vector<std::int64_t> dims(const std::string& text, std::size_t want, const char* flag, const char* form) {
  std::vector<std::int64_t> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t x = text.find('x', at);
    const std::string part = text.substr(at, x == std::string::npos ? std::string::npos : x - at);
    char* end = nullptr;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end || v < 1) throw InputError(fmt::format("{} '{}': expected {} (positive integers)", flag, text, form));
    out.push_back(v);
    if (x == std::string::npos) break;
    at = x + 1;
  }
  if (out.size() != want) throw InputError(fmt::format("{} '{}': expected {}", flag, text, form));
  return out;
}

// The case for kernel k: the dtype's case, or the same with B's storage transposed where
// only that is supported (the ladder's kernels take B as K x N, the FP8 GEMMs N x K).
Case case_for(Kernel& k, Case c) {
  if (c.op != Op::Gemm || !k.unsupported(c)) return c;
  Case t = c;
  t.gemm.trans_b = !t.gemm.trans_b;
  return k.unsupported(t) ? c : t;
}

// The kernels named, in order; a name ending in '.' adds every kernel with that prefix.
std::vector<Kernel*> bench_kernels(const BenchArgs& a, Registry& registry) {
  std::vector<Kernel*> kernels;
  for (const std::string& name : a.kernels) {
    if (!name.empty() && name.back() == '.') {
      const auto found = registry.matching(name);
      if (found.empty()) throw InputError(fmt::format("no kernel here starts with '{}' (see ulpgate list)", name));
      kernels.insert(kernels.end(), found.begin(), found.end());
      continue;
    }
    Kernel* k = registry.resolve(name);
    if (!k) throw InputError(fmt::format("unknown kernel '{}' (see ulpgate list)", name));
    kernels.push_back(k);
  }
  return kernels;
}

// The cases of --gemm, --shapes and --attention, validated (bad shapes: exit 2 before any
// work).
std::vector<Case> bench_cases(const BenchArgs& a, const std::string& dtype, std::uint64_t seed) {
  std::vector<Case> cases;
  std::vector<std::string> gemm = a.gemm_shapes;
  if (!a.shapes_preset.empty())
    for (const auto& s : gemm_shape_preset(a.shapes_preset)) gemm.push_back(fmt::format("{}x{}x{}", s[0], s[1], s[2]));
  for (const std::string& g : gemm) {
    const auto d = dims(g, 3, "--gemm", "MxNxK");
    Case c = dtype_gemm_case(dtype, d[0], d[1], d[2]);
    c.seed = seed;
    cases.push_back(c);
  }
  const auto layout = [&a] {  // --layout, checked where a shape takes it
    if (!a.layout.empty() && a.layout != "bhsd" && a.layout != "bshd")
      throw InputError(fmt::format("--layout '{}': bhsd or bshd", a.layout));
    return a.layout == "bshd" ? AttentionLayout::BSHD : AttentionLayout::BHSD;
  };
  for (const std::string& s : a.attention_shapes) {
    const auto d = dims(s, 5, "--attention", "BxHxSqxSkvxD");
    Case c = a.backward ? dtype_attention_backward_case(dtype) : dtype_attention_case(dtype);
    AttentionShape& at = c.attention;
    at.batch = d[0], at.heads = d[1], at.seq_q = d[2], at.seq_kv = d[3], at.head_dim = d[4];
    at.causal = a.causal;
    apply_served_variants(at, a.variants);
    if (!a.kv_cache.empty()) apply_kv_cache(c, a.kv_cache);
    at.layout = layout();
    c.seed = seed;
    cases.push_back(c);
  }
  if (a.lse_base != "e" && a.lse_base != "2") throw InputError(fmt::format("--lse-base '{}': e or 2", a.lse_base));
  for (const std::string& s : a.combine_shapes) {
    const auto d = dims(s, 5, "--combine", "BxHxSqxDxSPLITS");
    Case c = dtype_attention_combine_case(dtype);
    AttentionShape& at = c.attention;
    at.batch = d[0], at.heads = d[1], at.seq_q = d[2], at.head_dim = d[3], at.splits = d[4];
    at.lse_base2 = a.lse_base == "2";
    at.layout = layout();
    c.types["LSE"] = Format::FP32;
    c.dist["LSE_part"] = "lse(mean=4,std=4,empty=0.05)";
    c.seed = seed;
    cases.push_back(c);
  }
  for (Case& c : cases) validate(c);
  return cases;
}

// Times every kernel on every case (the baseline first on each), a progress line per row
// on stderr; returns how many rows failed.
int time_kernels(BenchReport& report, const std::vector<Case>& cases, const std::vector<Kernel*>& kernels, Kernel* baseline,
                 const BenchOptions& options, Kernel* forward) {
  int failed = 0, done = 0;
  const int total = static_cast<int>(cases.size() * (kernels.size() + (baseline ? 1 : 0)));
  for (const Case& c : cases) {
    double base_tflops = -1;
    std::vector<Kernel*> order;
    if (baseline) order.push_back(baseline);
    order.insert(order.end(), kernels.begin(), kernels.end());
    for (std::size_t i = 0; i < order.size(); ++i) {
      Kernel* k = order[i];
      if (baseline && i > 0 && k == baseline) continue;  // timed once, as the baseline
      BenchRow row = [&] {
        const KernelCrashGuard guard("bench", k->name());
        return bench_kernel(*k, case_for(*k, c), options, forward);
      }();
      if (baseline && i == 0 && row.status == "ok") base_tflops = row.tflops;
      else if (base_tflops > 0 && row.status == "ok") row.percent_of_baseline = 100.0 * row.tflops / base_tflops;
      failed += row.status.rfind("failed", 0) == 0 || (row.checked && !row.passed);
      ++done;
      std::fprintf(stderr, "bench: %d/%d %s: %s\n", done, total, k->name().c_str(),
                   row.status == "ok" ? fmt::format("median {:.4g} ms, {:.4g} TFLOP/s, {}", row.t.median_ms, row.tflops,
                                                    !row.checked ? "not checked" : row.passed ? "check passed" : "check FAILED")
                                            .c_str()
                                      : row.status.c_str());
      report.rows.push_back(std::move(row));
    }
  }
  return failed;
}

Exit bench_command(const BenchArgs& a, const LocalRegistry& local) {
  if (!a.json.empty()) check_output_file("--json", a.json);
  if (!a.md.empty()) check_output_file("--md", a.md);
  if (!a.html.empty()) check_output_file("--html", a.html);
  if (a.kernels.empty()) throw InputError("bench: give at least one --kernel");
  const int shape_kinds = !a.gemm_shapes.empty() + !a.shapes_preset.empty() + !a.attention_shapes.empty() + !a.combine_shapes.empty();
  if (shape_kinds == 0)
    throw InputError("bench: give --gemm MxNxK, --shapes square|llm, --attention BxHxSqxSkvxD or --combine BxHxSqxDxSPLITS");
  if ((!a.attention_shapes.empty() || !a.combine_shapes.empty()) && shape_kinds > 1)
    throw InputError("bench: one kind of shape per run (GEMM, attention or combine)");
  if (!a.kv_cache.empty() && a.attention_shapes.empty())
    throw InputError("bench: --kv-cache applies to attention shapes (--attention BxHxSqxSkvxD)");
  if (a.variants.any() && a.attention_shapes.empty())
    throw InputError("bench: --window, --softcap, --alibi, --sinks and --page-size apply to attention shapes (--attention BxHxSqxSkvxD)");
  if (a.backward && a.attention_shapes.empty()) throw InputError("bench: --backward times attention shapes (--attention BxHxSqxSkvxD)");
  if (a.reps < 1 || a.warmup < 0) throw InputError("bench: --reps must be >= 1 and --warmup >= 0");
  Registry registry = local();
  Kernel* baseline = nullptr;
  if (!a.baseline.empty()) {
    baseline = registry.resolve(a.baseline);
    if (!baseline) throw InputError(fmt::format("unknown baseline kernel '{}' (see ulpgate list)", a.baseline));
  }
  const std::vector<Kernel*> kernels = bench_kernels(a, registry);
  Kernel* forward = nullptr;
  if (!a.forward_kernel.empty()) {
    if (!a.backward) throw InputError("bench: --forward-kernel gives the backward its O and LSE; it needs --backward");
    forward = registry.resolve(a.forward_kernel);
    if (!forward) throw InputError(fmt::format("--forward-kernel '{}': not a kernel here (see ulpgate list)", a.forward_kernel));
  }
  const std::string dtype = a.dtype.empty() ? default_dtype(kernels.front()->name()) : a.dtype;
  const std::vector<Case> cases = bench_cases(a, dtype, parse_seed(a.seed));
  if (!a.html.empty()) report::check_gnuplot();  // before the work, not after it

  BenchOptions options;
  options.reps = a.reps, options.warmup = a.warmup, options.flush_l2 = !a.no_flush, options.check = !a.no_check;
  options.forward_kernel = forward ? forward->name() : "";
  BenchReport report;
  report.options = options;
  report.baseline = baseline ? baseline->name() : "";
  const DeviceInfo info = device_info();
  report.device = info.description;
  report.clock_before_mhz = info.sm_clock_mhz;
  const int failed = time_kernels(report, cases, kernels, baseline, options, forward);
  report.clock_after_mhz = device_info().sm_clock_mhz;
  const std::string md = bench_markdown(report);
  std::fputs(md.c_str(), stdout);
  if (!a.md.empty()) write_text_file_atomically(a.md, md);
  if (!a.json.empty()) write_text_file_atomically(a.json, bench_json(report).dump(2) + "\n");
  if (!a.html.empty()) write_text_file_atomically(a.html, render_bench_html(report));
  return failed ? Exit::Failed : Exit::Ok;
}

}  // namespace

Verb add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* bench = app.add_subcommand(
      "bench", "Time kernels on GEMM or attention shapes (CUDA events, L2 evicted, median of --reps runs) and check "
               "each timed output against the exact reference, in this process");
  set_help_footer(bench,
                {
                 {"ulpgate bench --kernel ladder. --baseline cublas.fp32 --shapes square", "the GEMM ladder beside cuBLAS (needs a GPU)"},
                 {"ulpgate bench --kernel cuda.attn_flash.fp16 --attention 4x16x4096x4096x128 --causal --json bench.json", "attention, timed and checked"}},
                "0 every kernel ran and every checked output passed; 1 a kernel failed or an output failed its check; 2 bad usage or bad input (one line on stderr); 3 an internal error");
  bench->add_option("--kernel", a->kernels, "Kernel to time (repeatable; a name ending in '.' takes every kernel "
                                            "with that prefix, e.g. ladder.)");
  bench->add_option("--baseline", a->baseline, "Kernel timed first on each case: the others' % of its TFLOP/s "
                                               "(e.g. cublas.fp32)");
  bench->add_option("--gemm", a->gemm_shapes, "GEMM shape MxNxK (repeatable)");
  bench->add_option("--shapes", a->shapes_preset, "GEMM shape preset: square (1024..8192) or llm")
      ->check(CLI::IsMember({"square", "llm"}));
  bench->add_option("--attention", a->attention_shapes, "Attention shape BxHxSqxSkvxD (repeatable)");
  bench->add_option("--combine", a->combine_shapes,
                    "Split-KV combine shape BxHxSqxDxSPLITS (attention_combine; repeatable; docs/concepts/split-kv.md)");
  bench->add_option("--lse-base", a->lse_base, "--combine: the LSEs' base, e (FlashAttention, cuDNN) or 2 (FlashInfer)");
  bench->add_flag("--causal", a->causal, "Attention: causal mask (FLOPs count the visible pairs only)");
  bench->add_option("--forward-kernel", a->forward_kernel,
                    "Attention --backward: O and LSE from this forward kernel on the same Q, K, V (not judged; default: the exact "
                    "forward, minutes at training sizes)");
  bench->add_option("--softcap", a->variants.softcap, "Attention: soft cap, each score x becomes cap tanh(x / cap)");
  bench->add_option("--alibi", a->variants.alibi, "Attention: ALiBi, flash or flashinfer (the form) with the standard slopes, or FORM:SLOPE or FORM:S1,S2,... per head");
  bench->add_option("--sinks", a->variants.sinks, "Attention: one sink logit for every head, or S1,S2,... per head (-inf: none)");
  bench->add_option("--kv-cache", a->kv_cache, "Attention: an FP8 K/V cache, e4m3 or e5m2 with amax scales, :FRAC of the range (default 1), :head for a scale per K/V head (docs/concepts/fp8-kv.md)");
  bench->add_option("--page-size", a->variants.pages, "Attention: paged K/V, pages of this many keys in a shuffled order (docs/concepts/paged-kv.md)");
  bench->add_option("--window", a->variants.window, "Attention: sliding window, e.g. hf:4096, flash:4095,0, flashinfer:4095 or cudnn:4096,0 (FLOPs: the visible pairs)");
  bench->add_flag("--backward", a->backward, "Attention: time the backward pass (dQ, dK, dV from Q, K, V, dO, O, LSE; "
                                             "FLOPs 2.5 times the forward's)");
  bench->add_option("--layout", a->layout, "Attention layout: bhsd (default) or bshd");
  bench->add_option("--dtype", a->dtype, "Input type (default: implied by the first kernel's name)");
  bench->add_option("--reps", a->reps, "Timed runs per kernel and case (default 20)")->check(CLI::Range(1, 100000));
  bench->add_option("--warmup", a->warmup, "Untimed runs first (default 3)")->check(CLI::Range(0, 1000));
  bench->add_flag("--no-flush", a->no_flush, "Do not evict L2 before each timed run");
  bench->add_flag("--no-check", a->no_check, "Do not check the outputs against the exact reference");
  bench->add_option("--seed", a->seed, "Seed of the inputs (default 1)");
  bench->add_option("--json", a->json, "Write the results as JSON here");
  bench->add_option("--md", a->md, "Write the Markdown table here too");
  bench->add_option("--html", a->html, "Write an HTML page with a speed-vs-size plot per kernel here (needs gnuplot)");
  return {bench, [a](const Context& ctx) { return bench_command(*a, ctx.local); }};
}

}  // namespace ulpgate
