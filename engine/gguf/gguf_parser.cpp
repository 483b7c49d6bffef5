// Validating parser of the GGUF header: magic, version, counts, metadata, tensor infos, data layout.
//
// Layout (all integers little-endian):
//   "GGUF" | u32 version | u64 tensor count | u64 metadata count
//   metadata: { string key | u32 value type | value }*
//   tensor infos: { string name | u32 n_dims | u64 ne[n_dims] | u32 tensor type | u64 data offset }*
//   padding to the alignment | data section (each tensor at its offset, aligned)
// A string is u64 length + bytes (no terminator); an array is u32 element type + u64 count + elements.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>

#include "engine/gguf/gguf_format.h"
#include "engine/model/model_config.h"  // ModelError

namespace kvchat::gguf_format {

namespace {

// Smallest possible entries: an empty key, its type and a one-byte value; an empty name, one
// dimension, the type and the offset. A count that cannot fit in the rest of the file is rejected
// before anything is allocated.
constexpr std::uint64_t kMinMetadataBytes = 8 + 4 + 1;
constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr std::uint64_t kMinArrayBytes = 4 + 8;
// Far above any real model (a few dozen keys, a few thousand tensors), so that even a large hostile
// file made of tiny entries cannot make the parser allocate gigabytes.
constexpr std::uint64_t kMaxMetadataCount = 1u << 20;
constexpr std::uint64_t kMaxTensorCount = 1u << 20;
// Arrays may hold arrays; the depth is bounded so that walking them cannot exhaust the stack.
constexpr int kMaxArrayDepth = 8;
constexpr std::uint32_t kMaxDims = 4;

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& product) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  product = a * b;
  return true;
}

bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& sum) {
  if (b > std::numeric_limits<std::uint64_t>::max() - a) return false;
  sum = a + b;
  return true;
}

std::string shape_string(const std::vector<std::int64_t>& ne) {
  std::string text = "[";
  for (std::size_t i = 0; i < ne.size(); ++i) text += (i ? ", " : "") + std::to_string(ne[i]);
  return text + "]";
}

// A bounds-checked cursor over the mapped file. Errors name the file, what is being read (the
// context: "header", "metadata 'key'", "tensor 'name'") and the byte offset.
class Cursor {
 public:
  Cursor(const std::string& path, const std::uint8_t* bytes, std::uint64_t size)
      : path_(path), bytes_(bytes), size_(size) {}

  std::uint64_t offset() const { return offset_; }
  std::uint64_t remaining() const { return size_ - offset_; }
  std::uint64_t size() const { return size_; }
  void set_context(std::string context) { context_ = std::move(context); }

  [[noreturn]] void fail_at(std::uint64_t offset, const std::string& problem) const {
    throw ModelError(path_ + ": " + context_ + " at offset " + std::to_string(offset) + ": " + problem);
  }
  [[noreturn]] void fail(const std::string& problem) const { fail_at(offset_, problem); }
  [[noreturn]] void fail_past_end(const std::string& what, std::uint64_t n) const {
    fail(what + " (" + std::to_string(n) + " bytes) runs past the end of the file (" + std::to_string(size_) +
         " bytes)");
  }

  // `what` names the field in the message; it is a literal so that the hot path builds no strings.
  const std::uint8_t* take(std::uint64_t n, const char* what) {
    if (n > remaining()) fail_past_end(what, n);
    const std::uint8_t* at = bytes_ + offset_;
    offset_ += n;
    return at;
  }
  std::uint32_t u32(const char* what) { return load<std::uint32_t>(take(4, what)); }
  std::uint64_t u64(const char* what) { return load<std::uint64_t>(take(8, what)); }
  std::string_view string(const char* what) {
    if (remaining() < 8) fail_past_end(std::string(what) + " length", 8);
    const auto length = load<std::uint64_t>(bytes_ + offset_);
    offset_ += 8;
    if (length > remaining())
      fail(std::string(what) + " of " + std::to_string(length) + " bytes runs past the end of the file (" +
           std::to_string(size_) + " bytes)");
    return {reinterpret_cast<const char*>(take(length, what)), static_cast<std::size_t>(length)};
  }

 private:
  const std::string& path_;
  const std::uint8_t* bytes_;
  std::uint64_t size_;
  std::uint64_t offset_ = 0;
  std::string context_ = "header";
};

