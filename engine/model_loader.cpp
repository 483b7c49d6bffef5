#include "engine/model_loader.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "engine/compute_options.h"
#include "engine/llama_model.h"

namespace kvchat {

LoadedModel load_model_directory(const std::string& directory, const LoadOptions& options) {
  namespace fs = std::filesystem;
  const auto started = std::chrono::steady_clock::now();
  if (!fs::is_directory(directory)) throw ModelError("model directory not found: " + directory);
  set_compute_threads(options.threads);

  LoadedModel loaded;
  loaded.directory = directory;
  loaded.config = ModelConfig::from_directory(directory);
  // Tokenizer and template first: they are cheap, and a bad one should fail before gigabytes are read.
  const fs::path tokenizer_path = fs::path(directory) / "tokenizer.json";
  const fs::path tokenizer_config_path = fs::path(directory) / "tokenizer_config.json";
  if (fs::exists(tokenizer_path)) {
    loaded.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_files(
        tokenizer_path.string(), fs::exists(tokenizer_config_path) ? tokenizer_config_path.string() : std::string()));
  }
  // Every id the tokenizer (and so the chat template) can emit must have an embedding row: a tokenizer
  // from another model would otherwise load fine and fail on the first message.
  if (loaded.tokenizer && loaded.tokenizer->vocab_size() > loaded.config.vocab_size)
    throw ModelError(tokenizer_path.string() + " has token ids up to " +
                     std::to_string(loaded.tokenizer->vocab_size() - 1) + " but the model's vocabulary (vocab_size in " +
                     (fs::path(directory) / "config.json").string() + ") has " + std::to_string(loaded.config.vocab_size) +
                     " ids: the tokenizer does not belong to these weights");
  loaded.formatter = fs::exists(tokenizer_config_path)
                         ? ChatFormatter::from_tokenizer_config(tokenizer_config_path.string())
                         : ChatFormatter::plain();
  loaded.model = LlamaModel::from_checkpoint(directory, loaded.config, options.dtype);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  spdlog::info("model directory {} loaded in {:.2f} s (tokenizer: {}, chat template: {})", directory, seconds,
               loaded.tokenizer ? "yes" : "no", loaded.formatter.has_template() ? "yes" : "no");
  return loaded;
}

}  // namespace kvchat
