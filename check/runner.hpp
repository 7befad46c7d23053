// The runner: allocates and poisons outputs, runs one kernel on one case, copies back,
// and reports what the kernel did to memory (unwritten outputs, writes into padding,
// modified inputs) before any analysis of the values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/tensor.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

/// How a run ended, richer than pass/fail (CUTLASS's Disposition).
enum class Disposition { Ok, NotSupported, Failed, Crashed, TimedOut };
std::string_view name(Disposition d);

struct RunOutcome {
  Disposition status = Disposition::Ok;
  std::string message;                    ///< why, for anything but Ok
  std::map<std::string, Tensor> outputs;  ///< "D" or "O", host copies (padding included)
  std::int64_t unwritten = 0;             ///< output elements no run wrote (see run_kernel)
  /// Per output ("D", "O"), the buffer offsets of those elements, ascending.
  std::map<std::string, std::vector<std::int64_t>> unwritten_at;
  std::int64_t padding_written = 0;       ///< padding elements of the output that changed
  std::vector<std::string> inputs_modified;
  RunNotes notes;                         ///< algorithm, library version, ...
};

/// The NaN pattern outputs are filled with before a run: sign set, exponent all ones, a
/// payload no arithmetic produces (hardware writes canonical NaNs), e.g. FP32 0xffbadbad.
/// In 8-bit formats every code is something a kernel may write (E4M3: 0xFF, its only
/// negative NaN), hence the second run of run_kernel.
Code poison_code(Format f);
/// The poison of that second run: the poison with its sign flipped (E4M3: 0xBA, finite,
/// as its positive NaN is the canonical one).
Code alternate_poison_code(Format f);

/// An output tensor of the case ("D" or "O") of the right size, filled with the poison
/// (or the alternate poison).
Tensor make_output(const Case& c, const std::string& operand, bool alternate = false);

/// Output operand names of a case, the op's main output first: "D" for GEMM, "O" for
/// attention, then "LSE" where the case asks for the log-sum-exp (types["LSE"]).
std::vector<std::string> outputs_of(const Case& c);

/// Runs kernel k on case c with the given inputs (host tensors, as gemm_view()/
/// attention_view() lay them out). Device kernels get device copies. Never throws for a
/// kernel failure: that becomes the outcome's status and message. An element is unwritten
/// when it still holds the poison and, in a second run made only when some element did,
/// the alternate poison (the outputs are the first run's).
RunOutcome run_kernel(Kernel& k, const Case& c, const std::map<std::string, Tensor>& inputs);

}  // namespace ulpgate
