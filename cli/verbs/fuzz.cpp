// `ulpgate fuzz`: kernels x input types fuzzed with generated cases (RapidCheck), failures
// shrunk into a corpus, the run record and reports written; in a worker process unless
// --in-process, and over MPI ranks under mpirun.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "campaign/fuzz.hpp"
#include "campaign/isolate.hpp"
#include "campaign/journal.hpp"
#include "check/ops/op.hpp"
#include "cli/memory.hpp"
#include "cli/mpi.hpp"
#include "cli/options.hpp"
#include "cli/results.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"
#include "reports/gnuplot.hpp"

namespace ulpgate {
namespace {

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
  std::string forward_kernel;    ///< attention backward's chained forward (--forward-kernel)
};

// Ctrl-C (SIGINT) or SIGTERM during a campaign: the worker's process group is killed
// (a hanging kernel would otherwise keep running, and PR_SET_PDEATHSIG reaches the worker
// only, not what it started), one line says what the journal holds and how to go on, and
// the process exits 130. Everything the handler uses is prepared before it is installed,
// and it calls only async-signal-safe functions.
namespace interrupt {

char journal_path[4096];
char children_path[64];  // /proc/self/task/<main thread>/children: the workers forked
bool tty = false;

void write_all(const char* s, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= static_cast<std::size_t>(w);
  }
}
void write_str(const char* s) { write_all(s, std::strlen(s)); }

// Kills each child's process group (the worker leads its own) and the child.
void kill_children() {
  const int fd = ::open(children_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  long pid = 0;
  for (ssize_t i = 0; i <= n; ++i) {
    if (i < n && buf[i] >= '0' && buf[i] <= '9') {
      pid = pid * 10 + (buf[i] - '0');
    } else if (pid > 0) {
      ::kill(static_cast<pid_t>(-pid), SIGKILL);
      ::kill(static_cast<pid_t>(pid), SIGKILL);
      pid = 0;
    }
  }
}

// Whole case lines of the journal: lines after the header, none when the last one is the
// finished mark (a journal this campaign has not reopened yet).
long journaled_cases() {
  const int fd = ::open(journal_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  static const char kFinished[] = "{\"finished\":true}\n";
  constexpr std::size_t kTail = sizeof kFinished - 1;
  char buf[1 << 16], tail[kTail + 1] = {};
  std::size_t tail_len = 0;
  long lines = 0;
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
    for (ssize_t i = 0; i < n; ++i) {
      lines += buf[i] == '\n';
      if (tail_len < kTail) tail[tail_len++] = buf[i];
      else std::memmove(tail, tail + 1, kTail - 1), tail[kTail - 1] = buf[i];
    }
  }
  ::close(fd);
  const bool finished = tail_len == kTail && std::memcmp(tail, kFinished, kTail) == 0;
  return finished || lines < 1 ? 0 : lines - 1;
}

void on_signal(int) {
  kill_children();
  kill_all_workers();  // workers the campaign's other threads started
  char number[24];
  long n = journaled_cases();
  std::size_t len = 0;
  do number[sizeof number - 1 - len++] = static_cast<char>('0' + n % 10);
  while ((n /= 10) > 0);
  if (tty) write_str("\r\033[K");
  write_str("interrupted: ");
  write_all(number + sizeof number - len, len);
  write_str(" cases journaled in ");
  write_str(journal_path);
  write_str("; rerun the same command with --resume to continue\n");
  ::_exit(kInterruptedStatus);
}

void install(const std::string& journal) {
  std::snprintf(journal_path, sizeof journal_path, "%s", journal.c_str());
  std::snprintf(children_path, sizeof children_path, "/proc/self/task/%d/children", static_cast<int>(::getpid()));
  tty = isatty(STDERR_FILENO);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace interrupt

// Every case file of the corpus is read (validated) and held to --max-memory before the
// campaign starts, so a bad one stops it before anything is written.
void check_corpus(const std::string& dir, std::uint64_t max_memory) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".json") continue;
    read_case_within(e.path().string(), max_memory);
  }
}

