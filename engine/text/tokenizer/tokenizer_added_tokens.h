#pragma once
// tokenizer.json "added_tokens": tokens matched in the raw text before normalization
// (<|eot_id|>, <s>, ...). Matching is leftmost-longest over a byte trie, with the lstrip / rstrip /
// single_word options of each token.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/types.h"

namespace kvchat::tokenization {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

struct AddedTokenMatch {
  std::size_t begin, end;  // bytes of the text the token takes (including stripped white space)
  TokenId id;
};

class AddedTokens {
 public:
  AddedTokens() = default;
  AddedTokens(const nlohmann::json& added_tokens, const std::string& source);

  // Appends the matches inside [region_begin, region_end) of `text`, left to right. With
  // include_special false, only non-special added tokens are recognised.
  void find(std::string_view text, std::size_t region_begin, std::size_t region_end, bool include_special,
            std::vector<AddedTokenMatch>& out) const;

  const AddedToken* by_id(TokenId id) const;
  std::optional<TokenId> id_of(std::string_view content) const;
  const std::vector<AddedToken>& all() const { return tokens_; }

 private:
  struct Node {
    std::unordered_map<unsigned char, std::int32_t> children;
    std::int32_t token = -1;  // index into tokens_ of the token ending here
  };
  std::vector<AddedToken> tokens_;
  std::vector<Node> trie_;
  bool can_start_[256] = {};
  std::unordered_map<TokenId, std::size_t> index_by_id_;
  std::unordered_map<std::string, TokenId> id_by_content_;
};

}  // namespace kvchat::tokenization
