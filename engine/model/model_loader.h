#pragma once
// Everything a chat needs from one model, loaded together: a Hugging Face directory (config.json,
// safetensors, tokenizer.json, tokenizer_config.json) or a single GGUF file (metadata, weights in their
// stored types, tokenizer, chat template).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/model/model_config.h"
#include "engine/model/weight_dtype.h"
#include "engine/text/chat_template.h"
#include "engine/text/constraint/token_constraint.h"
#include "engine/text/tokenizer.h"

namespace kvchat {

class LlamaModel;

struct LoadOptions {
  WeightDtype dtype = WeightDtype::Float32;  // how a directory's weights are kept (a GGUF file keeps its own types)
  int threads = 0;                           // 0 = the machine's cores
  // Whether a LongRoPE (Phi-3) model is opened for its whole context, with the long factors for every position
  // (ModelConfig::use_longrope_long_context), or with the short factors within the original context (Off).
  // WhereSupported (an app setting meant for the models that have it) leaves other models as they are; Required
  // (kvchat-cli --long-context, asked for this model) refuses them with a ModelError.
  enum class LongContext { Off, WhereSupported, Required };
  LongContext long_context = LongContext::Off;
};

struct LoadedModel {
  std::string path;             // the directory or the .gguf file
  std::string format;           // "safetensors" or "gguf"
  std::string weight_format;    // what users call it: "f32", "bf16", "Q4_K_M", "Q8_0", ...
  std::int64_t file_bytes = 0;  // of the weights on disk
  ModelConfig config;
  std::shared_ptr<const LlamaModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // null when a directory has no tokenizer.json
  ChatFormatter formatter;                     // plain() when there is no chat template

  // The tokenizer's bytes for constrained decoding (a JSON reply format, a schema), made at the first call from any
  // thread and shared by every copy of this LoadedModel: the chat's engine, its server and their turn runners build
  // the trie of a 128k vocabulary once per model. Null without a tokenizer.
  std::shared_ptr<const ConstraintVocabulary> constraint_vocabulary() const;

 private:
  struct LazyConstraintVocabulary;
  std::shared_ptr<LazyConstraintVocabulary> constraint_vocabulary_ = make_lazy_constraint_vocabulary();
  static std::shared_ptr<LazyConstraintVocabulary> make_lazy_constraint_vocabulary();
};

// A directory or a GGUF file (by its magic, whatever its name). Throws ModelError / TokenizerError /
// TemplateError with a message naming the bad file.
LoadedModel load_model(const std::string& path, const LoadOptions& options = {});
LoadedModel load_model_directory(const std::string& directory, const LoadOptions& options = {});
LoadedModel load_model_gguf(const std::string& file, const LoadOptions& options = {});

}  // namespace kvchat
