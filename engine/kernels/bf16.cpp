#include "engine/kernels/bf16.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_attributes.h"
#include "engine/kernels/thread_pool.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#include <immintrin.h>
#endif

namespace kvchat::kernels {
namespace {

// Below this many elements a conversion is cheaper than waking a worker.
constexpr std::int64_t kParallelConversionElements = 1 << 20;
// Elements per block claimed by a thread (multiple of 16, the vector step).
constexpr std::int64_t kConversionBlock = 1 << 16;

// The portable loops work on bit patterns directly (the header's inline helpers are compiled for AVX2
// in this library and would not inline into baseline code).
KVCHAT_ISA_BASELINE void bf16_to_f32_portable(const std::uint16_t* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

KVCHAT_ISA_BASELINE void f32_to_bf16_portable(const float* src, std::uint16_t* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, src + i, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
    } else {
      dst[i] = static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
  }
}

#if KVCHAT_HAVE_AVX2_KERNELS
KVCHAT_ISA_AVX2 void bf16_to_f32_avx2(const std::uint16_t* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 8)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
    _mm256_storeu_ps(dst + i + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
  }
  for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// Eight floats -> eight bf16 values, each in the low 16 bits of a 32-bit lane.
KVCHAT_ISA_AVX2 inline __m256i round_to_bf16_bits(__m256 values) {
  const __m256i bits = _mm256_castps_si256(values);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(values, values, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

KVCHAT_ISA_AVX2 void f32_to_bf16_avx2(const float* src, std::uint16_t* dst, std::int64_t n) {
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
#endif

void check_conversion_args(const char* function, const void* src, const void* dst, std::int64_t n) {
  if (n < 0) throw std::invalid_argument(std::string(function) + ": negative element count " + std::to_string(n));
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    throw std::invalid_argument(std::string(function) + ": null buffer for " + std::to_string(n) + " elements");
  }
}

template <typename Convert>
void run_conversion(std::int64_t n, const Convert& convert) {
  if (n < kParallelConversionElements) {
    convert(0, n);
    return;
  }
  default_thread_pool().parallel_for_blocks(n, convert, kConversionBlock);
}

}  // namespace

void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n) {
  check_conversion_args("bf16_to_f32", src, dst, n);
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    run_conversion(
        n, [&](std::int64_t begin, std::int64_t end) { bf16_to_f32_avx2(src + begin, dst + begin, end - begin); });
    return;
  }
#endif
  run_conversion(
      n, [&](std::int64_t begin, std::int64_t end) { bf16_to_f32_portable(src + begin, dst + begin, end - begin); });
}

void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n) {
  check_conversion_args("f32_to_bf16", src, dst, n);
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    run_conversion(
        n, [&](std::int64_t begin, std::int64_t end) { f32_to_bf16_avx2(src + begin, dst + begin, end - begin); });
    return;
  }
#endif
  run_conversion(
      n, [&](std::int64_t begin, std::int64_t end) { f32_to_bf16_portable(src + begin, dst + begin, end - begin); });
}

}  // namespace kvchat::kernels
