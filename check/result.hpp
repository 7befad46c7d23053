// One kernel run on one case as the check path hands it on: the run record's entry
// (campaign/record.hpp writes and reads it).
#pragma once

#include <string>
#include <vector>

#include "check/analyze.hpp"
#include "check/runner.hpp"
#include "core/case.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

/// One kernel run on one case.
struct CaseResult {
  std::string kernel;
  Case spec;                 ///< the complete case, seed included
  std::string id;            ///< case_id(kernel, spec): what the gate matches runs by
  std::string family;        ///< a description: op, types and distributions, e.g. "gemm bf16->fp32 normal(0,1)"
  std::string target;        ///< fuzz: "KERNEL DTYPE OP" of the target that generated it ("" otherwise)
  std::string origin;        ///< generated, shrunk (from a failing generated case), corpus, replay, sweep
  /// A shrunk case is the minimal form of a failure of the campaign, not one of its cases:
  /// counts leave it out.
  bool shrunk() const { return origin == "shrunk"; }
  std::string signature;     ///< failure_signature(verdict): "" when it passed
  Disposition status = Disposition::Ok;
  std::string message;       ///< why, when status is not ok
  RunNotes notes;            ///< algorithm, workspace, library version, ...
  std::vector<ErrorMetrics> metrics;  ///< one per output
  Verdict verdict;
  std::string reproducer;    ///< one command that reruns this case, e.g. "ulpgate replay cases/x.json"
  double seconds = 0;        ///< wall time of kernel + reference + analysis
};

/// The stable id of a kernel run on a case: 16 hex digits of a hash of the kernel's name
/// and the case's complete JSON (seed included). The same case on the same kernel has the
/// same id in every run, whatever else the campaign held.
std::string case_id(const std::string& kernel, const Case& c);

/// Sets r.id and r.signature from r.kernel, r.spec and r.verdict (call after changing them).
void stamp(CaseResult& r);

}  // namespace ulpgate