GgufValueType read_value_type(Cursor& cursor, const char* what) {
  const std::uint64_t at = cursor.offset();
  const std::uint32_t id = cursor.u32(what);
  if (!is_known_value_type(id)) cursor.fail_at(at, std::string("unknown ") + what + " " + std::to_string(id));
  return static_cast<GgufValueType>(id);
}

void skip_value(Cursor& cursor, GgufValueType type, int depth);

// Element type and count of an array at the cursor; the cursor is left on element 0.
std::pair<GgufValueType, std::uint64_t> read_array_header(Cursor& cursor, int depth) {
  if (depth > kMaxArrayDepth) cursor.fail("arrays nested more than " + std::to_string(kMaxArrayDepth) + " deep");
  const GgufValueType element_type = read_value_type(cursor, "array element type");
  const std::uint64_t at = cursor.offset();
  const std::uint64_t count = cursor.u64("array length");
  // Each element takes at least this many bytes: checked before walking or allocating anything.
  std::uint64_t min_element_bytes = fixed_value_size(element_type);
  if (element_type == GgufValueType::String) min_element_bytes = 8;
  if (element_type == GgufValueType::Array) min_element_bytes = kMinArrayBytes;
  std::uint64_t min_bytes = 0;
  if (!checked_mul(count, min_element_bytes, min_bytes) || min_bytes > cursor.remaining())
    cursor.fail_at(at, "array length " + std::to_string(count) + " of " + to_string(element_type) +
                           " cannot fit in the remaining " + std::to_string(cursor.remaining()) + " bytes");
  return {element_type, count};
}

void skip_array_elements(Cursor& cursor, GgufValueType element_type, std::uint64_t count, int depth) {
  if (const std::uint64_t size = fixed_value_size(element_type); size != 0) {
    cursor.take(size * count, "array data");  // the product was checked against the file size
    return;
  }
  for (std::uint64_t i = 0; i < count; ++i) skip_value(cursor, element_type, depth + 1);
}

// Checks one value of `type` at the cursor and moves past it.
void skip_value(Cursor& cursor, GgufValueType type, int depth) {
  if (type == GgufValueType::String) {
    cursor.string("string value");
  } else if (type == GgufValueType::Array) {
    const auto [element_type, count] = read_array_header(cursor, depth);
    skip_array_elements(cursor, element_type, count, depth);
  } else {
    cursor.take(fixed_value_size(type), "value");
  }
}

void read_counts(Cursor& cursor, std::uint64_t& tensor_count, std::uint64_t& metadata_count) {
  const std::uint64_t tensor_count_at = cursor.offset();
  tensor_count = cursor.u64("tensor count");
  const std::uint64_t metadata_count_at = cursor.offset();
  metadata_count = cursor.u64("metadata count");
  const std::uint64_t remaining = cursor.remaining();
  if (tensor_count > kMaxTensorCount || tensor_count > remaining / kMinTensorInfoBytes)
    cursor.fail_at(tensor_count_at, "tensor count " + std::to_string(tensor_count) + " cannot fit in the remaining " +
                                        std::to_string(remaining) + " bytes (limit " + std::to_string(kMaxTensorCount) +
                                        ")");
  if (metadata_count > kMaxMetadataCount || metadata_count > remaining / kMinMetadataBytes)
    cursor.fail_at(metadata_count_at, "metadata count " + std::to_string(metadata_count) +
                                          " cannot fit in the remaining " + std::to_string(remaining) +
                                          " bytes (limit " + std::to_string(kMaxMetadataCount) + ")");
  if (tensor_count * kMinTensorInfoBytes + metadata_count * kMinMetadataBytes > remaining)
    cursor.fail_at(tensor_count_at, std::to_string(tensor_count) + " tensors and " + std::to_string(metadata_count) +
                                        " metadata entries cannot fit in the remaining " + std::to_string(remaining) +
                                        " bytes");
}

void read_magic_and_version(Cursor& cursor, Header& header) {
  const std::uint8_t* magic = cursor.take(4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
    cursor.fail_at(0, std::string("not a GGUF file: magic is ") + hex + ", expected 47 47 55 46 (\"GGUF\")");
  }
  const std::uint32_t version = cursor.u32("version");
  if (version == 1) cursor.fail_at(4, "GGUF version 1 is not supported (only versions 2 and 3)");
  if (version == 0x02000000u || version == 0x03000000u) cursor.fail_at(4, "big-endian GGUF files are not supported");
  if (version != 2 && version != 3)
    cursor.fail_at(4, "unsupported GGUF version " + std::to_string(version) + " (only versions 2 and 3)");
  header.version = version;
}

