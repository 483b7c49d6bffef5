#pragma once
// A GGUF file's hyper-parameters ({arch}.* metadata) as a ModelConfig, and its quantization's name.
// No torch: engine/model/gguf_model.h loads the weights.
#include <string>

#include "engine/gguf/gguf_file.h"
#include "engine/model/model_config.h"

namespace kvchat {

// Throws ModelError naming the file and the key for a missing, mistyped or inconsistent value, and for
// an architecture other than llama and qwen2.
ModelConfig model_config_from_gguf(const GgufFile& file);

// What users call the file's quantization: general.file_type's name ("Q4_K_M", "Q8_0", "BF16", ...),
// or an empty string when the file does not say.
std::string gguf_file_type_name(const GgufFile& file);

}  // namespace kvchat
