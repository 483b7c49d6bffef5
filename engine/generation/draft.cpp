#include "engine/generation/draft.h"

#include <algorithm>
#include <stdexcept>
#include <string>

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

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config) {
  if (config.mode == SpeculativeMode::None) return nullptr;
  if (config.draft_tokens < 1 || config.draft_tokens > kMaxDraftTokens)
    throw std::invalid_argument("draft tokens must be between 1 and " + std::to_string(kMaxDraftTokens) + " (got " +
                                std::to_string(config.draft_tokens) + ")");
  return std::make_unique<PromptLookupDrafter>(config.max_ngram, config.min_ngram);
}

}  // namespace kvchat
