#pragma once
// A writable copy of a reference model folder (../shared is read-only) for tests that change one of
// its files: config.json, tokenizer.json, tokenizer_config.json or the safetensors header and data.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/test_paths.h"

namespace kvchat::test {

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// Copies shared/models/<name> to `destination` (replacing it) with owner-writable files.
inline std::string copy_reference_model(const std::string& name, const std::string& destination) {
  namespace fs = std::filesystem;
  fs::remove_all(destination);
  fs::copy(shared_path("models/" + name), destination, fs::copy_options::recursive);
  for (const auto& entry : fs::recursive_directory_iterator(destination))
    fs::permissions(entry.path(), fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  fs::permissions(destination, fs::perms::owner_all, fs::perm_options::add);
  return destination;
}

// Key order kept (ordered_json): tokenizer.json's vocab order and a config's fields stay as written.
inline nlohmann::ordered_json read_json_file(const std::string& path) {
  return nlohmann::ordered_json::parse(read_file_bytes(path));
}

inline void write_json_file(const std::string& path, const nlohmann::ordered_json& value) {
  write_file_bytes(path, value.dump());
}

// A safetensors file split into its JSON header text (as stored, padding included) and its data bytes.
struct SafetensorsParts {
  std::string header;
  std::string data;
};

inline SafetensorsParts read_safetensors(const std::string& path) {
  const std::string bytes = read_file_bytes(path);
  std::uint64_t header_size = 0;
  if (bytes.size() < 8) throw std::runtime_error(path + " is too short");
  std::memcpy(&header_size, bytes.data(), 8);  // little-endian, as the test machines are
  if (header_size > bytes.size() - 8) throw std::runtime_error(path + ": bad header size");
  return {bytes.substr(8, header_size), bytes.substr(8 + header_size)};
}

inline void write_safetensors(const std::string& path, const SafetensorsParts& parts) {
  const std::uint64_t header_size = parts.header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &header_size, 8);
  write_file_bytes(path, bytes + parts.header + parts.data);
}

}  // namespace kvchat::test
