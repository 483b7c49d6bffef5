#pragma once
// Safetensors headers and shard indexes, validated without LibTorch: everything about a checkpoint that
// comes from its bytes before a tensor is made. engine/model/safetensors.h maps the files and makes the tensors.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvchat {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets inside the data section
  std::uint64_t end = 0;
};

// The validated header of one .safetensors file.
struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> entries;
  std::uint64_t data_offset = 0;  // where the data section starts: 8 + the header's length
  std::uint64_t data_size = 0;
};

// Validates the whole file's `size` bytes at `bytes`: header length within the file, valid JSON, no
// tensor listed twice, known dtypes, offsets inside the data section, no overlaps, shape x dtype size ==
// byte length. Throws ModelError naming `path` (and the tensor).
SafetensorsHeader parse_safetensors_header(const std::uint8_t* bytes, std::uint64_t size, const std::string& path);

// model.safetensors.index.json: each tensor's shard, a plain file name inside the checkpoint's directory.
// Throws ModelError naming `index_path` for invalid JSON, a missing weight_map or a name leaving the folder.
std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& index_path);

// Element size in bytes of a safetensors dtype name; 0 if unknown.
std::size_t safetensors_dtype_size(const std::string& dtype);

}  // namespace kvchat
