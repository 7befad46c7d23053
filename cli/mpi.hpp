// The MPI side of `mpirun -n N ulpgate fuzz` (and sweep, probe), all of it: joining the
// job, the GPU of each rank, and the collectives the verbs need. The verbs decide what
// runs where; nothing else knows of MPI. Built without MPI (ULPGATE_MPI off), join() sees
// a launcher only to refuse it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "campaign/fuzz.hpp"
#include "cli/exit.hpp"

namespace ulpgate::mpi {

struct World {
  int rank = 0, size = 1;              ///< in MPI_COMM_WORLD
  int local_rank = 0, local_size = 1;  ///< among the ranks of this node
  std::string gpu;                     ///< CUDA_VISIBLE_DEVICES given to this rank ("": none set here)
};

/// The number of ranks an MPI launcher (mpirun, mpiexec, srun) started, from the variables
/// it sets (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX / Slurm ones); 1 when none is set.
int launched_ranks();

/// Joins the job when an MPI launcher started this process with more than one rank: picks
/// this rank's GPU (below), then MPI_Init; {0, 1} otherwise (MPI untouched). Built without
/// MPI, more than one launched rank is an InputError (each rank would run everything).
///
/// GPU: with CUDA devices on the node, rank r's CUDA_VISIBLE_DEVICES becomes one device,
/// the (node-local rank mod count)-th of the visible ones (of CUDA_VISIBLE_DEVICES when set,
/// else of the driver's /proc/driver/nvidia/gpus), before any CUDA call: this process and
/// its worker processes see only that device. With no device, nothing is set.
World join();

/// Collective over the world: rank 0 gets every rank's (status, text) in rank order, the
/// others an empty vector. Texts of any length (sent in pieces).
struct Message {
  int status = 0;
  std::string text;
};
std::vector<Message> gather(const World& w, int status, const std::string& text);

/// Collective: rank 0's value, on every rank.
int broadcast(const World& w, int value);
Exit broadcast(const World& w, Exit value);

/// Runs f, catching what it throws: Exit::Ok, or Exit::Usage for an InputError and
/// Exit::Internal for another exception, its message in error ("internal error: ..." for
/// the latter). For the steps after which every rank must still meet the collectives.
Exit attempt(const std::function<void()>& f, std::string& error);

/// Collective: rank 0 alone runs decide (printing what the verb prints), then every rank
/// returns its exit. An exception from decide is printed by rank 0 ("ulpgate: error: ...")
/// and becomes Exit::Usage or Exit::Internal as in attempt(): the other ranks never wait on
/// a rank 0 that threw.
Exit rank0_decides(const World& w, const std::function<Exit()>& decide);

/// Collective, after each rank's setup: Exit::Ok when every rank set up, else the first
/// failing rank's status on every rank, its error printed once by rank 0 (prefixed
/// "MPI rank r: " unless rank 0 failed the same way) and MPI finished. A barrier too: no
/// rank returns before every rank has set up.
Exit agree_on_setup(const World& w, Exit status, const std::string& error);

/// The campaign's work shared over the ranks (FuzzScheduler, dynamic load balancing): one
/// counter per phase in an RMA window on rank 0, claimed with MPI_Fetch_and_op, and the
/// exchange an MPI_Allgatherv. Collective to make and to destroy. A rank whose campaign
/// threw calls complete_with_error() so that the others' exchanges still meet it.
class Scheduler final : public FuzzScheduler {
 public:
  explicit Scheduler(const World& w);
  ~Scheduler() override;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  int rank() const override { return w_.rank; }
  std::int64_t claim(int phase, std::int64_t count) override;
  std::vector<std::string> exchange(const std::string& text) override;
  /// The exchanges run_fuzz has not made yet, with nothing done and this error.
  void complete_with_error(const std::string& error);

 private:
  World w_;
  int exchanges_ = 0;
  void* win_ = nullptr;  // MPI_Win, kept opaque here
};

/// Collective: units 0 .. n-1 run over the ranks, each by the next free rank (a Scheduler's
/// first phase); every rank gets each unit's result, in unit order (null for a unit a
/// failing rank left undone). A `run` that throws stops this rank's claims: its error is
/// printed here and every rank finds "MPI rank r failed: ..." in `failures`.
std::vector<nlohmann::json> share_units(const World& w, std::int64_t n, const std::function<nlohmann::json(std::int64_t)>& run,
                                        std::vector<std::string>& failures);

/// MPI_Finalize (once; nothing outside a job).
void finish(const World& w);

}  // namespace ulpgate::mpi
