#include "cli/mpi.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"

#ifndef ULPGATE_MPI
#define ULPGATE_MPI 0
#endif
#if ULPGATE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (the deprecated C++ bindings warn)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace ulpgate::mpi {
namespace {

int env_int(const char* name) {
  const char* s = std::getenv(name);
  if (!s || !*s) return -1;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  return *end || v < 0 || v > (1 << 24) ? -1 : static_cast<int>(v);
}

// This rank's place on its node from the launcher's variables (-1: none says).
int env_local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"})
    if (const int r = env_int(v); r >= 0) return r;
  return -1;
}

// The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them: its entries
// when it is set, else one index per GPU the NVIDIA driver lists. No CUDA call is made.
std::vector<std::string> visible_gpus() {
  std::vector<std::string> out;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string s(v);
    for (std::size_t at = 0; at <= s.size();) {
      const std::size_t comma = std::min(s.find(',', at), s.size());
      if (comma > at) out.push_back(s.substr(at, comma - at));
      at = comma + 1;
    }
    return out;
  }
  std::error_code ec;
  std::size_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec), end; !ec && it != end; it.increment(ec)) ++n;
  for (std::size_t i = 0; i < n; ++i) out.push_back(std::to_string(i));
  return out;
}

// Gives this rank one GPU (see join()); returns it, or "" when there is none.
std::string assign_gpu(int local_rank) {
  const std::vector<std::string> gpus = visible_gpus();
  if (gpus.empty()) return "";
  const std::string& mine = gpus[static_cast<std::size_t>(local_rank) % gpus.size()];
  ::setenv("CUDA_VISIBLE_DEVICES", mine.c_str(), 1);
  return mine;
}

#if ULPGATE_MPI
constexpr int kTagHeader = 2201, kTagBody = 2202;
constexpr std::size_t kPiece = std::size_t{1} << 30;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(fmt::format("MPI {}: {}", what, std::string(text, static_cast<std::size_t>(len))));
}
#endif

}  // namespace

int launched_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"})
    if (const int n = env_int(v); n >= 1) return n;
  if (std::getenv("PMIX_RANK"))  // srun --mpi=pmix
    if (const int n = env_int("SLURM_STEP_NUM_TASKS"); n >= 1) return n;
  return 1;
}

World join() {
  World w;
  const int launched = launched_ranks();
  if (launched <= 1) return w;
#if ULPGATE_MPI
  const int early_local = env_local_rank();
  if (early_local >= 0) w.gpu = assign_gpu(early_local);  // before MPI_Init: a CUDA-aware MPI may start CUDA there
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) check(MPI_Init(nullptr, nullptr), "MPI_Init");
  check(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &w.size), "MPI_Comm_size");
  MPI_Comm node;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  MPI_Comm_rank(node, &w.local_rank);
  MPI_Comm_size(node, &w.local_size);
  MPI_Comm_free(&node);
  if (early_local < 0) w.gpu = assign_gpu(w.local_rank);
  if (w.size == 1) finish(w);  // mpirun -n 1: a plain run
  return w;
#else
  throw InputError(fmt::format("started as one of {} MPI ranks, but this ulpgate is built without MPI (configure with "
                               "-DULPGATE_MPI=ON and an MPI installed): each rank would run the whole campaign; "
                               "without MPI, split it with --shard INDEX/COUNT and ulpgate merge",
                               launched));
#endif
}

