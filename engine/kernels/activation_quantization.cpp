#include "engine/kernels/activation_quantization.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_kernels.h"

namespace kvchat::kernels {
namespace {

// The byte sums of each 16 and each 32 of `count` bytes.
void byte_sums(const std::int8_t* bytes, std::int64_t count, std::int16_t* sums16, std::int16_t* sums32) {
  for (std::int64_t g = 0; g < count / 16; ++g) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += bytes[16 * g + j];
    sums16[g] = static_cast<std::int16_t>(sum);
  }
  for (std::int64_t b = 0; b < count / 32; ++b)
    sums32[b] = static_cast<std::int16_t>(sums16[2 * b] + sums16[2 * b + 1]);
}

// The bytes and the scales of x[cols] in groups of `group` (the byte sums come after, for both versions).
void quantize_portable(const float* x, std::int64_t cols, std::int64_t group, std::int8_t* bytes, float* scales) {
  for (std::int64_t g = 0; g < cols / group; ++g, x += group, bytes += group) {
    float largest = 0.f;
    bool finite = true;
    for (std::int64_t j = 0; j < group; ++j) {
      finite = finite && std::isfinite(x[j]);
      largest = std::fabs(x[j]) > largest ? std::fabs(x[j]) : largest;
    }
    float inverse;
    activation_group_scale(largest, finite, group, scales[g], inverse);
    for (std::int64_t j = 0; j < group; ++j)
      bytes[j] = inverse == 0.f ? 0 : static_cast<std::int8_t>(std::nearbyint(x[j] * inverse));
  }
}

}  // namespace

std::int64_t activation_group(ActivationRounding rounding) {
  switch (rounding) {
    case ActivationRounding::BlockBytes: return kActivationBlock;
    case ActivationRounding::SuperBlockBytes: return kActivationSuperBlock;
    case ActivationRounding::None: break;
  }
  throw std::invalid_argument("activation_group: no rounding asked for");
}

void quantize_activation_bytes(const float* x, std::int64_t cols, std::int64_t group, std::int8_t* bytes, float* scales,
                               std::int16_t* sums16, std::int16_t* sums32) {
  if (group != kActivationBlock && group != kActivationSuperBlock)
    throw std::invalid_argument("quantize_activation_bytes: groups of " + std::to_string(group) + ", not 32 or 256");
  if (cols < 0 || cols % group != 0)
    throw std::invalid_argument("quantize_activation_bytes: " + std::to_string(cols) +
                                " columns are not a whole number of groups of " + std::to_string(group));
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels())
    avx2::quantize_activation_bytes(x, cols, group, bytes, scales);
  else
    quantize_portable(x, cols, group, bytes, scales);
#else
  quantize_portable(x, cols, group, bytes, scales);
#endif
  byte_sums(bytes, cols, sums16, sums32);
}

void round_activations(ActivationRounding rounding, const float* x, std::int64_t n, std::int64_t cols, float* out) {
  const std::int64_t group = activation_group(rounding);
  const bool blocks = rounding == ActivationRounding::BlockBytes;
  const ThreadActivations& rounded = ThreadActivations::quantize(x, n, cols, blocks, !blocks);
  for (std::int64_t i = 0; i < n; ++i) {
    const QuantizedActivations row = rounded.row(i);
    const ActivationBytes& values = blocks ? row.blocks : row.super_blocks;
    for (std::int64_t c = 0; c < cols; ++c)
      out[i * cols + c] = values.scales[c / group] * static_cast<float>(values.bytes[c]);
  }
}

void ThreadActivations::Buffers::fill(const float* x, std::int64_t n, std::int64_t cols) {
  const auto elements = static_cast<std::size_t>(n * cols);
  if (bytes.size() < elements) {
    bytes.resize(elements);
    scales.resize(elements / static_cast<std::size_t>(group));
    sums16.resize(elements / 16);
    sums32.resize(elements / 32);
  }
  for (std::int64_t i = 0; i < n; ++i)
    quantize_activation_bytes(x + i * cols, cols, group, bytes.data() + i * cols, scales.data() + i * cols / group,
                              sums16.data() + i * cols / 16, sums32.data() + i * cols / 32);
}

ActivationBytes ThreadActivations::Buffers::row(std::int64_t i, std::int64_t cols) const {
  if (!made) return {};
  return {bytes.data() + i * cols, scales.data() + i * cols / group, sums16.data() + i * cols / 16,
          sums32.data() + i * cols / 32};
}

const ThreadActivations& ThreadActivations::quantize(const float* x, std::int64_t n, std::int64_t cols, bool blocks,
                                                     bool super_blocks) {
  thread_local ThreadActivations buffers;
  buffers.cols_ = cols;
  buffers.blocks_.group = kActivationBlock;
  buffers.super_blocks_.group = kActivationSuperBlock;
  buffers.blocks_.made = blocks;
  buffers.super_blocks_.made = super_blocks;
  if (blocks) buffers.blocks_.fill(x, n, cols);
  if (super_blocks) buffers.super_blocks_.fill(x, n, cols);
  return buffers;
}

QuantizedActivations ThreadActivations::row(std::int64_t i) const {
  return {blocks_.row(i, cols_), super_blocks_.row(i, cols_)};
}

}  // namespace kvchat::kernels
