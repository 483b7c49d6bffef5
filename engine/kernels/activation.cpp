#include "engine/kernels/activation.h"

#include <cmath>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_attributes.h"
#include "engine/kernels/vector_math_avx2.h"

namespace kvchat::kernels {
namespace {

KVCHAT_ISA_BASELINE_INLINE inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

KVCHAT_ISA_BASELINE void silu_mul_portable(float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) gate[i] = silu(gate[i]) * up[i];
}

#if KVCHAT_HAVE_AVX2_KERNELS
KVCHAT_ISA_AVX2 void silu_mul_avx2(float* gate, const float* up, std::int64_t n) {
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
#endif

}  // namespace

void silu_mul(float* gate, const float* up, std::int64_t n) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    silu_mul_avx2(gate, up, n);
    return;
  }
#endif
  silu_mul_portable(gate, up, n);
}

}  // namespace kvchat::kernels
