#pragma once
// The model step of a tokenizer: turns one pre-token into ids. Two algorithms share this interface
// so that the rest of the pipeline (added tokens, normalizer, pre-tokenizer, decoder) is common:
// merge-rank BPE (tokenizer.json, GGUF "gpt2") and score-driven SentencePiece BPE (GGUF "llama").
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/types.h"

namespace kvchat::tokenization {

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-token.
  virtual void tokenize(std::string_view word, std::vector<TokenId>& out) const = 0;
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  // nullptr when the id has no vocabulary entry.
  virtual const std::string* id_to_token(TokenId id) const = 0;
  // One past the largest id of the vocabulary.
  virtual TokenId id_limit() const = 0;
  // "BPE, 128000 vocabulary entries, 280147 merges": for the log line written at load.
  virtual std::string describe() const = 0;
};

}  // namespace kvchat::tokenization
