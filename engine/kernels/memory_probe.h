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

class ThreadPool;

// The same reader over memory that already exists (e.g. a model's weights, so that the probe needs
// no memory of its own and reads pages like the ones decode reads), with the threads of `pool`.
// No warm-up pass: the memory is taken to be resident and the pool in use. Same exceptions as
// above, and for a null `data`.
BandwidthResult measure_read_bandwidth_of(const void* data, std::size_t bytes, ThreadPool& pool, int runs);

}  // namespace kvchat::kernels
