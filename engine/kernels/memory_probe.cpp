#include "engine/kernels/memory_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/huge_pages.h"
#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/thread_pool.h"

namespace kvchat::kernels {
namespace {

constexpr std::size_t kMinimumBytes = 4096;

struct HugePageBufferDeleter {
  std::size_t bytes;
  void operator()(void* p) const { free_huge_page_buffer(p, bytes); }
};

// Each reader folds what it reads into a checksum that is stored, so the loads cannot be elided.
std::uint64_t read_portable(const std::uint64_t* data, std::size_t words) {
  std::uint64_t a = 0, b = 0, c = 0, d = 0;
  std::size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    a ^= data[i];
    b ^= data[i + 1];
    c ^= data[i + 2];
    d ^= data[i + 3];
  }
  for (; i < words; ++i) a ^= data[i];
  return a ^ b ^ c ^ d;
}

std::uint64_t read_words(const std::uint64_t* data, std::size_t words) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) return avx2::read_words(data, words);
#endif
  return read_portable(data, words);
}

void check_probe_arguments(const char* function, std::size_t bytes, int runs) {
  if (runs < 1) throw std::invalid_argument(std::string(function) + ": runs must be >= 1, got " + std::to_string(runs));
  if (bytes < kMinimumBytes) {
    throw std::invalid_argument(std::string(function) + ": buffer of " + std::to_string(bytes) +
                                " bytes is below the " + std::to_string(kMinimumBytes) + "-byte minimum");
  }
}

// Optionally one warm-up pass, then `runs` timed passes over data[0, words) split among the pool's threads.
BandwidthResult time_reads(const std::uint64_t* data, std::size_t words, ThreadPool& pool, int runs, bool warm_up) {
  const std::int64_t word_count = static_cast<std::int64_t>(words);
  std::atomic<std::uint64_t> checksum{0};
  std::vector<double> rates;
  rates.reserve(static_cast<std::size_t>(runs));
  const auto read_all = [&] {
    pool.parallel_for(word_count, [&](std::int64_t begin, std::int64_t end) {
      checksum.fetch_xor(read_words(data + begin, static_cast<std::size_t>(end - begin)), std::memory_order_relaxed);
    });
  };
  if (warm_up) read_all();  // wakes the workers and faults in any page not yet touched
  for (int run = 0; run < runs; ++run) {
    const auto start = std::chrono::steady_clock::now();
    read_all();
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    rates.push_back(static_cast<double>(words * sizeof(std::uint64_t)) / seconds.count() / 1e9);
  }
  volatile std::uint64_t sink = checksum.load();
  (void)sink;

  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t middle = sorted.size() / 2;
  const double median = sorted.size() % 2 ? sorted[middle] : 0.5 * (sorted[middle - 1] + sorted[middle]);
  BandwidthResult result{};
  result.best = sorted.back();
  result.median = median;
  result.gigabytes_per_second = result.best;
  result.runs = runs;
  return result;
}

}  // namespace

BandwidthResult measure_read_bandwidth(int threads, std::size_t bytes, int runs) {
  if (threads < 1)
    throw std::invalid_argument("measure_read_bandwidth: threads must be >= 1, got " + std::to_string(threads));
  check_probe_arguments("measure_read_bandwidth", bytes, runs);
  const std::size_t words = bytes / sizeof(std::uint64_t);
  // Huge pages, as for the model weights (see huge_pages.h): the probe measures what the memory
  // system delivers to a linear reader, not the cost of 4 KiB page walks.
  const std::size_t allocation = words * sizeof(std::uint64_t);
  std::unique_ptr<void, HugePageBufferDeleter> buffer(allocate_huge_page_buffer(allocation),
                                                      HugePageBufferDeleter{allocation});
  auto* data = static_cast<std::uint64_t*>(buffer.get());

  ThreadPool pool(threads);
  // Touch every page from the thread that will read it (first-touch placement), with a non-zero
  // pattern so that no page stays backed by the shared zero page.
  pool.parallel_for(static_cast<std::int64_t>(words), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) data[i] = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  });
  return time_reads(data, words, pool, runs, /*warm_up=*/true);
}

BandwidthResult measure_read_bandwidth_of(const void* data, std::size_t bytes, ThreadPool& pool, int runs) {
  check_probe_arguments("measure_read_bandwidth_of", bytes, runs);
  if (data == nullptr) throw std::invalid_argument("measure_read_bandwidth_of: null buffer");
  return time_reads(static_cast<const std::uint64_t*>(data), bytes / sizeof(std::uint64_t), pool, runs,
                    /*warm_up=*/false);
}

}  // namespace kvchat::kernels
