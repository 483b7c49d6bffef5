#pragma once
// Where tests find ../shared (reference models, fixtures), the build folder (kvchat-cli) and the source tree (the
// fixtures the repository keeps, tests/fixtures).
// The environment wins over the compiled-in default so that a relocated checkout still works.
#include <cstdlib>
#include <string>

namespace kvchat::test {

#ifndef KVCHAT_SHARED_DIR_DEFAULT
#define KVCHAT_SHARED_DIR_DEFAULT "../shared"
#endif
#ifndef KVCHAT_BUILD_DIR_DEFAULT
#define KVCHAT_BUILD_DIR_DEFAULT "build"
#endif
#ifndef KVCHAT_SOURCE_DIR_DEFAULT
#define KVCHAT_SOURCE_DIR_DEFAULT "."
#endif

// The environment variable when it is set and not empty, else the compiled-in default.
inline std::string environment_or(const char* variable, const char* fallback) {
  const char* value = std::getenv(variable);
  return value && *value ? value : fallback;
}

inline std::string shared_dir() { return environment_or("KVCHAT_SHARED_DIR", KVCHAT_SHARED_DIR_DEFAULT); }
inline std::string build_dir() { return environment_or("KVCHAT_BUILD_DIR", KVCHAT_BUILD_DIR_DEFAULT); }
inline std::string source_dir() { return environment_or("KVCHAT_SOURCE_DIR", KVCHAT_SOURCE_DIR_DEFAULT); }

inline std::string shared_path(const std::string& relative) { return shared_dir() + "/" + relative; }

}  // namespace kvchat::test
