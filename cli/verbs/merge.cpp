// `ulpgate merge RUN.json... --out DIR`: the shards' records of one campaign (fuzz --shard)
// as the campaign's record and reports (campaign/fuzz.hpp merge_shards); exit as fuzz would.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "campaign/fuzz.hpp"
#include "cli/options.hpp"
#include "cli/results.hpp"
#include "cli/verb.hpp"
#include "reports/gnuplot.hpp"

namespace ulpgate {
namespace {

struct MergeArgs {
  std::vector<std::string> runs;
  std::string out = "ulpgate-out";
  bool no_html = false, allow_partial = false;
};

Exit merge_command(const MergeArgs& a, const std::string& command_line) {
  check_out_dir(a.out);
  std::vector<std::pair<std::string, RunRecord>> shards;
  for (const auto& path : a.runs) shards.emplace_back(path, read_record_file(path));
  RunRecord r = merge_shards(shards);
  r.command = command_line;
  if (!a.no_html) report::check_gnuplot();
  create_out_dir(a.out);
  std::printf("ulpgate merge: %zu shards of campaign seed %llu, %zu targets\n", shards.size(),
              static_cast<unsigned long long>(r.seed), r.campaign.targets.size());
  return write_campaign_outputs(r, std::filesystem::path(a.out), a.no_html, a.allow_partial);
}

}  // namespace

Verb add_merge(CLI::App& app) {
  auto a = std::make_shared<MergeArgs>();
  auto* merge = app.add_subcommand("merge", "Join the records of a campaign's shards (fuzz --shard) into its record and "
                                            "reports");
  set_help_footer(merge,
                {
                 {"ulpgate merge s0/fuzz.json s1/fuzz.json --out whole", "the record and reports of a campaign run as --shard 0/2 and 1/2"}},
                "0 every case passed and every shard ran completely (as fuzz); 1 a case failed or a shard was cut short; 2 bad usage or bad input (one line on stderr); 3 an internal error");
  merge->add_option("RUN.json", a->runs, "The shards' fuzz.json files, every shard once")->required();
  merge->add_option("--out", a->out, "Output directory (default ulpgate-out)");
  merge->add_flag("--no-html", a->no_html, "Write no report.html (it needs gnuplot)");
  merge->add_flag("--allow-partial", a->allow_partial, "Exit 0 although a time budget cut a shard short");
  return {merge, [a](const Context& ctx) { return merge_command(*a, ctx.command_line); }, /*uses_kernels=*/true,
          /*large_memory=*/false};
}

}  // namespace ulpgate
