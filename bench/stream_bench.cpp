// How close the 16-bit decode kernels come to the memory bandwidth, and what keeps them from it.
//
// One decode token's products of the 1B shape (per layer q/k/v together, o, gate/up together, down; then
// the lm_head: 2.47 GB of 16-bit weights) on the default pool's threads, each variant in turn within a
// round, for many rounds (the bandwidth of a shared machine drifts from minute to minute, so only
// ratios within a round are compared):
//   contiguous read  the buffer read in one pass split among the threads (how the bench's probe reads)
//   product read     a plain read loop over the same rows in the kernels' guided blocks, product by product
//   f32 kernel       matvec_f32 over the same bytes taken as f32 rows of half the length: the least work a
//                    dot product can do per byte (one FMA per 32 bytes, the load folded into it)
//   bf16 kernel      matvec_bf16, the engine's decode product
//   f16 kernel       the F16 product of matmul_quantized
// Each figure is the variant's rate over the contiguous read's in the same round (median, min, max).
//
// Build (from the repository root, after building the engine in build/):
//   g++ -O2 -std=c++17 -I. bench/stream_bench.cpp build/engine/libkvchat_kernels.a
//       build/engine/libkvchat_gguf.a -lspdlog -lfmt -pthread -o stream_bench
// Usage: stream_bench [rounds]   (default 16)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/huge_pages.h"
#include "engine/kernels/matvec.h"
#include "engine/kernels/memory_probe.h"
#include "engine/kernels/quantized_matvec.h"
#include "engine/kernels/thread_pool.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#include <immintrin.h>
#endif

using namespace kvchat;
using namespace kvchat::kernels;
using Clock = std::chrono::steady_clock;

namespace {

struct Product {
  std::int64_t rows, cols;
  std::size_t offset;  // in 16-bit values
};

// Four 32-byte loads per 128 bytes folded into a checksum, as the memory probe reads. This file is built
// without instruction-set flags: the function carries its own.
#if KVCHAT_HAVE_AVX2_KERNELS
__attribute__((target("avx2")))
#endif
std::uint64_t
read_row_avx2(const std::uint8_t* data, std::size_t bytes) {
#if KVCHAT_HAVE_AVX2_KERNELS
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  std::size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 32)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 64)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 96)));
  }
  const __m256i all = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  std::uint64_t sum = static_cast<std::uint64_t>(_mm256_extract_epi64(all, 0) ^ _mm256_extract_epi64(all, 3));
#else
  std::uint64_t sum = 0;
  std::size_t i = 0;
#endif
  for (; i < bytes; ++i) sum ^= data[i];
  return sum;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 16;
  if (!use_avx2_kernels()) {
    std::fprintf(stderr, "stream_bench: needs the AVX2 kernels\n");
    return 1;
  }
  std::vector<Product> products;
  std::size_t values = 0;
  const auto add = [&](std::int64_t rows, std::int64_t cols) {
    products.push_back({rows, cols, values});
    values += static_cast<std::size_t>(rows * cols);
  };
  for (int layer = 0; layer < 16; ++layer) {
    add(2048 + 2 * 512, 2048);  // q, k, v
    add(2048, 2048);            // o
    add(2 * 8192, 2048);        // gate, up
    add(2048, 8192);            // down
  }
  add(128256, 2048);  // lm_head
  const std::size_t bytes = values * sizeof(std::uint16_t);
  auto* weights = static_cast<std::uint16_t*>(allocate_huge_page_buffer(bytes));
  // Values that are finite both as bf16 and as f16 (and, in pairs, as f32), written by the threads that read them.
  default_thread_pool().parallel_for(static_cast<std::int64_t>(values), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      weights[i] = static_cast<std::uint16_t>(0x3c00 + (i * 2654435761u >> 20) % 0x200);
  });
  std::vector<float> x(8192), y(128256);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (float& v : x) v = dist(rng);

  const auto contiguous = [&] { measure_read_bandwidth_of(weights, bytes, default_thread_pool(), 1); };
  const auto product_read = [&] {
    for (const Product& p : products) {
      const std::int64_t row_bytes = p.cols * 2;
      const auto* base = reinterpret_cast<const std::uint8_t*>(weights + p.offset);
      for_row_blocks(p.rows, row_bytes, [&](std::int64_t begin, std::int64_t end) {
        y[static_cast<std::size_t>(begin)] = static_cast<float>(
            read_row_avx2(base + begin * row_bytes, static_cast<std::size_t>((end - begin) * row_bytes)) & 1);
      });
    }
  };
  const auto f32_kernel = [&] {
    for (const Product& p : products)
      matvec_f32(reinterpret_cast<const float*>(weights + p.offset), x.data(), y.data(), p.rows, p.cols / 2);
  };
  const auto bf16_kernel = [&] {
    for (const Product& p : products) matvec_bf16(weights + p.offset, x.data(), y.data(), p.rows, p.cols);
  };
  const auto f16_kernel = [&] {
    for (const Product& p : products) {
      QuantizedMatrixView view;
      view.type = GgufType::F16;
      view.data = reinterpret_cast<const std::uint8_t*>(weights + p.offset);
      view.rows = p.rows;
      view.cols = p.cols;
      view.row_bytes = p.cols * 2;
      matmul_quantized(view, x.data(), y.data(), 1);
    }
  };
  struct Variant {
    const char* name;
    std::function<void()> run;
    std::vector<double> ratios;
  };
  std::vector<Variant> variants = {{"contiguous read", contiguous, {}},
                                   {"product read", product_read, {}},
                                   {"f32 kernel", f32_kernel, {}},
                                   {"bf16 kernel", bf16_kernel, {}},
                                   {"f16 kernel", f16_kernel, {}}};
  for (Variant& v : variants) v.run();  // fault in, wake the threads
  std::printf("%d threads, %.2f GB per pass, %d rounds\n", default_thread_pool().size(), bytes / 1e9, rounds);
  std::vector<double> contiguous_rates;
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> seconds;
    for (Variant& v : variants) {
      const auto start = Clock::now();
      v.run();
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    contiguous_rates.push_back(bytes / seconds[0] / 1e9);
    for (std::size_t i = 0; i < variants.size(); ++i) variants[i].ratios.push_back(seconds[0] / seconds[i]);
  }
  std::sort(contiguous_rates.begin(), contiguous_rates.end());
  std::printf("contiguous read: %.1f GB/s median (%.1f-%.1f)\n", median(contiguous_rates), contiguous_rates.front(),
              contiguous_rates.back());
  std::printf("share of the contiguous read's rate in the same round: median (min-max)\n");
  for (std::size_t i = 1; i < variants.size(); ++i) {
    std::vector<double> r = variants[i].ratios;
    std::sort(r.begin(), r.end());
    std::printf("  %-15s %.3f (%.3f-%.3f)\n", variants[i].name, median(r), r.front(), r.back());
  }
  free_huge_page_buffer(weights, bytes);
  return 0;
}
