// The AVX2 rounding of activation_quantization.h, bit-identical to the portable one (this file alone is
// compiled for AVX2, FMA and F16C; activation_quantization.cpp calls it after use_avx2_kernels() said yes).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
namespace kvchat::kernels::avx2 {
namespace {

inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// Four vectors of 8 int32 (each within int8) as 32 bytes in element order.
inline void store_bytes(const __m256i* lanes, std::int8_t* out) {
  // packs work per 128-bit lane; the permute restores element order.
  const __m256i words =
      _mm256_packs_epi16(_mm256_packs_epi32(lanes[0], lanes[1]), _mm256_packs_epi32(lanes[2], lanes[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
}

}  // namespace

void quantize_activation_bytes(const float* x, std::int64_t cols, std::int64_t group, std::int8_t* bytes,
                               float* scales) {
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
    activation_group_scale(horizontal_max(largest), _mm256_movemask_ps(non_finite) == 0, group, scales[g], inverse);
    const __m256 factor = _mm256_set1_ps(inverse);
    // Rounded to nearest even by the conversion (MXCSR's default), as std::nearbyint does.
    for (std::int64_t k = 0; k < group; k += 32) {
      __m256i lanes[4];
      for (int j = 0; j < 4; ++j) lanes[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * j), factor));
      store_bytes(lanes, bytes + k);
    }
    if (inverse == 0.f) std::memset(bytes, 0, static_cast<std::size_t>(group));
  }
}

}  // namespace kvchat::kernels::avx2
#endif  // KVCHAT_HAVE_AVX2_KERNELS
