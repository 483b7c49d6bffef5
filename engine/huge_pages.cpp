#include "engine/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace kvchat {

namespace {

constexpr std::size_t kHugePage = std::size_t(2) << 20;

// Below a huge page the alignment would only waste memory. The size is not rounded up: the last,
// partial huge page is ordinary pages (madvise only applies to whole huge pages).
std::uint8_t* allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t alignment = bytes >= kHugePage ? kHugePage : 64;
  void* memory = nullptr;
  if (::posix_memalign(&memory, alignment, bytes) != 0) throw std::bad_alloc();
  if (alignment == kHugePage) ::madvise(memory, bytes, MADV_HUGEPAGE);  // advice: failure changes nothing
  return static_cast<std::uint8_t*>(memory);
}

}  // namespace

void HugePageBuffer::Free::operator()(std::uint8_t* bytes) const { std::free(bytes); }

HugePageBuffer::HugePageBuffer(std::size_t bytes) : bytes_(allocate(bytes)), size_(bytes) {}

bool HugePageBuffer::operator==(const HugePageBuffer& other) const {
  return size_ == other.size_ && (size_ == 0 || std::memcmp(data(), other.data(), size_) == 0);
}

at::Tensor empty_on_huge_pages(at::IntArrayRef sizes, at::ScalarType dtype) {
  std::size_t bytes = c10::elementSize(dtype);
  for (std::int64_t size : sizes) bytes *= static_cast<std::size_t>(size);
  if (bytes < kHugePage) return at::empty(sizes, at::TensorOptions().dtype(dtype));
  std::uint8_t* memory = allocate(bytes);
  return at::from_blob(memory, sizes, [](void* data) { std::free(data); }, at::TensorOptions().dtype(dtype));
}

}  // namespace kvchat
