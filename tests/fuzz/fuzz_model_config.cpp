// config.json and generation_config.json, through ModelConfig::from_directory: the input is
// config.json, then (after a NUL byte, when there is one) generation_config.json. A refusal is a
// ModelError; anything else escaping (a JSON type error, say) is a bug.
#include <cstddef>
#include <cstdint>

#include "engine/model/model_config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = kvchat::fuzz::split_parts(data, size, 2);
  const auto& folder = kvchat::fuzz::scratch();
  folder.write("config.json", parts[0]);
  if (parts.size() > 1)
    folder.write("generation_config.json", parts[1]);
  else
    folder.remove("generation_config.json");
  try {
    const kvchat::ModelConfig config = kvchat::ModelConfig::from_directory(folder.path());
    // What the model code relies on once a config is accepted.
    if (config.head_dim <= 0 || config.head_dim % 2 != 0 || config.num_key_value_heads <= 0 ||
        config.num_attention_heads % config.num_key_value_heads != 0 || config.max_position_embeddings <= 0 ||
        config.max_position_embeddings > kvchat::kMaxContextPositions)
      __builtin_trap();
  } catch (const kvchat::ModelError&) {
  }
  return 0;
}
