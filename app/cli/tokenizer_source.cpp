#include "app/cli/tokenizer_source.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/gguf/gguf_file.h"

namespace kvchat::cli {

bool is_gguf_tokenizer_source(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(path, error)) return false;
  if (!fs::exists(path, error)) throw std::runtime_error("tokenizer not found: " + path);
  if (!fs::is_regular_file(path, error))
    throw std::runtime_error(path + " is neither a tokenizer folder nor a GGUF file");
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  if (!in.read(magic, 4) || std::string(magic, 4) != "GGUF")
    throw std::runtime_error(path +
                             " is not a GGUF file (it does not start with the GGUF magic) and not a tokenizer folder");
  return true;
}

Tokenizer tokenizer_from_path(const std::string& path) {
  if (!is_gguf_tokenizer_source(path)) return Tokenizer::from_directory(path);
  const GgufFile file(path);
  return Tokenizer::from_gguf(file);
}

ChatTemplateConfig chat_template_config_from_gguf(const std::string& path) {
  const Tokenizer tokenizer = tokenizer_from_path(path);
  if (!tokenizer.chat_template()) throw std::runtime_error(path + " has no chat template (tokenizer.chat_template)");
  ChatTemplateConfig config;
  config.chat_template = tokenizer.chat_template();
  if (const auto bos = tokenizer.bos_id()) config.special_tokens["bos_token"] = tokenizer.id_to_token(*bos);
  if (const auto eos = tokenizer.eos_id()) config.special_tokens["eos_token"] = tokenizer.id_to_token(*eos);
  return config;
}

}  // namespace kvchat::cli
