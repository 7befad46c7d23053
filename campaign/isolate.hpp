// Crash isolation: kernel evaluations in a worker process (`ulpgate worker`, a hidden verb)
// with a timeout. A kernel that segfaults, aborts, exits, hangs or poisons its CUDA context
// becomes a CaseResult (crashed, timed_out or failed) and the campaign goes on with a fresh
// worker. The parent runs no kernel code: it plans with stand-ins (worker_registry) whose
// supports() is asked of the worker. Messages: protocol.hpp; processes: process.hpp.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "check/check.hpp"
#include "campaign/record.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

struct WorkerProcess;
struct PoolReply;
class PoolReader;

/// "SIGSEGV" for the signals a misbehaving kernel or its runtime raises (strsignal's text
/// alone, "Segmentation fault", does not name the signal a user greps for); nullptr for
/// another. A string literal: safe in a signal handler.
const char* known_signal_name(int sig);

/// Starts every line the worker writes for its parent.
inline constexpr std::string_view kWorkerLinePrefix = "ulpgate-worker-v1 ";

struct IsolationOptions {
  /// The ulpgate binary to run as the worker; empty: this process's own executable
  /// (/proc/self/exe), which is right when the caller is ulpgate itself.
  std::string worker_binary;
  /// Plugin libraries the worker loads (`--plugin`), as the parent's registry did.
  std::vector<std::string> plugins;
  /// Per evaluation, from sending the request to the reply: input generation, the kernel,
  /// the reference and the analysis all count. Past it the worker is killed: timed_out.
  double timeout_seconds = 120;
  /// From starting a worker to its ready line (registry, plugins, CUDA initialisation).
  double startup_timeout_seconds = 120;
  /// Threads the worker's exact references may use (`ulpgate worker --threads N`, which
  /// sets ULPGATE_THREADS there); 0: the worker's default (every core). Campaigns that
  /// check several cases at once give each its share of the cores.
  unsigned reference_threads = 0;
  /// Cases the worker checks at once for submit() (`ulpgate worker --jobs N`: its threads).
  unsigned jobs = 1;
  /// How much of the worker's stderr (written during the failing case) a crash message keeps.
  std::size_t stderr_tail_bytes = 2048;
};

/// A generated case named by how it is drawn (fuzz.hpp, draw_case): the worker draws it
/// with its own kernel, so that the generator's supports() questions cost no round trip.
struct DrawSpec {
  Op op = Op::Gemm;
  std::string dtype;
  std::uint64_t target_seed = 0, index = 0;
  GenLimits limits;
};

/// Parent side: runs evaluations in a worker process, one at a time (evaluate) or several
/// at once in its threads (submit, next_result). The worker starts on the first
/// evaluation and again, lazily, on the first evaluation after one died. Not thread-safe;
/// one evaluator per thread of a campaign.
class IsolatedEvaluator {
 public:
  explicit IsolatedEvaluator(IsolationOptions options);
  /// Closes the worker's stdin (it exits), reaps it; kills its process group if it lingers.
  ~IsolatedEvaluator();
  IsolatedEvaluator(const IsolatedEvaluator&) = delete;
  IsolatedEvaluator& operator=(const IsolatedEvaluator&) = delete;

  /// Evaluates case c with the named kernel (a registry name, CPU model names with
  /// parameters included) in the worker, as evaluate() + to_case_result() would in process
  /// (family = case_family, reproducer left empty). A worker that dies gives status crashed
  /// (message: the signal or exit status and the tail of its stderr), one that does not
  /// answer in time timed_out. Never throws for kernel misbehaviour; throws InputError for
  /// what would fail in process too (unknown kernel, malformed case) and when no worker
  /// can be started (binary missing, bad plugin).
  CaseResult evaluate(const std::string& kernel, const Case& c, const EvaluationOptions& options = {});

  /// Concurrent checks (IsolationOptions::jobs of them in the worker's threads): submit()
  /// sends a case and returns at once; next_result() waits for any submitted case to
  /// finish and returns its id and the result evaluate() would give. Cases in flight when
  /// the worker dies, a case passes the timeout (counted from when a thread took it) or
  /// the CUDA context is lost are evaluated again, one at a time, by evaluate() in a fresh
  /// worker: a crash or hang is then the result of the case that causes it alone.
  /// evaluate(), supports() and describe() need in_flight() == 0.
  void submit(std::uint64_t id, const std::string& kernel, const Case& c, const EvaluationOptions& options = {});
  /// The same for a case the worker draws; a case it cannot draw is a failed result on
  /// the op's basic case ("harness error: case generation failed: ...").
  void submit(std::uint64_t id, const std::string& kernel, const DrawSpec& draw, const EvaluationOptions& options = {});
  std::size_t in_flight() const { return pending_.size() + redo_.size(); }
  struct Finished {
    std::uint64_t id = 0;
    CaseResult result;
    Case requested;  ///< the case as submitted or drawn (result.spec is it after filling)
    /// result's and (when the worker drew it) requested's JSON text as the worker sent
    /// them, for the journal; empty where not known.
    std::string result_json, requested_json;
  };
  Finished next_result();