void read_metadata(Cursor& cursor, std::uint64_t count, Header& header) {
  for (std::uint64_t i = 0; i < count; ++i) {
    cursor.set_context("metadata entry " + std::to_string(i));
    const std::uint64_t key_at = cursor.offset();
    GgufMetadataEntry entry;
    entry.key = cursor.string("key");
    cursor.set_context("metadata '" + std::string(entry.key) + "'");
    if (header.metadata_index.count(entry.key)) cursor.fail_at(key_at, "duplicate metadata key");
    entry.type = read_value_type(cursor, "value type");
    if (entry.type == GgufValueType::Array) {
      const auto [element_type, length] = read_array_header(cursor, 1);
      entry.element_type = element_type;
      entry.array_length = length;
      entry.value_offset = cursor.offset();
      skip_array_elements(cursor, element_type, length, 1);
    } else {
      entry.value_offset = cursor.offset();
      skip_value(cursor, entry.type, 0);
    }
    header.metadata_index.emplace(entry.key, header.metadata.size());
    header.metadata.push_back(entry);
  }
}

void read_alignment(Cursor& cursor, const std::uint8_t* bytes, Header& header) {
  auto it = header.metadata_index.find(kAlignmentKey);
  if (it == header.metadata_index.end()) return;
  const GgufMetadataEntry& entry = header.metadata[it->second];
  cursor.set_context(std::string("metadata '") + kAlignmentKey + "'");
  const std::optional<IntegerValue> value = read_integer(bytes + entry.value_offset, entry.type);
  if (!value) cursor.fail_at(entry.value_offset, std::string("must be an integer, not ") + to_string(entry.type));
  const std::uint64_t alignment = value->magnitude;
  if (value->negative || alignment == 0 || (alignment & (alignment - 1)) != 0)
    cursor.fail_at(entry.value_offset, "alignment " + value->to_string() + " is not a power of two");
  header.alignment = alignment;
}

