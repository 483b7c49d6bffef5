#include "engine/safetensors.h"
#include "engine/text/regular_file.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/gguf/mapped_file.h"
#include "engine/model_config.h"  // ModelError

namespace kvchat {

namespace {

using nlohmann::json;

// Safetensors' format allows a header up to 100 MB; anything bigger is a corrupt length field.
constexpr std::uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;
// Real tensors have a handful of dimensions; more only serves to make error messages and loops huge.
constexpr std::size_t kMaxDimensions = 8;

at::ScalarType scalar_type_of(const std::string& dtype, const std::string& context) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  throw ModelError(context + ": unsupported dtype '" + dtype + "' (supported: F32, BF16, F16)");
}

}  // namespace

std::size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

struct SafetensorsFile::Mapping {
  void* address = MAP_FAILED;
  std::size_t length = 0;
  ~Mapping() {
    if (address == MAP_FAILED) return;
    unregister_mapping(address);
    munmap(address, length);
  }
};

namespace {

// One header entry, every field checked against the data section of `data_size` bytes.
SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& value,
                             std::uint64_t data_size) {
  const std::string context = path + ": tensor '" + name + "'";
  if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets"))
    throw ModelError(context + ": entry needs dtype, shape and data_offsets");
  SafetensorsEntry entry;
  entry.name = name;
  if (!value["dtype"].is_string()) throw ModelError(context + ": dtype must be a string");
  entry.dtype = value["dtype"].get<std::string>();
  std::size_t element_size = safetensors_dtype_size(entry.dtype);
  if (element_size == 0) throw ModelError(context + ": unknown dtype '" + entry.dtype + "'");
  if (!value["shape"].is_array()) throw ModelError(context + ": shape must be an array");
  if (value["shape"].size() > kMaxDimensions)
    throw ModelError(context + ": shape has " + std::to_string(value["shape"].size()) + " dimensions (at most " +
                     std::to_string(kMaxDimensions) + ")");
  std::uint64_t elements = 1, byte_size = element_size;  // a shape of [] is one element
  for (const json& dim : value["shape"]) {
    if (!dim.is_number_integer() || dim.get<std::int64_t>() < 0)
      throw ModelError(context + ": shape must hold non-negative integers");
    entry.shape.push_back(dim.get<std::int64_t>());
    // A product that wraps could match a small byte range by accident: [2^62, 2^62] would be 0 bytes.
    if (__builtin_mul_overflow(elements, static_cast<std::uint64_t>(entry.shape.back()), &elements) ||
        __builtin_mul_overflow(elements, static_cast<std::uint64_t>(element_size), &byte_size))
      throw ModelError(context + ": shape has more elements than a file can hold");
  }
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
    throw ModelError(context + ": data_offsets must be two non-negative integers");
  entry.begin = offsets[0].get<std::uint64_t>();
  entry.end = offsets[1].get<std::uint64_t>();
  if (entry.begin > entry.end) throw ModelError(context + ": data_offsets begin after they end");
  if (entry.end > data_size)
    throw ModelError(context + ": data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                     ") lie outside the data section (" + std::to_string(data_size) +
                     " bytes); the file is truncated or corrupt");
  if (byte_size != entry.end - entry.begin)
    throw ModelError(context + ": shape x dtype size is " + std::to_string(byte_size) +
                     " bytes but data_offsets span " + std::to_string(entry.end - entry.begin) + " bytes");
  return entry;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = open_model_file(path);
  if (fd < 0)
    throw ModelError("cannot open " + path + ": " + (errno == ENOENT ? "file not found" : std::strerror(errno)));
  if (!is_regular_file_descriptor(fd)) {
    ::close(fd);
    throw ModelError("cannot open " + path + ": not a regular file");
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    int saved = errno;
    ::close(fd);
    throw ModelError("cannot stat " + path + ": " + std::strerror(saved));
  }
  const std::uint64_t file_size = static_cast<std::uint64_t>(info.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw ModelError(path + ": truncated safetensors file (" + std::to_string(file_size) + " bytes, no header)");
  }
  mapping_ = std::make_shared<Mapping>();
  mapping_->length = file_size;
  mapping_->address = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int saved = errno;
  ::close(fd);
  if (mapping_->address == MAP_FAILED) throw ModelError("cannot map " + path + ": " + std::strerror(saved));
  register_mapping(mapping_->address, mapping_->length, path);
  identity_ = FileIdentity::of(path, info);
  const auto* bytes = static_cast<const std::uint8_t*>(mapping_->address);

  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | bytes[i];  // little-endian u64
  if (header_length > kMaxHeaderBytes || header_length > file_size - 8)
    throw ModelError(path + ": header length " + std::to_string(header_length) + " runs past the end of the file (" +
                     std::to_string(file_size) + " bytes); the file is truncated or corrupt");
  data_ = bytes + 8 + header_length;
  const std::uint64_t data_size = file_size - 8 - header_length;

  json header;
  // JSON objects keep the last of two equal keys; a tensor listed twice must be an error, not a silent
  // choice, so the top-level keys are checked as they are parsed.
  std::set<std::string> tensor_names;
  std::string duplicate;
  auto note_key = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !tensor_names.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(data_), note_key);
    if (!duplicate.empty()) throw ModelError(path + ": tensor '" + duplicate + "' is listed twice in the header");
  } catch (const json::parse_error& error) {
    throw ModelError(path + ": header is not valid JSON: " + error.what());
  }
  if (!header.is_object()) throw ModelError(path + ": header is not a JSON object");

  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    entries_.emplace(name, parse_entry(path, name, value, data_size));
  }

  std::vector<const SafetensorsEntry*> by_offset;
  for (auto& [name, entry] : entries_) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  const SafetensorsEntry* furthest = nullptr;  // the entry reaching furthest into the data so far
  for (const SafetensorsEntry* entry : by_offset) {
    if (entry->begin == entry->end) continue;  // empty tensors occupy no bytes
    if (furthest && entry->begin < furthest->end)
      throw ModelError(path + ": tensors '" + furthest->name + "' and '" + entry->name + "' overlap in the data section");
    if (!furthest || entry->end > furthest->end) furthest = entry;
  }
  spdlog::debug("safetensors {}: {} tensors, {} data bytes", path, entries_.size(), data_size);
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw ModelError(path_ + ": tensor '" + name + "' not found");
  const SafetensorsEntry& entry = it->second;
  at::ScalarType type = scalar_type_of(entry.dtype, path_ + ": tensor '" + name + "'");
  void* address = const_cast<std::uint8_t*>(data_ + entry.begin);
  const std::size_t element_size = safetensors_dtype_size(entry.dtype);
  auto options = at::TensorOptions().dtype(type);
  if (reinterpret_cast<std::uintptr_t>(address) % element_size != 0) {
    // Misaligned data cannot be viewed as typed elements: copy it out.
    at::Tensor copy = at::empty(entry.shape, options);
    std::memcpy(copy.data_ptr(), address, entry.end - entry.begin);
    return copy;
  }
  // Zero-copy: the tensor keeps the mapping alive through its deleter.
  auto keep_alive = new std::shared_ptr<Mapping>(mapping_);
  return at::from_blob(address, entry.shape, [keep_alive](void*) { delete keep_alive; }, options);
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& directory) {
  namespace fs = std::filesystem;
  fs::path index_path = fs::path(directory) / "model.safetensors.index.json";
  fs::path single_path = fs::path(directory) / "model.safetensors";
  if (fs::exists(index_path)) {
    std::string text, why;
    if (!read_regular_file(index_path.string(), text, why)) throw ModelError("cannot open " + index_path.string() + ": " + why);
    json index;
    try {
      index = json::parse(text);
    } catch (const json::parse_error& error) {
      throw ModelError(index_path.string() + ": invalid JSON: " + error.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw ModelError(index_path.string() + ": missing 'weight_map' object");
    std::map<std::string, const SafetensorsFile*> opened;
    for (auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) throw ModelError(index_path.string() + ": weight_map entry '" + name + "' is not a file name");
      std::string file_name = file.get<std::string>();
      if (file_name.find('/') != std::string::npos || file_name == "..")
        throw ModelError(index_path.string() + ": weight_map names a file outside the directory: " + file_name);
      auto it = opened.find(file_name);
      if (it == opened.end()) {
        files_.push_back(std::make_unique<SafetensorsFile>((fs::path(directory) / file_name).string()));
        it = opened.emplace(file_name, files_.back().get()).first;
      }
      if (!it->second->contains(name))
        throw ModelError(it->second->path() + ": tensor '" + name + "' is listed in " + index_path.filename().string() +
                         " but missing from the file");
      where_[name] = it->second;
    }
  } else if (fs::exists(single_path)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single_path.string()));
    for (auto& [name, entry] : files_.back()->entries()) where_[name] = files_.back().get();
  } else {
    throw ModelError("no weights in " + directory + ": neither model.safetensors nor model.safetensors.index.json found");
  }
}

const SafetensorsEntry& SafetensorsCheckpoint::entry(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw ModelError("tensor '" + name + "' not found in the checkpoint");
  return it->second->entries().at(name);
}

const std::string& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw ModelError("tensor '" + name + "' not found in the checkpoint");
  return it->second->path();
}

at::Tensor SafetensorsCheckpoint::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw ModelError("tensor '" + name + "' not found in the checkpoint");
  return it->second->tensor(name);
}

std::vector<FileIdentity> SafetensorsCheckpoint::identities() const {
  std::vector<FileIdentity> out;
  for (const auto& file : files_) out.push_back(file->identity());
  return out;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (auto& [name, file] : where_) out.push_back(name);
  return out;
}

}  // namespace kvchat
