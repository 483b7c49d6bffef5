#include "engine/kernels/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

namespace kvchat::kernels {
namespace {

// KVCHAT_ISA caps the instruction sets the kernels use: "portable" (the plain C++ fallbacks), "avx2", or
// "avx512" (the default: the best the processor has). KVCHAT_AVX512=off is the older spelling of "avx2".
enum class IsaCeiling { Portable, Avx2, Avx512 };

IsaCeiling isa_ceiling_from_environment() {
  const char* avx512 = std::getenv("KVCHAT_AVX512");
  const IsaCeiling older = avx512 && std::strcmp(avx512, "off") == 0 ? IsaCeiling::Avx2 : IsaCeiling::Avx512;
  const char* setting = std::getenv("KVCHAT_ISA");
  if (!setting || !*setting) return older;
  if (std::strcmp(setting, "portable") == 0) return IsaCeiling::Portable;
  if (std::strcmp(setting, "avx2") == 0) return IsaCeiling::Avx2;
  if (std::strcmp(setting, "avx512") == 0) return older;
  spdlog::warn("KVCHAT_ISA={} is none of portable, avx2, avx512: using the best the processor has", setting);
  return older;
}

const IsaCeiling g_isa_ceiling = isa_ceiling_from_environment();
std::atomic<bool> g_avx2_kernels_enabled{g_isa_ceiling != IsaCeiling::Portable};
std::atomic<bool> g_avx512_kernels_enabled{g_isa_ceiling == IsaCeiling::Avx512};

}  // namespace

bool cpu_has_avx2_fma() {
  static const bool supported = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang before 16 does not know "f16c" in __builtin_cpu_supports. The
    // operating system's saving of the AVX registers it needs is part of the "avx2" answer.
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
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

bool cpu_has_avx512_bf16() {
  static const bool supported = [] {
#if defined(__x86_64__)
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
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
