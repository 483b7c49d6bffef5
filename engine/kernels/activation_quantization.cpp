#include "engine/kernels/activation_quantization.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_attributes.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#include <immintrin.h>
#endif

namespace kvchat::kernels {
namespace {

// The group's unit s = max|x| / 127 (NaN when the group is not finite), and the factor that takes x to
// its byte (0 for a zero or non-finite group). Shared by both versions: one definition.
KVCHAT_ISA_BASELINE_INLINE inline void group_scale(float largest, bool finite, float& unit, float& inverse) {
  if (!finite) {
    unit = NAN;
    inverse = 0.f;
    return;
  }
  unit = largest / 127.f;
  inverse = unit > 0.f ? 1.f / unit : 0.f;
}

// The byte sums of each 16 and each 32 of `count` bytes.
KVCHAT_ISA_BASELINE_INLINE inline void byte_sums(const std::int8_t* bytes, std::int64_t count, std::int16_t* sums16,
                                                 std::int16_t* sums32) {
  for (std::int64_t g = 0; g < count / 16; ++g) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += bytes[16 * g + j];
    sums16[g] = static_cast<std::int16_t>(sum);
  }
  for (std::int64_t b = 0; b < count / 32; ++b)
    sums32[b] = static_cast<std::int16_t>(sums16[2 * b] + sums16[2 * b + 1]);
}

KVCHAT_ISA_BASELINE void quantize_portable(const float* x, std::int64_t cols, std::int64_t group, std::int8_t* bytes,
                                           float* scales, std::int16_t* sums16, std::int16_t* sums32) {
  for (std::int64_t g = 0; g < cols / group; ++g, x += group, bytes += group) {
    float largest = 0.f;
    bool finite = true;
    for (std::int64_t j = 0; j < group; ++j) {
      finite = finite && std::isfinite(x[j]);
      largest = std::fabs(x[j]) > largest ? std::fabs(x[j]) : largest;
    }
    float inverse;
    group_scale(largest, finite, scales[g], inverse);
    for (std::int64_t j = 0; j < group; ++j)
      bytes[j] = inverse == 0.f ? 0 : static_cast<std::int8_t>(std::nearbyint(x[j] * inverse));
  }
  byte_sums(bytes - cols, cols, sums16, sums32);
}

#if KVCHAT_HAVE_AVX2_KERNELS
KVCHAT_ISA_AVX2 inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// Four vectors of 8 int32 (each within int8) as 32 bytes in element order.
KVCHAT_ISA_AVX2 inline void store_bytes(const __m256i* lanes, std::int8_t* out) {
  // packs work per 128-bit lane; the permute restores element order.
  const __m256i words =
      _mm256_packs_epi16(_mm256_packs_epi32(lanes[0], lanes[1]), _mm256_packs_epi32(lanes[2], lanes[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
}

KVCHAT_ISA_AVX2 void quantize_avx2(const float* x, std::int64_t cols, std::int64_t group, std::int8_t* bytes,
                                   float* scales, std::int16_t* sums16, std::int16_t* sums32) {
  const __m256 sign = _mm256_set1_ps(-0.f), infinity = _mm256_set1_ps(INFINITY);
  for (std::int64_t g = 0; g < cols / group; ++g, x += group, bytes += group) {
    __m256 largest = _mm256_setzero_ps(), non_finite = _mm256_setzero_ps();
    for (std::int64_t k = 0; k < group; k += 8) {
      const __m256 magnitude = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
      largest = _mm256_max_ps(largest, magnitude);
      // NaN compares unordered, infinity equal to infinity: both mark the group.
      non_finite = _mm256_or_ps(non_finite, _mm256_cmp_ps(magnitude, infinity, _CMP_NLT_UQ));
    }
    float inverse;
    group_scale(horizontal_max(largest), _mm256_movemask_ps(non_finite) == 0, scales[g], inverse);
    const __m256 factor = _mm256_set1_ps(inverse);
    // Rounded to nearest even by the conversion (MXCSR's default), as std::nearbyint does.
    for (std::int64_t k = 0; k < group; k += 32) {
      __m256i lanes[4];
      for (int j = 0; j < 4; ++j) lanes[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * j), factor));
      store_bytes(lanes, bytes + k);
    }
    if (inverse == 0.f) std::memset(bytes, 0, static_cast<std::size_t>(group));
  }
  byte_sums(bytes - cols, cols, sums16, sums32);
}
#endif

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
  if (use_avx2_kernels()) {
    quantize_avx2(x, cols, group, bytes, scales, sums16, sums32);
    return;
  }
#endif
  quantize_portable(x, cols, group, bytes, scales, sums16, sums32);
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
