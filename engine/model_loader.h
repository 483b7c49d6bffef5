#pragma once
// Everything a chat needs from one Hugging Face model directory, loaded together.
#include <memory>
#include <optional>
#include <string>

#include "engine/model_config.h"
#include "engine/text/chat_template.h"
#include "engine/text/tokenizer.h"

namespace kvchat {

class LlamaModel;

enum class WeightDtype { Float32, BFloat16 };
const char* to_string(WeightDtype dtype);
WeightDtype weight_dtype_from_string(const std::string& text);  // "f32"/"float32", "bf16"/"bfloat16"

struct LoadOptions {
  WeightDtype dtype = WeightDtype::Float32;  // how weights are kept in memory (compute is f32)
  int threads = 0;                           // 0 = the machine's cores
};

struct LoadedModel {
  std::string directory;
  ModelConfig config;
  std::shared_ptr<const LlamaModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // null when the directory has no tokenizer.json
  ChatFormatter formatter;                     // plain() when tokenizer_config.json has no template
};

// Throws ModelError / TokenizerError / TemplateError with a message naming the bad file.
LoadedModel load_model_directory(const std::string& directory, const LoadOptions& options = {});

// Sets LibTorch's intra-op threads and the engine kernels' threads (0 = the machine's cores).
void set_engine_threads(int threads);

}  // namespace kvchat
