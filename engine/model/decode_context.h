#pragma once
// The working memory of a forward pass: the activations of the rows being computed (one row for a
// decode step, one per token for a prompt), the attention scores of a single row and its logits.
//
// Ownership: whoever runs the steps owns one (a Session owns its own), and it is reused by every step,
// so a steady-state step allocates nothing; a prompt's forward sizes a context of its own. Never shared
// by two generations running at once; the model itself stays immutable and shareable.
#include <cstdint>
#include <vector>

#include "engine/types.h"

namespace kvchat {

struct ModelConfig;

struct DecodeContext {
  std::vector<float> logits;      // [vocab]: the last step's logits
  std::vector<float> row_logits;  // [rows, vocab]: every row's logits of the last decode_rows
  // [rows, width] each: the residual stream, a normed copy or a product's output, the projections.
  std::vector<float> x, h, q, k, v, attended, gate, up;
  std::vector<float> scores;  // [heads, positions]: a single row's, grows with the cache's capacity, never shrinks
  // What the forward rounds new keys and values through: set from the cache (or, without one, the caller's
  // setting) before each forward.
  KvDtype kv_dtype = KvDtype::F32;

  // Sizes every buffer for `rows` rows of the model (no-op once sized) and the scores for `positions`
  // attended positions.
  void reserve(const ModelConfig& config, std::int64_t positions, std::int64_t rows = 1);
};

}  // namespace kvchat
