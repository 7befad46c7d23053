// Test equipment: a small deterministic campaign loop over the journal and isolated
// evaluations, shaped like the fuzz loop, so that a test can SIGKILL it mid-way and resume.
//
//   journal_campaign JOURNAL RECORD [--resume] [--pause-ms N] [--pid-file F]
//
// Runs 10 cases (CPU models, a planted crash, a noisy kernel, and one case twice), each
// through Journal::resume_or_run; writes the run record's cases to RECORD and prints
// "evaluated E reused R". --pause-ms sleeps after each case, so a test can kill it
// between cases; --pid-file receives the current worker's pid after each case.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "check/check.hpp"
#include "campaign/isolate.hpp"
#include "campaign/journal.hpp"
#include "campaign/record.hpp"

int main(int argc, char** argv) {
  using namespace ulpgate;
  if (argc < 3) {
    std::fprintf(stderr, "usage: journal_campaign JOURNAL RECORD [--resume] [--pause-ms N] [--pid-file F]\n");
    return 2;
  }
  const std::string journal_path = argv[1], record_path = argv[2];
  bool resume = false;
  int pause_ms = 0;
  std::string pid_file;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--resume")) resume = true;
    else if (!std::strcmp(argv[i], "--pause-ms") && i + 1 < argc) pause_ms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--pid-file") && i + 1 < argc) pid_file = argv[++i];
    else {
      std::fprintf(stderr, "journal_campaign: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  try {
    // One crash only: each costs a worker start (about 0.6 s of loading CUDA libraries).
    const char* kernels[] = {"cpu.fp32_seq",  "cpu.fp32_pairwise", "planted.exit",
                             "cpu.blockfma:block=8,frac=13,round=rz", "planted.noisy", "cpu.fp32_seq",
                             "cpu.fp32_pairwise", "cpu.blockfma:block=16,frac=10,round=rz", "planted.noisy"};
    const nlohmann::json campaign = {{"driver", "journal_campaign"}, {"cases", 10}};
    Journal journal(journal_path, campaign, resume);
    for (const auto& note : journal.notes()) std::fprintf(stderr, "note: %s\n", note.c_str());
    IsolationOptions isolation;
    isolation.worker_binary = ULPGATE_BIN;
    isolation.plugins = {PLANTED_PLUGIN};
    isolation.timeout_seconds = 30;
    IsolatedEvaluator evaluator(isolation);
    int evaluated = 0;
    for (int i = 0; i < 10; ++i) {
      const int which = i == 9 ? 0 : i;  // the last case repeats the first
      const std::string kernel = kernels[which];
      Case c = dtype_gemm_case("fp32", 8, 8, 64);
      c.seed = 100 + static_cast<std::uint64_t>(which);
      journal.resume_or_run(kernel, c, [&] {
        ++evaluated;
        return evaluator.evaluate(kernel, c);
      });
      if (!pid_file.empty() && evaluator.worker_pid() > 0) {
        // Written whole and renamed: the SIGKILL may land at any point of this.
        std::ofstream(pid_file + ".tmp") << evaluator.worker_pid() << "\n";
        std::filesystem::rename(pid_file + ".tmp", pid_file);
      }
      if (pause_ms) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
    RunRecord record;
    record.kind = "fuzz";
    record.cases = journal.campaign_cases();
    write_record_file(record_path, record);
    std::printf("evaluated %d reused %zu\n", evaluated, journal.reused());
  } catch (const InputError& e) {
    std::fprintf(stderr, "journal_campaign: %s\n", e.what());
    return 2;
  }
  return 0;
}
