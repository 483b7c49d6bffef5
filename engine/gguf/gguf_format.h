#pragma once
// Byte-level pieces of the GGUF format shared by the header parser and GgufFile's getters
// (internal to kvchat_gguf).
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "engine/gguf/gguf_file.h"

namespace kvchat::gguf_format {

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "GGUF files are read in place: this code assumes a little-endian host"
#endif

constexpr std::uint32_t kDefaultAlignment = 32;
constexpr const char* kAlignmentKey = "general.alignment";

// A little-endian value at an arbitrary (possibly unaligned) address of the mapping.
template <typename T>
T load(const std::uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

// Bytes of one scalar value in the file; 0 for strings and arrays, whose size depends on their content.
std::uint64_t fixed_value_size(GgufValueType type);
bool is_known_value_type(std::uint32_t id);
bool is_integer_type(GgufValueType type);

// An integer value of any stored width, with the sign kept apart so every value of every type fits.
struct IntegerValue {
  bool negative = false;
  std::uint64_t magnitude = 0;
  std::string to_string() const { return (negative ? "-" : "") + std::to_string(magnitude); }
};
// The integer scalar of `type` at `at`; nullopt when `type` is not an integer type.
std::optional<IntegerValue> read_integer(const std::uint8_t* at, GgufValueType type);

// Everything the header says, validated; GgufFile keeps it.
struct Header {
  std::uint32_t version = 0;
  std::uint64_t alignment = kDefaultAlignment;
  std::uint64_t data_offset = 0;
  std::vector<GgufMetadataEntry> metadata;
  std::map<std::string_view, std::size_t> metadata_index;
  std::vector<GgufTensor> tensors;
  std::map<std::string_view, std::size_t> tensor_index;
};

// Parses and validates the header of the mapped file `bytes` (`size` bytes). Tensor descriptors point
// into `bytes`. Throws ModelError naming `path`, the field and its byte offset.
Header parse_header(const std::string& path, const std::uint8_t* bytes, std::uint64_t size);

}  // namespace kvchat::gguf_format
