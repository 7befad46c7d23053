// `ulpgate replay CASE.json`: one case file rerun on its kernel, in a worker process unless
// --in-process, and its analysis printed.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "campaign/fuzz.hpp"
#include "campaign/isolate.hpp"
#include "cli/memory.hpp"
#include "cli/options.hpp"
#include "cli/results.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"

namespace ulpgate {
namespace {

struct ReplayArgs {
  std::string case_path, out, max_memory;
  bool in_process = false;
  double timeout = 600;
};

// A case that needs more than max_memory bytes is refused before it runs.
Exit replay_command(const ReplayArgs& a, const Context& ctx) {
  const std::uint64_t max_memory = ctx.max_memory(a.max_memory);
  check_timeout(a.timeout);
  if (!a.out.empty()) check_output_file("--out", a.out);
  const Case c = read_case_within(a.case_path, max_memory);
  if (c.kernel.empty()) throw InputError(a.case_path + ": case.kernel is empty: name the kernel to replay on");
  std::printf("ulpgate replay %s: kernel %s, seed %llu\n", a.case_path.c_str(), c.kernel.c_str(),
              static_cast<unsigned long long>(c.seed));
  std::fflush(stdout);
  // The one check path, relations included, in a worker: a crashing case is a result.
  CaseResult r;
  if (!a.in_process) {
    IsolationOptions iso;
    iso.plugins = ctx.plugins;
    iso.timeout_seconds = a.timeout;
    r = IsolatedEvaluator(iso).evaluate(c.kernel, c, EvaluationOptions{});  // unknown kernel: InputError
  } else {
    Registry registry = ctx.local();
    r = replay_case(registry, c, EvaluationOptions{});
  }
  std::string command = "ulpgate";
  for (const auto& p : ctx.plugins) command += " --plugin " + p;
  command += " replay " + a.case_path;
  return finish_single_case(r, "replay", command, a.out);
}

}  // namespace

Verb add_replay(CLI::App& app) {
  auto a = std::make_shared<ReplayArgs>();
  auto* replay = app.add_subcommand("replay", "Rerun one case file on its kernel and print its analysis");
  set_help_footer(replay,
                {
                 {"ulpgate replay out/corpus/cpu.fp32_seq-1f0c2a9e.json", "rerun a saved failure in a worker process"},
                 {"ulpgate replay case.json --in-process --out rerun.json", "in this process, with a run record"}},
                "0 the case passed; 1 it failed (or the kernel crashed or timed out); 2 bad usage or bad input (one line on stderr); 3 an internal error");
  replay->add_option("CASE.json", a->case_path, "Case file (from a fuzz corpus or written by hand)")->required();
  replay->add_option("--out", a->out, "Also write the run record here");
  replay->add_flag("--in-process", a->in_process, "Run the kernel in this process (default: a worker process)");
  replay->add_option("--timeout", a->timeout, "Seconds before the worker is killed (default 600)");
  replay->add_option("--max-memory", a->max_memory, kMaxMemoryHelp);
  return {replay, [a](const Context& ctx) { return replay_command(*a, ctx); }};
}

}  // namespace ulpgate
