// Throughput of the decode kernels against the machine's read bandwidth.
//
// Every figure streams matrices that are not in cache: each shape is allocated several times over
// (>= 512 MiB in all) and the copies are used round-robin, as decode does with a model's layers.
//
// Build (from the repository root, after building kvchat_kernels in build/):
//   g++ -O2 -std=c++17 -I. bench/kernels_bench.cpp build/engine/libkvchat_kernels.a
//       build/engine/libkvchat_gguf.a -lspdlog -lfmt -pthread -o kernels_bench
// Usage: kernels_bench [--portable] [--tiny] [--small-pages] [--layers N] [threads...]   (default threads: 1 2; layers:
// 4)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/huge_pages.h"
#include "engine/kernels/matvec.h"
#include "engine/kernels/memory_probe.h"

using namespace kvchat::kernels;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Timing {
  double best;
  double median;
};

Timing summarize(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2]};
}

bool g_huge_pages = true;

// Random values in a buffer on huge pages (the default, as the engine should hold weights) or on
// ordinary 4 KiB pages (--small-pages), to show what the page size costs.
template <typename T>
class Buffer {
 public:
  explicit Buffer(std::size_t count) : count_(count), huge_(g_huge_pages) {
    data_ = static_cast<T*>(huge_ ? allocate_huge_page_buffer(count * sizeof(T)) : std::malloc(count * sizeof(T) + 1));
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (std::size_t i = 0; i < count; ++i) {
      if constexpr (sizeof(T) == 4)
        data_[i] = dist(rng);
      else
        data_[i] = float_to_bf16(dist(rng));
    }
  }
  ~Buffer() {
    if (huge_)
      free_huge_page_buffer(data_, count_ * sizeof(T));
    else
      std::free(data_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() const { return data_; }

 private:
  std::size_t count_;
  bool huge_;
  T* data_;
};

// Times `product(copy)` over `copies` distinct matrices, `rounds` times round-robin.
Timing time_round_robin(int copies, int rounds, const std::function<void(int)>& product) {
  std::vector<double> times;
  for (int round = 0; round < rounds; ++round) {
    for (int copy = 0; copy < copies; ++copy) {
      const auto start = Clock::now();
      product(copy);
      times.push_back(seconds_since(start));
    }
  }
  return summarize(times);
}

void bench_shape(std::int64_t rows, std::int64_t cols, std::int64_t n) {
  const std::size_t elements = static_cast<std::size_t>(rows * cols);
  const int copies = static_cast<int>(std::max<std::size_t>(2, (512ull << 20) / (elements * 4) + 1));
  const Buffer<float> w32(elements * copies);
  const Buffer<std::uint16_t> w16(elements * copies);
  const Buffer<float> x(static_cast<std::size_t>(cols * n));
  std::vector<float> y(static_cast<std::size_t>(rows * n));
  const int rounds = std::max(3, 2000 / copies / std::max<int>(1, static_cast<int>(elements >> 20)));
  const Timing f32 = time_round_robin(copies, rounds, [&](int copy) {
    const float* w = w32.data() + elements * copy;
    if (n == 1)
      matvec_f32(w, x.data(), y.data(), rows, cols);
    else
      matmul_f32_small(w, x.data(), y.data(), n, rows, cols);
  });
  const Timing bf16 = time_round_robin(copies, rounds, [&](int copy) {
    const std::uint16_t* w = w16.data() + elements * copy;
    if (n == 1)
      matvec_bf16(w, x.data(), y.data(), rows, cols);
    else
      matmul_bf16_small(w, x.data(), y.data(), n, rows, cols);
  });
  const double bytes = static_cast<double>(elements);
  std::printf(
      "  %6lld x %-5lld n=%lld  f32 %7.3f ms %5.1f GB/s (median %5.1f) | bf16 %7.3f ms %5.1f GB/s (median %5.1f)"
      "  bf16/f32 speed %.2fx\n",
      static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(n), f32.best * 1e3,
      bytes * 4 / f32.best / 1e9, bytes * 4 / f32.median / 1e9, bf16.best * 1e3, bytes * 2 / bf16.best / 1e9,
      bytes * 2 / bf16.median / 1e9, f32.best / bf16.best);
}

// One decode step's worth of products for a Llama-3.2-1B-shaped model (hidden 2048, 32 query and 8
// key/value heads of 64, intermediate 8192, vocab 128256), with `layers` distinct layers in memory;
// the figure is projected to all 16 layers.
template <typename Weight>
void bench_model(int layers, const char* dtype,
                 void (*matvec)(const Weight*, const float*, float*, std::int64_t, std::int64_t, const float*)) {
  struct Shape {
    std::int64_t rows, cols;
  };
  const Shape layer_shapes[] = {{2048, 2048}, {512, 2048},  {512, 2048}, {2048, 2048},
                                {8192, 2048}, {8192, 2048}, {2048, 8192}};
  const Shape head{128256, 2048};
  std::vector<std::unique_ptr<Buffer<Weight>>> matrices;
  for (int layer = 0; layer < layers; ++layer)
    for (const Shape& s : layer_shapes)
      matrices.push_back(std::make_unique<Buffer<Weight>>(static_cast<std::size_t>(s.rows * s.cols)));
  const Buffer<Weight> head_weights(static_cast<std::size_t>(head.rows * head.cols));
  const Buffer<float> x(8192);
  std::vector<float> y(static_cast<std::size_t>(head.rows));

  std::vector<double> layer_times, head_times;
  for (int step = 0; step < 8; ++step) {
    auto start = Clock::now();
    std::size_t index = 0;
    for (int layer = 0; layer < layers; ++layer)
      for (const Shape& s : layer_shapes)
        matvec(matrices[index++]->data(), x.data(), y.data(), s.rows, s.cols, nullptr);
    layer_times.push_back(seconds_since(start) / layers);
    start = Clock::now();
    matvec(head_weights.data(), x.data(), y.data(), head.rows, head.cols, nullptr);
    head_times.push_back(seconds_since(start));
  }
  const Timing layer = summarize(layer_times);
  const Timing head_time = summarize(head_times);
  double layer_params = 0;
  for (const Shape& s : layer_shapes) layer_params += static_cast<double>(s.rows * s.cols);
  const double model_bytes = (16 * layer_params + static_cast<double>(head.rows * head.cols)) * sizeof(Weight);
  const double best_token = 16 * layer.best + head_time.best;
  const double median_token = 16 * layer.median + head_time.median;
  std::printf("  model 1B-shape %-4s (%.2f GB): %.2f tok/s best (%.1f GB/s), %.2f tok/s median (%.1f GB/s)\n", dtype,
              model_bytes / 1e9, 1 / best_token, model_bytes / best_token / 1e9, 1 / median_token,
              model_bytes / median_token / 1e9);
}

void bench_tiny(std::int64_t rows, std::int64_t cols) {
  const Buffer<float> w(static_cast<std::size_t>(rows * cols));
  const Buffer<float> x(static_cast<std::size_t>(cols));
  std::vector<float> y(static_cast<std::size_t>(rows));
  const int calls = 100000;
  std::vector<double> times;
  for (int repeat = 0; repeat < 7; ++repeat) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) matvec_f32(w.data(), x.data(), y.data(), rows, cols);
    times.push_back(seconds_since(start) / calls);
  }
  const Timing t = summarize(times);
  std::printf("  tiny %lld x %lld f32: %.3f us per call (median %.3f)\n", static_cast<long long>(rows),
              static_cast<long long>(cols), t.best * 1e6, t.median * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts;
  int layers = 4;
  bool tiny_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--portable") == 0)
      set_avx2_kernels_enabled(false);
    else if (std::strcmp(argv[i], "--tiny") == 0)
      tiny_only = true;
    else if (std::strcmp(argv[i], "--small-pages") == 0)
      g_huge_pages = false;
    else if (std::strcmp(argv[i], "--layers") == 0 && i + 1 < argc)
      layers = std::atoi(argv[++i]);
    else
      thread_counts.push_back(std::atoi(argv[i]));
  }
  if (thread_counts.empty()) thread_counts = {1, 2};
  std::printf("avx2 kernels: %s, weights on %s pages\n", use_avx2_kernels() ? "yes" : "no",
              g_huge_pages ? "huge" : "4 KiB");
  for (int threads : thread_counts) {
    set_default_threads(threads);
    if (tiny_only) {
      std::printf("threads=%d\n", threads);
      for (std::int64_t size : {1, 8, 64}) bench_tiny(size, size);
      bench_tiny(172, 64);
      bench_tiny(512, 64);
      continue;
    }
    const BandwidthResult bw = measure_read_bandwidth(threads);
    std::printf("threads=%d read bandwidth: best %.2f GB/s, median %.2f GB/s\n", threads, bw.best, bw.median);
    bench_shape(8192, 2048, 1);
    bench_shape(2048, 8192, 1);
    bench_shape(128256, 2048, 1);
    bench_shape(2048, 2048, 1);
    bench_shape(512, 2048, 1);
    bench_shape(8192, 2048, 4);
    bench_model<float>(layers, "f32", matvec_f32);
    bench_model<std::uint16_t>(layers, "bf16", matvec_bf16);
    bench_tiny(1, 1);
    bench_tiny(8, 8);
    bench_tiny(64, 64);
    bench_tiny(172, 64);
    bench_tiny(512, 64);
  }
  return 0;
}
