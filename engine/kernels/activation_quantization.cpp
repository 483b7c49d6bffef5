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

// The block's unit s = max|x| / 127 (NaN when the block is not finite), and the factor that takes x to
// t (0 for a zero or non-finite block). Shared by both versions: one definition.
KVCHAT_ISA_BASELINE_INLINE inline void block_scale(float largest, bool finite, float& unit, float& inverse) {
  if (!finite) {
    unit = NAN;
    inverse = 0.f;
    return;
  }
  unit = largest / 127.f;
  inverse = unit > 0.f ? 1.f / unit : 0.f;
}

KVCHAT_ISA_BASELINE_INLINE inline void block_sums(const std::int8_t* high, const std::int8_t* low, std::int32_t* sums) {
  for (int half = 0; half < 2; ++half) {
    std::int32_t sum = 0;
    for (int j = 16 * half; j < 16 * half + 16; ++j) sum += kActivationRadix * high[j] + low[j];
    sums[half] = sum;
  }
}

KVCHAT_ISA_BASELINE void quantize_portable(const float* x, std::int64_t cols, std::int8_t* high, std::int8_t* low,
                                           float* scales, std::int32_t* sums) {
  for (std::int64_t b = 0; b < cols / kActivationBlock; ++b, x += 32, high += 32, low += 32, sums += 2) {
    float largest = 0.f;
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
      finite = finite && std::isfinite(x[j]);
      largest = std::fabs(x[j]) > largest ? std::fabs(x[j]) : largest;
    }
    float unit, inverse;
    block_scale(largest, finite, unit, inverse);
    scales[b] = unit / static_cast<float>(kActivationRadix);
    for (int j = 0; j < 32; ++j) {
      const float t = x[j] * inverse, rounded = inverse == 0.f ? 0.f : std::nearbyint(t);
      high[j] = static_cast<std::int8_t>(rounded);
      low[j] = inverse == 0.f ? 0 : static_cast<std::int8_t>(std::nearbyint((t - rounded) * static_cast<float>(kActivationRadix)));
    }
    block_sums(high, low, sums);
  }
}

// The byte sums of each 16 and each 32 of a super-block.
KVCHAT_ISA_BASELINE_INLINE inline void byte_sums(const std::int8_t* bytes, std::int16_t* sums16, std::int16_t* sums32) {
  for (int g = 0; g < kActivationSuperBlock / 16; ++g) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += bytes[16 * g + j];
    sums16[g] = static_cast<std::int16_t>(sum);
  }
  for (int b = 0; b < kActivationSuperBlock / 32; ++b)
    sums32[b] = static_cast<std::int16_t>(sums16[2 * b] + sums16[2 * b + 1]);
}

