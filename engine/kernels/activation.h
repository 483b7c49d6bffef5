#pragma once
// The gated activations of a decode step (SwiGLU, GeGLU), in place: written out so that a step needs no LibTorch
// call.
#include <cstdint>

namespace kvchat::kernels {

// gate[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)). n >= 0; gate and up must not overlap
// unless they are the same buffer.
void silu_mul(float* gate, const float* up, std::int64_t n);

// gate[i] = gelu_tanh(gate[i]) * up[i], PyTorch's gelu(approximate="tanh"):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Gemma's GeGLU.
void gelu_tanh_mul(float* gate, const float* up, std::int64_t n);

}  // namespace kvchat::kernels
