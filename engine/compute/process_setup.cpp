#include "engine/compute/process_setup.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdlib>

namespace kvchat {

void ensure_passive_openmp_threads(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("KVCHAT_NO_REEXEC")) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);
  // Still here: exec failed (no /proc, say). Run on with the default policy; only speed differs.
}

void keep_freed_memory_for_reuse() {
  // Best effort: a refused setting leaves glibc's defaults, which are only slower.
  constexpr int kLargestHeapAllocation = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kLargestHeapAllocation);
  mallopt(M_TRIM_THRESHOLD, kLargestHeapAllocation);
}

void release_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace kvchat
