#pragma once
// Vector math shared by the AVX2 kernels (attention's softmax, the SwiGLU activation, the quantized
// products' block scales and sums). Only for
// functions marked KVCHAT_ISA_AVX2, called after use_avx2_kernels() said yes.
#include "engine/kernels/isa_attributes.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvchat::kernels {

// The sum of a vector's 8 floats.
KVCHAT_ISA_AVX2 inline float horizontal_sum(__m256 v) {
  const __m128 folded = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// An IEEE half stored at `at` (a GGUF block scale; any alignment), as a float.
KVCHAT_ISA_AVX2 inline float load_f16_scale(const std::uint8_t* at) {
  std::uint16_t bits;
  std::memcpy(&bits, at, 2);
  return _cvtsh_ss(bits);
}

// exp(x) for 8 floats: range reduction x = k ln2 + r, a degree-6 polynomial for exp(r) on
// |r| <= ln2/2, and 2^k through the exponent bits. Relative error about 2e-7; inputs below -87
// (softmax tails) give 0, inputs above 88.37 give exp(88.37) (finite).
KVCHAT_ISA_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 max_input = _mm256_set1_ps(88.3762626647949f);
  const __m256 min_input = _mm256_set1_ps(-87.3365447505531f);
  const __m256 underflow = _mm256_cmp_ps(x, min_input, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, min_input), max_input);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - k ln2, with ln2 split in two for accuracy.
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
  return _mm256_andnot_ps(underflow, result);
}

}  // namespace kvchat::kernels
#endif
