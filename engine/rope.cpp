#include "engine/rope.h"

#include <cmath>

namespace kvchat {

at::Tensor rope_inverse_frequencies(const ModelConfig& config) {
  const std::int64_t dim = config.head_dim;
  at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  at::Tensor inv_freq = 1.0 / at::pow(config.rope_theta, exponents);  // float32, as transformers
  if (!config.rope_frequency_factors.empty())
    inv_freq = inv_freq / at::tensor(config.rope_frequency_factors, at::kDouble).to(at::kFloat);
  if (config.rope_scaling.rope_type == "linear") return inv_freq / config.rope_scaling.factor;
  if (config.rope_scaling.rope_type != "llama3") return inv_freq;

  // Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
  const RopeScaling& s = config.rope_scaling;
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  at::Tensor smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  at::Tensor medium = at::logical_and(wavelen >= high_freq_wavelen, wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const ModelConfig& config, const at::Tensor& positions) {
  at::Tensor inv_freq = rope_inverse_frequencies(config);
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0);  // [P, dim/2]
  at::Tensor emb = at::cat({freqs, freqs}, 1);
  return {emb.cos(), emb.sin()};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace kvchat
