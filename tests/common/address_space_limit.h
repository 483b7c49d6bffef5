#pragma once
// Caps the process's address space, so that a test case which allocates its way out of trouble (a
// hostile size taken at its word) fails instead of passing on a machine with memory to spare.
// Under AddressSanitizer the cap cannot work: its shadow memory alone reserves terabytes of address
// space, so every later mapping would fail. There the sanitizer's own max_allocation_size_mb (set by
// scripts/test-sanitize.sh) stands in for it, failing any single allocation past the same size.
#include <sys/resource.h>

#include <algorithm>

namespace kvchat::test {

inline bool limit_address_space(rlim_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
  (void)bytes;
  return true;
#else
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0) return false;
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max > bytes) limit.rlim_max = bytes;
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, bytes);
  return setrlimit(RLIMIT_AS, &limit) == 0;
#endif
}

}  // namespace kvchat::test
