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
  // "default", "linear" (frequencies / factor), "llama3" or "longrope" (Phi-3's, also called "su")
  std::string rope_type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
  // LongRoPE: per rotated pair, the divisor of its frequency in use (rotary_dim / 2 of them): the short factors, or
  // the long ones once the model is opened past its original context (use_longrope_long_context); and the factor cos
  // and sin are multiplied by.
  std::vector<double> longrope_factors;
  std::vector<double> longrope_long_factors;  // the config's long factors
  std::int64_t longrope_long_context = 0;     // the context they serve (the config's max_position_embeddings)
  double attention_factor = 1.0;
};

// The longest context a config may claim (2^24 positions): beyond it a value is a corrupt or hostile
// file, not a model (the largest real contexts are a few million).
constexpr std::int64_t kMaxContextPositions = std::int64_t(1) << 24;

struct ModelConfig {
  std::string model_type =
      "llama";  // "llama" (also Mistral, TinyLlama, SmolLM), "qwen2", "qwen3", "gemma2", "gemma3", "smollm3", "phi3"
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t head_dim = 0;  // hidden_size / num_attention_heads when the file has none
  // The leading dimensions of each head that RoPE rotates (Phi-4-mini's partial_rotary_factor); the rest pass
  // through. Equal to head_dim for every other family.
  std::int64_t rotary_dim = 0;
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
  std::string hidden_act = "silu";  // the gate's activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (Gemma's GeGLU)

  // Gemma 2 and 3. Embedding rows are multiplied by embedding_scale (sqrt(hidden_size)). Their norms compute
  // x * (1 + weight): a Hugging Face checkpoint stores `weight`, a GGUF file 1 + weight (llama.cpp's converter adds
  // it), so the safetensors loader adds norm_weight_offset to every norm weight it reads. post_norms: a norm of
  // the attention's and of the feed-forward's output before each residual add.
  double embedding_scale = 1.0;
  double norm_weight_offset = 0.0;
  bool post_norms = false;
  // Attention scores are scaled by 1/sqrt(query_pre_attention_scalar): head_dim unless the config says
  // (Gemma's query_pre_attn_scalar).
  double query_pre_attention_scalar = 0.0;
  // Soft-capping (Gemma 2): scores, and the final logits, become cap * tanh(value / cap); 0 for none.
  double attention_logit_softcap = 0.0;
  double final_logit_softcap = 0.0;
  // Sliding-window attention: a layer marked in sliding_layers attends only to the last sliding_window positions
  // (its own included: query p sees keys p - window + 1 .. p). 0: every layer attends to every position.
  std::int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // one per layer
  // SmolLM3: layers whose attention has no position rotation at all (NoPE); one per layer, empty for none.
  std::vector<bool> layers_without_rope;
  // The RoPE base of the sliding layers (Gemma 3's rope_local_base_freq, without rope_scaling); 0: rope_theta.
  double rope_local_theta = 0.0;

  // The window of one layer's attention: sliding_window for a sliding layer, else 0 (all positions).
  std::int64_t layer_window(std::int64_t layer) const {
    return sliding_window > 0 && static_cast<std::size_t>(layer) < sliding_layers.size() &&
                   sliding_layers[static_cast<std::size_t>(layer)]
               ? sliding_window
               : 0;
  }
  std::int64_t rotated_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  bool layer_uses_rope(std::int64_t layer) const {
    return static_cast<std::size_t>(layer) >= layers_without_rope.size() ||
           !layers_without_rope[static_cast<std::size_t>(layer)];
  }
  bool layer_uses_local_rope(std::int64_t layer) const { return rope_local_theta > 0 && layer_window(layer) > 0; }
  // 1/sqrt(query_pre_attention_scalar or head_dim), in f32.
  float attention_scale() const;
  std::string torch_dtype = "float32";
  std::int64_t bos_token_id = -1;
  std::vector<TokenId> eos_token_ids;  // generation_config.json's list wins over config.json's

  // Parses config.json text; `source` names the file in error messages.
  static ModelConfig from_json_text(const std::string& text, const std::string& source);
  static ModelConfig from_file(const std::string& config_json_path);
  // DIR/config.json, then DIR/generation_config.json when present.
  static ModelConfig from_directory(const std::string& directory);

  // A LongRoPE (Phi-3) config opened for its whole context: every position takes the long factors and the limit is
  // the context they serve, as llama.cpp does for a context past the original one. (transformers switches a sequence
  // to the long factors only once it passes the original length, which changes the rotation of every earlier
  // position: no cache can follow that, so kvchat chooses once, when it opens the model.) Throws ModelError for a
  // config without LongRoPE.
  void use_longrope_long_context();
  bool has_longrope_long_factors() const {
    return rope_scaling.rope_type == "longrope" && !rope_scaling.longrope_long_factors.empty();
  }

  std::int64_t parameter_count() const;
  // K/V bytes per cached token: 2 x layers x kv_heads x head_dim x element_size.
  std::int64_t kv_bytes_per_token(std::int64_t element_size = 4) const;
};

}  // namespace kvchat
