#pragma once
// Rotary position embeddings in Hugging Face's rotate_half layout: cos/sin rows are cat([freqs, freqs])
// over head_dim, computed in float32 exactly as transformers does (default and llama3 frequency scaling).
#include <ATen/ATen.h>

#include <cstdint>

#include "engine/model_config.h"

namespace kvchat {

// inv_freq [head_dim / 2], with rope_scaling applied.
at::Tensor rope_inverse_frequencies(const ModelConfig& config);
// cos and sin rows [positions.size(0), head_dim] for the given absolute positions (int64 tensor).
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const ModelConfig& config, const at::Tensor& positions);
// x: [heads, T, head_dim]; cos/sin: [T, head_dim]. Returns x*cos + rotate_half(x)*sin.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace kvchat