// Why a kernel has no target among the dtypes asked (all when none): each distinct reason
// it gave, with the basic cases it gave it for, e.g. "FP16 A, B, C and D (fp32 gemm to fp32,
// bf16, fp16); GEMM only (fp32 attention to fp32, bf16, fp16)".
std::string refused_basic_cases(Kernel& k, const std::vector<std::string>& dtypes) {
  std::vector<std::pair<std::string, std::vector<std::string>>> by_reason;
  for (const OpModule* op : all_op_modules())
    for (const std::string& dt : op->dtypes()) {
      if (!dtypes.empty() && !std::count(dtypes.begin(), dtypes.end(), dt)) continue;
      const std::string what = fmt::format("{} {} to ", dt, name(op->op()));
      for (const Case& c : op->basic_cases(dt)) {
        const auto why = k.unsupported(c);
        if (!why) continue;
        auto it = std::find_if(by_reason.begin(), by_reason.end(), [&](const auto& r) { return r.first == *why; });
        if (it == by_reason.end()) it = by_reason.insert(by_reason.end(), {*why, {}});
        const std::string out(name(c.types.at(outputs_of(c).front())));
        if (!it->second.empty() && it->second.back().rfind(what, 0) == 0) it->second.back() += ", " + out;
        else it->second.push_back(what + out);
      }
    }
  std::vector<std::string> parts;
  for (const auto& [why, cases] : by_reason) parts.push_back(fmt::format("{} ({})", why, fmt::join(cases, "; ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// "INDEX/COUNT", 0 <= INDEX < COUNT <= 2^20.
std::pair<int, int> parse_shard(const std::string& s) {
  const auto slash = s.find('/');
  const auto number = [&](const std::string& t) -> long long {
    if (t.empty() || t.size() > 8 || t.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(t);
  };
  const long long i = slash == std::string::npos ? -1 : number(s.substr(0, slash));
  const long long n = slash == std::string::npos ? -1 : number(s.substr(slash + 1));
  if (i < 0 || n < 1 || n > (1 << 20) || i >= n)
    throw InputError(fmt::format("--shard '{}': expected INDEX/COUNT with 0 <= INDEX < COUNT <= 1048576, e.g. 0/4", s));
  return {static_cast<int>(i), static_cast<int>(n)};
}

// A campaign set up to run: its options, the worker and the registry the targets came from.
struct Campaign {
  FuzzOptions o;
  std::unique_ptr<mpi::Scheduler> scheduler;  // under mpirun
  std::unique_ptr<IsolatedEvaluator> evaluator;
  Registry registry;
};

// This campaign's journal, and under MPI the other ranks' too; an unfinished one is
// continued with --resume only.
void set_journals(FuzzOptions& o, const FuzzArgs& a, const mpi::World& world) {
  o.journal_path = (std::filesystem::path(a.out_dir) / "journal.jsonl").string();
  if (world.size > 1) {
    if (!a.shard.empty())
      throw InputError(fmt::format("--shard {}: under mpirun the {} ranks share the campaign themselves (drop --shard)", a.shard, world.size));
    o.journal_path = (std::filesystem::path(a.out_dir) / fmt::format("journal-rank-{}.jsonl", world.rank)).string();
    // Units go to whichever rank is free: a resume finds a case in any rank's journal.
    const std::regex rank_journal("journal-rank-[0-9]+\\.jsonl");
    std::error_code ec;
    for (std::filesystem::directory_iterator it(a.out_dir, ec), end; !ec && it != end; it.increment(ec))
      if (std::regex_match(it->path().filename().string(), rank_journal) && it->path().string() != o.journal_path)
        o.journals_read.push_back(it->path().string());
    std::sort(o.journals_read.begin(), o.journals_read.end());
  }
  o.resume = a.resume;
  if (!a.resume)
    if (const std::size_t n = unfinished_journal_cases(o.journal_path))
      throw InputError(fmt::format("{} holds an unfinished campaign ({} cases journaled): --resume continues it, "
                                   "or remove it / choose another --out",
                                   o.journal_path, n));
}

// The targets (kernel x dtype) of the kernels and dtypes asked.
void choose_targets(Campaign& c, const FuzzArgs& a) {
  FuzzOptions& o = c.o;
  // Only the kernels asked for are asked what they support: a campaign over one kernel
  // must not depend on (or crash in) another kernel's supports().
  for (const auto& k : a.kernels)
    if (!c.registry.resolve(k)) throw InputError(fmt::format("--kernel '{}': no such kernel here (see ulpgate list)", k));
  for (const auto& t : all_targets(c.registry, a.kernels))
    if (a.dtypes.empty() || std::count(a.dtypes.begin(), a.dtypes.end(), t.dtype)) o.targets.push_back(t);
  // A kernel named that runs nothing is a mistake to report, not a campaign of the others;
  // one whose supports() crashed or hung is a kernel failure, recorded by the campaign.
  const auto supports_failed = [&](const std::string& kernel) {
    if (!c.evaluator) return false;
    const auto& failed = c.evaluator->support_failures();
    return std::any_of(failed.begin(), failed.end(), [&](const CaseResult& r) { return r.kernel == kernel; });
  };
  for (const auto& name : a.kernels) {
    Kernel* k = c.registry.resolve(name);
    if (std::none_of(o.targets.begin(), o.targets.end(), [&](const FuzzTarget& t) { return t.kernel == k->name(); }) &&
        !supports_failed(k->name()))
      throw InputError(fmt::format("--kernel '{}': no target here: it refused the basic case of every dtype asked: {}", name,
                                   refused_basic_cases(*k, a.dtypes)));
  }
  if (o.targets.empty()) throw InputError("fuzz: no kernel here supports the requested --dtype");
  if (!a.forward_kernel.empty()) {
    Kernel* f = c.registry.resolve(a.forward_kernel);
    if (!f) throw InputError(fmt::format("--forward-kernel '{}': no such kernel here (see ulpgate list)", a.forward_kernel));
    if (std::none_of(o.targets.begin(), o.targets.end(), [](const FuzzTarget& t) { return t.op == Op::AttentionBackward; }))
      throw InputError(fmt::format("--forward-kernel {}: no attention_backward target in this campaign (name a backward kernel "
                                   "with --kernel)", a.forward_kernel));
    o.forward_kernel = f->name();
  }
}

// Every flag, the output directory, the corpus and an earlier journal are checked before a
// worker starts or anything is written. Under MPI (world.size > 1) this is rank
// world.rank's shard of the campaign: its own journal (<out>/journal-rank-R.jsonl), its
// share of the node's cores, and the corpus as it was before any rank ran.
void prepare(Campaign& c, const FuzzArgs& a, const LocalRegistry& local, const mpi::World& world) {
  check_cases(a.cases);
  check_budget(a.seconds);
  check_timeout(a.timeout);
  for (const auto& d : a.dtypes) check_dtype(d);
  check_out_dir(a.out_dir);
  const std::uint64_t max_memory = a.max_memory ? a.max_memory : default_max_memory();
  FuzzOptions& o = c.o;
  o.cases = a.cases;
  o.seconds = a.seconds;
  o.seed = a.seed;
  o.max_k = a.max_k;
  const auto sizes = parse_size_schedule(a.sizes);
  if (!sizes) throw InputError(fmt::format("--sizes '{}': expected small, realistic or large", a.sizes));
  o.sizes = *sizes;
  o.metamorphic = !a.no_metamorphic;
  o.corpus_dir = a.corpus_dir.empty() ? (std::filesystem::path(a.out_dir) / "corpus").string() : a.corpus_dir;
  o.cases_dir = (std::filesystem::path(a.out_dir) / "cases").string();
  o.plugins = a.plugins;
  if (!a.shard.empty()) std::tie(o.shard_index, o.shard_count) = parse_shard(a.shard);
  set_journals(o, a, world);
  check_corpus(o.corpus_dir, max_memory);
  if (world.size > 1) o.corpus_files = corpus_files(o.corpus_dir);
  interrupt::install(o.journal_path);
  // Isolated (the default): kernels, their supports() included, run only in the worker.
  if (a.in_process && a.jobs > 1)
    throw InputError("--jobs needs worker processes: kernels in this process run one case at a time (drop --in-process)");
  // The ranks of one node share its cores.
  const unsigned cores = std::max(1u, default_threads() / static_cast<unsigned>(std::max(1, world.local_size)));
  o.jobs = a.in_process ? 1 : a.jobs > 0 ? a.jobs : static_cast<int>(std::min(16u, cores));
  if (!a.in_process) {
    IsolationOptions iso;
    iso.plugins = a.plugins;
    iso.timeout_seconds = a.timeout;
    // Each worker's references get its share of the cores.
    iso.reference_threads = std::max(1u, cores / static_cast<unsigned>(o.jobs));
    o.isolation = iso;
    c.evaluator = std::make_unique<IsolatedEvaluator>(iso);
    o.evaluator = c.evaluator.get();
    c.registry = worker_registry(*c.evaluator, a.kernels);
  } else {
    c.registry = local();
  }
  choose_targets(c, a);
  if (!a.no_html) report::check_gnuplot();  // before the campaign, not after it
  create_out_dir(a.out_dir);
}

// Runs the campaign with progress on stderr and events on stdout.
RunRecord run_campaign(Campaign& c, const FuzzArgs& a, const mpi::World& world) {
  const FuzzOptions& o = c.o;
  const bool tty = isatty(STDERR_FILENO);
  // Without a terminal (CI logs), a progress line at least every 10 s
  // (ULPGATE_PROGRESS_SECONDS overrides), so a long campaign is never silent.
  double progress_every = 10;
  if (const char* e = std::getenv("ULPGATE_PROGRESS_SECONDS")) progress_every = std::strtod(e, nullptr);
  double last_progress = 0;
  std::string split;
  if (world.size > 1)
    split = fmt::format("; MPI rank {} of {}: runs of {} cases claimed as it goes{}", world.rank, world.size,
                        kSharedUnitCases, world.gpu.empty() ? "" : ", CUDA_VISIBLE_DEVICES=" + world.gpu);
  else if (o.shard_count > 1)
    split = fmt::format("; shard {} of {} (every {}th target from target {})", o.shard_index, o.shard_count, o.shard_count,
                        o.shard_index);
  std::printf("ulpgate fuzz: seed %llu, %zu targets (kernel x dtype), %lld cases each, sizes %s (small regime K <= %lld), "
              "budget %s%s\n",
              static_cast<unsigned long long>(a.seed), o.targets.size(), static_cast<long long>(a.cases), a.sizes.c_str(),
              static_cast<long long>(a.max_k), a.seconds > 0 ? fmt::format("{:.0f} s", a.seconds).c_str() : "none",
              split.c_str());
  std::fflush(stdout);
  // Several ranks write to one terminal: their progress lines are not redrawn in place.
  const bool redraw = tty && world.size == 1;
  const std::string who = world.size > 1 ? fmt::format("rank {}: ", world.rank) : "";
  FuzzProgress last;
  RunRecord r = run_fuzz(
      c.registry, o,
      [&](const FuzzProgress& p) {
        last = p;
        const double rate = p.elapsed > 0 ? p.cases / p.elapsed : 0;
        const double eta = rate > 0 ? (p.total - p.cases) / rate : 0;
        if (redraw) {
          std::fprintf(stderr, "\r  %lld/%lld cases, %lld failing, %.1f cases/s, ETA %.0f s   ", static_cast<long long>(p.cases),
                       static_cast<long long>(p.total), static_cast<long long>(p.failures), rate, eta);
        } else if (p.elapsed - last_progress >= progress_every) {
          last_progress = p.elapsed;
          std::fprintf(stderr, "%sprogress: %lld/%lld cases, %lld failing, %.0f s elapsed, ETA %.0f s\n", who.c_str(),
                       static_cast<long long>(p.cases), static_cast<long long>(p.total), static_cast<long long>(p.failures),
                       p.elapsed, eta);
          std::fflush(stderr);
        }
      },
      [&](const std::string& line) {
        if (redraw) std::fprintf(stderr, "\r\033[K");
        std::printf("  %s%s\n", who.c_str(), line.c_str());
        std::fflush(stdout);
      });
  if (redraw) std::fprintf(stderr, "\r\033[K");
  if (last.elapsed > 0)
    std::printf("%sthroughput: %lld cases in %.2f s, %.0f cases/s (%d at once; results awaited %.0f%% of the time)\n",
                who.c_str(), static_cast<long long>(last.cases), last.elapsed, last.cases / last.elapsed, o.jobs,
                100 * last.waiting / last.elapsed);
  std::fflush(stdout);
  return r;
}

// Rank 0 under mpirun: the whole campaign's record and reports written (sets written), and
// the exit every rank takes; a failed rank, rank 0's own setup or campaign (status, error)
// included, is Exit::Internal.
Exit write_shared_record(Campaign& c, RunRecord& record, const FuzzArgs& a, const std::string& command_line,
                         const mpi::World& world, Exit status, const std::string& error, bool& written) {
  if (status != Exit::Ok) throw std::runtime_error("rank 0 has no record to write: " + error);
  record.command = command_line;
  std::printf("ulpgate fuzz: %d MPI ranks, work shared as they went\n", world.size);
  Exit rc = write_campaign_outputs(record, std::filesystem::path(a.out_dir), a.no_html, a.allow_partial);
  written = true;
  if (!c.scheduler->failures.empty()) {
    std::string list;
    for (const auto& [rank, why] : c.scheduler->failures) list += fmt::format("{}rank {} ({})", list.empty() ? "" : "; ", rank, why);
    std::fprintf(stderr, "ulpgate: error: %zu of %d MPI ranks failed, the cases they had not finished are recorded as "
                 "not run: %s\n", c.scheduler->failures.size(), world.size, list.c_str());
    rc = Exit::Internal;
  }
  return rc;
}

// `mpirun -n N ulpgate fuzz`: the ranks share the campaign's units as they become free
// (FuzzOptions::scheduler, dynamic load balancing); each ends with the whole record, which
// rank 0 writes with the reports; every rank exits with rank 0's code. A rank whose setup
// fails stops them all before anything runs (its error, exit 2 or 3); a rank whose campaign
// throws still meets the others' exchanges: the units it had not finished are recorded as
// not run and the exit is 3.
Exit fuzz_over_ranks(const FuzzArgs& a, const LocalRegistry& local, const std::string& command_line, const mpi::World& world) {
  Campaign c;
  std::string error;
  Exit status = mpi::attempt([&] { prepare(c, a, local, world); }, error);
  // Gather then broadcast: a barrier (no rank passes the broadcast before rank 0 has every
  // rank's setup), so every rank has listed the corpus and the journals before any rank
  // may save into them.
  if (const Exit failed = mpi::agree_on_setup(world, status, error); failed != Exit::Ok) return failed;
  c.scheduler = std::make_unique<mpi::Scheduler>(world);
  c.o.scheduler = c.scheduler.get();
  RunRecord record;
  status = mpi::attempt([&] { record = run_campaign(c, a, world); }, error);
  if (status != Exit::Ok) {
    std::fprintf(stderr, "ulpgate: MPI rank %d: %s\n", world.rank, error.c_str());
    c.scheduler->complete_with_error(error);
  }
  bool written = false;
  const Exit rc = mpi::rank0_decides(
      world, [&] { return write_shared_record(c, record, a, command_line, world, status, error, written); });
  written = mpi::broadcast(world, static_cast<int>(written)) != 0;
  // The record is written: a new campaign may replace this rank's journal.
  if (written && status == Exit::Ok) mpi::attempt([&] { mark_journal_finished(c.o.journal_path); }, error);
  c.scheduler.reset();  // collective
  mpi::finish(world);
  return rc;
}

Exit fuzz_command(const FuzzArgs& a, const LocalRegistry& local, const std::string& command_line) {
  const mpi::World world = mpi::join();
  if (world.size > 1) return fuzz_over_ranks(a, local, command_line, world);
  Campaign c;
  prepare(c, a, local, world);
  RunRecord r = run_campaign(c, a, world);
  r.command = command_line;
  const Exit rc = write_campaign_outputs(r, std::filesystem::path(a.out_dir), a.no_html, a.allow_partial);
  mark_journal_finished(c.o.journal_path);  // the record is written: a new campaign may replace it
  return rc;
}

struct FuzzFlags {
  FuzzArgs args;
  std::string seed = "1", max_memory;
};

}  // namespace

Verb add_fuzz(CLI::App& app) {
  auto f = std::make_shared<FuzzFlags>();
  FuzzArgs& a = f->args;
  auto* fuzz = app.add_subcommand("fuzz", "Fuzz kernels x input types with generated cases (RapidCheck), shrink "
                                          "failures into a corpus, write the run record and reports");
  set_help_footer(fuzz,
                {
                 {"ulpgate fuzz --kernel cpu.fp32_seq --seed 7 --out out", "one kernel, every input type it takes"},
                 {"ulpgate fuzz --plugin ./libmykernels.so --kernel my.gemm --dtype bf16 --cases 50 --time 0", "a plugin kernel, 50 cases, no time budget"},
                 {"ulpgate fuzz --out out --resume", "continue an interrupted campaign"}},
                "0 every case passed and the campaign ran completely; 1 a case failed, or the time budget cut the campaign short (PARTIAL); 2 bad usage or bad input (one line on stderr); 3 an internal error; 130 interrupted (--resume continues)");
  fuzz->add_option("--kernel", a.kernels, "Kernel (repeatable; default: every kernel here)");
  fuzz->add_option("--dtype", a.dtypes, "Input type (repeatable; default: every one each kernel supports)");
  fuzz->add_option("--cases", a.cases, "Cases per (kernel, dtype) (default 10)");
  fuzz->add_option("--time", a.seconds, "Budget in seconds for the whole campaign (default 300; 0: none)");
  fuzz->add_option("--seed", f->seed, "Campaign seed (default 1)");
  fuzz->add_option("--max-memory", f->max_memory, kMaxMemoryHelp);
  fuzz->add_option("--max-k", a.max_k, "Largest K (attention: seq_kv) of the small regime (default 1024)")
      ->check(CLI::Range(1, 1 << 20));
  fuzz->add_option("--sizes", a.sizes,
                   "Size schedule: small (small regime only), realistic (default: every fifth case from the large "
                   "regime: K up to 65536, M and N up to 4096, batch up to 16), large (every case)");
  fuzz->add_option("--out", a.out_dir, "Output directory (default ulpgate-out)");
  fuzz->add_option("--corpus", a.corpus_dir, "Corpus of saved failures, replayed first (default <out>/corpus)");
  fuzz->add_flag("--no-metamorphic", a.no_metamorphic, "Skip the repeatability, scaling and transpose checks");
  fuzz->add_option("--forward-kernel", a.forward_kernel,
                   "Attention backward: take O and LSE from this forward kernel, judged by its own rule (a chained "
                   "check; default: the exact forward rounded once)");
  fuzz->add_flag("--in-process", a.in_process, "Run kernels in this process (default: a worker process)");
  fuzz->add_option("--timeout", a.timeout, "Seconds per case before the worker is killed (default 300)");
  fuzz->add_option("--jobs", a.jobs, "Cases checked at once, by threads of one worker process (default: one per "
                                     "core, at most 16; results do not depend on it)")
      ->check(CLI::Range(1, 256));
  fuzz->add_flag("--resume", a.resume, "Continue an interrupted campaign from <out>/journal.jsonl");
  fuzz->add_flag("--allow-partial", a.allow_partial,
                 "Exit 0 although --time cut the campaign short (what did not run is recorded either way)");
  fuzz->add_flag("--no-html", a.no_html,
                 "Write no report.html (it needs gnuplot; `ulpgate report fuzz.json --html F` draws it later)");
  fuzz->add_option("--shard", a.shard,
                   "Run shard INDEX of COUNT (0-based, e.g. 2/8): every COUNT-th target; `ulpgate merge` joins the "
                   "shards' records into the whole campaign's");
  return {fuzz, [f](const Context& ctx) {
            FuzzArgs a = f->args;
            a.plugins = ctx.plugins;
            a.seed = parse_seed(f->seed);
            a.max_memory = ctx.max_memory(f->max_memory);
            return fuzz_command(a, ctx.local, ctx.command_line);
          }};
}

}  // namespace ulpgate
