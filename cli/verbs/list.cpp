// `ulpgate list`: the kernels, formats and input distributions available here.
#include <cstdio>
#include <string>

#include "cli/verb.hpp"
#include "core/format.hpp"
#include "distributions/spec.hpp"
#include "kernels/device.hpp"

namespace ulpgate {
namespace {

void list_formats() {
  std::printf("formats:\n");
  std::printf("  %-5s %4s %4s %5s %5s %-13s %-13s %-13s %s\n", "name", "bits", "exp", "frac",
              "bias", "max", "min normal", "min subnorm", "description");
  for (Format f : kAllFormats) {
    const auto& fi = info(f);
    std::printf("  %-5s %4d %4d %5d %5d %-13.6g %-13.6g %-13.6g %s\n",
                std::string(fi.name).c_str(), fi.bits, fi.exp_bits, fi.frac_bits, fi.bias,
                fi.max_finite(), fi.min_normal(), fi.min_subnormal(),
                std::string(fi.description).c_str());
  }
  std::printf("roundings: rne (nearest even), rna (nearest, ties away), rz, ru, rd; "
              "overflow: nosat (IEEE), satfinite\n");
}

void list_kernels(const Registry& registry) {
  std::printf("kernels (device: %s):\n", device_description().c_str());
  for (const auto& k : registry.all())
    std::printf("  %-40s %-6s %s\n", k->name().c_str(), k->traits().memory == Memory::Host ? "host" : "device",
                k->description().c_str());
  if (!cuda_device_available())
    std::printf("  (cublas.*, cublaslt.* and ladder.* need a CUDA device; none here)\n");
  std::printf("  cpu.blockfma:block=B,frac=F,round=R[,promote=N] builds any block-FMA model (B 1..512, F 1..52; promoted to FP32 every N products, N a multiple of B)\n");
}

}  // namespace

Verb add_list(CLI::App& app) {
  auto* list = app.add_subcommand("list", "Kernels, formats and distributions available here");
  set_help_footer(list,
                {
                 {"ulpgate list", "built-in kernels (with this machine's device), formats, distributions"},
                 {"ulpgate list --plugin ./libmykernels.so", "a plugin's kernels too"}},
                "0 listed; 2 a plugin that does not load; 3 an internal error");
  return {list, [](const Context& ctx) {
            const Registry registry = ctx.local();
            list_kernels(registry);
            list_formats();
            std::fputs(describe_families().c_str(), stdout);
            return Exit::Ok;
          },
          /*uses_kernels=*/true, /*large_memory=*/false};
}

}  // namespace ulpgate
