#include "engine/gguf/gguf_file.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "engine/gguf/gguf_format.h"
#include "engine/gguf/mapped_file.h"
#include "engine/model/model_config.h"  // ModelError

namespace kvchat {

namespace gguf_format {

std::uint64_t fixed_value_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::UInt8:
    case GgufValueType::Int8:
    case GgufValueType::Bool: return 1;
    case GgufValueType::UInt16:
    case GgufValueType::Int16: return 2;
    case GgufValueType::UInt32:
    case GgufValueType::Int32:
    case GgufValueType::Float32: return 4;
    case GgufValueType::UInt64:
    case GgufValueType::Int64:
    case GgufValueType::Float64: return 8;
    case GgufValueType::String:
    case GgufValueType::Array: return 0;
  }
  return 0;
}

bool is_known_value_type(std::uint32_t id) { return id <= static_cast<std::uint32_t>(GgufValueType::Float64); }

bool is_integer_type(GgufValueType type) {
  switch (type) {
    case GgufValueType::UInt8:
    case GgufValueType::Int8:
    case GgufValueType::UInt16:
    case GgufValueType::Int16:
    case GgufValueType::UInt32:
    case GgufValueType::Int32:
    case GgufValueType::UInt64:
    case GgufValueType::Int64: return true;
    default: return false;
  }
}

std::optional<IntegerValue> read_integer(const std::uint8_t* at, GgufValueType type) {
  auto from_signed = [](std::int64_t v) {
    // The magnitude of the most negative value does not fit in int64: negate in unsigned arithmetic.
    return IntegerValue{v < 0, v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v)};
  };
  auto from_unsigned = [](std::uint64_t v) { return IntegerValue{false, v}; };
  switch (type) {
    case GgufValueType::UInt8: return from_unsigned(load<std::uint8_t>(at));
    case GgufValueType::Int8: return from_signed(load<std::int8_t>(at));
    case GgufValueType::UInt16: return from_unsigned(load<std::uint16_t>(at));
    case GgufValueType::Int16: return from_signed(load<std::int16_t>(at));
    case GgufValueType::UInt32: return from_unsigned(load<std::uint32_t>(at));
    case GgufValueType::Int32: return from_signed(load<std::int32_t>(at));
    case GgufValueType::UInt64: return from_unsigned(load<std::uint64_t>(at));
    case GgufValueType::Int64: return from_signed(load<std::int64_t>(at));
    default: return std::nullopt;
  }
}

}  // namespace gguf_format

using gguf_format::load;

const char* to_string(GgufValueType type) {
  switch (type) {
    case GgufValueType::UInt8: return "uint8";
    case GgufValueType::Int8: return "int8";
    case GgufValueType::UInt16: return "uint16";
    case GgufValueType::Int16: return "int16";
    case GgufValueType::UInt32: return "uint32";
    case GgufValueType::Int32: return "int32";
    case GgufValueType::Float32: return "float32";
    case GgufValueType::Bool: return "bool";
    case GgufValueType::String: return "string";
    case GgufValueType::Array: return "array";
    case GgufValueType::UInt64: return "uint64";
    case GgufValueType::Int64: return "int64";
    case GgufValueType::Float64: return "float64";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------------
// Opening and mapping

namespace {

struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void fail_errno(const std::string& what, const std::string& path, int error) {
  throw ModelError("cannot " + what + " " + path + ": " + (error == ENOENT ? "file not found" : std::strerror(error)));
}

void require_regular(const std::string& path, const struct stat& info) {
  if (!S_ISREG(info.st_mode))
    throw ModelError(path + ": is " + file_kind(info.st_mode) + ", not a regular file; a GGUF model must be a file");
}

}  // namespace

void GgufFile::release(const GgufTensor& tensor) const {
  // Only a tensor of this file: its data lies inside the mapping (checked when the header was parsed).
  const auto* data = tensor.data;
  if (data < bytes_ || data > bytes_ + file_size_ ||
      tensor.n_bytes > static_cast<std::uint64_t>(bytes_ + file_size_ - data))
    return;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(tensor.data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(tensor.data) + tensor.n_bytes) / page * page;
  // Read-only private pages that were never written: dropping them loses nothing.
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  // Checked before opening: opening a FIFO blocks, opening a device may have side effects.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) fail_errno("open", path, errno);
  require_regular(path, info);
  // O_NONBLOCK in case the path was replaced by a FIFO since the check; fstat then rejects it.
  FileDescriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) fail_errno("open", path, errno);
  if (fstat(file.fd, &info) != 0) fail_errno("stat", path, errno);
  require_regular(path, info);

  file_size_ = static_cast<std::uint64_t>(info.st_size);
  if (file_size_ == 0) throw ModelError(path + ": empty file (0 bytes), not a GGUF file");
  if (file_size_ > std::numeric_limits<std::size_t>::max()) throw ModelError(path + ": too large to map");
  mapping_ = FileMapping::map(file.fd, static_cast<std::size_t>(file_size_), path);
  if (!mapping_) fail_errno("map", path, errno);
  identity_ = FileIdentity::of(path, info);
  bytes_ = mapping_->bytes();

  gguf_format::Header header = gguf_format::parse_header(path_, bytes_, file_size_);
  version_ = header.version;
  alignment_ = header.alignment;
  data_offset_ = header.data_offset;
  metadata_ = std::move(header.metadata);
  metadata_index_ = std::move(header.metadata_index);
  tensors_ = std::move(header.tensors);
  tensor_index_ = std::move(header.tensor_index);
  spdlog::debug("{}: GGUF v{}, {} metadata entries, {} tensors, alignment {}, data at {}", path_, version_,
                metadata_.size(), tensors_.size(), alignment_, data_offset_);
}

GgufFile::~GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------------
// Metadata getters. Every value was walked and bounds-checked when the file was opened.

const GgufMetadataEntry* GgufFile::find_metadata(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second];
}

