#include "engine/model/gguf_model_config.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "engine/gguf/dequantize.h"

namespace kvchat {

namespace {

[[noreturn]] void fail(const GgufFile& file, const std::string& problem) {
  throw ModelError(file.path() + ": " + problem);
}

std::int64_t positive(const GgufFile& file, const std::string& key) {
  const std::int64_t value = file.get_int64(key);
  if (value <= 0) fail(file, "metadata " + key + " must be positive, got " + std::to_string(value));
  return value;
}

std::int64_t positive_or(const GgufFile& file, const std::string& key, std::int64_t fallback) {
  return file.has_metadata(key) ? positive(file, key) : fallback;
}

double positive_float_or(const GgufFile& file, const std::string& key, double fallback) {
  if (!file.has_metadata(key)) return fallback;
  const double value = file.get_float(key);
  if (!(value > 0) || value > 1e30) fail(file, "metadata " + key + " must be a positive number");
  return value;
}

void read_rope_scaling(const GgufFile& file, const std::string& arch, ModelConfig& config) {
  const std::string type_key = arch + ".rope.scaling.type";
  const std::string type = file.has_metadata(type_key) ? std::string(file.get_string(type_key)) : "none";
  if (type == "linear") {
    config.rope_scaling.rope_type = "linear";
    config.rope_scaling.factor = positive_float_or(file, arch + ".rope.scaling.factor", 1.0);
  } else if (type != "none") {
    fail(file, "metadata " + type_key + " is '" + type + "': only none and linear RoPE scaling are supported");
  }
  // Llama 3's frequency scaling: llama.cpp's converter stores it as one factor per rotated pair.
  if (const GgufTensor* factors = file.find_tensor("rope_freqs.weight")) {
    if (factors->n_elements != config.head_dim / 2)
      fail(file, "tensor rope_freqs.weight has " + std::to_string(factors->n_elements) +
                     " values, expected head_dim/2 = " + std::to_string(config.head_dim / 2));
    const std::vector<float> values = dequantize_tensor(*factors);
    for (float value : values)
      if (!(value > 0) || value > 1e30f) fail(file, "tensor rope_freqs.weight holds a factor that is not positive");
    config.rope_frequency_factors.assign(values.begin(), values.end());
  }
}

// Gemma 2/3 as llama.cpp runs them: norms stored as 1 + weight (no offset here), embeddings times sqrt(hidden),
// GeGLU, post-norms, a sliding window on every other layer (Gemma 2) or on five of each six (Gemma 3, whose
// sliding layers use RoPE base 10000 and its global ones the file's base and scaling). llama.cpp keeps no
// query_pre_attn_scalar: it scales by 1/sqrt(head_dim), except for the 27B models (46 layers for Gemma 2, 62 for
// Gemma 3), whose scalar is hidden / heads.
void read_gemma_fields(const GgufFile& file, const std::string& arch, ModelConfig& config) {
  const bool gemma2 = arch == "gemma2";
  config.hidden_act = "gelu_pytorch_tanh";
  config.embedding_scale = std::sqrt(static_cast<double>(config.hidden_size));
  config.post_norms = true;
  const bool large = config.num_hidden_layers == (gemma2 ? 46 : 62);
  config.query_pre_attention_scalar =
      static_cast<double>(large ? config.hidden_size / config.num_attention_heads : config.head_dim);
  if (gemma2) {
    config.attention_logit_softcap = positive_float_or(file, arch + ".attn_logit_softcapping", 50.0);
    config.final_logit_softcap = positive_float_or(file, arch + ".final_logit_softcapping", 30.0);
  } else {
    config.rope_local_theta = 10000.0;
  }
  const std::string window_key = arch + ".attention.sliding_window";
  if (!file.has_metadata(window_key)) fail(file, "metadata " + window_key + " (the sliding window) is missing");
  config.sliding_window = positive(file, window_key);
  const std::int64_t pattern = gemma2 ? 2 : 6;
  for (std::int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
    config.sliding_layers.push_back((layer + 1) % pattern != 0);
}

// Phi-3 as llama.cpp's converter writes it: LongRoPE as two tensors of per-pair divisors (rope_factors_short,
// rope_factors_long) with the attention factor and the original context in the metadata, and the sliding window
// of every layer. As from a Hugging Face folder (model_config.cpp says why): the short divisors, and the context
// limited to the original one, unless the model is opened for its long context
// (ModelConfig::use_longrope_long_context).
void read_phi3_fields(const GgufFile& file, const std::string& arch, ModelConfig& config) {
  if (file.has_metadata(arch + ".attention.sliding_window")) {
    config.sliding_window = positive(file, arch + ".attention.sliding_window");
    config.sliding_layers.assign(static_cast<std::size_t>(config.num_hidden_layers), true);
  }
  const GgufTensor* short_factors = file.find_tensor("rope_factors_short.weight");
  const GgufTensor* long_factors = file.find_tensor("rope_factors_long.weight");
  if (short_factors == nullptr && long_factors == nullptr) return;  // Phi-3 mini 4k: plain RoPE
  if (short_factors == nullptr || long_factors == nullptr)
    fail(file, "tensors rope_factors_short.weight and rope_factors_long.weight must come together");
  RopeScaling& rope = config.rope_scaling;
  rope.rope_type = "longrope";
  const std::string original_key = arch + ".rope.scaling.original_context_length";
  if (!file.has_metadata(original_key)) fail(file, "metadata " + original_key + " (LongRoPE) is missing");
  rope.original_max_position_embeddings = positive(file, original_key);
  rope.attention_factor = positive_float_or(file, arch + ".rope.scaling.attn_factor", 1.0);
  rope.longrope_long_context = config.max_position_embeddings;
  config.max_position_embeddings = std::min(config.max_position_embeddings, rope.original_max_position_embeddings);
  for (auto [factors, kept] :
       {std::pair{short_factors, &rope.longrope_factors}, std::pair{long_factors, &rope.longrope_long_factors}}) {
    if (factors->n_elements != config.rotary_dim / 2)
      fail(file, "tensor " + factors->name + " has " + std::to_string(factors->n_elements) +
                     " values, expected one per rotated pair (" + std::to_string(config.rotary_dim / 2) + ")");
    for (float value : dequantize_tensor(*factors)) {
      if (!(value > 0) || value > 1e30f) fail(file, "tensor " + factors->name + " holds a factor that is not positive");
      kept->push_back(value);
    }
  }
}

}  // namespace

ModelConfig model_config_from_gguf(const GgufFile& file) {
  const std::string arch(file.get_string("general.architecture"));
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && !gemma && arch != "smollm3" && arch != "phi3")
    fail(file, "unsupported architecture '" + arch +
                   "' (general.architecture; supported: llama, qwen2, qwen3, gemma2, gemma3, smollm3, phi3)");
  ModelConfig config;
  config.model_type = arch;
  config.hidden_size = positive(file, arch + ".embedding_length");
  config.intermediate_size = positive(file, arch + ".feed_forward_length");
  config.num_hidden_layers = positive(file, arch + ".block_count");
  config.num_attention_heads = positive(file, arch + ".attention.head_count");
  config.num_key_value_heads = positive_or(file, arch + ".attention.head_count_kv", config.num_attention_heads);
  config.max_position_embeddings = positive_or(file, arch + ".context_length", 2048);
  if (config.max_position_embeddings > kMaxContextPositions)
    fail(file, "metadata " + arch + ".context_length is " + std::to_string(config.max_position_embeddings) +
                   ", more than the " + std::to_string(kMaxContextPositions) + " positions kvchat accepts");
  // The key llama.cpp's writer and convert_hf_to_gguf.py store. No default: families differ (Llama 2 1e-5,
  // Llama 3 and Qwen2 1e-6), and a guessed epsilon changes every logit without any error.
  const std::string eps_key = arch + ".attention.layer_norm_rms_epsilon";
  if (!file.has_metadata(eps_key)) fail(file, "metadata " + eps_key + " (the RMSNorm epsilon) is missing");
  config.rms_norm_eps = positive_float_or(file, eps_key, 0.0);
  config.rope_theta = positive_float_or(file, arch + ".rope.freq_base", 10000.0);
  config.qkv_bias = arch == "qwen2";
  config.qk_norm = arch == "qwen3" || arch == "gemma3";

