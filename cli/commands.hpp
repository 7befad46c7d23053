// The CLI's verbs beyond `list`, one function each (main.cpp parses the flags).
#pragma once

#include <functional>
#include <optional>

#include "campaign/gate.hpp"
#include "campaign/fuzz.hpp"
#include "campaign/isolate.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel.hpp"

namespace ulpgate {

struct SweepArgs {
  std::vector<std::string> kernels;
  std::string dtype;      ///< empty: implied by each kernel's name
  std::string out_dtype;  ///< empty: fp32 (fp64 for fp64)
  std::string vary = "K=256:65536:4";
  std::vector<std::string> dists = {"normal(0,1)"};
  std::string metric = "mean_normalised";
  std::int64_t mn = 64;
  std::uint64_t seed = 1;
  std::string out_dir;
  std::int64_t seq_q = 16;  ///< attention sweeps: queries per case
  std::uint64_t max_memory = 0;  ///< bytes a point may need (--max-memory; 0: the default)
  std::vector<std::string> plugins;
  bool in_process = false;  ///< run the points in this process (default: a worker process)
  double timeout = 600;     ///< seconds per point before the worker is killed
};

/// Builds the registry of this process (built-in kernels and --plugin libraries): used only
/// where kernels run here (--in-process). Otherwise a worker process holds the kernels and
/// this process plans with stand-ins (campaign/isolate.hpp, worker_registry).
using LocalRegistry = std::function<Registry()>;

/// Runs the sweep; returns the exit code.
int sweep_command(const SweepArgs& a, const LocalRegistry& local, const std::string& command_line);

}  // namespace ulpgate

namespace ulpgate {

struct FuzzArgs {
  std::vector<std::string> kernels;  ///< empty: every kernel here
  std::vector<std::string> dtypes;   ///< empty: every dtype each kernel supports
  std::int64_t cases = kDefaultCampaignCases;  ///< per (kernel, dtype)
  double seconds = 300;              ///< whole-campaign budget (0: none)
  std::uint64_t seed = 1;
  std::int64_t max_k = kDefaultCampaignMaxK;
  std::string sizes = "realistic";   ///< small, realistic or large (campaign/fuzz.hpp SizeSchedule)
  std::string out_dir = "ulpgate-out";
  std::string corpus_dir;            ///< empty: <out>/corpus
  bool no_metamorphic = false;
  bool in_process = false;  ///< no worker isolation
  int jobs = 0;             ///< workers at once (0: one per core, at most 16; in process: 1)
  double timeout = 300;     ///< per case, in the worker
  bool resume = false;      ///< continue from <out>/journal.jsonl
  bool no_html = false;     ///< skip report.html (it needs gnuplot)
  bool allow_partial = false;  ///< exit 0 although the time budget cut the campaign short
  std::vector<std::string> plugins;  ///< for the worker
  std::uint64_t max_memory = 0;  ///< bytes a corpus case may need (--max-memory; 0: the default)
  std::string shard;             ///< "INDEX/COUNT" (--shard; "": the whole campaign)
};

int fuzz_command(const FuzzArgs& a, const LocalRegistry& local, const std::string& command_line);

/// `ulpgate merge RUN.json... --out DIR`: the shards' records of one campaign as the
/// campaign's record and reports (campaign/fuzz.hpp merge_shards); exit as fuzz would.
int merge_command(const std::vector<std::string>& runs, const std::string& out_dir, bool no_html, bool allow_partial,
                  const std::string& command_line);

/// `ulpgate bench` (campaign/bench.hpp): kernels by name (a name ending in '.' is a prefix),
/// cases by GEMM shape or attention shape, one input type.
struct BenchArgs {
  std::vector<std::string> kernels, gemm_shapes, attention_shapes;
  std::string baseline, shapes_preset, dtype, layout, json, md, html, seed = "1";
  bool causal = false, no_flush = false, no_check = false;
  int reps = 20, warmup = 3;
};
int bench_command(const BenchArgs& a, const LocalRegistry& local);
/// Replays a case file on its kernel, in a worker process unless isolation is nullopt;
/// a case that needs more than max_memory bytes (0: the default) is refused first.
int replay_command(const std::string& case_path, const LocalRegistry& local, const std::string& out_json,
                   const std::optional<IsolationOptions>& isolation, const std::vector<std::string>& plugins,
                   std::uint64_t max_memory = 0);
/// Judges outputs computed elsewhere (.npy files, "D.npy" or "D=FILE.npy") as replay judges
/// a kernel run (check/check.hpp, check_given_outputs); exit 0 pass, 1 fail. p_bits > 0
/// declares an attention kernel that rounds P to that many bits before P V (KernelTraits).
int check_command(const std::string& case_path, const std::vector<std::string>& outputs, const std::string& out_json,
                  std::uint64_t max_memory, int p_bits = 0);
/// Writes the case's inputs (the buffers a kernel gets) as DIR/<operand>.npy and
/// DIR/manifest.json; an earlier export in dir is replaced only with force.
int export_command(const std::string& case_path, const std::string& dir, bool force, std::uint64_t max_memory);
int gate_command(const std::string& baseline_path, const std::string& run_path, const std::string& junit_path,
                 const GateOptions& options);
int baseline_update_command(const std::string& run_path, const std::string& out_path, double relative_slack,
                            double absolute_slack_ulp);

}  // namespace ulpgate
