#pragma once
// The working memory of decode steps: one token's activations, the attention scores and the logits.
//
// Ownership: whoever runs the steps owns one (a Session owns its own), and it is reused by every step,
// so a steady-state step allocates nothing. Never shared by two generations running at once; the
// model itself stays immutable and shareable.
#include <cstdint>
#include <vector>

namespace kvchat {

struct ModelConfig;

struct DecodeContext {
  std::vector<float> logits;  // [vocab]: the last step's logits
  std::vector<float> x, h, q, k, v, attended, gate, up;
  std::vector<float> scores;  // [heads, positions]: grows with the cache's capacity, never shrinks

  // Sizes every buffer for the model (no-op once sized) and the scores for `positions` attended positions.
  void reserve(const ModelConfig& config, std::int64_t positions);
};

}  // namespace kvchat
