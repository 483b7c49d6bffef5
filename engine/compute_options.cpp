#include "engine/compute_options.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "engine/kernels/cpu_features.h"

namespace kvchat {

namespace {
std::atomic<bool>& kernels_flag() {
  static std::atomic<bool> flag{[] {
    const char* setting = std::getenv("KVCHAT_KERNELS");
    return !(setting && std::strcmp(setting, "off") == 0);
  }()};
  return flag;
}
}  // namespace

bool fast_kernels_enabled() { return kernels_flag().load(std::memory_order_relaxed); }
void set_fast_kernels_enabled(bool enabled) { kernels_flag().store(enabled, std::memory_order_relaxed); }

}  // namespace kvchat
