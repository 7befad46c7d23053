#include "harness/evaluate.hpp"

#include <chrono>

#include <fmt/format.h>

#include "distributions/fill.hpp"
#include "core/error.hpp"

namespace ulpgate {

Case dtype_gemm_case(std::string_view dtype, std::int64_t m, std::int64_t n, std::int64_t k, std::optional<Format> out) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = m, c.gemm.n = n, c.gemm.k = k;
  c.gemm.trans_b = true;
  Format in, in_b, compute = Format::FP32, d = Format::FP32;
  if (dtype == "tf32") {
    in = in_b = Format::FP32, compute = Format::TF32;
  } else if (dtype == "e5m2") {
    in = Format::E5M2, in_b = Format::E4M3;
  } else if (auto f = parse_format(dtype); f && *f != Format::TF32) {
    in = in_b = *f;
    if (*f == Format::FP64) compute = d = Format::FP64;
  } else {
    throw InputError(fmt::format("--dtype '{}': expected fp64, fp32, tf32, fp16, bf16, e4m3 or e5m2", dtype));
  }
  c.types = {{"A", in}, {"B", in_b}, {"D", out.value_or(d)}, {"compute", compute}};
  validate(c);
  return c;
}

std::string default_dtype(const std::string& kernel) {
  const auto dot = kernel.find('.');
  const std::string suffix = dot == std::string::npos ? "" : kernel.substr(dot + 1);
  if (suffix.rfind("fp8", 0) == 0) return "e4m3";
  for (const char* t : {"fp64", "fp32", "tf32", "fp16", "bf16"})
    if (suffix == t) return t;
  return "fp32";
}

ToleranceModel nominal_tolerance(const Case& c, const KernelTraits& traits) {
  ToleranceModel t;
  const Format compute = c.types.at("compute");
  switch (compute) {
    case Format::FP64: t.accumulator_bits = 53; break;
    case Format::FP16: t.accumulator_bits = 11; break;
    case Format::BF16: t.accumulator_bits = 8; break;
    case Format::TF32: t.accumulator_bits = 24, t.input_bits = 11; break;
    default: t.accumulator_bits = 24; break;
  }
  if (traits.accumulator_bits > 0) t.accumulator_bits = traits.accumulator_bits;
  t.accumulator_eta = info(compute == Format::TF32 ? Format::FP32 : compute).min_subnormal();
  return t;
}

std::int64_t reduction_length(const Case& c) {
  return c.op == Op::Gemm ? c.gemm.k : c.attention.seq_kv;
}

OutputComparison compare_gemm(const Case& c, const GemmReference& ref, const Tensor& d) {
  OutputComparison cmp;
  cmp.format = c.types.at("D");
  cmp.shape = {c.gemm.batch, c.gemm.m, c.gemm.n};
  const MatrixView dv = gemm_view(c, "D");
  const std::int64_t n = c.gemm.batch * c.gemm.m * c.gemm.n;
  cmp.got.resize(n);
  for (std::int64_t b = 0; b < c.gemm.batch; ++b)
    for (std::int64_t i = 0; i < c.gemm.m; ++i)
      for (std::int64_t j = 0; j < c.gemm.n; ++j) cmp.got[ref.index(b, i, j)] = d.code(dv.offset(b, i, j));
  cmp.exact = ref.values;
  cmp.condition = ref.magnitude;
  cmp.accumulated = ref.intermediate;
  return cmp;
}

// A kernel that rounds its inputs to input_bits (TF32 tensor cores: 11) carries an input
// at or above that precision's overflow threshold, (2 - 2^-p) 2^emax, to Inf (rounding to
// nearest): every D element whose row of op(A) or column of op(B) holds one may then be
// non-finite, so its intermediate bound is +Inf (see OutputComparison::accumulated).
void mark_input_rounding_overflow(const Case& c, const std::map<std::string, Tensor>& inputs, int input_bits,
                                  OutputComparison& cmp) {
  const GemmShape& g = c.gemm;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B");
  const Tensor &a = inputs.at("A"), &b = inputs.at("B");
  const auto threshold = [&](const Tensor& t) { return std::ldexp(2.0 - std::ldexp(1.0, -input_bits), info(t.format()).emax()); };
  const double limit_a = threshold(a), limit_b = threshold(b);
  const auto over = [](const Tensor& t, std::int64_t off, double limit) {
    const double v = std::fabs(t.value(off));
    return std::isfinite(v) && v >= limit;
  };
  for (std::int64_t bi = 0; bi < g.batch; ++bi) {
    std::vector<char> row(static_cast<std::size_t>(g.m), 0), col(static_cast<std::size_t>(g.n), 0);
    bool any = false;
    for (std::int64_t k = 0; k < g.k; ++k) {
      for (std::int64_t i = 0; i < g.m; ++i) any |= row[i] |= over(a, op_a_offset(c, av, bi, i, k), limit_a);
      for (std::int64_t j = 0; j < g.n; ++j) any |= col[j] |= over(b, op_b_offset(c, bv, bi, k, j), limit_b);
    }
    if (!any) continue;
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j)
        if (row[i] || col[j]) cmp.accumulated[static_cast<std::size_t>((bi * g.m + i) * g.n + j)] = INFINITY;
  }
}

