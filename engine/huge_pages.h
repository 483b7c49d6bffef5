#pragma once
// Large buffers on transparent huge pages. A KV cache or a snapshot of a long conversation is 100+ MB:
// in 4 KiB pages its first touch is ~32,000 page faults (measured: ~0.6 s for 131 MB on a 2-core VM,
// more than copying the bytes), in 2 MiB pages ~64. Where the system keeps huge pages for those who ask
// (/sys/kernel/mm/transparent_hugepage/enabled = madvise, Debian's default) the buffer asks; elsewhere
// it is an ordinary aligned allocation.
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvchat {

// Uninitialised bytes, 2 MiB-aligned when large. Move-only.
class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(std::size_t bytes);
  std::uint8_t* data() { return bytes_.get(); }
  const std::uint8_t* data() const { return bytes_.get(); }
  std::size_t size() const { return size_; }
  bool operator==(const HugePageBuffer& other) const;

 private:
  struct Free {
    void operator()(std::uint8_t* bytes) const;
  };
  std::unique_ptr<std::uint8_t, Free> bytes_;
  std::size_t size_ = 0;
};

// at::empty's equivalent on huge pages (contiguous, uninitialised), for the cache's large buffers.
at::Tensor empty_on_huge_pages(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace kvchat
