#pragma once
// config.json (+ generation_config.json) of Llama-family models. No torch.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/types.h"

namespace kvchat {

// A bad or unsupported model file: config, weights, missing tensors. The message names the file
// (and the tensor or field).
struct ModelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RopeScaling {
  std::string rope_type = "default";  // "default", "linear" (frequencies / factor) or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

// The longest context a config may claim (2^24 positions): beyond it a value is a corrupt or hostile
// file, not a model (the largest real contexts are a few million).
constexpr std::int64_t kMaxContextPositions = std::int64_t(1) << 24;

struct ModelConfig {
  std::string model_type = "llama";  // "llama" (also Mistral, TinyLlama, SmolLM), "qwen2" or "qwen3"
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t head_dim = 0;  // hidden_size / num_attention_heads when the file has none
  std::int64_t vocab_size = 0;
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Per-pair divisors of the RoPE frequencies (a GGUF file's rope_freqs tensor: Llama 3's scaling as
  // llama.cpp stores it), head_dim / 2 of them; empty for none.
  std::vector<double> rope_frequency_factors;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;     // q/k/v projections have biases (Llama's attention_bias; always for Qwen2)
  bool output_bias = false;  // the attention output projection has one (Llama's attention_bias; never Qwen2)
  bool mlp_bias = false;
  // Each head of q and k goes through an RMSNorm of its own (weights [head_dim], shared by the heads) before
  // RoPE: Qwen3's q_norm and k_norm.
  bool qk_norm = false;
  std::string hidden_act = "silu";
  std::string torch_dtype = "float32";
  std::int64_t bos_token_id = -1;
  std::vector<TokenId> eos_token_ids;  // generation_config.json's list wins over config.json's

  // Parses config.json text; `source` names the file in error messages.
  static ModelConfig from_json_text(const std::string& text, const std::string& source);
  static ModelConfig from_file(const std::string& config_json_path);
  // DIR/config.json, then DIR/generation_config.json when present.
  static ModelConfig from_directory(const std::string& directory);

  std::int64_t parameter_count() const;
  // K/V bytes per cached token: 2 x layers x kv_heads x head_dim x element_size.
  std::int64_t kv_bytes_per_token(std::int64_t element_size = 4) const;
};

}  // namespace kvchat
