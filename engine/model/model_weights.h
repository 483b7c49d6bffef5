#pragma once
// A Llama model's weights, apart from its config and run state: what they are (the structs), where
// they come from (a safetensors checkpoint, or seeded random values of a config's exact shape) and how
// much memory they take. Immutable once loaded; a model shares them with every session.
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/gguf/gguf_types.h"
#include "engine/gguf/mapped_file.h"
#include "engine/model/linear.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_dtype.h"

namespace kvchat {

struct LayerWeights {
  at::Tensor attention_norm;  // [hidden] f32
  Linear q, k, v, o;
  at::Tensor q_norm, k_norm;  // [head_dim] f32 with ModelConfig::qk_norm; undefined without
  at::Tensor mlp_norm;        // [hidden] f32 (Gemma's pre_feedforward_layernorm)
  // Gemma 2/3 (ModelConfig::post_norms): norms of the attention's and of the feed-forward's output; undefined without.
  at::Tensor post_attention_norm, post_mlp_norm;
  Linear gate, up, down;
  // The layer's seven matrices, in that order.
  std::array<const Linear*, 7> matrices() const { return {&q, &k, &v, &o, &gate, &up, &down}; }
};

struct ModelWeights {
  Linear embedding;  // [vocab, hidden]: row i is token i's embedding (any storage type, no bias)
  std::vector<LayerWeights> layers;
  at::Tensor final_norm;  // [hidden] f32
  Linear lm_head;         // shares `embedding` when tie_word_embeddings
  // The files these weights map (empty for weights made in memory): checked before each turn.
  std::vector<FileIdentity> mapped_files;
};

// DIR's safetensors (one file or shards), every tensor checked against the config's shapes. Matrices
// are kept in `dtype`; a checkpoint already in that dtype stays memory-mapped, not copied. Norm
// weights and biases are always f32. Throws ModelError naming the file and tensor.
ModelWeights load_model_weights(const std::string& directory, const ModelConfig& config, WeightDtype dtype);

// Normal(0, 0.02) matrices and unit norms, seeded: benchmarks of real model sizes without a download.
ModelWeights random_model_weights(const ModelConfig& config, std::uint64_t seed, WeightDtype dtype);
// The same shapes with every matrix in a GGUF block type (Q8_0, Q4_K, F16, ...) made of random blocks
// with small finite scales: decode speed does not depend on the values, only on the bytes per weight.
ModelWeights random_quantized_model_weights(const ModelConfig& config, std::uint64_t seed, GgufType type);

// Bytes of every weight (a tied lm_head counted once).
std::int64_t weight_bytes(const ModelWeights& weights, bool tied_lm_head);

}  // namespace kvchat
