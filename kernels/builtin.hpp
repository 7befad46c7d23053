// The built-in kernels: the CPU models everywhere, the CUDA, library and ladder kernels
// where a CUDA device is present. The one file that knows every backend.
#pragma once

#include "kernels/kernel.hpp"

namespace ulpgate {

/// A registry holding every built-in kernel that can run on this machine: the CPU models
/// always, the CUDA and library kernels when a CUDA device is present.
Registry builtin_registry();

}  // namespace ulpgate
