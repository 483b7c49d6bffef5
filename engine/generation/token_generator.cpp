#include "engine/generation/token_generator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/generation/draft.h"
#include "engine/generation/sampler.h"
#include "engine/text/constraint/token_constraint.h"

namespace kvchat {

double DecodeRate::elapsed_ms(Clock::time_point now) const {
  return std::chrono::duration<double, std::milli>(now - first_token_).count();
}

double DecodeRate::tokens_per_second(int generated_tokens, Clock::time_point now) const {
  const double ms = elapsed_ms(now);
  return generated_tokens > 1 && ms > 0 ? (generated_tokens - 1) * 1000.0 / ms : 0.0;
}

namespace {

// Whether every logit is finite: a NaN or infinite logit means corrupt weights or an overflow, and
// sampling from it would give garbage tokens that look like output. Tests the exponent bits, so the
// loop vectorises (one pass over the vocabulary costs far less than the step that made it).
bool all_finite(const float* values, std::int64_t size) {
  std::uint32_t worst = 0;
  for (std::int64_t i = 0; i < size; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, values + i, sizeof bits);
    worst |= ((bits & 0x7f800000u) == 0x7f800000u) ? 1u : 0u;
  }
  return worst == 0;
}

}  // namespace

TokenGenerator::TokenGenerator(const GenerationConfig& config, std::vector<TokenId> stop_ids,
                               std::int64_t context_limit)
    : config_(config), stop_ids_(std::move(stop_ids)), context_limit_(context_limit) {}

