#pragma once
// Safetensors checkpoints: one file, or shards listed by model.safetensors.index.json.
// Files are memory-mapped; every header is validated before any tensor is touched.
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/mapped_file.h"
#include "engine/model/safetensors_header.h"  // SafetensorsEntry, the validation

namespace kvchat {

// One mapped .safetensors file. The mapping lives as long as any tensor viewing it.
class SafetensorsFile {
 public:
  // Maps and validates (parse_safetensors_header). Throws ModelError naming the file (and the tensor).
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const FileIdentity& identity() const { return identity_; }  // the file as it was mapped
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // A tensor of the file's dtype viewing the mapping (no copy) when aligned, else a copy.
  at::Tensor tensor(const std::string& name) const;

 private:
  std::string path_;
  FileIdentity identity_;
  std::shared_ptr<FileMapping> mapping_;
  const std::uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, SafetensorsEntry> entries_;
};

// All tensors of a checkpoint directory: model.safetensors, or the shards named by
// model.safetensors.index.json (each tensor must be in the shard the index names).
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& directory);
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;
  at::Tensor tensor(const std::string& name) const;
  std::vector<std::string> names() const;
  std::vector<FileIdentity> identities() const;  // of every mapped file

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

}  // namespace kvchat