KVCHAT_ISA_BASELINE void quantize_bytes_portable(const float* x, std::int64_t cols, std::int8_t* bytes, float* scales,
                                                 std::int16_t* sums16, std::int16_t* sums32) {
  for (std::int64_t s = 0; s < cols / kActivationSuperBlock; ++s, x += 256, bytes += 256, sums16 += 16, sums32 += 8) {
    float largest = 0.f;
    bool finite = true;
    for (int j = 0; j < 256; ++j) {
      finite = finite && std::isfinite(x[j]);
      largest = std::fabs(x[j]) > largest ? std::fabs(x[j]) : largest;
    }
    float inverse;
    block_scale(largest, finite, scales[s], inverse);
    for (int j = 0; j < 256; ++j) bytes[j] = inverse == 0.f ? 0 : static_cast<std::int8_t>(std::nearbyint(x[j] * inverse));
    byte_sums(bytes, sums16, sums32);
  }
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
  const __m256i words = _mm256_packs_epi16(_mm256_packs_epi32(lanes[0], lanes[1]), _mm256_packs_epi32(lanes[2], lanes[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
}

KVCHAT_ISA_AVX2 void quantize_avx2(const float* x, std::int64_t cols, std::int8_t* high, std::int8_t* low,
                                   float* scales, std::int32_t* sums) {
  const __m256 sign = _mm256_set1_ps(-0.f), infinity = _mm256_set1_ps(INFINITY);
  const __m256 radix = _mm256_set1_ps(static_cast<float>(kActivationRadix));
  for (std::int64_t b = 0; b < cols / kActivationBlock; ++b, x += 32, high += 32, low += 32, sums += 2) {
    __m256 v[4], largest = _mm256_setzero_ps(), non_finite = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      const __m256 magnitude = _mm256_andnot_ps(sign, v[k]);
      largest = _mm256_max_ps(largest, magnitude);
      // NaN compares unordered, infinity equal to infinity: both mark the block.
      non_finite = _mm256_or_ps(non_finite, _mm256_cmp_ps(magnitude, infinity, _CMP_NLT_UQ));
    }
    float unit, inverse;
    block_scale(horizontal_max(largest), _mm256_movemask_ps(non_finite) == 0, unit, inverse);
    scales[b] = unit / static_cast<float>(kActivationRadix);
    const __m256 factor = _mm256_set1_ps(inverse);
    // Rounded to nearest even by the conversions (MXCSR's default), as std::nearbyint does.
    __m256i high_lanes[4], low_lanes[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 t = _mm256_mul_ps(v[k], factor);
      high_lanes[k] = _mm256_cvtps_epi32(t);
      low_lanes[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(t, _mm256_cvtepi32_ps(high_lanes[k])), radix));
      if (inverse == 0.f) high_lanes[k] = low_lanes[k] = _mm256_setzero_si256();
    }
    store_bytes(high_lanes, high);
    store_bytes(low_lanes, low);
    block_sums(high, low, sums);
  }
}

KVCHAT_ISA_AVX2 void quantize_bytes_avx2(const float* x, std::int64_t cols, std::int8_t* bytes, float* scales,
                                         std::int16_t* sums16, std::int16_t* sums32) {
  const __m256 sign = _mm256_set1_ps(-0.f), infinity = _mm256_set1_ps(INFINITY);
  for (std::int64_t s = 0; s < cols / kActivationSuperBlock; ++s, x += 256, bytes += 256, sums16 += 16, sums32 += 8) {
    __m256 largest = _mm256_setzero_ps(), non_finite = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k) {
      const __m256 magnitude = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k));
      largest = _mm256_max_ps(largest, magnitude);
      non_finite = _mm256_or_ps(non_finite, _mm256_cmp_ps(magnitude, infinity, _CMP_NLT_UQ));
    }
    float inverse;
    block_scale(horizontal_max(largest), _mm256_movemask_ps(non_finite) == 0, scales[s], inverse);
    const __m256 factor = _mm256_set1_ps(inverse);
    for (int k = 0; k < 8; ++k) {
      __m256i lanes[4];
      for (int j = 0; j < 4; ++j) lanes[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * k + 8 * j), factor));
      store_bytes(lanes, bytes + 32 * k);
    }
    if (inverse == 0.f) std::memset(bytes, 0, 256);
    byte_sums(bytes, sums16, sums32);
  }
}
#endif

// 254 * high + low as 16-bit integers (baseline code: this file is built with AVX2 flags).
KVCHAT_ISA_BASELINE void combine_bytes(const std::int8_t* high, const std::int8_t* low, std::int64_t count,
                                       std::int16_t* values) {
  for (std::int64_t i = 0; i < count; ++i) values[i] = static_cast<std::int16_t>(kActivationRadix * high[i] + low[i]);
}

}  // namespace

void quantize_activations(const float* x, std::int64_t cols, std::int8_t* high, std::int8_t* low, float* scales,
                          std::int32_t* sums) {
  if (cols < 0 || cols % kActivationBlock != 0)
    throw std::invalid_argument("quantize_activations: " + std::to_string(cols) + " columns are not a whole number of blocks of 32");
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    quantize_avx2(x, cols, high, low, scales, sums);
    return;
  }
#endif
  quantize_portable(x, cols, high, low, scales, sums);
}

