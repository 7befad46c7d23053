// Test equipment: a plugin whose descriptor claims five kernels but gives no list (NULL):
// the loader must refuse it by name instead of reading through the null pointer.
#include "ulpgate/plugin.h"

namespace {
const ulpgate_plugin kPlugin = {ULPGATE_PLUGIN_ABI_VERSION, 5, nullptr};
}  // namespace

extern "C" __attribute__((visibility("default"))) const ulpgate_plugin* ulpgate_plugin_entry(void) { return &kPlugin; }
