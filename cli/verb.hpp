// The CLI's verbs, one file each (cli/verbs/<verb>.cpp): each declares its subcommand's
// options and runs it with what main resolved once for every verb.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/exit.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

/// Builds the registry of this process (built-in kernels and --plugin libraries): used only
/// where kernels run here (list, worker, bench, probe, --in-process). Otherwise a worker
/// process holds the kernels and this process plans with stand-ins (campaign/isolate.hpp,
/// worker_registry).
using LocalRegistry = std::function<Registry()>;

/// What main resolves once for every verb.
struct Context {
  std::vector<std::string> plugins;  ///< --plugin paths as loaded and as reproducers name them
  LocalRegistry local;               ///< the built-in kernels and the plugins'
  std::string command_line;          ///< the whole command, for run records
  /// --max-memory's bytes; "" means the default, half of this machine's memory.
  std::uint64_t max_memory(const std::string& text) const;
};

/// A verb: its subcommand (options bound to the verb's own state) and how it runs.
struct Verb {
  CLI::App* command = nullptr;
  std::function<Exit(const Context&)> run;
  /// false: run without applying --reference and --plugin (a verb that loads no kernels).
  bool uses_kernels = true;
  /// false: the verb never touches more than a few hundred megabytes, so it skips the
  /// restart with huge pages (cli/startup.hpp) and its second start of the process.
  bool large_memory = true;
};

/// The options every verb takes (--plugin, --reference), as parsed.
struct GlobalOptions {
  std::vector<std::string> plugins;
  std::string reference;  ///< "": auto
};

/// The help of every --max-memory.
inline constexpr const char* kMaxMemoryHelp =
    "Refuse a case that needs more memory than this, e.g. 12GB or 512MiB (default: half of this machine's memory)";

/// One example of a verb's --help: the command and what it does.
struct HelpExample {
  const char* command;
  const char* what;
};

/// Ends a verb's --help with its examples and its exit codes.
void set_help_footer(CLI::App* command, std::initializer_list<HelpExample> examples, const char* exit_codes);

/// "ulpgate: error: MSG (see 'ulpgate --help')" on stderr; Exit::Usage.
Exit usage_error(const std::string& msg);

/// Parses the command line: nullopt to go on, else the exit (0 after --help or --version;
/// an unknown verb or a parse error told as usage_error).
std::optional<Exit> parse_command_line(CLI::App& app, int argc, char** argv);

/// Applies --reference and --plugin (unless the verb loads no kernels), then runs the verb.
Exit run_verb(const Verb& verb, const GlobalOptions& g, int argc, char** argv);

Verb add_list(CLI::App& app);
Verb add_worker(CLI::App& app);
Verb add_sweep(CLI::App& app);
Verb add_fuzz(CLI::App& app);
Verb add_merge(CLI::App& app);
Verb add_replay(CLI::App& app);
Verb add_export(CLI::App& app);
Verb add_check(CLI::App& app);
Verb add_probe(CLI::App& app);
Verb add_bench(CLI::App& app);
Verb add_gate(CLI::App& app);
Verb add_baseline(CLI::App& app);
Verb add_report(CLI::App& app);

}  // namespace ulpgate
