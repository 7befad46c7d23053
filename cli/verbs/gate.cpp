// `ulpgate gate --baseline B RUN.json`: a run record against a baseline; exit 0 pass, 1 a
// regression.
#include <cstdio>
#include <memory>
#include <string>

#include "campaign/gate.hpp"
#include "cli/verb.hpp"
#include "core/file_io.hpp"
#include "reports/report.hpp"

namespace ulpgate {
namespace {

struct GateArgs {
  std::string baseline, run, junit;
  GateOptions options;
};

Exit gate_command(const GateArgs& a) {
  const Baseline b = read_baseline_file(a.baseline);
  const RunRecord r = read_record_file(a.run);
  const GateResult g = gate(b, r, a.options);
  std::fputs(render_gate_table(g).c_str(), stdout);
  if (!a.junit.empty()) write_text_file_atomically(a.junit, render_gate_junit(g));
  return g.failed ? Exit::Failed : Exit::Ok;
}

}  // namespace

Verb add_gate(CLI::App& app) {
  auto a = std::make_shared<GateArgs>();
  auto* gate = app.add_subcommand("gate", "Compare a run record with a baseline: exit 0 pass, 1 regression");
  set_help_footer(gate,
                {
                 {"ulpgate gate --baseline baselines/cpu_models.json out/fuzz.json", "a run against the baseline of the same campaign"},
                 {"ulpgate gate --baseline base.json out/fuzz.json --junit gate.xml", "with JUnit XML for CI"}},
                "0 the gate passed; 1 a regression; 2 bad usage or bad input, or a run of another campaign (one line on stderr); 3 an internal error");
  gate->add_option("--baseline", a->baseline, "Baseline file (ulpgate baseline update)")->required();
  gate->add_option("RUN.json", a->run, "Run record")->required();
  gate->add_option("--junit", a->junit, "Write the gate's JUnit XML here");
  gate->add_flag("--allow-missing", a->options.allow_missing,
                 "Baseline cases missing from the run, or not run in its time budget, do not fail the gate");
  gate->add_flag("--allow-different-campaign", a->options.allow_different_campaign,
                 "Compare a run of another campaign definition (seed, cases, kernels, ...) instead of refusing (exit 2)");
  return {gate, [a](const Context&) { return gate_command(*a); }, /*uses_kernels=*/true, /*large_memory=*/false};
}

}  // namespace ulpgate