  /// What the kernel says of case c, asked in the worker. A kernel whose supports() crashes
  /// or hangs the worker is unsupported with that as the reason (status Crashed or
  /// TimedOut); such failures are kept (support_failures). Throws InputError for an
  /// unknown kernel.
  struct SupportAnswer {
    bool supported = false;
    std::string why;
    Disposition status = Disposition::Ok;
  };
  SupportAnswer supports(const std::string& kernel, const Case& c);
  /// The kernels the worker has (names empty) or the named ones, resolved there (CPU model
  /// names with parameters included). Throws InputError for an unknown name.
  std::vector<std::unique_ptr<Kernel>> describe(const std::vector<std::string>& names = {});
  /// Every supports() query that crashed or hung a worker, as failed results.
  const std::vector<CaseResult>& support_failures() const { return support_failures_; }

  /// Workers started so far (a restart after a crash counts).
  int workers_started() const { return workers_started_; }
  /// The running worker's pid, -1 when none runs.
  pid_t worker_pid() const;

 private:
  /// One request and its reply. The worker may die, hang or garble: then status says how
  /// and message why, and the worker is gone. An {"error"} reply throws InputError.
  struct Exchange {
    nlohmann::json reply;
    Disposition status = Disposition::Ok;
    std::string message;
  };
  Exchange exchange(const nlohmann::json& request, const char* doing);
  /// A submitted case not yet returned.
  struct Pending {
    std::uint64_t id = 0;
    std::string kernel;
    Case c;
    EvaluationOptions options;
    std::optional<DrawSpec> draw;  ///< c is unknown until the worker drew it
    double started = -1;  ///< seconds on the steady clock when a worker thread took it
    double sent = 0;
  };
  /// The worker is killed; every pending case goes to redo_, to be evaluated alone.
  void lose_pool();
  void submit(Pending p);
  /// A pending case checked alone (evaluate(), or the worker draws it first).
  Finished evaluate_alone(const Pending& p);
  /// When the pool has overrun its timeout (seconds on the steady clock).
  double pool_deadline() const;
  /// A reply from the pool: the finished case it brings, or nullopt (a case started, or the
  /// reply lost the pool: its cases go to redo_).
  std::optional<Finished> take_pool_reply(PoolReply& reply);
  void start_worker();
  void stop_worker();
  IsolationOptions options_;
  std::vector<CaseResult> support_failures_;
  std::string binary_;
  int workers_started_ = 0;
  std::unique_ptr<WorkerProcess> worker_;  // null when none runs
  /// Pool mode: reads and parses the worker's replies on a thread of its own, so that the
  /// campaign thread only takes finished results (next_result starts it; anything else
  /// that touches the worker stops it first: stop_reader).
  std::unique_ptr<PoolReader> reader_;
  void stop_reader();
  std::map<std::uint64_t, Pending> pending_;  // submitted to the running worker
  std::deque<Pending> redo_;                  // lost with a worker, to check alone
};

/// A registry of stand-ins for the worker's kernels (every kernel it has, plus `names`
/// resolved there): names, descriptions and traits for planning; unsupported() asks the
/// worker (once per kernel and case); run() throws (kernels run only in the worker).
Registry worker_registry(IsolatedEvaluator& evaluator, const std::vector<std::string>& names = {});

/// Kills every worker this process runs (each one's process group), from any thread or a
/// signal handler (async-signal-safe): what Ctrl-C does before the campaign exits.
void kill_all_workers();

/// Worker side, `ulpgate worker [--jobs N]`: serves requests on stdin until it closes, with the
/// kernels of `registry` (builtin_registry() + the --plugin libraries; CPU model names are
/// resolved on demand). Returns the process exit code: 0 at the end of input, 0 after a
/// reply with "restart" (lost CUDA context), 3 if the protocol pipe breaks.
int serve_worker(Registry& registry, unsigned jobs = 1);

}  // namespace ulpgate
