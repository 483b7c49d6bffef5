#include "engine/text/tokenizer/tokenizer_added_tokens.h"
#include "engine/text/tokenizer/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_error.h"

namespace kvchat::tokenization {

namespace {

bool is_space_byte(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// A byte that belongs to a word for single_word: ASCII letters, digits, '_' and any non-ASCII
// byte (letters of other scripts).
bool is_word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c >= 0x80;
}

}  // namespace

AddedTokens::AddedTokens(const nlohmann::json& added_tokens, const std::string& source) {
  trie_.emplace_back();
  if (added_tokens.is_null()) return;
  if (!added_tokens.is_array()) throw TokenizerError(source + ": 'added_tokens' is not an array");
  for (std::size_t i = 0; i < added_tokens.size(); ++i) {
    const auto& entry = added_tokens[i];
    std::string where = source + ": added_tokens[" + std::to_string(i) + "]";
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
        entry["id"].get<long long>() < 0 || entry["id"].get<long long>() > 0x7FFFFFFF || !entry.contains("content") ||
        !entry["content"].is_string()) {
      throw TokenizerError(where + " needs a non-negative integer 'id' and a string 'content'");
    }
    AddedToken token;
    token.id = entry["id"].get<TokenId>();
    token.content = entry["content"].get<std::string>();
    if (token.content.empty()) throw TokenizerError(where + " has empty content");
    token.special = optional_field(entry, "special", false, where);
    token.lstrip = optional_field(entry, "lstrip", false, where);
    token.rstrip = optional_field(entry, "rstrip", false, where);
    token.single_word = optional_field(entry, "single_word", false, where);
    token.normalized = optional_field(entry, "normalized", !token.special, where);
    if (index_by_id_.count(token.id)) throw TokenizerError(where + " repeats id " + std::to_string(token.id));
    index_by_id_[token.id] = tokens_.size();
    id_by_content_[token.content] = token.id;

    std::int32_t node = 0;
    for (unsigned char c : token.content) {
      auto it = trie_[node].children.find(c);
      if (it == trie_[node].children.end()) {
        trie_.emplace_back();
        std::int32_t child = static_cast<std::int32_t>(trie_.size() - 1);
        trie_[node].children[c] = child;
        node = child;
      } else {
        node = it->second;
      }
    }
    trie_[node].token = static_cast<std::int32_t>(tokens_.size());
    can_start_[static_cast<unsigned char>(token.content[0])] = true;
    tokens_.push_back(std::move(token));
  }
}

void AddedTokens::find(std::string_view text, std::size_t region_begin, std::size_t region_end, bool include_special,
                       std::vector<AddedTokenMatch>& out) const {
  if (tokens_.empty()) return;
  std::size_t previous_end = region_begin;
  std::size_t pos = region_begin;
  while (pos < region_end) {
    if (!can_start_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Walk the trie and keep the longest acceptable token starting here.
    const AddedToken* best = nullptr;
    std::size_t best_end = 0;
    std::int32_t node = 0;
    for (std::size_t i = pos; i < region_end; ++i) {
      auto it = trie_[node].children.find(static_cast<unsigned char>(text[i]));
      if (it == trie_[node].children.end()) break;
      node = it->second;
      if (trie_[node].token < 0) continue;
      const AddedToken& candidate = tokens_[static_cast<std::size_t>(trie_[node].token)];
      if (candidate.special && !include_special) continue;
      if (candidate.single_word) {
        bool word_before = pos > region_begin && is_word_byte(static_cast<unsigned char>(text[pos - 1]));
        bool word_after = i + 1 < region_end && is_word_byte(static_cast<unsigned char>(text[i + 1]));
        if (word_before || word_after) continue;
      }
      best = &candidate;
      best_end = i + 1;
    }
    if (!best) {
      ++pos;
      continue;
    }
    std::size_t begin = pos, end = best_end;
    if (best->lstrip) {
      while (begin > previous_end && is_space_byte(static_cast<unsigned char>(text[begin - 1]))) --begin;
    }
    if (best->rstrip) {
      while (end < region_end && is_space_byte(static_cast<unsigned char>(text[end]))) ++end;
    }
    out.push_back({begin, end, best->id});
    previous_end = end;
    pos = end;
  }
}

const AddedToken* AddedTokens::by_id(TokenId id) const {
  auto it = index_by_id_.find(id);
  return it == index_by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<TokenId> AddedTokens::id_of(std::string_view content) const {
  auto it = id_by_content_.find(std::string(content));
  if (it == id_by_content_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kvchat::tokenization
