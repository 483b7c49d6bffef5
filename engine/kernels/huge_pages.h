#pragma once
// Memory for large, read-mostly buffers (model weights) backed by transparent huge pages.
// Streaming a matrix through 4 KiB pages costs a TLB miss every 4 KiB and stops the hardware
// prefetcher at every page boundary; with 2 MiB pages the matvec kernels read measurably faster
// (DESIGN's tuning table). Debian's default THP mode is
// "madvise", so buffers must ask for huge pages explicitly.
#include <cstddef>

namespace kvchat::kernels {

// 2 MiB-aligned, zero-filled storage of at least `bytes` bytes, advised for huge pages (falls back to
// ordinary pages where the system has none). Throws std::bad_alloc. Free with free_huge_page_buffer.
void* allocate_huge_page_buffer(std::size_t bytes);
void free_huge_page_buffer(void* buffer, std::size_t bytes);

// Advises an existing buffer (the whole 2 MiB pages inside [data, data + bytes)) for huge pages.
// Returns false where the system does not support it. Takes effect for pages not yet touched, or
// when the kernel's background compaction gets to them.
bool advise_huge_pages(void* data, std::size_t bytes);

}  // namespace kvchat::kernels
