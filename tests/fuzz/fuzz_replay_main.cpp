// The fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput once on every file of the folders
// (or files) given, so that the inputs that once crashed a target are replayed by ctest in every
// build. An input that crashes fails the test by crashing it; an empty folder fails it too (a
// regression folder that lost its files must not pass quietly).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      for (const auto& entry : fs::directory_iterator(argv[i]))
        if (entry.is_regular_file()) inputs.push_back(entry.path());
    } else {
      inputs.emplace_back(argv[i]);
    }
  }
  if (inputs.empty()) {
    spdlog::error("no inputs to replay");
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      spdlog::error("cannot read {}", input.string());
      return 1;
    }
    spdlog::info("replaying {} ({} bytes)", input.string(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  spdlog::info("{} inputs replayed", inputs.size());
  return 0;
}
