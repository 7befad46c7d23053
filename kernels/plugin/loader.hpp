// Loads plugin kernels (include/ulpgate/plugin.h) from shared libraries.
#pragma once

#include <string>

#include "kernels/kernel.hpp"

namespace ulpgate {

/// dlopens path, checks the ABI version (kOldestPluginAbi to ULPGATE_PLUGIN_ABI_VERSION;
/// a case an older version cannot describe is unsupported by its kernels, plugin.h
/// "Versions") and the kernel list (read with the descriptor of the plugin's version), and adds every kernel it lists to the registry. Throws InputError naming the plugin (bad path, missing entry
/// point, wrong ABI, a NULL or implausible kernel list, a kernel without name or
/// functions, duplicate name). The library stays loaded for the life of the process.
/// A device-memory kernel is unsupported on a machine without a CUDA device ("needs a
/// CUDA device; none here"); messages a plugin writes are read within their buffers.
void load_plugin(const std::string& path, Registry& registry);

/// The path to dlopen for --plugin `path`: dlopen searches the library path, not the
/// current directory, for a name without '/', so "foo.so" that exists here becomes
/// "./foo.so". InputError for an empty path.
std::string resolve_plugin_path(const std::string& path);

/// The oldest plugin ABI version load_plugin accepts.
inline constexpr unsigned kOldestPluginAbi = 1;

/// The most kernels one plugin may list (a larger count is a damaged descriptor).
inline constexpr unsigned kMaxPluginKernels = 4096;

}  // namespace ulpgate
