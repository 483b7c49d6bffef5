#include "engine/model/rope.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace kvchat {

at::Tensor rope_inverse_frequencies(const ModelConfig& config) {
  const std::int64_t dim = config.rotated_dims();
  at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  if (config.rope_scaling.rope_type == "longrope")  // 1 / (factor * base^(2i/dim)), float32 as transformers
    return 1.0 / (at::tensor(config.rope_scaling.longrope_factors, at::kDouble).to(at::kFloat) *
                  at::pow(config.rope_theta, exponents));
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
  if (config.rope_scaling.rope_type == "longrope") {
    const auto factor = static_cast<float>(config.rope_scaling.attention_factor);
    return {emb.cos() * factor, emb.sin() * factor};
  }
  return {emb.cos(), emb.sin()};
}

RopeTable::RopeTable(const ModelConfig& config)
    : config_(config),
      head_dim_(config.rotated_dims()),
      cos_chunks_(static_cast<std::size_t>((config.max_position_embeddings + kChunkPositions - 1) / kChunkPositions)),
      sin_chunks_(cos_chunks_.size()) {}

void RopeTable::ensure(std::int64_t end) const {
  const std::int64_t needed = (end + kChunkPositions - 1) / kChunkPositions;
  if (needed <= ready_chunks_.load(std::memory_order_acquire)) return;
  if (needed > static_cast<std::int64_t>(cos_chunks_.size()))
    throw std::length_error("RoPE rows up to position " + std::to_string(end) + " exceed the context limit of " +
                            std::to_string(config_.max_position_embeddings));
  std::lock_guard<std::mutex> lock(grow_mutex_);
  for (std::int64_t chunk = ready_chunks_.load(std::memory_order_relaxed); chunk < needed; ++chunk) {
    at::Tensor positions = at::arange(chunk * kChunkPositions, (chunk + 1) * kChunkPositions, at::kLong);
    auto [cos, sin] = rope_cos_sin(config_, positions);
    cos_chunks_[static_cast<std::size_t>(chunk)] = cos.contiguous();
    sin_chunks_[static_cast<std::size_t>(chunk)] = sin.contiguous();
    ready_chunks_.store(chunk + 1, std::memory_order_release);
  }
}

std::int64_t RopeTable::ready_positions() const { return ready_chunks_.load() * kChunkPositions; }

}  // namespace kvchat
