#include "engine/model/model_loader.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string_view>

#include "engine/compute/compute_options.h"
#include "engine/compute/process_setup.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/gguf_model.h"
#include "engine/model/llama_model.h"

namespace kvchat {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every id the tokenizer (and so the chat template) can emit must have an embedding row: a tokenizer
// from another model would otherwise load fine and fail on the first message.
void check_tokenizer_fits(const LoadedModel& loaded, const std::string& tokenizer_source,
                          const std::string& vocab_source) {
  if (loaded.tokenizer && loaded.tokenizer->vocab_size() > loaded.config.vocab_size)
    throw ModelError(tokenizer_source + " has token ids up to " + std::to_string(loaded.tokenizer->vocab_size() - 1) +
                     " but the model's vocabulary (" + vocab_source + ") has " +
                     std::to_string(loaded.config.vocab_size) + " ids: the tokenizer does not belong to these weights");
}

bool has_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

void open_for_context(ModelConfig& config, LoadOptions::LongContext long_context) {
  if (long_context == LoadOptions::LongContext::Required ||
      (long_context == LoadOptions::LongContext::WhereSupported && config.has_longrope_long_factors()))
    config.use_longrope_long_context();
}

}  // namespace

struct LoadedModel::LazyConstraintVocabulary {
  std::once_flag made;
  std::shared_ptr<const ConstraintVocabulary> vocabulary;
};

std::shared_ptr<LoadedModel::LazyConstraintVocabulary> LoadedModel::make_lazy_constraint_vocabulary() {
  return std::make_shared<LazyConstraintVocabulary>();
}

std::shared_ptr<const ConstraintVocabulary> LoadedModel::constraint_vocabulary() const {
  if (!tokenizer) return nullptr;
  std::call_once(constraint_vocabulary_->made, [&] {
    const auto started = std::chrono::steady_clock::now();
    constraint_vocabulary_->vocabulary = ConstraintVocabulary::from_tokenizer(*tokenizer);
    spdlog::info("constrained decoding: the vocabulary's token trie made in {:.0f} ms",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  });
  return constraint_vocabulary_->vocabulary;
}

LoadedModel load_model(const std::string& path, const LoadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code error;
  LoadedModel loaded;
  if (fs::is_directory(path, error)) {
    loaded = load_model_directory(path, options);
  } else {
    if (!fs::exists(path, error)) throw ModelError("model not found: " + path);
    if (!fs::is_regular_file(path, error)) throw ModelError(path + " is neither a model directory nor a GGUF file");
    if (!has_gguf_magic(path))
      throw ModelError(path + " is not a GGUF file (it does not start with the GGUF magic) and not a model directory");
    loaded = load_model_gguf(path, options);
  }
  release_freed_memory();  // the loader's temporaries (converted tensors) need not stay resident
  return loaded;
}

LoadedModel load_model_directory(const std::string& directory, const LoadOptions& options) {
  namespace fs = std::filesystem;
  const auto started = std::chrono::steady_clock::now();
  if (!fs::is_directory(directory)) throw ModelError("model directory not found: " + directory);
  set_compute_threads(options.threads);

  LoadedModel loaded;
  loaded.path = directory;
  loaded.format = "safetensors";
  loaded.weight_format = to_string(options.dtype);
  loaded.config = ModelConfig::from_directory(directory);
  open_for_context(loaded.config, options.long_context);
  // Tokenizer and template first: they are cheap, and a bad one should fail before gigabytes are read.
  const fs::path tokenizer_path = fs::path(directory) / "tokenizer.json";
  const fs::path tokenizer_config_path = fs::path(directory) / "tokenizer_config.json";
  if (fs::exists(tokenizer_path)) {
    loaded.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_files(
        tokenizer_path.string(), fs::exists(tokenizer_config_path) ? tokenizer_config_path.string() : std::string()));
  }
  check_tokenizer_fits(loaded, tokenizer_path.string(),
                       "vocab_size in " + (fs::path(directory) / "config.json").string());
  loaded.formatter = fs::exists(tokenizer_config_path)
                         ? ChatFormatter::from_tokenizer_config(tokenizer_config_path.string())
                         : ChatFormatter::plain();
  loaded.model = LlamaModel::from_checkpoint(directory, loaded.config, options.dtype);
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error))
    if (entry.path().extension() == ".safetensors")
      loaded.file_bytes += static_cast<std::int64_t>(entry.file_size(error));
  spdlog::info("model directory {} loaded in {:.2f} s (tokenizer: {}, chat template: {})", directory,
               seconds_since(started), loaded.tokenizer ? "yes" : "no", loaded.formatter.has_template() ? "yes" : "no");
  return loaded;
}

LoadedModel load_model_gguf(const std::string& path, const LoadOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  set_compute_threads(options.threads);
  auto file = std::make_shared<const GgufFile>(path);

  LoadedModel loaded;
  loaded.path = path;
  loaded.format = "gguf";
  loaded.file_bytes = static_cast<std::int64_t>(file->file_size());
  loaded.config = model_config_from_gguf(*file);
  open_for_context(loaded.config, options.long_context);
  // Tokenizer and template first: cheap, and they fail before the weights are touched.
  // llama.cpp's convention for a file without a vocabulary: the key present, with "none" (or "no_vocab").
  const std::string_view vocabulary =
      file->has_metadata("tokenizer.ggml.model") ? file->get_string("tokenizer.ggml.model") : "none";
  const bool has_vocabulary = vocabulary != "none" && vocabulary != "no_vocab";
  if (has_vocabulary) {
    loaded.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_gguf(*file));
    check_tokenizer_fits(loaded, path + " (tokenizer.ggml.tokens)", "rows of token_embd.weight");
  }
  const Tokenizer* tokenizer = loaded.tokenizer.get();
  if (tokenizer && tokenizer->chat_template()) {
    auto text_of = [&](std::optional<TokenId> id) -> std::optional<std::string> {
      if (!id) return std::nullopt;
      return tokenizer->id_to_token(*id);
    };
    loaded.formatter = ChatFormatter::from_template(*tokenizer->chat_template(), text_of(tokenizer->bos_id()),
                                                    text_of(tokenizer->eos_id()), path + " (tokenizer.chat_template)");
  } else {
    loaded.formatter = ChatFormatter::plain();
  }
  auto model = std::make_shared<LlamaModel>(loaded.config, load_gguf_weights(file, loaded.config));
  loaded.weight_format = gguf_file_type_name(*file);
  if (loaded.weight_format.empty()) loaded.weight_format = model->weight_types();
  loaded.model = model;
  spdlog::info(
      "GGUF model {} loaded in {:.2f} s: {} ({}), {} layers, hidden {}, heads {}/{} (kv), vocab {}, "
      "{:.1f} MiB of weights ({}), tokenizer: {}, chat template: {}",
      path, seconds_since(started), loaded.config.model_type, loaded.weight_format, loaded.config.num_hidden_layers,
      loaded.config.hidden_size, loaded.config.num_attention_heads, loaded.config.num_key_value_heads,
      loaded.config.vocab_size, model->weight_bytes() / 1048576.0, model->weight_types(), tokenizer ? "yes" : "no",
      loaded.formatter.has_template() ? "yes" : "no");
  return loaded;
}

}  // namespace kvchat
