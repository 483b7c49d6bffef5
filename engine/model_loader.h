#pragma once
// Everything a chat needs from one Hugging Face model directory, loaded together.
#include <memory>
#include <optional>
#include <string>

#include "engine/model_config.h"
#include "engine/text/chat_template.h"
#include "engine/text/tokenizer.h"
#include "engine/weight_dtype.h"

namespace kvchat {

class LlamaModel;

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

}  // namespace kvchat