  if (config.hidden_size % config.num_attention_heads != 0 && !file.has_metadata(arch + ".attention.key_length"))
    fail(file, arch + ".embedding_length is not a multiple of " + arch + ".attention.head_count");
  config.head_dim = positive_or(file, arch + ".attention.key_length", config.hidden_size / config.num_attention_heads);
  if (positive_or(file, arch + ".attention.value_length", config.head_dim) != config.head_dim)
    fail(file, arch + ".attention.value_length differs from the key length: not supported");
  if (config.head_dim % 2 != 0) fail(file, "the head dimension must be even for RoPE");
  config.rotary_dim = positive_or(file, arch + ".rope.dimension_count", config.head_dim);
  if (config.rotary_dim > config.head_dim || config.rotary_dim % 2 != 0)
    fail(file, arch + ".rope.dimension_count is " + std::to_string(config.rotary_dim) +
                   ": it must be even and at most the head dimension");
  if (config.num_attention_heads % config.num_key_value_heads != 0)
    fail(file, arch + ".attention.head_count is not a multiple of " + arch + ".attention.head_count_kv");
  read_rope_scaling(file, arch, config);
  if (gemma) read_gemma_fields(file, arch, config);
  // SmolLM3 as llama.cpp runs it: every fourth layer without RoPE.
  if (arch == "phi3") read_phi3_fields(file, arch, config);
  if (arch == "smollm3")
    for (std::int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
      config.layers_without_rope.push_back((layer + 1) % 4 == 0);

  const GgufTensor* embedding = file.find_tensor("token_embd.weight");
  if (embedding == nullptr) fail(file, "tensor token_embd.weight is missing");
  if (embedding->ne.size() != 2) fail(file, "tensor token_embd.weight must have 2 dimensions");
  config.vocab_size = embedding->ne[1];
  config.tie_word_embeddings = file.find_tensor("output.weight") == nullptr;

  // Generation ends at the file's end-of-sequence and end-of-turn tokens.
  auto id_of = [&](const char* key) -> std::int64_t {
    if (!file.has_metadata(key)) return -1;
    const std::int64_t id = file.get_int64(key);
    if (id < 0 || id >= config.vocab_size) fail(file, std::string("metadata ") + key + " is outside the vocabulary");
    return id;
  };
  config.bos_token_id = id_of("tokenizer.ggml.bos_token_id");
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"})
    if (const std::int64_t id = id_of(key);
        id >= 0 && std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), static_cast<TokenId>(id)) ==
                       config.eos_token_ids.end())
      config.eos_token_ids.push_back(static_cast<TokenId>(id));
  return config;
}

std::string gguf_file_type_name(const GgufFile& file) {
  if (!file.has_metadata("general.file_type")) return "";
  // llama.cpp's llama_ftype values.
  static const std::pair<int, const char*> names[] = {
      {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
      {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
      {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {32, "BF16"},
  };
  const std::int64_t value = file.get_int64("general.file_type");
  for (const auto& [id, name] : names)
    if (id == value) return name;
  return "";
}

}  // namespace kvchat
