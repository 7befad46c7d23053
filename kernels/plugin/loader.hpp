// Loads plugin kernels (include/ulpgate/plugin.h) from shared libraries.
#pragma once

#include <string>

#include "kernels/kernel.hpp"

namespace ulpgate {

/// dlopens path, checks the ABI version, and adds every kernel it lists to the registry.
/// Throws InputError (bad path, missing entry point, wrong ABI, duplicate name). The
/// library stays loaded for the life of the process.
void load_plugin(const std::string& path, Registry& registry);

}  // namespace ulpgate
