#pragma once
// Where `tokenize` and `render` read a tokenizer and a chat template from: a Hugging Face folder
// (tokenizer.json, tokenizer_config.json) or a single GGUF file (tokenizer.ggml.*, tokenizer.chat_template).
#include <string>

#include "engine/text/chat_template_config.h"
#include "engine/text/tokenizer.h"

namespace kvchat::cli {

// Whether --tokenizer PATH names a GGUF file (a regular file starting with the GGUF magic, whatever its
// name) rather than a folder. Anything else (no such path, an empty or foreign file, a FIFO) throws
// std::runtime_error saying what PATH is, instead of failing later on PATH/tokenizer.json.
bool is_gguf_tokenizer_source(const std::string& path);

// DIR: DIR/tokenizer.json (and tokenizer_config.json); a GGUF file: its tokenizer metadata.
Tokenizer tokenizer_from_path(const std::string& path);

// A GGUF file's tokenizer.chat_template, with its BOS/EOS token texts as the template's bos_token and
// eos_token. Throws std::runtime_error when the file has no chat template.
ChatTemplateConfig chat_template_config_from_gguf(const std::string& path);

}  // namespace kvchat::cli
