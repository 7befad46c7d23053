#include "campaign/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
#include "distributions/fill.hpp"
#include "check/check.hpp"
#include "check/ops/op.hpp"
#include "check/ops/attention_backward.hpp"
#include "check/runner.hpp"
#include "kernels/device.hpp"

namespace ulpgate {

BenchTiming timing_of(std::vector<double> ms) {
  if (ms.empty()) throw std::logic_error("timing_of: no times");
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  // nearest rank: the ceil(q n)-th smallest (1-based), q in (0, 1]
  const auto rank = [&](double q) { return ms[static_cast<std::size_t>(std::ceil(q * static_cast<double>(n))) - 1]; };
  BenchTiming t;
  t.reps = static_cast<int>(n);
  t.median_ms = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  t.min_ms = ms.front(), t.max_ms = ms.back();
  t.p10_ms = rank(0.1), t.p90_ms = rank(0.9);
  return t;
}

double case_flops(const Case& c) {
  if (c.op == Op::Gemm)
    return 2.0 * static_cast<double>(c.gemm.batch) * static_cast<double>(c.gemm.m) * static_cast<double>(c.gemm.n) *
           static_cast<double>(c.gemm.k);
  const AttentionShape& a = c.attention;
  if (c.op == Op::AttentionCombine)  // a multiply-add per partial value
    return 2.0 * static_cast<double>(a.batch * a.heads * a.seq_q) * static_cast<double>(a.splits * a.head_dim);
  // Visible (query, key) pairs (core/case.hpp attention_visible_count).
  double pairs = 0;
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t i = 0; i < a.seq_q; ++i) pairs += static_cast<double>(attention_visible_count(c, b, i));
  const double forward = 2.0 * static_cast<double>(a.head_dim + a.eff_head_dim_v()) * static_cast<double>(a.heads) * pairs;
  // The backward as FlashAttention counts it: 2.5 times the forward (five matrix products,
  // S and dP recomputed, dV, dQ and dK, against the forward's two).
  return c.op == Op::AttentionBackward ? 2.5 * forward : forward;
}

namespace {

// The case's inputs: filled, and the backward's O and LSE from `forward` run on Q, K and V
// where given, else derived (the exact forward rounded once). Where the forward kernel did not
// run, no inputs and the row's status saying why.
std::pair<Inputs, std::string> bench_inputs(Case& c, Kernel* forward) {
  if (!forward || c.op != Op::AttentionBackward) return {case_inputs(c), ""};
  Inputs inputs = fill_inputs(c);
  const Case fc = forward_case(c);
  Inputs qkv;
  for (const std::string& op : fc.inputs()) qkv.insert_or_assign(op, inputs.at(op));
  const RunOutcome f = run_kernel(*forward, fc, qkv);
  if (f.status != Disposition::Ok)
    return {{}, fmt::format("{}: forward kernel {}: {}", f.status == Disposition::NotSupported ? "not supported" : "failed",
                            forward->name(), f.message)};
  for (const std::string& op : c.derived_inputs()) inputs.insert_or_assign(op, f.outputs.at(op));
  return {std::move(inputs), ""};
}

}  // namespace

