#pragma once
// Proposals for speculative decoding: tokens the model is likely to produce next, checked by the model in
// one pass (TokenGenerator). A proposal never decides a token; a wrong one costs a row of computation.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/types.h"

namespace kvchat {

// Proposals per check are bounded: past a few dozen rows a check costs more than the steps it can save.
constexpr int kMaxDraftTokens = 32;

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `max_tokens` tokens expected to follow `context` (the prompt and the reply so far), into `out`
  // (cleared first). None is a valid answer: the step then decodes one token as usual.
  virtual void propose(const std::vector<TokenId>& context, int max_tokens, std::vector<TokenId>& out) = 0;
};

// Prompt lookup: chat repeats its context (code being edited, quotes, names, lists), so the tokens that
// followed the latest earlier occurrence of the context's last n tokens are a cheap guess. The longest n
// from max_ngram down to min_ngram that occurs wins; among its occurrences, the latest. The proposal reads on
// past the context's end into itself (a repeat p tokens back means period p), so it always has max_tokens.
class PromptLookupDrafter : public Drafter {
 public:
  PromptLookupDrafter(int max_ngram, int min_ngram);
  void propose(const std::vector<TokenId>& context, int max_tokens, std::vector<TokenId>& out) override;

 private:
  int max_ngram_, min_ngram_;
};

// The drafter a configuration asks for (null for SpeculativeMode::None). Throws std::invalid_argument for
// settings out of range.
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config);

}  // namespace kvchat
