#include "engine/kernels/cpu_features.h"

namespace kvchat::kernels {

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

}  // namespace kvchat::kernels