BenchRow bench_kernel(Kernel& k, Case c, const BenchOptions& options, Kernel* forward) {
  validate(c);
  BenchRow row;
  row.kernel = k.name();
  if (const auto why = k.unsupported(c)) {
    row.c = c;
    row.status = "not supported: " + *why;
    return row;
  }
  const auto [inputs, forward_failed] = bench_inputs(c, forward);  // may set scales and kv_lengths
  row.c = c;
  if (!forward_failed.empty()) {
    row.status = forward_failed;
    return row;
  }
  if (forward && c.op == Op::AttentionBackward) row.notes["forward"] = forward->name() + " (O and LSE, not judged)";
  row.flops = case_flops(c);
  std::map<std::string, Tensor> outputs;  // every output the kernel writes (backward: dQ, dK, dV)
  for (const std::string& name : outputs_of(c)) outputs.emplace(name, make_output(c, name));
  const bool device = k.traits().memory == Memory::Device;
  std::vector<double> ms;
  try {
    if (device) {
      void* stream = thread_stream();
      std::map<std::string, DeviceBuffer> in_dev;
      KernelIo io;
      for (const auto& [name, t] : inputs) {
        in_dev.emplace(name, to_device(t, stream));
        io.in[name] = in_dev.at(name).get();
      }
      std::map<std::string, DeviceBuffer> out_dev;
      for (const auto& [name, t] : outputs) {
        out_dev.emplace(name, to_device(t, stream));
        io.out[name] = out_dev.at(name).get();
      }
      io.stream = stream;
      constexpr std::size_t kFlush = std::size_t{256} << 20;
      DeviceBuffer flush(options.flush_l2 ? kFlush : 0, stream);
      for (int i = 0; i < options.warmup; ++i) k.run(c, io, row.notes);
      StreamTimer timer(stream);
      for (int i = 0; i < options.reps; ++i) {
        if (options.flush_l2) device_memset(flush.get(), i & 0xff, kFlush, stream);
        timer.start();
        k.run(c, io, row.notes);
        timer.stop();
        ms.push_back(timer.elapsed_ms());
      }
      device_synchronize(stream);
      for (auto& [name, t] : outputs) to_host(t, out_dev.at(name), stream);
      row.timer = "cuda events";
    } else {
      KernelIo io;
      for (const auto& [name, t] : inputs) io.in[name] = t.data();
      for (auto& [name, t] : outputs) io.out[name] = t.data();
      for (int i = 0; i < options.warmup; ++i) k.run(c, io, row.notes);
      for (int i = 0; i < options.reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        k.run(c, io, row.notes);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      row.timer = "steady clock";
    }
  } catch (const KernelUnsupported& e) {
    row.status = std::string("not supported: ") + e.what();
    return row;
  } catch (const KernelError& e) {
    row.status = std::string("failed: ") + e.what();
    return row;
  }
  row.t = timing_of(ms);
  row.tflops = row.flops / (row.t.median_ms * 1e-3) / 1e12;
  if (options.check) {
    EvaluationOptions eo;
    eo.effective_bits = c.op == Op::Gemm;
    const Evaluation ev = evaluate_with_inputs(k, c, inputs, eo);
    row.effective_bits = ev.effective_bits;
    row.checked = true;
    row.passed = ev.verdict.passed;
    row.verdict = ev.verdict.passed ? "pass" : ev.verdict.reasons.front();
    if (!ev.metrics.empty()) row.max_normalised = ev.metrics.front().max_normalised;
    // The timed run's outputs are the checked run's, but for an atomically summed dQ.
    row.same_bits = true;
    for (const auto& [name, output] : outputs) {
      if (name == "dQ" && k.traits().atomic_dq) continue;
      const auto it = ev.run.outputs.find(name);
      row.same_bits = row.same_bits && it != ev.run.outputs.end() && it->second.size_bytes() == output.size_bytes() &&
                      std::equal(static_cast<const char*>(output.data()),
                                 static_cast<const char*>(output.data()) + output.size_bytes(),
                                 static_cast<const char*>(it->second.data()));
    }
  }
  return row;
}

std::vector<std::array<std::int64_t, 3>> gemm_shape_preset(const std::string& name) {
  if (name == "square") return {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096}, {8192, 8192, 8192}};
  if (name == "llm") return {{4096, 4096, 11008}, {4096, 11008, 4096}, {8192, 8192, 8192}, {16, 4096, 4096}};
  throw InputError(fmt::format("--shapes '{}': square or llm", name));
}

std::string bench_case_text(const Case& c) {
  if (c.op == Op::Gemm) return fmt::format("{} {}", shape_text(c, false), name(c.types.at("A")));
  return fmt::format("{}{} {}", shape_text(c), c.attention.causal ? " causal" : "", name(c.types.at(primary_input(c.op))));
}

std::string bench_markdown(const BenchReport& r) {
  std::string s = fmt::format("# ulpgate bench\n\n{}; SM clock {} MHz before, {} MHz after. {} warm-up and {} timed runs "
                              "per kernel, {}; TFLOP/s from the median.\n\n",
                              r.device, r.clock_before_mhz, r.clock_after_mhz, r.options.warmup, r.options.reps,
                              r.options.flush_l2 ? "device kernels: L2 evicted before each timed run (256 MiB memset), timed by CUDA events; host kernels by the steady clock" : "L2 not flushed");
  if (!r.options.forward_kernel.empty())
    s += fmt::format("Backward cases take O and LSE from {} on the same Q, K and V (not judged).\n\n", r.options.forward_kernel);
  s += fmt::format("| kernel | case | median ms | p10 - p90 ms | TFLOP/s | % of {} | check | max normalised | effective bits "
                   "| notes |\n",
                   r.baseline.empty() ? "baseline" : r.baseline);
  s += "|---|---|---:|---:|---:|---:|---|---:|---:|---|\n";
  for (const BenchRow& row : r.rows) {
    if (row.status != "ok") {
      s += fmt::format("| {} | {} | | | | | {} | | | |\n", row.kernel, bench_case_text(row.c), row.status);
      continue;
    }
    std::string notes = row.notes.count("algorithm") ? row.notes.at("algorithm") : row.notes.count("kernel") ? row.notes.at("kernel") : "";
    if (row.checked && !row.same_bits) notes += (notes.empty() ? "" : "; ") + std::string("checked run's bits differ from the timed run's");
    s += fmt::format("| {} | {} | {:.4g} | {:.4g} - {:.4g} | {:.4g} | {} | {} | {} | {} | {} |\n", row.kernel, bench_case_text(row.c),
                     row.t.median_ms, row.t.p10_ms, row.t.p90_ms, row.tflops,
                     row.percent_of_baseline < 0 ? "" : fmt::format("{:.1f}", row.percent_of_baseline),
                     !row.checked ? "not checked" : row.passed ? "pass" : "**FAIL**: " + row.verdict,
                     row.max_normalised < 0 ? "" : fmt::format("{:.3g}", row.max_normalised),
                     std::isfinite(row.effective_bits) ? fmt::format("{:.2f}", row.effective_bits) : "", notes);
  }
  return s;
}

