#include "engine/model/model_config.h"
#include "engine/text/regular_file.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace kvchat {

namespace {

using nlohmann::json;

std::string read_text_file(const std::string& path) {
  std::string contents, error;
  if (!read_regular_file(path, contents, error)) throw ModelError("cannot open " + path + ": " + error);
  return contents;
}

// Typed field access whose errors name the file and the field.
struct FieldReader {
  const json& object;
  const std::string& source;

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw ModelError(source + ": field '" + field + "' " + why);
  }
  bool present(const char* field) const { return object.contains(field) && !object.at(field).is_null(); }

  std::int64_t integer(const char* field) const {
    if (!present(field)) fail(field, "is missing");
    const json& value = object.at(field);
    if (!value.is_number_integer()) fail(field, "must be an integer");
    return value.get<std::int64_t>();
  }
  std::int64_t positive_int(const char* field) const {
    const std::int64_t number = integer(field);
    if (number <= 0) fail(field, "must be positive, got " + std::to_string(number));
    return number;
  }
  std::int64_t positive_int_or(const char* field, std::int64_t fallback) const {
    return present(field) ? positive_int(field) : fallback;
  }
  std::int64_t non_negative_int_or(const char* field, std::int64_t fallback) const {
    if (!present(field)) return fallback;
    const std::int64_t number = integer(field);
    if (number < 0) fail(field, "must not be negative, got " + std::to_string(number));
    return number;
  }
  double positive_number_or(const char* field, double fallback) const {
    if (!present(field)) return fallback;
    const json& value = object.at(field);
    if (!value.is_number()) fail(field, "must be a number");
    double number = value.get<double>();
    if (!(number > 0)) fail(field, "must be positive");
    return number;
  }
  bool bool_or(const char* field, bool fallback) const {
    if (!present(field)) return fallback;
    if (!object.at(field).is_boolean()) fail(field, "must be true or false");
    return object.at(field).get<bool>();
  }
  std::string string_or(const char* field, const std::string& fallback) const {
    if (!present(field)) return fallback;
    if (!object.at(field).is_string()) fail(field, "must be a string");
    return object.at(field).get<std::string>();
  }
};

// eos_token_id may be an int or a list of ints.
std::vector<TokenId> read_token_ids(const json& value, const std::string& source, const char* field) {
  std::vector<TokenId> ids;
  auto add = [&](const json& item) {
    if (!item.is_number_integer() || item.get<std::int64_t>() < 0)
      throw ModelError(source + ": field '" + field + "' must be a non-negative integer or a list of them");
    ids.push_back(static_cast<TokenId>(item.get<std::int64_t>()));
  };
  if (value.is_array()) {
    for (const json& item : value) add(item);
  } else if (!value.is_null()) {
    add(value);
  }
  return ids;
}

