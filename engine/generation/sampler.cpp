#include "engine/generation/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvchat {

TokenId argmax(const float* values, std::int64_t size) {
  std::int64_t best = 0;
  for (std::int64_t i = 1; i < size; ++i)
    if (values[i] > values[best]) best = i;
  return static_cast<TokenId>(best);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), generator_(params.seed) {}

const float* Sampler::penalised(const float* logits, std::int64_t vocab_size,
                                const std::vector<TokenId>& recent) const {
  if (params_.repetition_penalty == 1.0f || recent.empty()) return logits;
  penalised_.assign(logits, logits + vocab_size);
  const std::size_t window =
      params_.repetition_window > 0
          ? std::min<std::size_t>(recent.size(), static_cast<std::size_t>(params_.repetition_window))
          : recent.size();
  // Each distinct id of the window is penalised once.
  window_ids_.assign(recent.end() - static_cast<std::ptrdiff_t>(window), recent.end());
  std::sort(window_ids_.begin(), window_ids_.end());
  window_ids_.erase(std::unique(window_ids_.begin(), window_ids_.end()), window_ids_.end());
  for (TokenId id : window_ids_) {
    if (id < 0 || id >= vocab_size) continue;
    float& v = penalised_[static_cast<std::size_t>(id)];
    v = v > 0 ? v / params_.repetition_penalty : v * params_.repetition_penalty;  // CTRL-style
  }
  return penalised_.data();
}

void Sampler::log_probabilities(const float* logits, std::int64_t vocab_size, const std::vector<TokenId>& recent,
                                TokenId chosen, int top, TokenLogprobs& out) const {
  const float* values = penalised(logits, vocab_size, recent);
  const double scale = params_.temperature > 0.0f ? 1.0 / params_.temperature : 1.0;
  // log-softmax: x*scale - (max*scale + log(sum(exp((x - max)*scale)))), in double.
  const double highest = values[argmax(values, vocab_size)];
  double sum = 0;
  for (std::int64_t i = 0; i < vocab_size; ++i) sum += std::exp((values[i] - highest) * scale);
  const double log_sum = std::log(sum);
  const auto logprob = [&](TokenId id) { return static_cast<float>((values[id] - highest) * scale - log_sum); };
  out.chosen = {chosen, logprob(chosen)};
  out.top.clear();
  const auto wanted = static_cast<std::size_t>(std::clamp<std::int64_t>(top, 0, vocab_size));
  if (wanted == 0) return;
  order_.resize(static_cast<std::size_t>(vocab_size));
  std::iota(order_.begin(), order_.end(), 0);
  auto better = [&](TokenId a, TokenId b) { return values[a] > values[b] || (values[a] == values[b] && a < b); };
  std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(wanted), order_.end(), better);
  for (std::size_t i = 0; i < wanted; ++i) out.top.push_back({order_[i], logprob(order_[i])});
}

std::vector<double> Sampler::probabilities(const float* logits, std::int64_t vocab_size,
                                           const std::vector<TokenId>& recent) const {
  compute_probabilities(logits, vocab_size, recent);
  return probabilities_;
}

void Sampler::compute_probabilities(const float* logits, std::int64_t vocab_size,
                                    const std::vector<TokenId>& recent) const {
  const float* values = penalised(logits, vocab_size, recent);
  probabilities_.assign(static_cast<std::size_t>(vocab_size), 0.0);
  if (greedy()) {
    probabilities_[static_cast<std::size_t>(argmax(values, vocab_size))] = 1.0;
    return;
  }
  // Candidates sorted by logit, best first (stable: ties keep the lower id first).
  order_.resize(static_cast<std::size_t>(vocab_size));
  std::iota(order_.begin(), order_.end(), 0);
  auto better = [&](TokenId a, TokenId b) { return values[a] > values[b] || (values[a] == values[b] && a < b); };
  std::size_t keep = order_.size();
  if (params_.top_k > 0) keep = std::min(keep, static_cast<std::size_t>(params_.top_k));
  // Only the kept candidates need ordering (a full sort of a 128k vocabulary costs milliseconds).
  std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(keep), order_.end(), better);

  // Softmax with temperature over the kept candidates (max subtracted for stability).
  const double temperature = params_.temperature;
  const double top = values[order_[0]];
  weights_.resize(keep);
  double sum = 0;
  for (std::size_t i = 0; i < keep; ++i) sum += weights_[i] = std::exp((values[order_[i]] - top) / temperature);
  for (std::size_t i = 0; i < keep; ++i) weights_[i] /= sum;

  if (params_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p (at least one token)
    double cumulative = 0;
    std::size_t cut = keep;
    for (std::size_t i = 0; i < keep; ++i) {
      cumulative += weights_[i];
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  if (params_.min_p > 0.0f) {  // drop tokens less likely than min_p x the most likely one
    const double threshold = params_.min_p * weights_[0];
    std::size_t cut = 1;
    while (cut < keep && weights_[cut] >= threshold) ++cut;
    keep = cut;
  }
  double kept_mass = 0;
  for (std::size_t i = 0; i < keep; ++i) kept_mass += weights_[i];
  for (std::size_t i = 0; i < keep; ++i) probabilities_[static_cast<std::size_t>(order_[i])] = weights_[i] / kept_mass;
}

TokenId Sampler::sample(const float* logits, std::int64_t vocab_size, const std::vector<TokenId>& recent) {
  if (greedy()) return argmax(penalised(logits, vocab_size, recent), vocab_size);
  compute_probabilities(logits, vocab_size, recent);
  const std::vector<double>& probs = probabilities_;
  // Inverse-CDF draw from the seeded generator: same seed and logits, same token.
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(generator_);
  double cumulative = 0;
  TokenId last_nonzero = 0;
  for (std::int64_t i = 0; i < vocab_size; ++i) {
    if (probs[static_cast<std::size_t>(i)] <= 0) continue;
    cumulative += probs[static_cast<std::size_t>(i)];
    last_nonzero = static_cast<TokenId>(i);
    if (u < cumulative) return last_nonzero;
  }
  return last_nonzero;  // rounding left u just above the total
}

}  // namespace kvchat
