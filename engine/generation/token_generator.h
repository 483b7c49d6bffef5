#pragma once
// The decode phase of a generation: sample a token from the current logits, hand it to the caller,
// decide whether to stop, else feed it to the model for the next logits; one token per step.
//
// How a token is fed (the cache's decode step, or recomputing the whole sequence) is the caller's:
// the generator only samples, times and applies the stop rules, so both paths share them.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/types.h"

namespace kvchat {

// Decode speed since the first token: the one definition, used live and for the final stats.
class DecodeRate {
 public:
  using Clock = std::chrono::steady_clock;
  void first_token_at(Clock::time_point time) { first_token_ = time; }
  double elapsed_ms(Clock::time_point now = Clock::now()) const;
  // Tokens after the first, per second of decode; 0 until there are two.
  double tokens_per_second(int generated_tokens, Clock::time_point now = Clock::now()) const;

 private:
  Clock::time_point first_token_;
};

// Handed to the token callback with every new token.
struct DecodeProgress {
  int generated_tokens = 0;               // this token included
  double decode_tokens_per_second = 0.0;  // DecodeRate: 0 until the second token
  // This token's log-probabilities when GenerationConfig::top_logprobs asks for them, else null. Valid
  // during the callback.
  const TokenLogprobs* logprobs = nullptr;
  // Speculative decoding: this token was sampled from a row fed ahead with an earlier pass (a proposal that
  // held), so no model pass ran for it.
  bool from_checked_row = false;
};

// Called with each new token as soon as it is sampled. Runs on the generating thread.
using TokenCallback = std::function<void(TokenId token, const DecodeProgress& progress)>;

struct DecodeResult {
  std::vector<TokenId> generated;  // the stop token included when the reason is Eos
  StopReason stop_reason = StopReason::Stopped;
  double ttft_ms = 0.0;    // from the generation's start to the first sample
  double decode_ms = 0.0;  // from the first token to the last
  double decode_tokens_per_second = 0.0;
  int drafted_tokens = 0, accepted_tokens = 0, draft_checks = 0;  // speculative decoding (GenerationStats)
};

class Drafter;

// The caller's side of speculative decoding. After each sampled token the generator asks `drafter` for the
// tokens likely to follow and feeds the sampled token and the proposals as rows in one pass; the rows'
// logits then serve the next samples for as long as each sample equals the proposal it was fed with. At
// the first sample that differs, `keep` drops the rows fed ahead. Every sample is still drawn from logits
// computed as a decode step would compute them, so the output is what plain decoding gives.
struct DraftChecking {
  Drafter* drafter = nullptr;
  int max_draft_tokens = 0;
  // Feeds tokens[0, count) at positions position .. position + count - 1 and returns every row's logits
  // [count, vocab] (each row's to the bit as FeedToken would give it), valid until the next call.
  std::function<const float*(const TokenId* tokens, int count, std::int64_t position)> feed_rows;
  // Keeps the first `positions` positions fed, dropping the rest.
  std::function<void(std::int64_t positions)> keep;
};

class TokenGenerator {
 public:
  // Feeds `token` at absolute `position` and returns the logits that follow it ([vocab], valid until
  // the next call).
  using FeedToken = std::function<const float*(TokenId token, std::int64_t position)>;

  // stop_ids: the end-of-sequence ids; context_limit: prompt + generated tokens never exceed it.
  TokenGenerator(const GenerationConfig& config, std::vector<TokenId> stop_ids, std::int64_t context_limit);

  // Starts from `logits`, the prompt's last position's. `started` is when the generation began (TTFT).
  // Throws std::runtime_error if any logits are NaN or infinite (corrupt weights): never garbage tokens.
  // `drafts` (may be null: none) turns on speculative decoding; when the run ends, the positions fed are
  // the prompt's and every sampled token's but the last, as without it.
  DecodeResult run(const std::vector<TokenId>& prompt, const float* logits, std::int64_t vocab_size,
                   const FeedToken& feed, const std::atomic<bool>* stop, const TokenCallback& on_token,
                   std::chrono::steady_clock::time_point started, const DraftChecking* drafts = nullptr) const;

 private:
  GenerationConfig config_;
  std::vector<TokenId> stop_ids_;
  std::int64_t context_limit_;
};

}  // namespace kvchat