// Gemma 2/3's fields, and the sliding window of any family that has one (Gemma's alternate layers, Mistral's every
// layer). Layers are marked by `layer_types` where the config has it, else by the family's pattern as transformers
// derives it: Gemma 2 slides on every other layer from the first, Gemma 3 on five of each six.
void read_gemma_and_window_fields(const FieldReader& read, const json& root, bool gemma2, bool gemma3,
                                  ModelConfig& config) {
  const std::size_t layers = static_cast<std::size_t>(config.num_hidden_layers);
  if (gemma2 || gemma3) {
    config.embedding_scale = std::sqrt(static_cast<double>(config.hidden_size));
    config.norm_weight_offset = 1.0;
    config.post_norms = true;
    config.query_pre_attention_scalar = read.positive_number_or("query_pre_attn_scalar", 256.0);
    const auto cap = [&](const char* field, double gemma2_default) {
      if (!root.contains(field)) return gemma2 ? gemma2_default : 0.0;
      return root.at(field).is_null() ? 0.0 : read.positive_number_or(field, 0.0);
    };
    config.attention_logit_softcap = cap("attn_logit_softcapping", 50.0);
    config.final_logit_softcap = cap("final_logit_softcapping", 30.0);
    config.sliding_window = read.positive_int_or("sliding_window", 4096);
    if (gemma3) config.rope_local_theta = read.positive_number_or("rope_local_base_freq", 10000.0);
    const std::int64_t pattern = gemma2 ? 2 : read.positive_int_or("sliding_window_pattern", 6);
    for (std::size_t layer = 0; layer < layers; ++layer)
      config.sliding_layers.push_back((static_cast<std::int64_t>(layer) + 1) % pattern != 0);
  } else if ((config.model_type == "llama" || config.model_type == "phi3") && read.present("sliding_window")) {
    // Mistral's and Phi-3's: every layer.
    config.sliding_window = read.positive_int("sliding_window");
    config.sliding_layers.assign(layers, true);
  } else if ((config.model_type == "qwen2" || config.model_type == "qwen3") &&
             read.bool_or("use_sliding_window", false) && read.present("sliding_window")) {
    // Qwen2's and Qwen3's, switched on by use_sliding_window (off in the released models): the layers from
    // max_window_layers on (transformers' default 28) attend through the window, the ones before it to everything.
    config.sliding_window = read.positive_int("sliding_window");
    const std::int64_t first_window_layer = read.non_negative_int_or("max_window_layers", 28);
    for (std::size_t layer = 0; layer < layers; ++layer)
      config.sliding_layers.push_back(static_cast<std::int64_t>(layer) >= first_window_layer);
  }
  if (read.present("layer_types")) {
    const json& types = root.at("layer_types");
    if (!types.is_array() || types.size() != layers)
      read.fail("layer_types", "must list one type per layer (" + std::to_string(layers) + ")");
    config.sliding_layers.clear();
    for (const json& type : types) {
      if (type == "sliding_attention")
        config.sliding_layers.push_back(true);
      else if (type == "full_attention")
        config.sliding_layers.push_back(false);
      else
        read.fail("layer_types", "holds '" + type.dump() + "' (supported: sliding_attention, full_attention)");
    }
    if (config.sliding_window == 0 &&
        std::find(config.sliding_layers.begin(), config.sliding_layers.end(), true) != config.sliding_layers.end())
      read.fail("sliding_window", "is missing, but layer_types has sliding layers");
  }
}

// SmolLM3's layers without RoPE: no_rope_layers holds 1 for a layer that rotates and 0 for one that does not;
// without it, every no_rope_layer_interval-th layer (4) goes without, as transformers derives the list.
void read_no_rope_layers(const FieldReader& read, const json& root, ModelConfig& config) {
  const std::size_t layers = static_cast<std::size_t>(config.num_hidden_layers);
  if (read.present("no_rope_layers")) {
    const json& flags = root.at("no_rope_layers");
    if (!flags.is_array() || flags.size() != layers)
      read.fail("no_rope_layers", "must hold one 0 or 1 per layer (" + std::to_string(layers) + ")");
    for (const json& flag : flags) {
      if (flag != 0 && flag != 1) read.fail("no_rope_layers", "must hold only 0 and 1");
      config.layers_without_rope.push_back(flag == 0);
    }
    return;
  }
  const std::int64_t interval = read.positive_int_or("no_rope_layer_interval", 4);
  for (std::size_t layer = 0; layer < layers; ++layer)
    config.layers_without_rope.push_back((static_cast<std::int64_t>(layer) + 1) % interval == 0);
}

