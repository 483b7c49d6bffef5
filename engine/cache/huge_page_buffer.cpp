#include "engine/cache/huge_page_buffer.h"

#include <cstring>

#include "engine/kernels/huge_pages.h"

namespace kvchat {

namespace {
// Below one huge page an ordinary allocation wastes nothing and faults little.
constexpr std::size_t kHugePage = std::size_t(2) << 20;
}  // namespace

void HugePageBuffer::Free::operator()(std::uint8_t* bytes) const { kernels::free_huge_page_buffer(bytes, size); }

HugePageBuffer::HugePageBuffer(std::size_t bytes)
    : bytes_(bytes == 0 ? nullptr : static_cast<std::uint8_t*>(kernels::allocate_huge_page_buffer(bytes)),
             Free{bytes}) {}

bool HugePageBuffer::operator==(const HugePageBuffer& other) const {
  return size() == other.size() && (size() == 0 || std::memcmp(data(), other.data(), size()) == 0);
}

at::Tensor empty_on_huge_pages(at::IntArrayRef sizes, at::ScalarType dtype) {
  std::size_t bytes = c10::elementSize(dtype);
  for (std::int64_t size : sizes) bytes *= static_cast<std::size_t>(size);
  if (bytes < kHugePage) return at::empty(sizes, at::TensorOptions().dtype(dtype));
  void* memory = kernels::allocate_huge_page_buffer(bytes);
  return at::from_blob(
      memory, sizes, [bytes](void* data) { kernels::free_huge_page_buffer(data, bytes); },
      at::TensorOptions().dtype(dtype));
}

}  // namespace kvchat
