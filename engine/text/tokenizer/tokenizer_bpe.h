#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocabulary, ranked merges,
// byte fallback (<0xNN> tokens), unknown-token fusing and ignore_merges.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/types.h"

namespace kvchat::tokenization {

class BpeModel {
 public:
  // `source` names the file in error messages. Throws TokenizerError for anything malformed.
  BpeModel(const nlohmann::json& model, const std::string& source);
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-token. Merging uses a heap over adjacent pairs, so a word of n
  // characters costs O(n log n) however long it is (a 100 KB run of one letter is one word).
  void tokenize(std::string_view word, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  // nullptr when the id has no vocabulary entry.
  const std::string* id_to_token(TokenId id) const;
  // One past the largest id of the vocabulary.
  TokenId id_limit() const { return static_cast<TokenId>(id_to_token_.size()); }
  std::size_t vocab_entries() const { return vocab_.size(); }
  std::size_t merge_count() const { return merges_.size(); }

 private:
  struct Merge {
    std::int32_t rank;
    TokenId merged;
  };
  static std::uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
           static_cast<std::uint32_t>(right);
  }
  const Merge* find_merge(TokenId left, TokenId right) const;
  // Splits the word into initial symbols (characters, byte-fallback bytes, unknowns).
  void initial_symbols(std::string_view word, std::vector<TokenId>& symbols) const;

  std::vector<std::string> id_to_token_;                      // owns the token strings
  std::vector<bool> present_;                                 // ids that have a vocabulary entry
  std::unordered_map<std::string_view, TokenId> vocab_;       // views into id_to_token_
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::optional<TokenId> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<TokenId> byte_tokens_;  // id of <0xNN> for each byte, -1 where absent
};

}  // namespace kvchat::tokenization
