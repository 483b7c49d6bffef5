#pragma once
// What the fuzz targets share: cutting one input into the several files a format needs, and a scratch
// folder for the entry points that read real files (they refuse anything but a regular file, and the
// GGUF reader memory-maps it, so the bytes must be on disk).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvchat::fuzz {

// Parts are separated by a NUL byte: JSON and template text never hold one, so a real file is a seed
// as it is, and the mutator cuts or joins parts by inserting or deleting a single byte.
constexpr char kPartSeparator = '\0';

// At most `max_parts` parts; the last one keeps any further separators.
inline std::vector<std::string> split_parts(const std::uint8_t* data, std::size_t size, std::size_t max_parts) {
  std::vector<std::string> parts;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (parts.size() + 1 < max_parts) {
    const std::size_t cut = rest.find(kPartSeparator);
    if (cut == std::string_view::npos) break;
    parts.emplace_back(rest.substr(0, cut));
    rest.remove_prefix(cut + 1);
  }
  parts.emplace_back(rest);
  return parts;
}

// A folder of its own per process (libFuzzer's -jobs/-fork run several), removed at exit.
class ScratchFolder {
 public:
  ScratchFolder() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvchat-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a scratch folder in " + pattern);
    path_ = pattern;
  }
  ~ScratchFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;

  const std::string& path() const { return path_; }

  // Writes `bytes` to path()/name (replacing it) and returns the file's path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string file = path_ + "/" + name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + file);
    return file;
  }
  void remove(const std::string& name) const {
    std::error_code ignored;
    std::filesystem::remove(path_ + "/" + name, ignored);
  }

 private:
  std::string path_;
};

inline const ScratchFolder& scratch() {
  static const ScratchFolder folder;
  return folder;
}

}  // namespace kvchat::fuzz