// Phi-3's LongRoPE (rope_scaling type "longrope", formerly "su"): short and long per-pair frequency divisors for
// contexts up to and past original_max_position_embeddings, and cos/sin scaled by the attention factor
// (sqrt(1 + ln(s) / ln(original)) for s = max_position_embeddings / original unless the config gives it).
// transformers switches to the long divisors once a sequence passes the original length, which changes the
// rotation of every earlier position: no cache can follow that switch. kvchat takes the short divisors and limits
// the context to the original length, where its results are transformers' exactly; a model opened for its long
// context (use_longrope_long_context) takes the long divisors for every position instead, as llama.cpp does.
void read_longrope(const FieldReader& read, const json& scaling, ModelConfig& config) {
  const FieldReader scaling_read{scaling, read.source};
  RopeScaling& rope = config.rope_scaling;
  rope.rope_type = "longrope";
  rope.original_max_position_embeddings = read.positive_int_or(
      "original_max_position_embeddings", scaling_read.positive_int_or("original_max_position_embeddings", 0));
  if (rope.original_max_position_embeddings == 0)
    read.fail("original_max_position_embeddings", "is missing (LongRoPE needs it)");
  const std::size_t pairs = static_cast<std::size_t>(config.rotated_dims() / 2);
  for (const char* field : {"short_factor", "long_factor"})
    if (!scaling.contains(field) || !scaling.at(field).is_array() || scaling.at(field).size() != pairs)
      scaling_read.fail(field, "must list " + std::to_string(pairs) + " factors (one per rotated pair)");
  for (auto [field, factors] :
       {std::pair{"short_factor", &rope.longrope_factors}, std::pair{"long_factor", &rope.longrope_long_factors}})
    for (const json& value : scaling.at(field)) {
      if (!value.is_number() || !(value.get<double>() > 0)) scaling_read.fail(field, "must hold positive numbers");
      factors->push_back(value.get<double>());
    }
  rope.longrope_long_context = config.max_position_embeddings;
  const double original = static_cast<double>(rope.original_max_position_embeddings);
  const double scale = static_cast<double>(config.max_position_embeddings) / original;
  const double computed = scale <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(scale) / std::log(original));
  rope.attention_factor = scaling_read.positive_number_or("attention_factor", computed);
  config.max_position_embeddings = std::min(config.max_position_embeddings, rope.original_max_position_embeddings);
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  // Said as such: a parser's "unexpected end of input" reads like a damaged file, not an empty one.
  if (text.empty()) throw ModelError(source + ": empty file (0 bytes), expected a JSON object");
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& error) {  // parse_error, and out_of_range for a number like 1e400
    throw ModelError(source + ": invalid JSON: " + error.what());
  }
  if (!root.is_object()) throw ModelError(source + ": expected a JSON object");
  FieldReader read{root, source};

  ModelConfig config;
  config.model_type = read.string_or("model_type", "llama");
  // Architectures that share the Llama computation (Qwen2 adds q/k/v biases, Qwen3 per-head q/k norms, Gemma its
  // norms, GeGLU, soft-capping and sliding windows); anything else would run silently wrong.
  if (config.model_type == "mistral") config.model_type = "llama";
  if (config.model_type == "gemma3" && (read.present("vision_config") || read.present("text_config")))
    throw ModelError(source +
                     ": a Gemma 3 checkpoint with a vision tower (field 'vision_config') is not supported; "
                     "open its GGUF file (the text model) or a text-only Gemma 3 (model_type gemma3_text)");
  if (config.model_type == "gemma3_text") config.model_type = "gemma3";
  const bool qwen2 = config.model_type == "qwen2";
  const bool qwen3 = config.model_type == "qwen3";
  const bool gemma2 = config.model_type == "gemma2", gemma3 = config.model_type == "gemma3";
  const bool gemma = gemma2 || gemma3;
  const bool smollm3 = config.model_type == "smollm3";
  const bool phi3 = config.model_type == "phi3";
  if (config.model_type != "llama" && !qwen2 && !qwen3 && !gemma && !smollm3 && !phi3)
    throw ModelError(source + ": unsupported model_type '" + config.model_type +
                     "' (supported: llama, mistral, qwen2, qwen3, gemma2, gemma3_text, smollm3, phi3)");
  // Mixtures of experts route each token through some of many feed-forward blocks: not this engine's layer.
  for (const char* experts : {"num_local_experts", "num_experts"})
    if (read.present(experts) && root.at(experts).is_number_integer() && root.at(experts).get<std::int64_t>() > 1)
      read.fail(experts, "is " + std::to_string(root.at(experts).get<std::int64_t>()) +
                             ": mixture-of-experts models are not supported");

  config.hidden_size = read.positive_int("hidden_size");
  config.intermediate_size = read.positive_int("intermediate_size");
  config.num_hidden_layers = read.positive_int("num_hidden_layers");
  config.num_attention_heads = read.positive_int("num_attention_heads");
  config.num_key_value_heads = read.positive_int_or("num_key_value_heads", config.num_attention_heads);
  config.vocab_size = read.positive_int("vocab_size");
  config.max_position_embeddings = read.positive_int_or("max_position_embeddings", 2048);
  if (config.max_position_embeddings > kMaxContextPositions)
    read.fail("max_position_embeddings", "is " + std::to_string(config.max_position_embeddings) + ", more than the " +
                                             std::to_string(kMaxContextPositions) + " positions kvchat accepts");
  config.rms_norm_eps = read.positive_number_or("rms_norm_eps", 1e-6);
  config.rope_theta = read.positive_number_or("rope_theta", 10000.0);
  config.tie_word_embeddings = read.bool_or("tie_word_embeddings", gemma);  // Gemma's default: tied
  const bool attention_bias = read.bool_or("attention_bias", false);
  config.qkv_bias = qwen2 || attention_bias;
  config.output_bias = !qwen2 && attention_bias;
  config.qk_norm = qwen3 || gemma3;
  // SmolLM3's sliding window is off in the released models; a checkpoint that turns it on attends differently from
  // what this engine computes (Qwen2's and Qwen3's are read with the other windows below).
  if (smollm3 && read.bool_or("use_sliding_window", false))
    throw ModelError(source + ": use_sliding_window is true: SmolLM3's sliding-window attention is not supported");
  config.mlp_bias = read.bool_or("mlp_bias", false);
  config.torch_dtype = read.string_or("torch_dtype", "float32");
  config.hidden_act = gemma ? read.string_or("hidden_activation", read.string_or("hidden_act", "gelu_pytorch_tanh"))
                            : read.string_or("hidden_act", "silu");
  if (config.hidden_act != "silu" && config.hidden_act != "gelu_pytorch_tanh")
    throw ModelError(source + ": unsupported hidden_act '" + config.hidden_act +
                     "' (supported: silu, gelu_pytorch_tanh)");

  if (read.present("head_dim")) {
    config.head_dim = read.positive_int("head_dim");
  } else {
    if (config.hidden_size % config.num_attention_heads != 0)
      throw ModelError(source + ": hidden_size " + std::to_string(config.hidden_size) +
                       " is not divisible by num_attention_heads " + std::to_string(config.num_attention_heads));
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  if (config.head_dim % 2 != 0) throw ModelError(source + ": head_dim must be even for RoPE");
  // Phi-4-mini rotates the first 3/4 of each head.
  const double partial_rotary = read.positive_number_or("partial_rotary_factor", 1.0);
  if (partial_rotary > 1.0) read.fail("partial_rotary_factor", "must not exceed 1");
  config.rotary_dim = static_cast<std::int64_t>(static_cast<double>(config.head_dim) * partial_rotary);
  if (config.rotary_dim <= 0 || config.rotary_dim % 2 != 0)
    read.fail("partial_rotary_factor", "gives " + std::to_string(config.rotary_dim) + " rotated dimensions, not even");
  if (config.num_attention_heads % config.num_key_value_heads != 0)
    throw ModelError(source + ": num_attention_heads " + std::to_string(config.num_attention_heads) +
                     " is not a multiple of num_key_value_heads " + std::to_string(config.num_key_value_heads));

  if (read.present("rope_scaling")) {
    const json& scaling = root.at("rope_scaling");
    if (!scaling.is_object()) throw ModelError(source + ": field 'rope_scaling' must be an object or null");
    FieldReader scaling_read{scaling, source};
    std::string type = scaling_read.string_or("rope_type", scaling_read.string_or("type", "default"));
    if (type == "llama3") {
      config.rope_scaling.rope_type = "llama3";
      config.rope_scaling.factor = scaling_read.positive_number_or("factor", 8.0);
      config.rope_scaling.low_freq_factor = scaling_read.positive_number_or("low_freq_factor", 1.0);
      config.rope_scaling.high_freq_factor = scaling_read.positive_number_or("high_freq_factor", 4.0);
      config.rope_scaling.original_max_position_embeddings =
          scaling_read.positive_int_or("original_max_position_embeddings", 8192);
      if (config.rope_scaling.high_freq_factor <= config.rope_scaling.low_freq_factor)
        throw ModelError(source + ": rope_scaling high_freq_factor must exceed low_freq_factor");
    } else if (type == "linear") {
      config.rope_scaling.rope_type = "linear";
      config.rope_scaling.factor = scaling_read.positive_number_or("factor", 1.0);
    } else if (type == "longrope" || type == "su") {
      read_longrope(read, scaling, config);
    } else if (type != "default") {
      throw ModelError(source + ": unsupported rope_scaling type '" + type +
                       "' (supported: default, linear, llama3, longrope)");
    }
  }

  read_gemma_and_window_fields(read, root, gemma2, gemma3, config);
  if (smollm3) read_no_rope_layers(read, root, config);

  if (read.present("bos_token_id")) {
    auto ids = read_token_ids(root.at("bos_token_id"), source, "bos_token_id");
    if (!ids.empty()) config.bos_token_id = ids.front();
  }
  if (read.present("eos_token_id"))
    config.eos_token_ids = read_token_ids(root.at("eos_token_id"), source, "eos_token_id");
  return config;
}