void GgufFile::fail_key(std::string_view key, const std::string& problem) const {
  throw ModelError(path_ + ": metadata '" + std::string(key) + "': " + problem);
}

const GgufMetadataEntry& GgufFile::entry_of(std::string_view key, GgufValueType type) const {
  const GgufMetadataEntry* entry = find_metadata(key);
  if (!entry) fail_key(key, "not found");
  if (entry->type != type) fail_key(key, std::string("is ") + to_string(entry->type) + ", not " + to_string(type));
  return *entry;
}

const GgufMetadataEntry& GgufFile::array_of(std::string_view key) const { return entry_of(key, GgufValueType::Array); }

std::string_view GgufFile::get_string(std::string_view key) const {
  const GgufMetadataEntry& entry = entry_of(key, GgufValueType::String);
  const auto length = load<std::uint64_t>(bytes_ + entry.value_offset);
  return {reinterpret_cast<const char*>(bytes_ + entry.value_offset + 8), static_cast<std::size_t>(length)};
}

std::uint32_t GgufFile::get_uint32(std::string_view key) const {
  const GgufMetadataEntry* entry = find_metadata(key);
  if (!entry) fail_key(key, "not found");
  const auto value = gguf_format::read_integer(bytes_ + entry->value_offset, entry->type);
  if (!value) fail_key(key, std::string("is ") + to_string(entry->type) + ", not an integer");
  if (value->negative || value->magnitude > std::numeric_limits<std::uint32_t>::max())
    fail_key(key, "value " + value->to_string() + " does not fit in uint32");
  return static_cast<std::uint32_t>(value->magnitude);
}

namespace {

// The int64 value of `value`, or nullopt when it does not fit.
std::optional<std::int64_t> to_int64(const gguf_format::IntegerValue& value) {
  constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (!value.negative) return value.magnitude <= max ? std::optional<std::int64_t>(value.magnitude) : std::nullopt;
  if (value.magnitude > max + 1) return std::nullopt;
  return value.magnitude == max + 1 ? std::numeric_limits<std::int64_t>::min()
                                    : -static_cast<std::int64_t>(value.magnitude);
}

}  // namespace

std::int64_t GgufFile::get_int64(std::string_view key) const {
  const GgufMetadataEntry* entry = find_metadata(key);
  if (!entry) fail_key(key, "not found");
  const auto value = gguf_format::read_integer(bytes_ + entry->value_offset, entry->type);
  if (!value) fail_key(key, std::string("is ") + to_string(entry->type) + ", not an integer");
  const auto result = to_int64(*value);
  if (!result) fail_key(key, "value " + value->to_string() + " does not fit in int64");
  return *result;
}

float GgufFile::get_float(std::string_view key) const {
  const GgufMetadataEntry* entry = find_metadata(key);
  if (!entry) fail_key(key, "not found");
  if (entry->type == GgufValueType::Float32) return load<float>(bytes_ + entry->value_offset);
  if (entry->type == GgufValueType::Float64) return static_cast<float>(load<double>(bytes_ + entry->value_offset));
  fail_key(key, std::string("is ") + to_string(entry->type) + ", not a float");
}

bool GgufFile::get_bool(std::string_view key) const {
  // Written as 0 or 1; any other byte reads as true, as a C bool cast would.
  return bytes_[entry_of(key, GgufValueType::Bool).value_offset] != 0;
}

std::uint64_t GgufFile::get_array_length(std::string_view key) const { return array_of(key).array_length; }

std::vector<std::string_view> GgufFile::get_string_array(std::string_view key) const {
  const GgufMetadataEntry& entry = array_of(key);
  if (entry.element_type != GgufValueType::String)
    fail_key(key, std::string("is an array of ") + to_string(entry.element_type) + ", not of strings");
  std::vector<std::string_view> strings;
  strings.reserve(static_cast<std::size_t>(entry.array_length));
  std::uint64_t at = entry.value_offset;
  for (std::uint64_t i = 0; i < entry.array_length; ++i) {
    const auto length = load<std::uint64_t>(bytes_ + at);
    strings.emplace_back(reinterpret_cast<const char*>(bytes_ + at + 8), static_cast<std::size_t>(length));
    at += 8 + length;
  }
  return strings;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const GgufMetadataEntry& entry = array_of(key);
  const auto n = static_cast<std::size_t>(entry.array_length);
  std::vector<float> values(n);
  const std::uint8_t* at = bytes_ + entry.value_offset;
  if (entry.element_type == GgufValueType::Float32) {
    if (n != 0) std::memcpy(values.data(), at, n * sizeof(float));
  } else if (entry.element_type == GgufValueType::Float64) {
    for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(load<double>(at + 8 * i));
  } else {
    fail_key(key, std::string("is an array of ") + to_string(entry.element_type) + ", not of floats");
  }
  return values;
}

std::vector<std::int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufMetadataEntry& entry = array_of(key);
  if (!gguf_format::is_integer_type(entry.element_type))
    fail_key(key, std::string("is an array of ") + to_string(entry.element_type) + ", not of integers");
  const std::uint64_t element_size = gguf_format::fixed_value_size(entry.element_type);
  std::vector<std::int64_t> values(static_cast<std::size_t>(entry.array_length));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto value = *gguf_format::read_integer(bytes_ + entry.value_offset + i * element_size, entry.element_type);
    const auto result = to_int64(value);
    if (!result) fail_key(key, "element " + std::to_string(i) + " = " + value.to_string() + " does not fit in int64");
    values[i] = *result;
  }
  return values;
}

}  // namespace kvchat
