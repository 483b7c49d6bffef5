#pragma once
// Token selection as a chain, applied in this order (llama.cpp's order): repetition penalty ->
// greedy (temperature <= 0) or temperature -> top-k -> top-p -> min-p -> seeded draw.
#include <cstdint>
#include <random>
#include <vector>

#include "engine/types.h"

namespace kvchat {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // `recent` is the token history the repetition penalty looks at (its last repetition_window ids).
  TokenId sample(const float* logits, std::int64_t vocab_size, const std::vector<TokenId>& recent);

  // The distribution the draw is made from, after every filter (zeros for removed tokens). For greedy
  // decoding, a one-hot vector on the argmax.
  std::vector<double> probabilities(const float* logits, std::int64_t vocab_size,
                                    const std::vector<TokenId>& recent) const;

  // The TokenLogprobs of `chosen` and of the `top` most likely tokens (see TokenLogprob for the
  // distribution). `recent` as for the sample() that chose it.
  void log_probabilities(const float* logits, std::int64_t vocab_size, const std::vector<TokenId>& recent,
                         TokenId chosen, int top, TokenLogprobs& out) const;

  const SamplingParams& params() const { return params_; }
  bool greedy() const { return params_.temperature <= 0.0f || params_.top_k == 1; }

 private:
  // The logits after the repetition penalty: `logits` itself when no penalty applies, else a copy in
  // penalised_. The distribution goes into probabilities_.
  const float* penalised(const float* logits, std::int64_t vocab_size, const std::vector<TokenId>& recent) const;
  void compute_probabilities(const float* logits, std::int64_t vocab_size, const std::vector<TokenId>& recent) const;

  SamplingParams params_;
  std::mt19937_64 generator_;
  // Scratch reused by every call, so that sampling a token allocates nothing once they are sized.
  mutable std::vector<float> penalised_;
  mutable std::vector<TokenId> window_ids_, order_;
  mutable std::vector<double> weights_, probabilities_;
};

// Index of the largest value; the first one on ties (as llama2.c's argmax).
TokenId argmax(const float* values, std::int64_t size);

}  // namespace kvchat
