#pragma once
// The {"String": "..."} / {"Regex": "..."} pattern object that tokenizer.json uses in Split
// pre-tokenizers and Replace normalizers/decoders.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/text/tokenizer/tokenizer_regex.h"

namespace kvchat::tokenization {

class Pattern {
 public:
  // `where` names the field in error messages ("pre_tokenizer.pattern in tokenizer.json").
  Pattern(const nlohmann::json& pattern, const std::string& where);
  // Non-overlapping matches [begin, end), left to right.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;
  std::string replace_all(std::string_view text, std::string_view replacement) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

}  // namespace kvchat::tokenization
