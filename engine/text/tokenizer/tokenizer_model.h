#pragma once
// The model step of a tokenizer: turns one pre-token into ids. Two algorithms share this interface
// so that the rest of the pipeline (added tokens, normalizer, pre-tokenizer, decoder) is common:
// merge-rank BPE (tokenizer.json, GGUF "gpt2") and score-driven SentencePiece BPE (GGUF "llama").
#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/types.h"

namespace kvchat::tokenization {

// Ids index vectors (the vocabulary here, the embedding and logits in the engine), so a file's ids must
// be nearly dense: one id of 10^8 in a three-token vocabulary would cost gigabytes. Ids stay below twice
// the number of tokens plus 1024, and below 2^24 (real vocabularies have a few hundred thousand tokens).
constexpr long long kMaxTokenIds = 1LL << 24;
inline long long token_id_limit(std::size_t token_count) {
  return std::min(kMaxTokenIds, 2 * static_cast<long long>(token_count) + 1024);
}
// The message for an id at or past token_id_limit(token_count).
inline std::string sparse_id_message(long long id, std::size_t token_count) {
  return "id " + std::to_string(id) + " is too large for " + std::to_string(token_count) +
         " tokens (ids must be below " + std::to_string(token_id_limit(token_count)) + ")";
}

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