DecodeResult TokenGenerator::run(const std::vector<TokenId>& prompt, const float* logits, std::int64_t vocab_size,
                                 const FeedToken& feed, const std::atomic<bool>* stop, const TokenCallback& on_token,
                                 std::chrono::steady_clock::time_point started, const DraftChecking* drafts) const {
  // Steady state allocates nothing: every buffer below is sized before the first step.
  Sampler sampler(config_.sampling);
  // Room for the tokens this run can make: the context limit bounds them whatever max_new_tokens says.
  const auto room = static_cast<std::size_t>(
      std::max<std::int64_t>(0, context_limit_ - static_cast<std::int64_t>(prompt.size())) + 1);
  const auto token_budget = std::min(static_cast<std::size_t>(std::max(0, config_.max_new_tokens)), room);
  // Ids past the tokenizer's have no text: they are never sampled.
  const std::int64_t sampled =
      config_.sampled_vocabulary > 0 ? std::min<std::int64_t>(vocab_size, config_.sampled_vocabulary) : vocab_size;
  std::vector<TokenId> recent;  // what the repetition penalty looks at
  recent.reserve(prompt.size() + token_budget);
  recent = prompt;
  DecodeResult result;
  result.generated.reserve(token_budget);
  DecodeRate rate;
  TokenLogprobs logprobs;
  if (config_.top_logprobs > 0) logprobs.top.reserve(static_cast<std::size_t>(config_.top_logprobs));
  auto position = static_cast<std::int64_t>(prompt.size());  // where the next fed token goes
  // Speculative decoding: the proposals fed ahead of `position` (rows whose logits are in `rows`), how many of
  // them the samples have confirmed, and how many positions the caller holds (position + unconfirmed rows).
  const bool speculative = drafts && drafts->drafter && drafts->max_draft_tokens > 0;
  std::vector<TokenId> proposed, fed_rows;
  if (speculative) {
    proposed.reserve(static_cast<std::size_t>(drafts->max_draft_tokens));
    fed_rows.reserve(static_cast<std::size_t>(drafts->max_draft_tokens) + 1);
  }
  std::size_t confirmed = 0;
  const float* rows = nullptr;
  std::int64_t fed_end = position;
  int draft_length = speculative ? drafts->max_draft_tokens : 0;  // shrinks while proposals miss
  bool logits_from_checked_row = false;  // `logits` is a row after the first of a pass fed ahead
  std::optional<TokenConstraint> constraint;
  std::vector<float> masked;
  if (config_.grammar) {
    if (!config_.grammar_vocabulary) throw std::invalid_argument("a grammar needs the tokenizer's vocabulary");
    constraint.emplace(config_.grammar, config_.grammar_vocabulary);
    masked.resize(static_cast<std::size_t>(sampled));
  }
  const auto drop_unconfirmed_rows = [&] {
    if (fed_end > position) drafts->keep(position);
    fed_end = position;
    // Adapt: a check that confirmed nothing halves the next proposal, one that confirmed all doubles it.
    if (!proposed.empty()) {
      if (confirmed == 0) draft_length = std::max(1, draft_length / 2);
      if (confirmed == proposed.size()) draft_length = std::min(drafts->max_draft_tokens, draft_length * 2);
    }
    proposed.clear();
    confirmed = 0;
  };
  while (true) {
    if (!all_finite(logits, vocab_size))
      throw std::runtime_error("the model produced NaN or infinite logits at position " + std::to_string(position - 1) +
                               ": its weights are corrupt or out of range");
    // Constrained decoding samples from a copy whose disallowed tokens are at -infinity.
    const float* sample_from = logits;
    if (constraint) {
      std::copy(logits, logits + sampled, masked.begin());
      constraint->mask_logits(masked.data(), sampled, stop_ids_);
      sample_from = masked.data();
    }
    const TokenId token = sampler.sample(sample_from, sampled, recent);
    // Before the token joins `recent`: the penalty it was drawn under.
    if (config_.top_logprobs >= 0)
      sampler.log_probabilities(sample_from, sampled, recent, token, config_.top_logprobs, logprobs);
    if (constraint && std::find(stop_ids_.begin(), stop_ids_.end(), token) == stop_ids_.end() &&
        !constraint->accept(token))
      throw std::logic_error("the sampler chose token " + std::to_string(token) + ", which the constraint refused");
    const auto now = DecodeRate::Clock::now();
    if (result.generated.empty()) {
      rate.first_token_at(now);
      result.ttft_ms = std::chrono::duration<double, std::milli>(now - started).count();
    }
    result.generated.push_back(token);
    recent.push_back(token);
    const int generated = static_cast<int>(result.generated.size());
    if (on_token)
      on_token(token, DecodeProgress{generated, rate.tokens_per_second(generated, now),
                                     config_.top_logprobs >= 0 ? &logprobs : nullptr, logits_from_checked_row});

    // The last sampled token is never fed: it would only matter to a next turn, whose prompt carries it
    // (or, after an end-of-sequence id, the template's own turn end).
    if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
      result.stop_reason = StopReason::Eos;
      break;
    }
    if (generated >= config_.max_new_tokens) {
      result.stop_reason = StopReason::MaxTokens;
      break;
    }
    if (position + 1 >= context_limit_) {  // the next token would have no position left
      result.stop_reason = StopReason::ContextFull;
      break;
    }
    if (stop && stop->load(std::memory_order_relaxed)) {
      result.stop_reason = StopReason::Stopped;
      break;
    }
    if (confirmed < proposed.size() && proposed[confirmed] == token) {
      // Sampled what was proposed: its row was fed ahead, and its logits are the next row's.
      ++confirmed;
      ++result.accepted_tokens;
      logits = rows + static_cast<std::int64_t>(confirmed) * vocab_size;
      logits_from_checked_row = true;
      ++position;
      if (confirmed == proposed.size()) drop_unconfirmed_rows();
      continue;
    }
    if (speculative) {
      drop_unconfirmed_rows();
      // Proposals beyond the samples this run may still make, or past the context, would never be used.
      const std::int64_t samples_left = static_cast<std::int64_t>(token_budget) - generated - 1;
      const std::int64_t positions_left = context_limit_ - position - 2;
      const int most = static_cast<int>(std::min<std::int64_t>({draft_length, samples_left, positions_left}));
      if (most > 0) drafts->drafter->propose(recent, most, proposed);
      if (!proposed.empty()) {
        fed_rows.assign(1, token);
        fed_rows.insert(fed_rows.end(), proposed.begin(), proposed.end());
        rows = drafts->feed_rows(fed_rows.data(), static_cast<int>(fed_rows.size()), position);
        logits = rows;
        logits_from_checked_row = false;
        fed_end = position + static_cast<std::int64_t>(fed_rows.size());
        ++position;
        result.drafted_tokens += static_cast<int>(proposed.size());
        ++result.draft_checks;
        continue;
      }
    }
    logits = feed(token, position);
    logits_from_checked_row = false;
    ++position;
    fed_end = position;
  }
  // The last sample is never fed: rows fed ahead of it (its own included) go.
  if (speculative && fed_end > position) drafts->keep(position);
  const auto end = DecodeRate::Clock::now();
  if (result.generated.size() > 1) {
    result.decode_ms = rate.elapsed_ms(end);
    result.decode_tokens_per_second = rate.tokens_per_second(static_cast<int>(result.generated.size()), end);
  }
  return result;
}

}  // namespace kvchat