Evaluation evaluate_with_inputs(Kernel& k, const Case& c, const std::map<std::string, Tensor>& inputs,
                                const EvaluationOptions& options, const Registry* registry) {
  const auto start = std::chrono::steady_clock::now();
  Evaluation ev;
  ev.tolerance = options.tolerance.value_or(nominal_tolerance(c, k.traits()));
  if (c.op != Op::Gemm) throw InputError("attention evaluation needs the attention reference (not built yet)");
  ev.run = run_kernel(k, c, inputs);
  if (ev.run.status != Disposition::Ok) {
    ev.verdict.passed = ev.run.status == Disposition::NotSupported;
    if (!ev.verdict.passed) ev.verdict.reasons.push_back(fmt::format("{}: {}", name(ev.run.status), ev.run.message));
  } else {
    ev.reference = std::make_shared<const GemmReference>(gemm_reference(c, inputs));
    const GemmReference& ref = *ev.reference;
    OutputComparison cmp = compare_gemm(c, ref, ev.run.outputs.at("D"));
    const Format compute = c.types.at("compute");
    // FP64 too: the intermediate bound is a double, +Inf once the terms pass DBL_MAX.
    cmp.accumulator_max = info(compute == Format::TF32 ? Format::FP32 : compute).max_finite();
    if (ev.tolerance.input_bits > 0) mark_input_rounding_overflow(c, inputs, ev.tolerance.input_bits, cmp);
    ErrorMetrics m = analyze(cmp);
    m.output = "D";
    m.unwritten = ev.run.unwritten;
    m.padding_written = ev.run.padding_written;
    if (options.baseline && registry) {
      Kernel* model = registry->find(options.baseline->model);
      if (!model) throw InputError(fmt::format("baseline model '{}' is not a kernel here", options.baseline->model));
      if (model->supports(c)) {
        const RunOutcome base = run_kernel(*model, c, inputs);
        if (base.status == Disposition::Ok)
          ev.baseline_max_normalised = analyze(compare_gemm(c, ref, base.outputs.at("D"))).max_normalised;
      }
    }
    ev.verdict = judge(cmp, m, ev.tolerance, reduction_length(c), ev.baseline_max_normalised,
                       options.baseline.value_or(BaselineRule{}));
    if (!ev.run.inputs_modified.empty()) {
      ev.verdict.passed = false;
      ev.verdict.reasons.push_back(fmt::format("the kernel wrote to its inputs ({})", fmt::join(ev.run.inputs_modified, ", ")));
    }
    ev.metrics.push_back(std::move(m));
  }
  ev.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ev;
}

CaseResult to_case_result(const Kernel& k, const Case& c, const Evaluation& ev, std::string family) {
  CaseResult r;
  r.kernel = k.name();
  r.spec = c;
  r.family = std::move(family);
  r.status = ev.run.status;
  r.message = ev.run.message;
  r.notes = ev.run.notes;
  r.metrics = ev.metrics;
  r.verdict = ev.verdict;
  r.seconds = ev.seconds;
  return r;
}

std::string case_family(const Case& c) {
  const auto dist = [&](const char* op) {
    auto it = c.dist.find(op);
    return it == c.dist.end() ? std::string(kDefaultDist) : it->second;
  };
  if (c.op == Op::Gemm)
    return fmt::format("gemm {}->{} {} {}", name(c.types.at("A")), name(c.types.at("D")), name(c.types.at("compute")),
                       dist("A"));
  return fmt::format("attention {}->{} {} {}", name(c.types.at("Q")), name(c.types.at("O")), name(c.types.at("compute")),
                     dist("Q"));
}

Evaluation evaluate(Kernel& k, Case& c, const EvaluationOptions& options, const Registry* registry) {
  const auto inputs = fill_inputs(c);
  return evaluate_with_inputs(k, c, inputs, options, registry);
}

}  // namespace ulpgate
