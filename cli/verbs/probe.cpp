// `ulpgate probe`: how GEMM kernels and tensor-core instructions accumulate FP32 dot
// products (campaign/probe.hpp), in this process. A unit outside the block-FMA model is a
// finding (exit 1); a bad kernel or case, exit 2.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "campaign/probe.hpp"
#include "check/check.hpp"
#include "cli/crash_guard.hpp"
#include "cli/mpi.hpp"
#include "cli/options.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"

namespace ulpgate {
namespace {

struct ProbeArgs {
  std::vector<std::string> kernels, instructions;
  int max_block = 512, max_promote = 4096;
  std::int64_t validate = -1;  ///< < 0: the unit kind's default
  std::string json, dtype, dump;
  std::int64_t dump_count = 20000, dump_span = 263;
  std::int64_t mn = 1;
};

// One unit's result: its lines, its JSON object, its exit (Ok, or Failed: not a block-FMA
// unit).
struct Probed {
  std::string text;
  nlohmann::json model;
  Exit rc = Exit::Ok;
};
using ProbeJob = std::function<Probed()>;

// A unit's JSON object: the probed model, or the problem that kept it from one.
nlohmann::json model_json(const std::string& unit, const std::string& dtype, const ProbedAccumulation& p,
                          const std::string& problem) {
  nlohmann::json j{{"unit", unit}, {"input", dtype}};
  if (!problem.empty()) {
    j["problem"] = problem;
    return j;
  }
  j["block"] = p.block;
  if (p.frac) j["frac_bits"] = *p.frac;
  else j["frac_bits_at_least"] = p.frac_at_least;
  j["rounding"] = p.rounding ? std::string(name(*p.rounding)) : std::string("not observable");
  j["promote"] = p.promote;
  if (p.align_inputs) j["align"] = *p.align_inputs ? "inputs" : "product";
  if (p.align_format) j["align_format"] = std::string(name(*p.align_format));
  j["out_bits"] = p.out;
  j["accumulator"] = std::string(name(p.accumulator));
  if (p.interleave) j["interleave"] = p.interleave;
  j["rounding_moot"] = p.rounding_moot;
  j["validated"] = p.validated;
  j["summary"] = p.describe();
  if (p.known()) j["model"] = p.model(*parse_format(dtype)).name();
  return j;
}

// --dump: the unit's results on random dot products, written to DIR/UNIT.dots; the line
// that says so.
std::string dump_unit(const ProbeArgs& a, const std::string& unit, const ProbeBatch& batch) {
  const std::string file = a.dump + "/" + safe_file_name(unit) + ".dots";
  const std::int64_t n = dump_batched(batch, unit, a.dump_count, a.dump_span, file);
  return fmt::format("{}: {} random dot products written to {}\n", unit, n, file);
}

// The experiments, the alignment and the validation in batches, then a line and a JSON
// object; a unit outside the block-FMA model is a finding (Exit::Failed), a case the unit
// does not take an InputError.
Probed probe_one(const ProbeArgs& a, const std::string& unit, Format input, const ProbeDot& dot, const ProbeBatch& batch,
                 std::int64_t default_validate) {
  Probed out;
  const std::string dtype(name(input));
  if (!a.dump.empty()) out.text += dump_unit(a, unit, batch);
  try {
    ProbedAccumulation p = probe_unit(dot, batch, a.max_block, a.max_promote);
    const std::int64_t n = a.validate < 0 ? default_validate : a.validate;
    std::string counts;
    if (n > 0 && p.known()) {
      const BatchValidation v = validate_batched(p, batch, input, n);
      p.validated = static_cast<int>(std::min<std::int64_t>(v.total(), INT32_MAX));
      counts = fmt::format(" ({} normal, {} cancelling, {} with subnormal inputs)", v.normal, v.cancelling, v.subnormal);
    }
    out.text += fmt::format("{} ({} inputs): {}{}\n", unit, dtype, p.describe(), counts);
    out.model = model_json(unit, dtype, p, "");
  } catch (const InputError&) {
    throw;
  } catch (const std::runtime_error& e) {
    out.text += fmt::format("{}: not a block-FMA unit: {}\n", unit, e.what());
    out.model = model_json(unit, dtype, {}, e.what());
    out.rc = Exit::Failed;
  }
  return out;
}

// The units in the order given: instructions, then kernels (their names checked here).
std::vector<ProbeJob> probe_jobs(const ProbeArgs& a, Registry& registry) {
  std::vector<ProbeJob> jobs;
  for (const std::string& inst : a.instructions)
    jobs.push_back([&a, inst] {
      const auto [dot, batch] = mma_unit(inst);  // unknown name or no device: exit 2
      return probe_one(a, inst, batch.input, dot, batch, 1000000);
    });
  for (const std::string& kernel : a.kernels) {
    Kernel* k = registry.resolve(kernel);
    if (!k) throw InputError(fmt::format("unknown kernel '{}' (see ulpgate list)", kernel));
    const Format input = *parse_format(a.dtype.empty() ? default_dtype(kernel) : a.dtype);
    // validated in batches: up to mn dot products per GEMM, on D's diagonal
    jobs.push_back([&a, kernel, k, input] {
      const KernelCrashGuard guard("probe", kernel);
      return probe_one(a, kernel, input, kernel_unit(*k, input, a.mn), kernel_batch(*k, input, a.mn), 1000);
    });
  }
  return jobs;
}

Exit probe_here(const ProbeArgs& a, const std::vector<ProbeJob>& jobs) {
  nlohmann::json models = nlohmann::json::array();
  Exit rc = Exit::Ok;
  for (const auto& job : jobs) {
    const Probed r = job();
    std::fputs(r.text.c_str(), stdout);
    std::fflush(stdout);
    models.push_back(r.model);
    rc = worst(rc, r.rc);
  }
  if (!a.json.empty()) write_text_file_atomically(a.json, models.dump(2) + "\n");
  return rc;
}

// One unit on one rank, as JSON: its result, or its error and exit.
nlohmann::json probe_shared(const ProbeJob& job) {
  nlohmann::json j;
  std::string error;
  const Exit failed = mpi::attempt(
      [&] {
        const Probed r = job();
        j["text"] = r.text, j["model"] = r.model, j["rc"] = code(r.rc);
      },
      error);
  if (failed != Exit::Ok) j = {{"error", error}, {"rc", code(failed)}};
  return j;
}

// mpirun: the ranks (each with its own GPU where there are several) claim the units as
// they become free; rank 0 prints them in the order given and writes the JSON.
Exit probe_over_ranks(const ProbeArgs& a, const std::vector<ProbeJob>& jobs, const mpi::World& world) {
  std::vector<std::string> failures;  // (a unit's errors are in its result)
  const std::vector<nlohmann::json> done = mpi::share_units(
      world, static_cast<std::int64_t>(jobs.size()),
      [&](std::int64_t u) { return probe_shared(jobs[static_cast<std::size_t>(u)]); }, failures);
  const Exit rc = mpi::rank0_decides(world, [&] {
    Exit worst_rc = Exit::Ok;
    nlohmann::json models = nlohmann::json::array();
    std::string errors;
    for (const auto& j : done) {
      if (j.contains("error")) {
        errors += fmt::format("ulpgate: error: {}\n", j["error"].get<std::string>());
      } else {
        std::fputs(j["text"].get<std::string>().c_str(), stdout);
        models.push_back(j["model"]);
      }
      worst_rc = worst(worst_rc, static_cast<Exit>(j["rc"].get<int>()));
    }
    std::fflush(stdout);
    std::fputs(errors.c_str(), stderr);
    if (!a.json.empty()) write_text_file_atomically(a.json, models.dump(2) + "\n");
    return worst_rc;
  });
  mpi::finish(world);
  return rc;
}

Exit probe_command(const ProbeArgs& a, const Context& ctx) {
  if (a.kernels.empty() && a.instructions.empty()) throw InputError("probe: give at least one --kernel or --instruction");
  if (!a.dump.empty()) {
    check_out_dir(a.dump);
    create_out_dir(a.dump);
  }
  Registry registry = ctx.local();
  const std::vector<ProbeJob> jobs = probe_jobs(a, registry);
  const mpi::World world = mpi::join();
  return world.size == 1 ? probe_here(a, jobs) : probe_over_ranks(a, jobs, world);
}

}  // namespace

Verb add_probe(CLI::App& app) {
  auto a = std::make_shared<ProbeArgs>();
  auto* probe = app.add_subcommand(
      "probe", "How each GEMM kernel accumulates FP32 dot products (block size, fraction bits after alignment, "
               "rounding, promotion), from known-answer M x N x K cases (D[0][0] the dot product) run in this process");
  set_help_footer(probe,
                {
                 {"ulpgate probe --kernel cpu.blockfma:block=16,frac=25,round=rz --dtype fp16", "infer a kernel's block size, bits and rounding"},
                 {"ulpgate probe --instruction mma.bf16 --json mma.json", "a tensor-core instruction (needs a GPU)"}},
                "0 every unit fits the block-FMA model; 1 a unit does not (a finding); 2 bad usage or bad input (one line on stderr); 3 an internal error");
  probe->add_option("--kernel", a->kernels, "Kernel to probe (repeatable)");
  probe->add_option("--instruction", a->instructions,
                    "Tensor-core instruction to probe (repeatable): mma.f16, mma.bf16, mma.tf32, mma.e4m3, mma.e5m2, mma.f16.f16acc, "
                    "wgmma.f16, wgmma.bf16, wgmma.tf32, wgmma.e4m3, wgmma.e5m2 "
                    "(a chain of mma.sync on the device, D fed back as C)");
  probe->add_option("--validate", a->validate, "Random dot products the inferred model must reproduce bit for bit "
                                               "(default 1000 for kernels, 1000000 for instructions)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 32));
  probe->add_option("--json", a->json, "Write the probed models here (one object per unit)");
  probe->add_option("--max-block", a->max_block, "Largest block size tried (default 512)")->check(CLI::Range(2, 65536));
  probe->add_option("--max-promote", a->max_promote, "Largest promotion length tried (default 4096)")
      ->check(CLI::Range(1, 1 << 20));
  probe->add_option("--dtype", a->dtype, "Input type of the probe's cases: fp32, tf32, fp16, bf16, e4m3, e5m2 "
                                         "(default: implied by each kernel's name)")
      ->check(CLI::IsMember({"fp32", "tf32", "fp16", "bf16", "e4m3", "e5m2"}));
  probe->add_option("--dump", a->dump, "Also write each unit's results on random dot products to DIR/UNIT.dots "
                                       "(format in campaign/probe.hpp, dump_batched), for offline study");
  probe->add_option("--dump-count", a->dump_count, "Dot products per dump (default 20000)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 26));
  probe->add_option("--dump-span", a->dump_span, "Longest dot product of a dump (default 263)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  probe->add_option("--mn", a->mn, "M = N of the probe's cases: its dot product is D[0][0], every other input "
                                   "zero; a library takes the path of that shape (default 1)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{16384}));
  return {probe, [a](const Context& ctx) { return probe_command(*a, ctx); }};
}

}  // namespace ulpgate