nlohmann::json bench_json(const BenchReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BenchRow& row : r.rows) {
    nlohmann::json j{{"kernel", row.kernel}, {"case", to_json(row.c)}, {"status", row.status}};
    if (row.status == "ok") {
      j["timer"] = row.timer;
      j["ms"] = {{"median", row.t.median_ms}, {"min", row.t.min_ms}, {"max", row.t.max_ms}, {"p10", row.t.p10_ms},
                 {"p90", row.t.p90_ms}, {"reps", row.t.reps}};
      j["flops"] = row.flops, j["tflops"] = row.tflops;
      if (row.percent_of_baseline >= 0) j["percent_of_baseline"] = row.percent_of_baseline;
      if (row.checked)
        j["check"] = {{"passed", row.passed}, {"verdict", row.verdict}, {"max_normalised", row.max_normalised},
                      {"same_bits_as_timed", row.same_bits}};
      if (row.checked && std::isfinite(row.effective_bits)) j["check"]["effective_bits"] = row.effective_bits;
      j["notes"] = row.notes;
    }
    rows.push_back(std::move(j));
  }
  return {{"ulpgate_bench", 1},
          {"device", r.device},
          {"sm_clock_mhz", {{"before", r.clock_before_mhz}, {"after", r.clock_after_mhz}}},
          {"warmup", r.options.warmup},
          {"reps", r.options.reps},
          {"l2_flushed", r.options.flush_l2},
          {"forward_kernel", r.options.forward_kernel},
          {"baseline", r.baseline},
          {"rows", rows}};
}

BenchReport bench_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("ulpgate_bench")) throw InputError("not a bench report (no \"ulpgate_bench\" field)");
  if (j["ulpgate_bench"] != 1) throw InputError(fmt::format("ulpgate_bench: version {} (this ulpgate reads 1)", j["ulpgate_bench"].dump()));
  std::string at = "bench";
  try {
    BenchReport r;
    r.device = j.at("device").get<std::string>();
    r.clock_before_mhz = j.at("sm_clock_mhz").at("before").get<std::int64_t>();
    r.clock_after_mhz = j.at("sm_clock_mhz").at("after").get<std::int64_t>();
    r.options.warmup = j.at("warmup").get<int>(), r.options.reps = j.at("reps").get<int>();
    r.options.flush_l2 = j.at("l2_flushed").get<bool>();
    r.options.forward_kernel = j.value("forward_kernel", "");  // absent in reports without one
    r.baseline = j.at("baseline").get<std::string>();
    for (std::size_t i = 0; i < j.at("rows").size(); ++i) {
      at = fmt::format("rows[{}]", i);
      const nlohmann::json& x = j["rows"][i];
      BenchRow row;
      row.kernel = x.at("kernel").get<std::string>();
      row.c = case_from_json(x.at("case"));
      row.status = x.at("status").get<std::string>();
      if (row.status == "ok") {
        row.timer = x.at("timer").get<std::string>();
        const nlohmann::json& ms = x.at("ms");
        row.t = {ms.at("median").get<double>(), ms.at("min").get<double>(), ms.at("max").get<double>(),
                 ms.at("p10").get<double>(), ms.at("p90").get<double>(), ms.at("reps").get<int>()};
        row.flops = x.at("flops").get<double>(), row.tflops = x.at("tflops").get<double>();
        row.percent_of_baseline = x.value("percent_of_baseline", -1.0);
        if (x.contains("check")) {
          const nlohmann::json& ch = x["check"];
          row.checked = true;
          row.passed = ch.at("passed").get<bool>(), row.verdict = ch.at("verdict").get<std::string>();
          row.max_normalised = ch.at("max_normalised").get<double>();
          row.same_bits = ch.at("same_bits_as_timed").get<bool>();
          row.effective_bits = ch.value("effective_bits", static_cast<double>(NAN));
        }
        row.notes = x.at("notes").get<RunNotes>();
      }
      r.rows.push_back(std::move(row));
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: {}", at, e.what()));
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", at, e.what()));
  }
}

}  // namespace ulpgate
