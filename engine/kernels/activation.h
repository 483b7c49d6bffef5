#pragma once
// The SwiGLU activation of a decode step, in place: written out so that a step needs no LibTorch call.
#include <cstdint>

namespace kvchat::kernels {

// gate[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)). n >= 0; gate and up must not overlap
// unless they are the same buffer.
void silu_mul(float* gate, const float* up, std::int64_t n);

}  // namespace kvchat::kernels
