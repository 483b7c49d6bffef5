#include "engine/model/safetensors.h"
#include "engine/text/regular_file.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/gguf/mapped_file.h"
#include "engine/model/model_config.h"  // ModelError

namespace kvchat {

namespace {

at::ScalarType scalar_type_of(const std::string& dtype, const std::string& context) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  throw ModelError(context + ": unsupported dtype '" + dtype + "' (supported: F32, BF16, F16)");
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
  if (file_size == 0) {
    ::close(fd);
    throw ModelError(path + ": empty file (0 bytes), not a safetensors file");
  }
  if (file_size < 8) {
    ::close(fd);
    throw ModelError(path + ": truncated safetensors file (" + std::to_string(file_size) + " bytes, no header)");
  }
  mapping_ = FileMapping::map(fd, file_size, path);
  int saved = errno;
  ::close(fd);
  if (!mapping_) throw ModelError("cannot map " + path + ": " + std::strerror(saved));
  identity_ = FileIdentity::of(path, info);
  const std::uint8_t* bytes = mapping_->bytes();
  SafetensorsHeader header = parse_safetensors_header(bytes, file_size, path);
  data_ = bytes + header.data_offset;
  entries_ = std::move(header.entries);
  const std::uint64_t data_size = header.data_size;
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
  auto keep_alive = new std::shared_ptr<FileMapping>(mapping_);
  return at::from_blob(
      address, entry.shape, [keep_alive](void*) { delete keep_alive; }, options);
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& directory) {
  namespace fs = std::filesystem;
  fs::path index_path = fs::path(directory) / "model.safetensors.index.json";
  fs::path single_path = fs::path(directory) / "model.safetensors";
  if (fs::exists(index_path)) {
    std::string text, why;
    if (!read_regular_file(index_path.string(), text, why))
      throw ModelError("cannot open " + index_path.string() + ": " + why);
    std::map<std::string, const SafetensorsFile*> opened;
    for (auto& [name, file_name] : parse_safetensors_index(text, index_path.string())) {
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
    throw ModelError("no weights in " + directory +
                     ": neither model.safetensors nor model.safetensors.index.json found");
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
