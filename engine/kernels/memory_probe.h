#pragma once
// Measures the machine's sustained memory read bandwidth, the ceiling for batch-1 decode (which reads
// every weight once per token). Benchmarks compare the matvec kernels' achieved GB/s against it.
#include <cstddef>

namespace kvchat::kernels {

struct BandwidthResult {
  double gigabytes_per_second;  // the figure to quote: the best run (least disturbed by other load)
  double best;                  // 1e9 bytes/s
  double median;                // 1e9 bytes/s
  int runs;
};

// Reads a buffer of `bytes` (much larger than the last-level cache by default; huge pages where the
// system has them) `runs` times with `threads` threads, each streaming a contiguous slice with vector
// loads. Throws std::invalid_argument
// for threads < 1, runs < 1 or a buffer smaller than 4 KiB, std::bad_alloc if it cannot be allocated.
BandwidthResult measure_read_bandwidth(int threads, std::size_t bytes = 1ull << 30, int runs = 5);

}  // namespace kvchat::kernels
