// One core's throughput of the quantized row kernels (integer_dot.h): AVX-512, AVX2 and portable, on rows
// that stay in cache (the compute ceiling) or that stream from memory (what decode sees).
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
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/integer_dot.h"

using namespace kvchat;
using namespace kvchat::kernels;

namespace {

struct BlockFormat {
  GgufType type;
  const char* name;
  int block_size, block_bytes;
  int scale_offset;      // where the block's f16 d is (set to 1.0 so that sums stay finite)
  int min_scale_offset;  // the min's (Q4_1/Q5_1's m, the K-quants' dmin), likewise (-1: none)
};

constexpr BlockFormat kFormats[] = {
    {GgufType::Q8_0, "q8_0", 32, 34, 0, -1},  {GgufType::Q4_0, "q4_0", 32, 18, 0, -1},
    {GgufType::Q4_1, "q4_1", 32, 20, 0, 2},   {GgufType::Q5_0, "q5_0", 32, 22, 0, -1},
    {GgufType::Q5_1, "q5_1", 32, 24, 0, 2},   {GgufType::Q4_K, "q4_k", 256, 144, 0, 2},
    {GgufType::Q5_K, "q5_k", 256, 176, 0, 2}, {GgufType::Q6_K, "q6_k", 256, 210, 208, -1},
};

enum class Kernels { Avx512, Avx2, Portable };

void use(Kernels kernels) {
  set_avx2_kernels_enabled(kernels != Kernels::Portable);
  set_avx512_kernels_enabled(kernels == Kernels::Avx512);
}

}  // namespace

int main(int argc, char** argv) {
  const int cols = 2048, rows = argc > 1 ? std::atoi(argv[1]) : 64;
  std::mt19937 rng(1);
  std::vector<float> x(cols);
  for (float& value : x) value = std::normal_distribution<float>()(rng);
  const ThreadActivations& activations = ThreadActivations::quantize(x.data(), 1, cols, true, true);
  std::printf("%d rows of %d columns, one thread\n", rows, cols);
  for (const BlockFormat& format : kFormats) {
    const int blocks = cols / format.block_size;
    const std::size_t row_bytes = static_cast<std::size_t>(blocks) * format.block_bytes;
    std::vector<std::uint8_t> weights(row_bytes * rows);
    for (std::uint8_t& byte : weights) byte = static_cast<std::uint8_t>(rng());
    const std::uint16_t one = 0x3c00;
    for (std::size_t block = 0; block < weights.size() / format.block_bytes; ++block) {
      std::memcpy(weights.data() + block * format.block_bytes + format.scale_offset, &one, 2);
      if (format.min_scale_offset >= 0)
        std::memcpy(weights.data() + block * format.block_bytes + format.min_scale_offset, &one, 2);
    }
    for (Kernels kernels : {Kernels::Avx512, Kernels::Avx2, Kernels::Portable}) {
      if (kernels != Kernels::Portable && !cpu_has_avx2_fma()) continue;
      if (kernels == Kernels::Avx512 && !cpu_has_avx512()) continue;
      use(kernels);
      const IntegerRowDot dot = integer_row_dot(format.type);
      float sink = 0.f;
      long passes = 0;
      const auto start = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500)) {
        for (int r = 0; r < rows; ++r) sink += dot(weights.data() + r * row_bytes, activations.row(0), blocks);
        ++passes;
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double weights_per_second = double(passes) * rows * cols / seconds;
      std::printf("%-5s %-8s %6.2f G weights/s  %6.2f GB/s  (%g)\n", format.name,
                  kernels == Kernels::Avx512 ? "avx512"
                  : kernels == Kernels::Avx2 ? "avx2"
                                             : "portable",
                  weights_per_second / 1e9, weights_per_second * format.block_bytes / format.block_size / 1e9, sink);
    }
  }
  use(Kernels::Avx512);
  return 0;
}
