#pragma once
// A GGUF file taken apart into its pieces, so that tests can break one field and write it back.
// Reads only well-formed files (the fixtures); it is independent of the library's parser.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvchat::test {

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

template <typename T>
void append_le(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // the test hosts are little-endian, like the format
  out.append(bytes, sizeof(T));
}

inline std::string gguf_string(const std::string& text) {
  std::string out;
  append_le<std::uint64_t>(out, text.size());
  return out + text;
}

// A metadata entry as raw bytes: key, value type, value.
inline std::string gguf_kv_u32(const std::string& key, std::uint32_t value) {
  std::string out = gguf_string(key);
  append_le<std::uint32_t>(out, 4);  // uint32
  append_le<std::uint32_t>(out, value);
  return out;
}

struct GgufTensorInfo {
  std::string name;
  std::vector<std::uint64_t> dims;
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
};

struct GgufPieces {
  std::string magic_and_version;      // 8 bytes
  std::vector<std::string> metadata;  // each entry's raw bytes
  std::vector<GgufTensorInfo> tensors;
  std::string data;                             // the data section
  std::uint64_t alignment = 32;                 // used for the padding before the data section
  std::optional<std::uint64_t> tensor_count;    // overrides tensors.size()
  std::optional<std::uint64_t> metadata_count;  // overrides metadata.size()

  // Bytes of the header up to the end of the tensor infos.
  std::string header() const {
    std::string out = magic_and_version;
    append_le<std::uint64_t>(out, tensor_count.value_or(tensors.size()));
    append_le<std::uint64_t>(out, metadata_count.value_or(metadata.size()));
    for (const std::string& entry : metadata) out += entry;
    for (const GgufTensorInfo& tensor : tensors) {
      out += gguf_string(tensor.name);
      append_le<std::uint32_t>(out, static_cast<std::uint32_t>(tensor.dims.size()));
      for (std::uint64_t dim : tensor.dims) append_le<std::uint64_t>(out, dim);
      append_le<std::uint32_t>(out, tensor.type);
      append_le<std::uint64_t>(out, tensor.offset);
    }
    return out;
  }

  std::string bytes() const {
    std::string out = header();
    out.append((alignment - out.size() % alignment) % alignment, '\0');
    return out + data;
  }

  // Offset inside metadata[index] of its value type field (after the key).
  std::size_t value_type_offset(std::size_t index) const {
    std::uint64_t key_length = 0;
    std::memcpy(&key_length, metadata[index].data(), 8);
    return 8 + static_cast<std::size_t>(key_length);
  }

  std::size_t metadata_index(const std::string& key) const {
    for (std::size_t i = 0; i < metadata.size(); ++i)
      if (value_type_offset(i) == 8 + key.size() && metadata[i].compare(8, key.size(), key) == 0) return i;
    throw std::runtime_error("no metadata key " + key);
  }
};

// Splits a well-formed GGUF v3 file (without general.alignment) into its pieces.
inline GgufPieces split_gguf(const std::string& bytes) {
  std::size_t at = 0;
  auto u32 = [&] {
    std::uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return v;
  };
  auto u64 = [&] {
    std::uint64_t v;
    std::memcpy(&v, bytes.data() + at, 8);
    at += 8;
    return v;
  };
  auto skip_value = [&](std::uint32_t type, auto& self) -> void {
    static const std::size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      at += static_cast<std::size_t>(u64());
    } else if (type == 9) {
      const std::uint32_t element_type = u32();
      const std::uint64_t count = u64();
      for (std::uint64_t i = 0; i < count; ++i) self(element_type, self);
    } else {
      at += sizes[type];
    }
  };
  GgufPieces pieces;
  pieces.magic_and_version = bytes.substr(0, 8);
  at = 8;
  const std::uint64_t n_tensors = u64();
  const std::uint64_t n_metadata = u64();
  for (std::uint64_t i = 0; i < n_metadata; ++i) {
    const std::size_t begin = at;
    at += static_cast<std::size_t>(u64());  // key
    skip_value(u32(), skip_value);
    pieces.metadata.push_back(bytes.substr(begin, at - begin));
  }
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo tensor;
    const std::uint64_t name_length = u64();
    tensor.name = bytes.substr(at, static_cast<std::size_t>(name_length));
    at += static_cast<std::size_t>(name_length);
    const std::uint32_t n_dims = u32();
    for (std::uint32_t d = 0; d < n_dims; ++d) tensor.dims.push_back(u64());
    tensor.type = u32();
    tensor.offset = u64();
    pieces.tensors.push_back(tensor);
  }
  at += (pieces.alignment - at % pieces.alignment) % pieces.alignment;
  pieces.data = bytes.substr(std::min(at, bytes.size()));
  return pieces;
}

}  // namespace kvchat::test
