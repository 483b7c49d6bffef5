#include "engine/model/model_config.h"
#include "engine/text/regular_file.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

  std::int64_t positive_int(const char* field) const {
    if (!present(field)) fail(field, "is missing");
    const json& value = object.at(field);
    if (!value.is_number_integer()) fail(field, "must be an integer");
    std::int64_t number = value.get<std::int64_t>();
    if (number <= 0) fail(field, "must be positive, got " + std::to_string(number));
    return number;
  }
  std::int64_t positive_int_or(const char* field, std::int64_t fallback) const {
    return present(field) ? positive_int(field) : fallback;
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
  // Architectures that share the Llama computation exactly (Qwen2 adds q/k/v biases, Qwen3 per-head q/k
  // norms); anything else would run silently wrong.
  if (config.model_type == "mistral") config.model_type = "llama";
  const bool qwen2 = config.model_type == "qwen2";
  const bool qwen3 = config.model_type == "qwen3";
  if (config.model_type != "llama" && !qwen2 && !qwen3)
    throw ModelError(source + ": unsupported model_type '" + config.model_type +
                     "' (supported: llama, mistral, qwen2, qwen3)");

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
  config.tie_word_embeddings = read.bool_or("tie_word_embeddings", false);
  const bool attention_bias = read.bool_or("attention_bias", false);
  config.qkv_bias = qwen2 || attention_bias;
  config.output_bias = !qwen2 && attention_bias;
  config.qk_norm = qwen3;
  // Qwen2's and Qwen3's sliding window is off in the released models; a checkpoint that turns it on attends
  // differently from what this engine computes.
  if ((qwen2 || qwen3) && read.bool_or("use_sliding_window", false))
    throw ModelError(source + ": use_sliding_window is true: sliding-window attention is not supported");
  config.mlp_bias = read.bool_or("mlp_bias", false);
  config.torch_dtype = read.string_or("torch_dtype", "float32");
  config.hidden_act = read.string_or("hidden_act", "silu");
  if (config.hidden_act != "silu")
    throw ModelError(source + ": unsupported hidden_act '" + config.hidden_act + "' (supported: silu)");

  if (read.present("head_dim")) {
    config.head_dim = read.positive_int("head_dim");
  } else {
    if (config.hidden_size % config.num_attention_heads != 0)
      throw ModelError(source + ": hidden_size " + std::to_string(config.hidden_size) +
                       " is not divisible by num_attention_heads " + std::to_string(config.num_attention_heads));
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  if (config.head_dim % 2 != 0) throw ModelError(source + ": head_dim must be even for RoPE");
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
    } else if (type != "default") {
      throw ModelError(source + ": unsupported rope_scaling type '" + type + "' (supported: default, linear, llama3)");
    }
  }

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

std::int64_t ModelConfig::parameter_count() const {
  std::int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  std::int64_t per_layer =
      hidden_size * (q + 2 * kv) + q * hidden_size + 3 * hidden_size * intermediate_size + 2 * hidden_size;
  std::int64_t total = vocab_size * hidden_size + num_hidden_layers * per_layer + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

std::int64_t ModelConfig::kv_bytes_per_token(std::int64_t element_size) const {
  return 2 * num_hidden_layers * num_key_value_heads * head_dim * element_size;
}

}  // namespace kvchat
