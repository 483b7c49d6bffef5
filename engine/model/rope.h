#pragma once
// Rotary position embeddings in Hugging Face's rotate_half layout: cos/sin rows are cat([freqs, freqs])
// over the rotated dimensions (head_dim, or Phi-4-mini's leading part of it), computed in float32 exactly as
// transformers does (default, linear, llama3 and LongRoPE frequency scaling).
#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/model/model_config.h"

namespace kvchat {

// inv_freq [rotated dims / 2], with rope_scaling applied.
at::Tensor rope_inverse_frequencies(const ModelConfig& config);
// cos and sin rows [positions.size(0), rotated dims] for the given absolute positions (int64 tensor).
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const ModelConfig& config, const at::Tensor& positions);

// The cos/sin rows of every position up to the model's context limit, computed on demand a chunk of
// positions at a time: a config that claims millions of positions must not cost gigabytes before its
// first token. Shared by every session of a model (thread-safe); rows never move once computed, so
// a row pointer stays valid for the table's life. The values are those of rope_cos_sin.
class RopeTable {
 public:
  explicit RopeTable(const ModelConfig& config);

  // Makes the rows of positions [0, end) available; end must not exceed the context limit.
  void ensure(std::int64_t end) const;
  // Rows of one position [rotated dims] (ensure(position + 1) first).
  const float* cos_row(std::int64_t position) const { return row(cos_chunks_, position); }
  const float* sin_row(std::int64_t position) const { return row(sin_chunks_, position); }
  std::int64_t ready_positions() const;

 private:
  static constexpr std::int64_t kChunkPositions = 4096;
  const float* row(const std::vector<at::Tensor>& chunks, std::int64_t position) const {
    return chunks[static_cast<std::size_t>(position / kChunkPositions)].data_ptr<float>() +
           (position % kChunkPositions) * head_dim_;
  }

  ModelConfig config_;
  std::int64_t head_dim_;
  mutable std::mutex grow_mutex_;
  // One slot per chunk, sized at construction (never reallocated): [kChunkPositions, head_dim] each.
  mutable std::vector<at::Tensor> cos_chunks_, sin_chunks_;
  mutable std::atomic<std::int64_t> ready_chunks_{0};
};

}  // namespace kvchat