ModelConfig ModelConfig::from_file(const std::string& path) { return from_json_text(read_text_file(path), path); }

ModelConfig ModelConfig::from_directory(const std::string& directory) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(directory)) throw ModelError("model directory not found: " + directory);
  ModelConfig config = from_file((fs::path(directory) / "config.json").string());
  fs::path generation_path = fs::path(directory) / "generation_config.json";
  if (fs::exists(generation_path)) {
    json generation;
    try {
      generation = json::parse(read_text_file(generation_path.string()));
    } catch (const json::exception& error) {  // parse_error, and out_of_range for a number like 1e400
      throw ModelError(generation_path.string() + ": invalid JSON: " + error.what());
    }
    // generation_config.json decides when generation ends (e.g. stories260K ends a story with BOS).
    if (generation.is_object() && generation.contains("eos_token_id") && !generation.at("eos_token_id").is_null())
      config.eos_token_ids = read_token_ids(generation.at("eos_token_id"), generation_path.string(), "eos_token_id");
  }
  return config;
}

void ModelConfig::use_longrope_long_context() {
  RopeScaling& rope = rope_scaling;
  if (!has_longrope_long_factors())
    throw ModelError("the long context is a LongRoPE (Phi-3) mode: this " + model_type + " model has no long factors");
  rope.longrope_factors = rope.longrope_long_factors;
  max_position_embeddings = std::max(max_position_embeddings, rope.longrope_long_context);
}

std::int64_t ModelConfig::parameter_count() const {
  std::int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  std::int64_t per_layer =
      hidden_size * (q + 2 * kv) + q * hidden_size + 3 * hidden_size * intermediate_size + 2 * hidden_size;
  std::int64_t total = vocab_size * hidden_size + num_hidden_layers * per_layer + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

float ModelConfig::attention_scale() const {
  return 1.0f / std::sqrt(query_pre_attention_scalar > 0 ? static_cast<float>(query_pre_attention_scalar)
                                                         : static_cast<float>(head_dim));
}

std::int64_t ModelConfig::kv_bytes_per_token(std::int64_t element_size) const {
  return 2 * num_hidden_layers * num_key_value_heads * head_dim * element_size;
}

}  // namespace kvchat
