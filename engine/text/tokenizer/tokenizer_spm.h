#pragma once
// SentencePiece-style BPE driven by token scores, as GGUF "llama" vocabularies are tokenized by
// llama.cpp: there is no merge list. Starting from single characters, the adjacent pair whose
// concatenation is a vocabulary token with the highest score is merged, again and again (the
// leftmost pair among equal scores). Characters left without a token become <0xNN> byte tokens.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/text/tokenizer/tokenizer_model.h"
#include "engine/types.h"

namespace kvchat::tokenization {

class SpmModel : public Model {
 public:
  // tokens[id] / scores[id] for every id (same length, tokens distinct). Only ids with
  // can_produce[id] set can come out of merging: control and unknown tokens are left out so that
  // text can never turn into them. `unk` is used for a byte that has no <0xNN> token.
  SpmModel(std::vector<std::string> tokens, std::vector<float> scores, const std::vector<bool>& can_produce,
           std::optional<TokenId> unk, const std::string& source);
  SpmModel(const SpmModel&) = delete;
  SpmModel& operator=(const SpmModel&) = delete;

  // `word` is already escaped (spaces are "▁"). O(n log n) in its characters.
  void tokenize(std::string_view word, std::vector<TokenId>& out) const override;

  std::optional<TokenId> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(TokenId id) const override;
  TokenId id_limit() const override { return static_cast<TokenId>(id_to_token_.size()); }
  std::string describe() const override;

 private:
  std::optional<TokenId> producible(std::string_view text) const;
  void append_bytes(std::string_view text, std::vector<TokenId>& out) const;

  std::vector<std::string> id_to_token_;  // owns the token strings
  std::vector<float> scores_;
  std::unordered_map<std::string_view, TokenId> vocab_;  // every token, views into id_to_token_
  std::vector<bool> can_produce_;
  std::optional<TokenId> unk_;
  std::vector<TokenId> byte_tokens_;  // token of each byte (<0xNN>, else the 1-byte string), -1 if none
};

}  // namespace kvchat::tokenization
