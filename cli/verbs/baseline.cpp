// `ulpgate baseline update RUN.json --out B`: the baseline the gate compares later runs with.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "campaign/gate.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"

namespace ulpgate {
namespace {

struct BaselineArgs {
  std::string run, out;
  double slack = 0.25, slack_ulp = 1.0;
};

Exit baseline_update_command(const BaselineArgs& a) {
  if (!(a.slack >= 0) || std::isinf(a.slack)) throw InputError("--slack must be finite and >= 0");
  if (!(a.slack_ulp >= 0) || std::isinf(a.slack_ulp)) throw InputError("--slack-ulp must be finite and >= 0");
  const RunRecord r = read_record_file(a.run);
  const Baseline b = baseline_from_record(r, a.slack, a.slack_ulp);
  write_baseline_file(a.out, b);
  std::printf("baseline %s: %zu cases of %zu targets from %s\n", a.out.c_str(), b.cases.size(), b.campaign.targets.size(),
              a.run.c_str());
  return Exit::Ok;
}

}  // namespace

Verb add_baseline(CLI::App& app) {
  auto a = std::make_shared<BaselineArgs>();
  auto* baseline = app.add_subcommand("baseline", "Baselines for the gate");
  auto* update = baseline->add_subcommand("update", "Write a baseline from a run record");
  set_help_footer(update,
                {
                 {"ulpgate baseline update out/fuzz.json --out baseline.json", "the baseline of a complete, passing run"},
                 {"ulpgate baseline update out/fuzz.json --out baseline.json --slack 0.5 --slack-ulp 2", "with more room for each error"}},
                "0 written; 2 bad usage or bad input (one line on stderr); 3 an internal error (a run that failed or did not complete is bad input)");
  set_help_footer(baseline,
                {
                 {"ulpgate baseline update out/fuzz.json --out baseline.json", "the baseline of a complete, passing run"},
                 {"ulpgate baseline update out/fuzz.json --out baseline.json --slack 0.5 --slack-ulp 2", "with more room for each error"}},
                "0 written; 2 bad usage or bad input (one line on stderr); 3 an internal error (a run that failed or did not complete is bad input)");
  baseline->require_subcommand(1);
  update->add_option("RUN.json", a->run, "Run record")->required();
  update->add_option("--out", a->out, "Baseline file to write")->required();
  update->add_option("--slack", a->slack, "Allowed relative growth of each error (default 0.25)");
  update->add_option("--slack-ulp", a->slack_ulp, "Absolute floor of the allowed growth, in ULPs of the output (default 1)");
  // update is the only subcommand, and baseline requires one.
  return {baseline, [a](const Context&) { return baseline_update_command(*a); }, /*uses_kernels=*/true, /*large_memory=*/false};
}

}  // namespace ulpgate
