// `ulpgate check CASE.json --outputs D.npy`: outputs computed elsewhere (.npy files, "D.npy"
// or "D=FILE.npy") judged as replay judges a kernel run (check/check.hpp,
// check_given_outputs); exit 0 pass, 1 fail.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "check/check.hpp"
#include "cli/memory.hpp"
#include "cli/options.hpp"
#include "cli/results.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"

namespace ulpgate {
namespace {

struct CheckArgs {
  std::string case_path, out, max_memory;
  std::vector<std::string> outputs, forward;
  int p_bits = 0;  ///< > 0: an attention kernel that rounds P to that many bits before P V (KernelTraits)
};

// The files of --outputs, each read as the case's output it names.
std::map<std::string, Tensor> read_outputs(const Case& c, const std::vector<std::string>& output_args,
                                           std::vector<std::string>& files, std::vector<std::string>& named) {
  const std::vector<std::string> wanted = outputs_of(c);
  std::map<std::string, Tensor> outputs;
  for (const std::string& arg : output_args) {
    const auto eq = arg.find('=');
    const std::string path = eq == std::string::npos ? arg : arg.substr(eq + 1);
    const std::string op = eq == std::string::npos ? std::filesystem::path(arg).stem().string() : arg.substr(0, eq);
    if (std::find(wanted.begin(), wanted.end(), op) == wanted.end())
      throw InputError(fmt::format("--outputs {}: '{}' is not an output of this {} case (its outputs: {}; a file {}.npy, "
                                   "or {}=FILE.npy)", arg, op, name(c.op), fmt::join(wanted, ", "), wanted.front(), wanted.front()));
    if (outputs.count(op)) throw InputError(fmt::format("--outputs: {} is given twice", op));
    outputs.emplace(op, read_npy_file(path, c.types.at(op), operand_elements(c, op)));
    files.push_back(path);
    named.push_back(op + "=" + path);
  }
  for (const std::string& op : wanted)
    if (!outputs.count(op)) throw InputError(fmt::format("--outputs: no file for the case's output {} ({}.npy)", op, op));
  return outputs;
}

// The files of --forward (attention backward: the forward's O and LSE the backward was
// computed from), each read as the case's operand it names.
std::map<std::string, Tensor> read_forward(const Case& c, const std::vector<std::string>& args, std::vector<std::string>& named) {
  std::map<std::string, Tensor> out;
  const std::vector<std::string> derived = c.derived_inputs();
  for (const std::string& arg : args) {
    const auto eq = arg.find('=');
    const std::string path = eq == std::string::npos ? arg : arg.substr(eq + 1);
    const std::string op = eq == std::string::npos ? std::filesystem::path(arg).stem().string() : arg.substr(0, eq);
    if (std::find(derived.begin(), derived.end(), op) == derived.end())
      throw InputError(derived.empty() ? fmt::format("--forward {}: {} cases take no forward outputs (attention_backward does)", arg, name(c.op))
                                       : fmt::format("--forward {}: '{}' is not a forward output ({}; O.npy or O=FILE.npy)", arg, op,
                                                     fmt::join(derived, ", ")));
    if (out.count(op)) throw InputError(fmt::format("--forward: {} is given twice", op));
    out.emplace(op, read_npy_file(path, c.types.at(op), operand_elements(c, op)));
    named.push_back(op + "=" + path);
  }
  return out;
}

Exit check_command(const CheckArgs& a, const Context& ctx) {
  if (!a.out.empty()) check_output_file("--out", a.out);
  const Case c = read_case_within(a.case_path, ctx.max_memory(a.max_memory));
  if (a.p_bits != 0 && (!is_attention(c.op) || a.p_bits < 2 || a.p_bits > 24))
    throw InputError(!is_attention(c.op) ? "--p-bits: attention cases only (the precision P is rounded to before P V)"
                                           : fmt::format("--p-bits {}: must be 0 (undeclared) or 2 to 24 bits", a.p_bits));
  std::vector<std::string> files, named;
  const std::map<std::string, Tensor> outputs = read_outputs(c, a.outputs, files, named);
  std::vector<std::string> forward_named;
  const std::map<std::string, Tensor> forward = read_forward(c, a.forward, forward_named);
  const std::string source = fmt::format("external:{}", fmt::join(files, ","));
  std::printf("ulpgate check %s: %s, seed %llu\n", a.case_path.c_str(), source.c_str(), static_cast<unsigned long long>(c.seed));
  std::fflush(stdout);
  KernelTraits declared;
  declared.p_bits = a.p_bits;
  CaseResult r = check_given_outputs(c, outputs, source, declared, forward);
  return finish_single_case(r, "check",
                            fmt::format("ulpgate check {} --outputs {}{}{}", a.case_path, fmt::join(named, " --outputs "),
                                        forward_named.empty() ? "" : fmt::format(" --forward {}", fmt::join(forward_named, " --forward ")),
                                        a.p_bits ? fmt::format(" --p-bits {}", a.p_bits) : ""),
                            a.out);
}

}  // namespace

Verb add_check(CLI::App& app) {
  auto a = std::make_shared<CheckArgs>();
  auto* check = app.add_subcommand("check", "Judge outputs computed elsewhere (.npy) against the case's exact reference, "
                                            "as replay judges a kernel run");
  set_help_footer(check,
                {
                 {"ulpgate check case.json --outputs D.npy", "judge a GEMM output computed elsewhere"},
                 {"ulpgate check attention.json --outputs O=o.npy --p-bits 11", "attention whose P was rounded to FP16 before P V"},
                 {"ulpgate check backward.json --outputs dQ.npy --outputs dK.npy --outputs dV.npy --forward O=o.npy",
                  "attention gradients computed from a forward output of your own"}},
                "0 the outputs passed; 1 they failed; 2 bad usage or bad input (one line on stderr); 3 an internal error");
  check->add_option("CASE.json", a->case_path, "Case file (the one exported)")->required();
  check->add_option("--outputs", a->outputs, "Output file named by its output (D.npy, O.npy) or NAME=FILE.npy (repeatable)")
      ->required()
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  check->add_option("--forward", a->forward,
                    "Attention backward: the forward output the gradients were computed from, O.npy or LSE.npy (or "
                    "NAME=FILE.npy; repeatable), in place of the exact forward rounded once")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  check->add_option("--out", a->out, "Also write the run record here");
  check->add_option("--max-memory", a->max_memory, kMaxMemoryHelp);
  check->add_option("--p-bits", a->p_bits,
                    "Attention: the kernel rounds P to this many bits before P V (11: FP16, 8: BF16, as FlashAttention "
                    "and cuDNN do; 24: P kept in FP32, the tighter rule); 0 (default): undeclared, P in the inputs' 16-bit "
                    "format admitted");
  return {check, [a](const Context& ctx) { return check_command(*a, ctx); }};
}

}  // namespace ulpgate
