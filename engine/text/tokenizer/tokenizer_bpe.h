#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocabulary, ranked merges,
// byte fallback (<0xNN> tokens), unknown-token fusing and ignore_merges.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/text/tokenizer/tokenizer_model.h"
#include "engine/types.h"

namespace kvchat::tokenization {

// The settings of tokenizer.json's BPE model other than vocabulary and merges.
struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel : public Model {
 public:
  // `source` names the file in error messages. Throws TokenizerError for anything malformed.
  BpeModel(const nlohmann::json& model, const std::string& source);
  // From plain arrays (a GGUF file): tokens[id] is the token of `id` (all distinct), merges[rank]
  // the pair merged with that rank. `merges_key` names the merge list in error messages.
  BpeModel(std::vector<std::string> tokens, const std::vector<std::pair<std::string_view, std::string_view>>& merges,
           const BpeOptions& options, const std::string& source, const std::string& merges_key);
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-token. Merging uses a heap over adjacent pairs, so a word of n
  // characters costs O(n log n) however long it is (a 100 KB run of one letter is one word).
  void tokenize(std::string_view word, std::vector<TokenId>& out) const override;

  std::optional<TokenId> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(TokenId id) const override;
  TokenId id_limit() const override { return static_cast<TokenId>(id_to_token_.size()); }
  std::string describe() const override;
  std::size_t vocab_entries() const { return vocab_.size(); }
  std::size_t merge_count() const { return merges_.size(); }

 private:
  struct Merge {
    std::int32_t rank;
    TokenId merged;
  };
  static std::uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  const Merge* find_merge(TokenId left, TokenId right) const;
  // Indexes id_to_token_/present_ once they are final, then applies the options.
  void finish_vocab(const BpeOptions& options, const std::string& source);
  // `where` ("<file>: model.merges[3]") prefixes the error when a token is unknown.
  void add_merge(std::string_view left, std::string_view right, std::int32_t rank, const std::string& where);
  // Splits the word into initial symbols (characters, byte-fallback bytes, unknowns).
  void initial_symbols(std::string_view word, std::vector<TokenId>& symbols) const;

  std::vector<std::string> id_to_token_;                 // owns the token strings
  std::vector<bool> present_;                            // ids that have a vocabulary entry
  std::unordered_map<std::string_view, TokenId> vocab_;  // views into id_to_token_
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::optional<TokenId> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<TokenId> byte_tokens_;  // id of <0xNN> for each byte, -1 where absent
};

}  // namespace kvchat::tokenization
