// One core's throughput of the quantized row kernels (integer_dot.h, block_types.h's table): AVX-512, AVX2
// and portable, on rows that stay in cache (the compute ceiling) or that stream from memory (what decode sees).
//
// Build (from the repository root, after building kvchat_kernels in build/):
//   g++ -O2 -std=c++17 -I. bench/integer_dot_bench.cpp build/engine/libkvchat_kernels.a \
//       build/engine/libkvchat_gguf.a -lspdlog -lfmt -pthread -o integer_dot_bench
// Usage: integer_dot_bench [rows]   (default 64 rows of 2,048 columns: in cache; 20000 streams ~40 MB)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "engine/gguf/gguf_types.h"
#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/block_types.h"
#include "engine/kernels/integer_dot.h"

using namespace kvchat;
using namespace kvchat::kernels;

int main(int argc, char** argv) {
  const int cols = 2048, rows = argc > 1 ? std::atoi(argv[1]) : 64;
  std::mt19937 rng(1);
  std::vector<float> x(cols);
  for (float& value : x) value = std::normal_distribution<float>()(rng);
  const ThreadActivations& activations = ThreadActivations::quantize(x.data(), 1, cols, true, true);
  std::printf("%d rows of %d columns, one thread\n", rows, cols);
  // Every block type with integer kernels, each instruction set it has one for that this processor runs.
  for (const BlockType& type : block_types()) {
    if (type.rounding == ActivationRounding::None) continue;
    const GgufTypeInfo& format = *type.format;
    const int blocks = cols / static_cast<int>(format.block_size);
    const std::size_t row_bytes = static_cast<std::size_t>(blocks) * format.block_bytes;
    std::vector<std::uint8_t> weights(row_bytes * rows);
    for (std::uint8_t& byte : weights) byte = static_cast<std::uint8_t>(rng());
    // Scales (d, and m or dmin) of 1.0, so that sums stay finite.
    const std::uint16_t one = 0x3c00;
    for (std::size_t block = 0; block < weights.size() / format.block_bytes; ++block)
      for (int field : {type.scale_at, type.min_at})
        if (field >= 0) std::memcpy(weights.data() + block * format.block_bytes + field, &one, 2);
    for (Isa isa : {Isa::Avx512, Isa::Avx2, Isa::Portable}) {
      const IntegerRowDot dot = type.on(isa).dot;
      if (!dot || !cpu_runs_block_kernels(isa)) continue;
      float sink = 0.f;
      long passes = 0;
      const auto start = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500)) {
        for (int r = 0; r < rows; ++r) sink += dot(weights.data() + r * row_bytes, activations.row(0), blocks);
        ++passes;
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double weights_per_second = double(passes) * rows * cols / seconds;
      std::printf("%-5s %-8s %6.2f G weights/s  %6.2f GB/s  (%g)\n", format.name, to_string(isa),
                  weights_per_second / 1e9, weights_per_second * format.block_bytes / format.block_size / 1e9, sink);
    }
  }
  return 0;
}
