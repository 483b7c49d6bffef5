#include "engine/kernels/huge_pages.h"

#include <cstdint>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvchat::kernels {
namespace {
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

std::size_t round_up_to_huge_page(std::size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}
}  // namespace

#if defined(__linux__)

void* allocate_huge_page_buffer(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  // Over-allocate by one huge page so that the returned region can start on a 2 MiB boundary, then
  // give the unused head and tail back.
  const std::size_t size = round_up_to_huge_page(bytes);
  const std::size_t mapped = size + kHugePageBytes;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(raw, aligned - start);
  const std::uintptr_t end = start + mapped;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  void* buffer = reinterpret_cast<void*>(aligned);
  madvise(buffer, size, MADV_HUGEPAGE);  // best effort: without THP the buffer is still valid
  return buffer;
}

void free_huge_page_buffer(void* buffer, std::size_t bytes) {
  if (buffer == nullptr) return;
  munmap(buffer, round_up_to_huge_page(bytes == 0 ? 1 : bytes));
}

bool advise_huge_pages(void* data, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const std::uintptr_t last = (start + bytes) / kHugePageBytes * kHugePageBytes;
  if (last <= first) return false;
  return madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) == 0;
}

#else

void* allocate_huge_page_buffer(std::size_t bytes) {
  const std::size_t size = round_up_to_huge_page(bytes == 0 ? 1 : bytes);
  void* buffer = ::operator new (size, std::align_val_t{kHugePageBytes});
  std::memset(buffer, 0, size);
  return buffer;
}

void free_huge_page_buffer(void* buffer, std::size_t) { ::operator delete (buffer, std::align_val_t{kHugePageBytes}); }

bool advise_huge_pages(void*, std::size_t) { return false; }

#endif

}  // namespace kvchat::kernels
