#pragma once
// Constrained decoding: which tokens may come next so that the reply stays within a JsonGrammar.
//
// A ConstraintVocabulary (one per tokenizer, built once) holds every token's bytes in a trie. The allowed
// tokens are found by walking the trie with the byte matcher, one copy of its state per trie depth: a branch
// dies at its first refused byte, so a position that allows a few bytes visits few nodes. Inside a string,
// where nearly every token is allowed, the walk would visit the whole trie; there the tokens made only of
// whole plain characters (no quote, backslash or control character) are allowed from a precomputed set,
// and only the rest (a few percent of a vocabulary) is walked: XGrammar's split into tokens that the
// position alone decides and tokens that need the matcher, for the position where it matters.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/text/constraint/json_grammar.h"
#include "engine/text/constraint/json_matcher.h"
#include "engine/types.h"

namespace kvchat {

class Tokenizer;

class ConstraintVocabulary {
 public:
  // token_bytes[id]: what token `id` adds to a text; `usable[id]` false for tokens a grammar never allows
  // (special tokens, ids without a token): only the stop ids end a constrained reply.
  ConstraintVocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& usable);
  static std::shared_ptr<const ConstraintVocabulary> from_tokenizer(const Tokenizer& tokenizer);

  std::int64_t size() const { return static_cast<std::int64_t>(token_bytes_.size()); }
  const std::string& bytes(TokenId id) const { return token_bytes_[static_cast<std::size_t>(id)]; }

 private:
  friend class TokenConstraint;
  struct TrieNode {
    std::int32_t first_child = -1, next_sibling = -1;
    std::int32_t token_begin = 0, token_end = 0;  // tokens whose bytes end here: trie.tokens[begin, end)
    std::uint8_t byte = 0;
  };
  struct Trie {
    std::vector<TrieNode> nodes;  // nodes[0] is the root (no byte)
    std::vector<TokenId> tokens;
    std::size_t depth = 0;  // the longest token's bytes
  };
  static Trie build_trie(std::vector<std::pair<std::string, TokenId>> entries);

  std::vector<std::string> token_bytes_;
  Trie all_;      // every usable token
  Trie special_;  // the usable tokens that are not plain
  // Plain tokens (whole UTF-8 characters, none of them a quote, backslash or control character), with
  // their length in code points; plain_bits_ has bit `id` set for each.
  std::vector<TokenId> plain_;
  std::vector<std::int32_t> plain_code_points_;
  std::vector<std::uint64_t> plain_bits_;
};

// One reply's constraint: the matcher's state after the tokens accepted so far.
class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const ConstraintVocabulary> vocabulary);

  // Bit `id` set for each token that may come next (stop ids not included: see complete()).
  const std::vector<std::uint64_t>& allowed();
  // Sets the logits of the tokens that may not come next to -infinity. The stop ids may come exactly when
  // the reply is complete. Throws std::runtime_error when nothing may come (no token spells a byte the
  // grammar needs), never leaving every logit at -infinity.
  void mask_logits(float* logits, std::int64_t size, const std::vector<TokenId>& stop_ids);
  // Takes the token that was chosen. False when it was not allowed (the constraint is then broken: dead()).
  bool accept(TokenId token);
  bool complete() const { return matcher_.complete(); }
  bool dead() const { return matcher_.dead(); }

 private:
  void walk(const ConstraintVocabulary::Trie& trie, std::int32_t node, std::size_t depth);
  void allow(const ConstraintVocabulary::Trie& trie, const ConstraintVocabulary::TrieNode& node);

  std::shared_ptr<const JsonGrammar> grammar_;
  std::shared_ptr<const ConstraintVocabulary> vocabulary_;
  JsonMatcher matcher_;
  std::vector<JsonMatcher> states_;  // the walk's matcher per trie depth, reused
  std::vector<std::uint64_t> allowed_;
  bool allowed_current_ = false;
  std::string text_;  // the reply so far: errors quote its end
};

}  // namespace kvchat
