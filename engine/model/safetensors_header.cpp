#include "engine/model/safetensors_header.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/model/model_config.h"  // ModelError

namespace kvchat {

namespace {

using nlohmann::json;

// Safetensors' format allows a header up to 100 MB; anything bigger is a corrupt length field.
constexpr std::uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;
// Real tensors have a handful of dimensions; more only serves to make error messages and loops huge.
constexpr std::size_t kMaxDimensions = 8;

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
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
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

std::size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes = {
      {"F64", 8}, {"F32", 4},  {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},     {"I16", 2},    {"I8", 1},
      {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4},  {"U64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

SafetensorsHeader parse_safetensors_header(const std::uint8_t* bytes, std::uint64_t size, const std::string& path) {
  if (size < 8) throw ModelError(path + ": truncated safetensors file (" + std::to_string(size) + " bytes, no header)");
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | bytes[i];  // little-endian u64
  if (header_length > kMaxHeaderBytes || header_length > size - 8)
    throw ModelError(path + ": header length " + std::to_string(header_length) + " runs past the end of the file (" +
                     std::to_string(size) + " bytes); the file is truncated or corrupt");
  SafetensorsHeader result;
  result.data_offset = 8 + header_length;
  result.data_size = size - result.data_offset;
  const std::uint64_t data_size = result.data_size;
  const auto* data = bytes + result.data_offset;

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
    header = json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(data), note_key);
    if (!duplicate.empty()) throw ModelError(path + ": tensor '" + duplicate + "' is listed twice in the header");
  } catch (const json::exception& error) {  // parse_error, and out_of_range for a number like 1e400
    throw ModelError(path + ": header is not valid JSON: " + error.what());
  }
  if (!header.is_object()) throw ModelError(path + ": header is not a JSON object");

  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    result.entries.emplace(name, parse_entry(path, name, value, data_size));
  }

  std::vector<const SafetensorsEntry*> by_offset;
  for (auto& [name, entry] : result.entries) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  const SafetensorsEntry* furthest = nullptr;  // the entry reaching furthest into the data so far
  for (const SafetensorsEntry* entry : by_offset) {
    if (entry->begin == entry->end) continue;  // empty tensors occupy no bytes
    if (furthest && entry->begin < furthest->end)
      throw ModelError(path + ": tensors '" + furthest->name + "' and '" + entry->name +
                       "' overlap in the data section");
    if (!furthest || entry->end > furthest->end) furthest = entry;
  }
  return result;
}

std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& index_path) {
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& error) {  // parse_error, and out_of_range for a number like 1e400
    throw ModelError(index_path + ": invalid JSON: " + error.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw ModelError(index_path + ": missing 'weight_map' object");
  std::map<std::string, std::string> shard_of;
  for (auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) throw ModelError(index_path + ": weight_map entry '" + name + "' is not a file name");
    std::string file_name = file.get<std::string>();
    if (file_name.find('/') != std::string::npos || file_name == "..")
      throw ModelError(index_path + ": weight_map names a file outside the directory: " + file_name);
    shard_of.emplace(name, std::move(file_name));
  }
  return shard_of;
}

}  // namespace kvchat
