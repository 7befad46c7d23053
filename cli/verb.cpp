#include "cli/verb.hpp"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "cli/memory.hpp"
#include "cli/options.hpp"
#include "kernels/builtin.hpp"
#include "kernels/plugin/loader.hpp"
#include "references/gemm_reference.hpp"

namespace ulpgate {

std::uint64_t Context::max_memory(const std::string& text) const {
  return text.empty() ? default_max_memory() : parse_memory_size(text);
}

void set_help_footer(CLI::App* command, std::initializer_list<HelpExample> examples, const char* exit_codes) {
  std::string text = "Examples:\n";
  for (const HelpExample& e : examples) text += fmt::format("  {}\n      {}\n", e.command, e.what);
  text += fmt::format("\nExit codes: {}.\n", exit_codes);
  command->footer(text);
}

Exit usage_error(const std::string& msg) {
  std::fprintf(stderr, "ulpgate: error: %s (see 'ulpgate --help')\n", msg.c_str());
  return Exit::Usage;
}

std::optional<Exit> parse_command_line(CLI::App& app, int argc, char** argv) {
  // An unknown verb gets a message of its own rather than CLI11's "argument not expected".
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const auto* sub : app.get_subcommands({})) known |= sub->get_name() == argv[1];
    if (!known) return usage_error(fmt::format("unknown command '{}'", argv[1]));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version
      app.exit(e);
      return Exit::Ok;
    }
    if (argc <= 1) {
      std::fputs(app.help().c_str(), stderr);
      return Exit::Usage;
    }
    return usage_error(e.what());
  }
  return std::nullopt;
}

Exit run_verb(const Verb& verb, const GlobalOptions& g, int argc, char** argv) {
  Context ctx;
  for (int i = 0; i < argc; ++i) ctx.command_line += (i ? " " : "") + std::string(argv[i]);
  if (!verb.uses_kernels) return verb.run(ctx);
  if (!g.reference.empty()) {
    ::setenv("ULPGATE_REFERENCE", g.reference.c_str(), 1);  // worker processes inherit it
    set_reference_path(*parse_reference_path(g.reference));
    if (g.reference == "gpu" && !gpu_reference_available())
      return usage_error("--reference gpu: no CUDA device here (or a build without CUDA)");
  }
  ctx.plugins = resolve_plugins(g.plugins);  // "" refused, "foo.so" here found
  ctx.local = [plugins = ctx.plugins] {
    Registry r = builtin_registry();
    for (const auto& p : plugins) load_plugin(p, r);
    return r;
  };
  return verb.run(ctx);
}

}  // namespace ulpgate