// Shape, element count and byte size of the tensor info at the cursor (after its name).
void read_tensor_shape(Cursor& cursor, GgufTensor& tensor) {
  const std::uint64_t dims_at = cursor.offset();
  const std::uint32_t n_dims = cursor.u32("dimension count");
  if (n_dims == 0 || n_dims > kMaxDims)
    cursor.fail_at(dims_at,
                   "has " + std::to_string(n_dims) + " dimensions (1 to " + std::to_string(kMaxDims) + " allowed)");
  std::uint64_t elements = 1;
  for (std::uint32_t i = 0; i < n_dims; ++i) {
    const std::uint64_t dim_at = cursor.offset();
    const std::uint64_t dim = cursor.u64("dimension");
    if (dim == 0) cursor.fail_at(dim_at, "dimension " + std::to_string(i) + " is 0");
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      cursor.fail_at(dim_at, "dimension " + std::to_string(i) + " is " + std::to_string(dim) + ", too large");
    tensor.ne.push_back(static_cast<std::int64_t>(dim));
    if (!checked_mul(elements, dim, elements) ||
        elements > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      cursor.fail_at(dims_at,
                     "element count overflows: dimensions " + shape_string(tensor.ne) + " multiply past 2^63 - 1");
  }
  tensor.n_elements = static_cast<std::int64_t>(elements);

  const std::uint64_t type_at = cursor.offset();
  const std::uint32_t type_id = cursor.u32("tensor type");
  const GgufTypeInfo* type = find_gguf_type(type_id);
  if (!type) cursor.fail_at(type_at, "unknown tensor type id " + std::to_string(type_id));
  tensor.type = type->type;
  if (tensor.ne[0] % type->block_size != 0)
    cursor.fail_at(type_at, "row length " + std::to_string(tensor.ne[0]) + " is not a multiple of the block size " +
                                std::to_string(type->block_size) + " of " + type->name);
  if (!checked_mul(elements / type->block_size, type->block_bytes, tensor.n_bytes))
    cursor.fail_at(type_at, "byte size of shape " + shape_string(tensor.ne) + " overflows");
}

// Reads every tensor info; `offset_fields` receives the file offset of each tensor's data offset field
// (the place errors about the tensor's data point at).
void read_tensor_infos(Cursor& cursor, const std::uint8_t* bytes, std::uint64_t count, Header& header,
                       std::vector<std::uint64_t>& offset_fields) {
  for (std::uint64_t i = 0; i < count; ++i) {
    cursor.set_context("tensor info " + std::to_string(i));
    const std::uint64_t name_at = cursor.offset();
    const std::string_view name = cursor.string("name");
    cursor.set_context("tensor '" + std::string(name) + "'");
    if (header.tensor_index.count(name)) cursor.fail_at(name_at, "duplicate tensor name");
    GgufTensor tensor;
    tensor.name = std::string(name);
    read_tensor_shape(cursor, tensor);
    offset_fields.push_back(cursor.offset());
    tensor.offset = cursor.u64("data offset");
    tensor.data = bytes;  // completed once the data section's start is known
    header.tensor_index.emplace(name, header.tensors.size());
    header.tensors.push_back(std::move(tensor));
  }
}

// Each tensor's data aligned, inside the file and overlapping no other tensor's.
void check_data_layout(Cursor& cursor, Header& header, const std::vector<std::uint64_t>& offset_fields) {
  const std::uint64_t size = cursor.size();
  cursor.set_context("data section");
  if (!header.tensors.empty() && header.data_offset > size)
    cursor.fail_at(cursor.offset(), "the data section would start at offset " + std::to_string(header.data_offset) +
                                        ", past the end of the file (" + std::to_string(size) + " bytes)");
  for (std::size_t i = 0; i < header.tensors.size(); ++i) {
    GgufTensor& tensor = header.tensors[i];
    cursor.set_context("tensor '" + tensor.name + "'");
    if (tensor.offset % header.alignment != 0)
      cursor.fail_at(offset_fields[i], "data offset " + std::to_string(tensor.offset) +
                                           " is not a multiple of the alignment " + std::to_string(header.alignment));
    std::uint64_t begin = 0;
    const bool begin_fits = checked_add(header.data_offset, tensor.offset, begin);
    if (!begin_fits || begin > size || tensor.n_bytes > size - begin)
      cursor.fail_at(offset_fields[i], "data offset " + std::to_string(tensor.offset) + " (file offset " +
                                           (begin_fits ? std::to_string(begin) : "beyond 2^64") + ") with " +
                                           std::to_string(tensor.n_bytes) + " bytes is past the end of the file (" +
                                           std::to_string(size) + " bytes)");
    tensor.data += begin;
  }
  std::vector<std::size_t> order(header.tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return header.tensors[a].offset < header.tensors[b].offset; });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const GgufTensor& before = header.tensors[order[k - 1]];
    const GgufTensor& after = header.tensors[order[k]];
    if (before.offset + before.n_bytes > after.offset) {
      cursor.set_context("tensor '" + after.name + "'");
      cursor.fail_at(offset_fields[order[k]], "data [" + std::to_string(after.offset) + ", " +
                                                  std::to_string(after.offset + after.n_bytes) + ") overlaps tensor '" +
                                                  before.name + "' [" + std::to_string(before.offset) + ", " +
                                                  std::to_string(before.offset + before.n_bytes) + ")");
    }
  }
}

}  // namespace

Header parse_header(const std::string& path, const std::uint8_t* bytes, std::uint64_t size) {
  Cursor cursor(path, bytes, size);
  Header header;
  read_magic_and_version(cursor, header);
  std::uint64_t tensor_count = 0;
  std::uint64_t metadata_count = 0;
  read_counts(cursor, tensor_count, metadata_count);

  read_metadata(cursor, metadata_count, header);
  read_alignment(cursor, bytes, header);
  std::vector<std::uint64_t> offset_fields;
  read_tensor_infos(cursor, bytes, tensor_count, header, offset_fields);

  // The data section starts at the first aligned offset after the tensor infos. A file without
  // tensors may end before that padding.
  const std::uint64_t header_end = cursor.offset();
  const std::uint64_t padding = (header.alignment - header_end % header.alignment) % header.alignment;
  if (!checked_add(header_end, padding, header.data_offset))
    cursor.fail("the data section's start overflows (alignment " + std::to_string(header.alignment) + ")");
  check_data_layout(cursor, header, offset_fields);
  return header;
}

}  // namespace kvchat::gguf_format
