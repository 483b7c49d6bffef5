#include "engine/generation/draft.h"

#include "engine/generation/session.h"
#include "engine/model/llama_model.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvchat {

PromptLookupDrafter::PromptLookupDrafter(int max_ngram, int min_ngram) : max_ngram_(max_ngram), min_ngram_(min_ngram) {
  if (min_ngram < 1 || max_ngram < min_ngram)
    throw std::invalid_argument("prompt lookup needs 1 <= min_ngram <= max_ngram (got " + std::to_string(min_ngram) +
                                " and " + std::to_string(max_ngram) + ")");
}

void PromptLookupDrafter::propose(const std::vector<TokenId>& context, int max_tokens, std::vector<TokenId>& out) {
  out.clear();
  const auto size = static_cast<std::int64_t>(context.size());
  if (max_tokens <= 0) return;
  for (std::int64_t n = std::min<std::int64_t>(max_ngram_, size - 1); n >= min_ngram_; --n) {
    const TokenId* suffix = context.data() + size - n;
    // The latest earlier occurrence: scanning back from the one just before the suffix itself. A scan of
    // the whole context costs microseconds next to a decode step, even at thousands of tokens.
    for (std::int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + n, context.data() + start)) continue;
      // What followed that occurrence, read on into the proposal itself where it reaches the end: a match
      // p tokens back says the text repeats with period p, so a loop of a few tokens still gives a full
      // proposal.
      const std::int64_t from = start + n;
      for (std::int64_t i = 0; i < max_tokens; ++i) {
        const std::int64_t at = from + i;
        out.push_back(at < size ? context[static_cast<std::size_t>(at)] : out[static_cast<std::size_t>(at - size)]);
      }
      return;
    }
  }
}

DraftModelDrafter::DraftModelDrafter(std::shared_ptr<const LlamaModel> draft,
                                     std::shared_ptr<const ComputeContext> compute)
    : session_(std::make_unique<Session>(std::move(draft), KvCacheMode::Contiguous)) {
  session_->set_compute_context(std::move(compute));
}

DraftModelDrafter::~DraftModelDrafter() = default;

const LlamaModel& DraftModelDrafter::model() const { return session_->model(); }

void DraftModelDrafter::propose(const std::vector<TokenId>& context, int max_tokens, std::vector<TokenId>& out) {
  out.clear();
  if (max_tokens <= 0 || context.empty()) return;
  // Room for the context and the proposals within the draft model's own positions.
  const std::int64_t room = model().config().max_position_embeddings - static_cast<std::int64_t>(context.size());
  if (room < 2) return;
  GenerationConfig config;  // greedy, its own end-of-sequence ids (a proposed end is checked like any token)
  config.max_new_tokens = static_cast<int>(std::min<std::int64_t>(max_tokens, room - 1));
  out = session_->generate(context, config).generated;
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config, const LlamaModel& target,
                                      std::shared_ptr<const ComputeContext> compute) {
  if (config.mode == SpeculativeMode::None) return nullptr;
  if (config.draft_tokens < 1 || config.draft_tokens > kMaxDraftTokens)
    throw std::invalid_argument("draft tokens must be between 1 and " + std::to_string(kMaxDraftTokens) + " (got " +
                                std::to_string(config.draft_tokens) + ")");
  if (config.mode == SpeculativeMode::Lookup)
    return std::make_unique<PromptLookupDrafter>(config.max_ngram, config.min_ngram);
  if (!config.draft_model) throw std::invalid_argument("speculative decoding with a draft model needs a draft model");
  const std::int64_t draft_vocabulary = config.draft_model->config().vocab_size;
  if (draft_vocabulary != target.config().vocab_size)
    throw std::invalid_argument("the draft model's vocabulary has " + std::to_string(draft_vocabulary) +
                                " ids, the model's " + std::to_string(target.config().vocab_size) +
                                ": a draft model must share the model's tokenizer");
  return std::make_unique<DraftModelDrafter>(config.draft_model, std::move(compute));
}

}  // namespace kvchat
