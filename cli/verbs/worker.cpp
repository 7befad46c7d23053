// `ulpgate worker` (hidden): the isolation worker that runs kernels for fuzz, sweep and
// replay, cases in and results out as JSON lines (campaign/isolate.hpp).
#include <cstdlib>
#include <memory>
#include <string>

#include "campaign/isolate.hpp"
#include "cli/verb.hpp"

namespace ulpgate {
namespace {

struct WorkerArgs {
  unsigned threads = 0;
  unsigned jobs = 1;
};

}  // namespace

Verb add_worker(CLI::App& app) {
  auto a = std::make_shared<WorkerArgs>();
  // Hidden (no group): fuzz, sweep and replay start it, users do not.
  auto* worker = app.add_subcommand("worker", "Evaluate cases sent as JSON lines on stdin")->group("");
  worker->add_option("--threads", a->threads, "Threads for the exact references (sets ULPGATE_THREADS)");
  worker->add_option("--jobs", a->jobs, "Submitted cases checked at once")->check(CLI::Range(1u, 1024u));
  return {worker, [a](const Context& ctx) {
            if (a->threads > 0) ::setenv("ULPGATE_THREADS", std::to_string(a->threads).c_str(), 1);
            Registry registry = ctx.local();
            return static_cast<Exit>(serve_worker(registry, a->jobs));  // 0, or 3: the pipe broke
          }};
}

}  // namespace ulpgate
