// The AVX2 conversions of bf16.h (this file alone is compiled for AVX2, FMA and F16C; bf16.cpp calls it after
// use_avx2_kernels() said yes).
#include <cstdint>

#include "engine/kernels/bf16.h"
#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
namespace kvchat::kernels::avx2 {
namespace {

// Eight floats -> eight bf16 values, each in the low 16 bits of a 32-bit lane.
inline __m256i round_to_bf16_bits(__m256 values) {
  const __m256i bits = _mm256_castps_si256(values);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(values, values, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

}  // namespace

void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 8)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
    _mm256_storeu_ps(dst + i + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
  }
  for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = round_to_bf16_bits(_mm256_loadu_ps(src + i));
    const __m256i hi = round_to_bf16_bits(_mm256_loadu_ps(src + i + 8));
    // packus works per 128-bit lane: [lo0-3 hi0-3 | lo4-7 hi4-7]; restore element order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

}  // namespace kvchat::kernels::avx2
#endif  // KVCHAT_HAVE_AVX2_KERNELS
