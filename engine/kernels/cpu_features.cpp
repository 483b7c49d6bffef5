#include "engine/kernels/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kvchat::kernels {
namespace {
std::atomic<bool> g_avx2_kernels_enabled{true};
std::atomic<bool> g_avx512_kernels_enabled{[] {
  const char* setting = std::getenv("KVCHAT_AVX512");
  return !(setting && std::strcmp(setting, "off") == 0);
}()};
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

bool cpu_has_avx512() {
  static const bool supported = [] {
#if defined(__x86_64__)
    // libgcc's checks include the OS's XSAVE support for the 512-bit registers.
    __builtin_cpu_init();
    return cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
  }();
  return supported;
}

bool cpu_has_avx512_vnni() {
  static const bool supported = [] {
#if defined(__x86_64__)
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
  }();
  return supported;
}

bool use_avx512_kernels() {
  return use_avx2_kernels() && cpu_has_avx512() && g_avx512_kernels_enabled.load(std::memory_order_relaxed);
}

void set_avx512_kernels_enabled(bool enabled) { g_avx512_kernels_enabled.store(enabled, std::memory_order_relaxed); }

}  // namespace kvchat::kernels
