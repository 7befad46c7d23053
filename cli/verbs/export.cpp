// `ulpgate export CASE.json --dir DIR`: a case's inputs as .npy files and a manifest, for
// kernels run outside ulpgate; `ulpgate check --outputs` judges what they computed.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "check/ops/op.hpp"
#include "check/runner.hpp"
#include "cli/memory.hpp"
#include "cli/options.hpp"
#include "cli/verb.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/npy.hpp"
#include "distributions/fill.hpp"

namespace ulpgate {
namespace {

struct ExportArgs {
  std::string case_path, dir, max_memory;
  bool force = false;  ///< replace an earlier export in dir
};

// Where each element of an operand's buffer lives: the npy file is the flat buffer, element
// `index` of it is operand[b][r][c] (GEMM, as stored) or [b][h][s][d] (attention).
nlohmann::json buffer_description(const Case& c, const std::string& operand) {
  const Format f = c.types.at(operand);
  const std::int64_t n = operand_elements(c, operand);
  nlohmann::json j{{"file", operand + ".npy"}, {"format", name(f)}, {"dtype", npy_dtype(f)}, {"elements", n},
                   {"shape", {n}}};
  if (c.op == Op::Gemm) {
    const MatrixView v = gemm_view(c, operand);
    const bool row = v.layout == Layout::RowMajor;
    j.update({{"layout", row ? "row_major" : "col_major"}, {"batch", v.batch}, {"rows", v.rows}, {"cols", v.cols},
              {"ld", v.ld}, {"batch_stride", v.batch_stride()},
              {"index", row ? "b*batch_stride + r*ld + c" : "b*batch_stride + c*ld + r"},
              {"padding", row ? "c >= cols" : "r >= rows"}});
  } else {
    const AttentionView v = attention_view(c, operand);
    const bool bhsd = v.layout == AttentionLayout::BHSD;
    j.update({{"layout", name(v.layout)}, {"batch", v.batch}, {"heads", v.heads}, {"seq", v.seq}, {"dim", v.dim},
              {"index", bhsd ? "((b*heads + h)*seq + s)*dim + d" : "((b*seq + s)*heads + h)*dim + d"}});
  }
  return j;
}

Exit export_command(const ExportArgs& a, const Context& ctx) {
  const std::string& case_path = a.case_path;
  const std::string& dir = a.dir;
  Case c = read_case_within(case_path, ctx.max_memory(a.max_memory));
  check_out_dir(dir);
  const std::filesystem::path out(dir);
  std::error_code ec;
  if (!a.force && std::filesystem::exists(out / "manifest.json", ec))
    throw InputError(fmt::format("--dir {}: holds an export already ({}); --force replaces it", dir,
                                 (out / "manifest.json").string()));
  std::map<std::string, Tensor> inputs;
  try {
    inputs = case_inputs(c);  // may set the amax scales and kv_lengths: the manifest's case has them
  } catch (const InputError& e) {
    throw InputError(case_path + ": " + e.what());
  }
  create_out_dir(dir);
  nlohmann::json manifest{{"ulpgate_export", 1}, {"case", to_json(c)}};
  std::vector<std::string> files;
  for (const auto& [operand, t] : inputs) {
    files.push_back(operand + ".npy");
    write_npy_file((out / files.back()).string(), t);
    manifest["inputs"][operand] = buffer_description(c, operand);
  }
  for (const std::string& operand : outputs_of(c)) {
    manifest["outputs"][operand] = buffer_description(c, operand);
    manifest["outputs"][operand]["padding_read"] = false;
  }
  // Last, so that a manifest names a complete export.
  write_text_file_atomically((out / "manifest.json").string(), manifest.dump(2) + "\n");
  std::printf("%s\n", fmt::format("ulpgate export {}: seed {}, {} and manifest.json written to {}; outputs to compute: {}",
                                    case_path, c.seed, fmt::join(files, ", "), dir, fmt::join(outputs_of(c), ", ")).c_str());
  return Exit::Ok;
}

}  // namespace

Verb add_export(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* export_ = app.add_subcommand("export", "Write a case's inputs as .npy files (the buffers a kernel gets, padding "
                                               "included) and DIR/manifest.json, for a kernel run elsewhere");
  set_help_footer(export_,
                {
                 {"ulpgate export case.json --dir inputs", "inputs/A.npy, inputs/B.npy, ..., inputs/manifest.json"}},
                "0 written; 2 bad usage or bad input (one line on stderr); 3 an internal error");
  export_->add_option("CASE.json", a->case_path, "Case file")->required();
  export_->add_option("--dir", a->dir, "Directory for <operand>.npy and manifest.json")->required();
  export_->add_flag("--force", a->force, "Replace an earlier export in --dir");
  export_->add_option("--max-memory", a->max_memory, kMaxMemoryHelp);
  return {export_, [a](const Context& ctx) { return export_command(*a, ctx); }, /*uses_kernels=*/true, /*large_memory=*/false};
}

}  // namespace ulpgate