void quantize_activation_bytes(const float* x, std::int64_t cols, std::int8_t* bytes, float* scales,
                               std::int16_t* sums16, std::int16_t* sums32) {
  if (cols < 0 || cols % kActivationSuperBlock != 0)
    throw std::invalid_argument("quantize_activation_bytes: " + std::to_string(cols) +
                                " columns are not a whole number of super-blocks of 256");
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    quantize_bytes_avx2(x, cols, bytes, scales, sums16, sums32);
    return;
  }
#endif
  quantize_bytes_portable(x, cols, bytes, scales, sums16, sums32);
}

void round_activations(ActivationRounding rounding, const float* x, std::int64_t n, std::int64_t cols, float* out) {
  if (rounding == ActivationRounding::None) throw std::invalid_argument("round_activations: no rounding asked for");
  const bool one_byte = rounding == ActivationRounding::OneBytePerValue;
  const bool high_only = rounding == ActivationRounding::HighBytePerValue;
  const ThreadActivations& rounded = ThreadActivations::quantize(x, n, cols, !one_byte, one_byte);
  for (std::int64_t i = 0; i < n; ++i) {
    const QuantizedActivations row = rounded.row(i);
    for (std::int64_t c = 0; c < cols; ++c) {
      // The one-byte rounding leaves the two-byte scales null.
      out[i * cols + c] = one_byte ? row.byte_scales[c / kActivationSuperBlock] * static_cast<float>(row.bytes[c])
                          : high_only
                              ? row.scales[c / kActivationBlock] * static_cast<float>(kActivationRadix) * static_cast<float>(row.high[c])
                              : row.scales[c / kActivationBlock] * static_cast<float>(kActivationRadix * row.high[c] + row.low[c]);
    }
  }
}

const ThreadActivations& ThreadActivations::quantize(const float* x, std::int64_t n, std::int64_t cols, bool two_bytes,
                                                     bool one_byte) {
  thread_local ThreadActivations buffers;
  const auto elements = static_cast<std::size_t>(n * cols);
  buffers.cols_ = cols;
  buffers.two_bytes_ = two_bytes;
  buffers.one_byte_ = one_byte;
  if (two_bytes) {
    if (buffers.high_.size() < elements) {
      buffers.high_.resize(elements);
      buffers.low_.resize(elements);
      buffers.scales_.resize(elements / kActivationBlock);
      buffers.sums_.resize(elements / 16);
      buffers.values_.resize(elements);
    }
    for (std::int64_t i = 0; i < n; ++i)
      quantize_activations(x + i * cols, cols, buffers.high_.data() + i * cols, buffers.low_.data() + i * cols,
                           buffers.scales_.data() + i * cols / kActivationBlock, buffers.sums_.data() + i * cols / 16);
    combine_bytes(buffers.high_.data(), buffers.low_.data(), static_cast<std::int64_t>(elements), buffers.values_.data());
  }
  if (one_byte) {
    if (buffers.bytes_.size() < elements) {
      buffers.bytes_.resize(elements);
      buffers.byte_scales_.resize(elements / kActivationSuperBlock);
      buffers.byte_sums16_.resize(elements / 16);
      buffers.byte_sums32_.resize(elements / 32);
    }
    for (std::int64_t i = 0; i < n; ++i)
      quantize_activation_bytes(x + i * cols, cols, buffers.bytes_.data() + i * cols,
                                buffers.byte_scales_.data() + i * cols / kActivationSuperBlock,
                                buffers.byte_sums16_.data() + i * cols / 16, buffers.byte_sums32_.data() + i * cols / 32);
  }
  return buffers;
}

QuantizedActivations ThreadActivations::row(std::int64_t i) const {
  QuantizedActivations row;
  if (two_bytes_)
    row = {high_.data() + i * cols_, low_.data() + i * cols_, scales_.data() + i * cols_ / kActivationBlock,
           sums_.data() + i * cols_ / 16, values_.data() + i * cols_};
  if (one_byte_) {
    row.bytes = bytes_.data() + i * cols_;
    row.byte_scales = byte_scales_.data() + i * cols_ / kActivationSuperBlock;
    row.byte_sums16 = byte_sums16_.data() + i * cols_ / 16;
    row.byte_sums32 = byte_sums32_.data() + i * cols_ / 32;
  }
  return row;
}

}  // namespace kvchat::kernels
