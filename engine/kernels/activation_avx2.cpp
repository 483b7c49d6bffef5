// The AVX2 SwiGLU of activation.h (this file alone is compiled for AVX2, FMA and F16C; activation.cpp calls it
// after use_avx2_kernels() said yes).
#include <cmath>
#include <cstdint>

#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
namespace kvchat::kernels::avx2 {

void silu_mul(float* gate, const float* up, std::int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 sign = _mm256_set1_ps(-0.f);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    // exp8 saturates at exp(88.37) instead of overflowing, so a very negative x gives x / huge = -0
    // (the limit), never a NaN from inf/inf.
    const __m256 denominator = _mm256_add_ps(one, exp8(_mm256_xor_ps(x, sign)));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(x, denominator), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace kvchat::kernels::avx2
#endif  // KVCHAT_HAVE_AVX2_KERNELS
