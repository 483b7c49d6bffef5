#pragma once
// Where tests find ../shared (reference models, fixtures), the build folder (kvchat-cli) and the source tree (the
// fixtures the repository keeps, tests/fixtures).
// The environment wins over the compiled-in default so that a relocated checkout still works.
#include <cstdlib>
#include <string>

namespace kvchat::test {

inline std::string shared_dir() {
  if (const char* env = std::getenv("KVCHAT_SHARED_DIR"); env && *env) return env;
#ifdef KVCHAT_SHARED_DIR_DEFAULT
  return KVCHAT_SHARED_DIR_DEFAULT;
#else
  return "../shared";
#endif
}

inline std::string build_dir() {
  if (const char* env = std::getenv("KVCHAT_BUILD_DIR"); env && *env) return env;
#ifdef KVCHAT_BUILD_DIR_DEFAULT
  return KVCHAT_BUILD_DIR_DEFAULT;
#else
  return "build";
#endif
}

inline std::string source_dir() {
  if (const char* env = std::getenv("KVCHAT_SOURCE_DIR"); env && *env) return env;
#ifdef KVCHAT_SOURCE_DIR_DEFAULT
  return KVCHAT_SOURCE_DIR_DEFAULT;
#else
  return ".";
#endif
}

inline std::string shared_path(const std::string& relative) { return shared_dir() + "/" + relative; }

}  // namespace kvchat::test
