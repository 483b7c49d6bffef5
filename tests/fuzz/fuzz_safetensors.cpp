// Safetensors: a shard's header (length, JSON, dtypes, shapes, offsets, overlaps) and the sharded
// checkpoint's model.safetensors.index.json. The input is both at once: its bytes as a whole .safetensors
// file, and as the text of an index. A refusal is a ModelError; anything else escaping is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/model/model_config.h"  // ModelError
#include "engine/model/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const kvchat::SafetensorsHeader header = kvchat::parse_safetensors_header(data, size, "fuzz.safetensors");
    // What SafetensorsFile::tensor relies on: every entry lies inside the data section of the input.
    for (const auto& [name, entry] : header.entries)
      if (entry.end > header.data_size || header.data_offset + header.data_size != size) __builtin_trap();
  } catch (const kvchat::ModelError&) {
  }
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    for (const auto& [tensor, shard] : kvchat::parse_safetensors_index(text, "model.safetensors.index.json"))
      if (shard.find('/') != std::string::npos || shard == "..") __builtin_trap();  // must stay in the folder
  } catch (const kvchat::ModelError&) {
  }
  return 0;
}
