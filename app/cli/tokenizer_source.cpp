#include "app/cli/tokenizer_source.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/gguf/gguf_file.h"

namespace kvchat::cli {

bool is_gguf_file(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

Tokenizer tokenizer_from_path(const std::string& path) {
  if (!is_gguf_file(path)) return Tokenizer::from_directory(path);
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
