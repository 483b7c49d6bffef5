#pragma once
// Leaves this process only `headroom` bytes of address space beyond what it maps now, until destroyed:
// enough for ordinary allocations, not for dozens of new threads' stacks (each reserves its 8 MiB), so a
// test can make starting threads fail for real. Only the soft limit is lowered, so it can be put back.
// Under AddressSanitizer the cap cannot work (its shadow memory is terabytes of address space):
// active() is then false and the test skips.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include "common/sanitized_build.h"

namespace kvchat::test {

class AddressSpaceHeadroom {
 public:
  explicit AddressSpaceHeadroom(rlim_t headroom) {
    if (kSanitizedBuild || getrlimit(RLIMIT_AS, &saved_) != 0) return;
    unsigned long long pages = 0;
    if (std::FILE* statm = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(statm, "%llu", &pages) != 1) pages = 0;
      std::fclose(statm);
    }
    if (pages == 0) return;
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + headroom;
    if (saved_.rlim_max != RLIM_INFINITY && lowered.rlim_cur > saved_.rlim_max) return;
    active_ = setrlimit(RLIMIT_AS, &lowered) == 0;
  }
  ~AddressSpaceHeadroom() {
    if (active_) setrlimit(RLIMIT_AS, &saved_);
  }
  AddressSpaceHeadroom(const AddressSpaceHeadroom&) = delete;
  AddressSpaceHeadroom& operator=(const AddressSpaceHeadroom&) = delete;
  bool active() const { return active_; }

 private:
  rlimit saved_{};
  bool active_ = false;
};

}  // namespace kvchat::test
