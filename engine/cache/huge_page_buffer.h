#pragma once
// Large engine buffers on transparent huge pages (the allocation itself: engine/kernels/huge_pages.h).
// A KV cache or a snapshot of a long conversation is 100+ MB: in 4 KiB pages its first touch is tens of
// thousands of page faults (slower than copying the bytes), in 2 MiB pages a few dozen.
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvchat {

// Bytes on huge pages (zero-filled, 2 MiB-aligned). Move-only.
class HugePageBuffer {
 public:
  HugePageBuffer() : bytes_(nullptr, Free{0}) {}
  explicit HugePageBuffer(std::size_t bytes);
  std::uint8_t* data() { return bytes_.get(); }
  const std::uint8_t* data() const { return bytes_.get(); }
  std::size_t size() const { return bytes_.get_deleter().size; }
  bool operator==(const HugePageBuffer& other) const;

 private:
  struct Free {
    std::size_t size;
    void operator()(std::uint8_t* bytes) const;
  };
  std::unique_ptr<std::uint8_t, Free> bytes_;
};

// at::empty's equivalent for the cache's large buffers (contiguous; huge pages from 2 MiB up).
at::Tensor empty_on_huge_pages(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace kvchat
