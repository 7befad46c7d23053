// ulpgate command-line tool: the global options, one verb per file (cli/verbs/), and the
// exit codes of cli/exit.hpp.
#include <malloc.h>

#include <climits>
#include <cstdio>
#include <exception>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "campaign/record.hpp"
#include "cli/startup.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"

int main(int argc, char** argv) {
  using namespace ulpgate;
  // Large cases allocate and free vectors of 10^7-10^8 elements at every step (reference,
  // comparison, analysis). glibc serves each from a fresh mmap, whose pages the kernel
  // zeroes on first touch: a quarter of a 4096^2 sweep point went to that. From the heap,
  // and never trimmed, freed blocks are reused instead (the high-water mark stays mapped).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  CLI::App app{"ulpgate: numerical-precision validation and fuzzing for GPU GEMM and attention kernels", "ulpgate"};
  app.set_version_flag("--version", fmt::format("ulpgate {} (git {})", ULPGATE_VERSION, git_revision()));
  app.require_subcommand(1);
  app.fallthrough(true);  // global options may follow the verb
  GlobalOptions globals;
  // One value per --plugin (repeat the flag), so that it may stand before a positional argument.
  app.add_option("--plugin", globals.plugins, "Load kernels from a plugin shared library (repeatable)")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--reference", globals.reference,
                 "Where GEMM references compute their exact dot products: auto (default: the GPU's int8 digit "
                 "products for cases of 2^29 terms or more where a CUDA device is present, else the CPU), cpu, gpu "
                 "(sets ULPGATE_REFERENCE for worker processes)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}));
  // In this order in --help.
  const std::vector<Verb> verbs = {add_list(app),   add_worker(app), add_sweep(app), add_fuzz(app),  add_merge(app),
                                   add_replay(app), add_export(app), add_check(app), add_probe(app), add_bench(app),
                                   add_gate(app),   add_baseline(app), add_report(app)};
  if (const std::optional<Exit> done = parse_command_line(app, argc, argv)) return code(*done);
  try {
    for (const Verb& verb : verbs) {
      if (!verb.command->parsed()) continue;
      if (verb.large_memory) restart_with_huge_pages(argv);
      return code(run_verb(verb, globals, argc, argv));
    }
  } catch (const InputError& e) {
    std::fprintf(stderr, "ulpgate: error: %s\n", e.what());
    return code(Exit::Usage);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ulpgate: internal error: %s\n", e.what());
    return code(Exit::Internal);
  }
  return code(Exit::Ok);
}
