#pragma once
// GGUF model files (versions 2 and 3, little-endian), memory-mapped read-only. Opening validates the
// whole header before anything is used: a corrupt or hostile file gives a ModelError naming the file,
// the field and its byte offset, never a crash, a hang or a huge allocation. No torch.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/gguf_types.h"
#include "engine/gguf/mapped_file.h"

namespace kvchat {

// Metadata value types, ids as stored in the file.
enum class GgufValueType : std::uint32_t {
  UInt8 = 0,
  Int8 = 1,
  UInt16 = 2,
  Int16 = 3,
  UInt32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  UInt64 = 10,
  Int64 = 11,
  Float64 = 12,
};

const char* to_string(GgufValueType type);

// One metadata key. The value stays in the mapped file; GgufFile's typed getters decode it.
struct GgufMetadataEntry {
  std::string_view key;  // views the mapping
  GgufValueType type = GgufValueType::UInt8;
  GgufValueType element_type = GgufValueType::UInt8;  // arrays only
  std::uint64_t array_length = 0;                     // arrays only
  std::uint64_t value_offset = 0;                     // file offset of the value (arrays: of element 0)
};

struct GgufTensor {
  std::string name;
  GgufType type = GgufType::F32;
  std::vector<std::int64_t> ne;  // 1 to 4 dims, ne[0] = row length (a numpy shape reversed)
  std::int64_t n_elements = 0;
  std::uint64_t n_bytes = 0;
  std::uint64_t offset = 0;            // inside the data section
  const std::uint8_t* data = nullptr;  // in the mapping: valid while its GgufFile lives

  std::int64_t row_length() const { return ne[0]; }
  std::int64_t n_rows() const { return n_elements / ne[0]; }
  std::uint64_t row_bytes() const { return n_bytes / static_cast<std::uint64_t>(n_rows()); }
};

class GgufFile {
 public:
  // Opens, maps and validates a regular file. Throws ModelError.
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t file_size() const { return file_size_; }
  const FileIdentity& identity() const { return identity_; }  // the file as it was mapped
  std::uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section

  // Metadata in file order; lookups by key.
  const std::vector<GgufMetadataEntry>& metadata() const { return metadata_; }
  const GgufMetadataEntry* find_metadata(std::string_view key) const;
  bool has_metadata(std::string_view key) const { return find_metadata(key) != nullptr; }

  // Typed getters throw ModelError naming the key when it is missing or of another type.
  // Integers widen from any integer type whose value fits; get_float reads f32 (f64 is rounded).
  std::string_view get_string(std::string_view key) const;
  std::uint32_t get_uint32(std::string_view key) const;
  std::int64_t get_int64(std::string_view key) const;
  float get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::uint64_t get_array_length(std::string_view key) const;
  std::vector<std::string_view> get_string_array(std::string_view key) const;  // views the mapping
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<std::int64_t> get_int_array(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

  // For a tensor the caller has copied out and will not read through the mapping again (Q/K rows put
  // back in Hugging Face's order): the pages wholly inside it leave this process's resident memory, so
  // the copy does not count twice. Advice only: a page read again comes back from the file.
  void release(const GgufTensor& tensor) const;

 private:
  const GgufMetadataEntry& entry_of(std::string_view key, GgufValueType type) const;
  const GgufMetadataEntry& array_of(std::string_view key) const;
  [[noreturn]] void fail_key(std::string_view key, const std::string& problem) const;

  std::string path_;
  std::unique_ptr<FileMapping> mapping_;
  const std::uint8_t* bytes_ = nullptr;
  std::uint64_t file_size_ = 0;
  FileIdentity identity_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<GgufMetadataEntry> metadata_;
  std::map<std::string_view, std::size_t> metadata_index_;  // keys view the mapping
  std::vector<GgufTensor> tensors_;
  std::map<std::string_view, std::size_t> tensor_index_;  // names view the mapping
};

}  // namespace kvchat
