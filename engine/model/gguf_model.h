#pragma once
// A Llama-family model from one GGUF file (general.architecture "llama" or "qwen2"): the
// hyper-parameters from the {arch}.* metadata and the weights as the file stores them. Matrices stay in
// the mapped file in their stored type (F32, BF16, F16 or a quantization); only the Q/K rows of a
// llama file are copied, to undo the permutation llama.cpp's converter applies for its interleaved
// RoPE (this engine rotates halves, as Hugging Face does; qwen2 files are stored that way already).
#include <memory>
#include <string>

#include "engine/gguf/gguf_file.h"
#include "engine/model/gguf_model_config.h"  // model_config_from_gguf, gguf_file_type_name
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace kvchat {

// Every tensor checked against the config (present, shape, a type this engine decodes). The weights
// keep `file` alive. Throws ModelError naming the file and the tensor.
ModelWeights load_gguf_weights(const std::shared_ptr<const GgufFile>& file, const ModelConfig& config);

}  // namespace kvchat