std::vector<Message> gather(const World& w, int status, const std::string& text) {
  std::vector<Message> out;
  if (w.size <= 1) {
    out.push_back({status, text});
    return out;
  }
#if ULPGATE_MPI
  if (w.rank != 0) {
    const std::int64_t header[2] = {status, static_cast<std::int64_t>(text.size())};
    check(MPI_Send(header, 2, MPI_INT64_T, 0, kTagHeader, MPI_COMM_WORLD), "MPI_Send");
    for (std::size_t at = 0; at < text.size(); at += kPiece)
      check(MPI_Send(text.data() + at, static_cast<int>(std::min(kPiece, text.size() - at)), MPI_CHAR, 0, kTagBody,
                     MPI_COMM_WORLD),
            "MPI_Send");
    return out;
  }
  out.push_back({status, text});
  for (int r = 1; r < w.size; ++r) {
    std::int64_t header[2] = {0, 0};
    check(MPI_Recv(header, 2, MPI_INT64_T, r, kTagHeader, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
    Message m{static_cast<int>(header[0]), std::string(static_cast<std::size_t>(header[1]), '\0')};
    for (std::size_t at = 0; at < m.text.size(); at += kPiece)
      check(MPI_Recv(m.text.data() + at, static_cast<int>(std::min(kPiece, m.text.size() - at)), MPI_CHAR, r, kTagBody,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE),
            "MPI_Recv");
    out.push_back(std::move(m));
  }
#endif
  return out;
}

int broadcast(const World& w, int value) {
#if ULPGATE_MPI
  if (w.size > 1) check(MPI_Bcast(&value, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
#endif
  (void)w;
  return value;
}

Exit broadcast(const World& w, Exit value) { return static_cast<Exit>(broadcast(w, code(value))); }

Exit attempt(const std::function<void()>& f, std::string& error) {
  try {
    f();
    return Exit::Ok;
  } catch (const InputError& e) {
    error = e.what();
    return Exit::Usage;
  } catch (const std::exception& e) {
    error = std::string("internal error: ") + e.what();
    return Exit::Internal;
  }
}

Exit rank0_decides(const World& w, const std::function<Exit()>& decide) {
  Exit rc = Exit::Ok;
  if (w.rank == 0) {
    std::string error;
    if (const Exit failed = attempt([&] { rc = decide(); }, error); failed != Exit::Ok) {
      std::fprintf(stderr, failed == Exit::Usage ? "ulpgate: error: %s\n" : "ulpgate: %s\n", error.c_str());
      rc = failed;
    }
    std::fflush(stdout);
  }
  return broadcast(w, rc);
}

Exit agree_on_setup(const World& w, Exit status, const std::string& error) {
  const std::vector<Message> setup = gather(w, code(status), error);
  int rc = code(Exit::Ok);
  std::string first;
  for (std::size_t r = 0; r < setup.size() && rc == code(Exit::Ok); ++r)
    if (setup[r].status != code(Exit::Ok))
      rc = setup[r].status,
      first = setup[r].status == code(status) && setup[r].text == error ? error : fmt::format("MPI rank {}: {}", r, setup[r].text);
  rc = broadcast(w, rc);
  if (rc != code(Exit::Ok)) {
    if (w.rank == 0) std::fprintf(stderr, "ulpgate: error: %s\n", first.c_str());
    finish(w);
  }
  return static_cast<Exit>(rc);
}

#if ULPGATE_MPI
namespace {
constexpr int kPhases = 2;  // run_fuzz's: cases, shrinks (sweep and probe use the first)
MPI_Win& window(void*& w) { return *static_cast<MPI_Win*>(w); }
}  // namespace
#endif

Scheduler::Scheduler(const World& w) : w_(w) {
#if ULPGATE_MPI
  win_ = new MPI_Win;
  std::int64_t* base = nullptr;
  const MPI_Aint bytes = w.rank == 0 ? kPhases * static_cast<MPI_Aint>(sizeof(std::int64_t)) : 0;
  check(MPI_Win_allocate(bytes, sizeof(std::int64_t), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &window(win_)),
        "MPI_Win_allocate");
  check(MPI_Win_lock_all(0, window(win_)), "MPI_Win_lock_all");
  if (w.rank == 0) {
    const std::int64_t zeros[kPhases] = {};
    check(MPI_Put(zeros, kPhases, MPI_INT64_T, 0, 0, kPhases, MPI_INT64_T, window(win_)), "MPI_Put");
    check(MPI_Win_flush(0, window(win_)), "MPI_Win_flush");
  }
  check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");  // no claim before the counters are 0
#endif
}

Scheduler::~Scheduler() {
#if ULPGATE_MPI
  MPI_Win_unlock_all(window(win_));
  MPI_Win_free(&window(win_));
  delete static_cast<MPI_Win*>(win_);
#endif
}

std::int64_t Scheduler::claim(int phase, std::int64_t count) {
  (void)count;
#if ULPGATE_MPI
  if (phase < 0 || phase >= kPhases) throw std::logic_error("Scheduler::claim: no such phase");
  const std::int64_t one = 1;
  std::int64_t got = 0;
  check(MPI_Fetch_and_op(&one, &got, MPI_INT64_T, 0, phase, MPI_SUM, window(win_)), "MPI_Fetch_and_op");
  check(MPI_Win_flush(0, window(win_)), "MPI_Win_flush");
  return got;
#else
  (void)phase;
  return count;
#endif
}

std::vector<std::string> Scheduler::exchange(const std::string& text) {
  ++exchanges_;
  std::vector<std::string> out;
#if ULPGATE_MPI
  const auto n = static_cast<std::int64_t>(text.size());
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(w_.size));
  check(MPI_Allgather(&n, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, MPI_COMM_WORLD), "MPI_Allgather");
  std::vector<int> counts, displs;
  std::int64_t total = 0;
  for (const std::int64_t s : sizes) {
    if (total + s > INT32_MAX) throw std::runtime_error("the ranks' results exceed 2 GiB in one exchange");
    counts.push_back(static_cast<int>(s)), displs.push_back(static_cast<int>(total));
    total += s;
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  check(MPI_Allgatherv(text.data(), static_cast<int>(n), MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR,
                       MPI_COMM_WORLD),
        "MPI_Allgatherv");
  for (std::size_t r = 0; r < sizes.size(); ++r) out.push_back(all.substr(static_cast<std::size_t>(displs[r]), static_cast<std::size_t>(sizes[r])));
#else
  out.push_back(text);
#endif
  return out;
}

void Scheduler::complete_with_error(const std::string& error) {
  while (exchanges_ < kSharedFuzzExchanges) exchange(failed_exchange(error));
}

std::vector<nlohmann::json> share_units(const World& w, std::int64_t n, const std::function<nlohmann::json(std::int64_t)>& run,
                                        std::vector<std::string>& failures) {
  Scheduler sched(w);
  nlohmann::json mine{{"units", nlohmann::json::array()}, {"error", ""}};
  try {
    for (std::int64_t u; (u = sched.claim(0, n)) < n;) mine["units"].push_back({{"unit", u}, {"result", run(u)}});
  } catch (const std::exception& e) {
    mine["error"] = e.what();
    std::fprintf(stderr, "ulpgate: MPI rank %d: %s\n", w.rank, e.what());
  }
  std::vector<nlohmann::json> out(static_cast<std::size_t>(n));
  const std::vector<std::string> all = sched.exchange(mine.dump());
  for (std::size_t r = 0; r < all.size(); ++r) {
    const nlohmann::json j = nlohmann::json::parse(all[r]);
    for (const auto& x : j.at("units")) out.at(x.at("unit").get<std::size_t>()) = x.at("result");
    if (const std::string e = j.at("error").get<std::string>(); !e.empty()) failures.push_back(fmt::format("MPI rank {} failed: {}", r, e));
  }
  return out;
}

void finish(const World& w) {
  (void)w;
#if ULPGATE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
#endif
}

}  // namespace ulpgate::mpi
