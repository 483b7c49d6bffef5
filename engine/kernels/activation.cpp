#include "engine/kernels/activation.h"

#include <cmath>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_kernels.h"

namespace kvchat::kernels {
namespace {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

void silu_mul_portable(float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) gate[i] = silu(gate[i]) * up[i];
}

}  // namespace

void silu_mul(float* gate, const float* up, std::int64_t n) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    avx2::silu_mul(gate, up, n);
    return;
  }
#endif
  silu_mul_portable(gate, up, n);
}

void gelu_tanh_mul(float* gate, const float* up, std::int64_t n) {
  // Scalar: Gemma's feed-forward products dominate a step, not this loop.
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    gate[i] = 0.5f * x * (1.0f + std::tanh(kBeta * (x + kKappa * x * x * x))) * up[i];
  }
}

}  // namespace kvchat::kernels
