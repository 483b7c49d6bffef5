#pragma once
// The models the engine's multi-row suites (speculative decoding, batched decode) run on, by name: a shared
// model folder or GGUF file ("models/stories260K", "fixtures/gguf/....gguf"), the same with "-bf16" (a folder's
// weights kept in bf16), a family fixture of this repository ("family:gemma3", "family:gemma3/model-Q4_K.gguf"),
// or a random Qwen2-layout model ("qwen2-random-f32", "qwen2-random-bf16", "qwen2-random-q4_k": q/k/v biases, GQA;
// the last with every matrix in Q4_K blocks).
#include <memory>
#include <string>

#include "common/test_paths.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"
#include "engine/model/model_weights.h"

namespace kvchat::test {

inline const char* const kRandomQwen2Config = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
  "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
  "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 1024,
  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false,
  "bos_token_id": 1, "eos_token_id": 2
})";

inline std::shared_ptr<const LlamaModel> load_test_model(const std::string& name) {
  if (name == "qwen2-random-f32" || name == "qwen2-random-bf16")
    return LlamaModel::random(ModelConfig::from_json_text(kRandomQwen2Config, "qwen2 test config"), 11,
                              name == "qwen2-random-bf16" ? WeightDtype::BFloat16 : WeightDtype::Float32);
  if (name == "qwen2-random-q4_k") {
    const ModelConfig config = ModelConfig::from_json_text(kRandomQwen2Config, "qwen2 test config");
    return std::make_shared<LlamaModel>(config, random_quantized_model_weights(config, 11, GgufType::Q4_K));
  }
  LoadOptions options;
  std::string path =
      name.rfind("family:", 0) == 0 ? source_dir() + "/tests/fixtures/families/" + name.substr(7) : shared_path(name);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, "-bf16") == 0) {
    path = path.substr(0, path.size() - 5);
    options.dtype = WeightDtype::BFloat16;
  }
  return load_model(path, options).model;
}

}  // namespace kvchat::test
