#include "engine/text/tokenizer/tokenizer_pattern.h"

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_error.h"

namespace kvchat::tokenization {

Pattern::Pattern(const nlohmann::json& pattern, const std::string& where) {
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    literal_ = pattern["String"].get<std::string>();
    if (literal_.empty()) throw TokenizerError(where + ": empty String pattern");
  } else if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    regex_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>());
  } else {
    throw TokenizerError(where + ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
}

std::vector<std::pair<std::size_t, std::size_t>> Pattern::find_all(std::string_view text) const {
  if (regex_) return regex_->find_all(text);
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  for (std::size_t at = text.find(literal_); at != std::string_view::npos;
       at = text.find(literal_, at + literal_.size())) {
    matches.emplace_back(at, at + literal_.size());
  }
  return matches;
}

std::string Pattern::replace_all(std::string_view text, std::string_view replacement) const {
  std::string out;
  out.reserve(text.size());
  std::size_t copied = 0;
  for (auto [begin, end] : find_all(text)) {
    out.append(text.substr(copied, begin - copied));
    out.append(replacement);
    copied = end;
  }
  out.append(text.substr(copied));
  return out;
}

}  // namespace kvchat::tokenization
