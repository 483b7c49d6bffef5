#include "engine/kernels/cpu_features.h"

#include <atomic>

namespace kvchat::kernels {
namespace {
std::atomic<bool> g_avx2_kernels_enabled{true};
}

bool cpu_has_avx2_fma() {
  static const bool supported = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
  }();
  return supported;
}

bool use_avx2_kernels() { return cpu_has_avx2_fma() && g_avx2_kernels_enabled.load(std::memory_order_relaxed); }

void set_avx2_kernels_enabled(bool enabled) { g_avx2_kernels_enabled.store(enabled, std::memory_order_relaxed); }

}  // namespace kvchat::kernels
