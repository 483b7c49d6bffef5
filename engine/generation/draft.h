#pragma once
// Proposals for speculative decoding: tokens the model is likely to produce next, checked by the model in
// one pass (TokenGenerator). A proposal never decides a token; a wrong one costs a row of computation.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/types.h"

namespace kvchat {

class ComputeContext;
class LlamaModel;
class Session;

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

// A smaller model of the same vocabulary proposes its own greedy continuation (a 0.5B Qwen for a larger one, a
// Q4 file for its F16 original). Its session keeps a KV cache that follows the conversation: a proposal keeps
// the cached prefix it shares with the context (the rejected tokens fall away there) and prefills the rest.
// Where the context passes the draft model's own limit, it proposes nothing.
class DraftModelDrafter : public Drafter {
 public:
  DraftModelDrafter(std::shared_ptr<const LlamaModel> draft, std::shared_ptr<const ComputeContext> compute);
  ~DraftModelDrafter() override;
  void propose(const std::vector<TokenId>& context, int max_tokens, std::vector<TokenId>& out) override;
  const LlamaModel& model() const;

 private:
  std::unique_ptr<Session> session_;
};

// The drafter a configuration asks for, proposing for `target` (null for SpeculativeMode::None); the draft
// model's proposals compute with `compute`. Throws std::invalid_argument for settings out of range, a draft
// mode without a draft model, or a draft model whose vocabulary differs from the target's.
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config, const LlamaModel& target,
                                      std::shared_ptr<const ComputeContext> compute = nullptr);

}  // namespace kvchat
