#pragma once
// Shared helpers of the tokenizer tests: fixture loading, cached tokenizers, readable id lists.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_fixture.h"
#include "common/test_paths.h"
#include "engine/text/tokenizer.h"

namespace kvchat::test {

// Loading the 128k-token Llama 3 file takes a moment: each test binary loads each folder once.
inline const Tokenizer& cached_tokenizer(const std::string& directory) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[directory];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::from_directory(directory));
  return *slot;
}

inline std::string tokenizer_fixture_dir(const std::string& model) {
  return shared_path("fixtures/tokenizers/" + model);
}

inline std::string ids_to_string(const std::vector<TokenId>& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

inline std::vector<TokenId> json_ids(const nlohmann::json& ids) { return ids.get<std::vector<TokenId>>(); }

// Makes control characters and non-ASCII bytes visible in failure messages.
inline std::string escaped(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvchat::test
