#include "engine/session.h"

#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "engine/kv_cache.h"
#include "engine/llama_model.h"
#include "engine/sampler.h"

namespace kvchat {

namespace {
using Clock = std::chrono::steady_clock;
double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}
bool stop_requested(const std::atomic<bool>* stop) { return stop && stop->load(std::memory_order_relaxed); }
}  // namespace

Session::Session(std::shared_ptr<const LlamaModel> model, KvCacheMode cache_mode)
    : model_(std::move(model)), cache_mode_(cache_mode) {
  if (!model_) throw std::invalid_argument("Session needs a model");
  cache_ = make_kv_cache(cache_mode_, model_->cache_shape());
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

std::int64_t Session::cache_tokens() const { return cache_ ? cache_->size() : 0; }
std::int64_t Session::cache_bytes() const { return cache_ ? cache_->bytes() : 0; }
std::int64_t Session::cache_capacity_tokens() const { return cache_ ? cache_->capacity() : 0; }

void Session::set_cache_mode(KvCacheMode mode) {
  if (mode == cache_mode_) return;
  cache_mode_ = mode;
  clear();
}

void Session::truncate(std::int64_t tokens) {
  tokens = std::clamp<std::int64_t>(tokens, 0, static_cast<std::int64_t>(history_.size()));
  if (cache_) cache_->truncate(tokens);
  history_.resize(static_cast<std::size_t>(tokens));
}

void Session::clear() {
  cache_ = make_kv_cache(cache_mode_, model_->cache_shape());  // releases the old buffers
  history_.clear();
}

GenerationResult Session::generate(const std::vector<TokenId>& prompt, const GenerationConfig& config,
                                   const std::atomic<bool>* stop, const TokenCallback& on_token) {
  // The guard belongs to the thread that runs the model, so it is made here, not at load.
  c10::InferenceMode inference_guard;
  const ModelConfig& model_config = model_->config();
  const std::int64_t context_limit = model_config.max_position_embeddings;
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (static_cast<std::int64_t>(prompt.size()) > context_limit)
    throw std::invalid_argument("the prompt has " + std::to_string(prompt.size()) +
                                " tokens, more than the model's context of " + std::to_string(context_limit));
  set_cache_mode(config.cache_mode);

  const std::vector<TokenId>& stop_ids = config.stop_token_ids.empty() ? model_config.eos_token_ids : config.stop_token_ids;
  GenerationResult result;
  GenerationStats& stats = result.stats;
  stats.cache_mode = cache_mode_;
  stats.prompt_tokens = static_cast<int>(prompt.size());
  const auto started = Clock::now();

  // --- prefill: only what the cache does not hold yet ---
  at::Tensor logits;
  std::vector<TokenId> sequence;  // the uncached path's whole sequence
  if (cache_) {
    std::size_t common = 0;
    while (common < history_.size() && common < prompt.size() && history_[common] == prompt[common]) ++common;
    // Logits come from running at least one token, so a fully cached prompt re-runs its last token.
    if (common == prompt.size()) --common;
    truncate(static_cast<std::int64_t>(common));
    stats.reused_tokens = static_cast<int>(common);
    const std::size_t chunk = static_cast<std::size_t>(std::max(1, config.prefill_chunk_tokens));
    for (std::size_t begin = common; begin < prompt.size(); begin += chunk) {
      if (stop_requested(stop)) break;
      std::vector<TokenId> piece(prompt.begin() + begin, prompt.begin() + std::min(prompt.size(), begin + chunk));
      logits = model_->forward(piece, cache_->size(), cache_.get());
      history_.insert(history_.end(), piece.begin(), piece.end());
      stats.prefilled_tokens += static_cast<int>(piece.size());
    }
  } else {
    sequence = prompt;
    if (!stop_requested(stop)) {
      logits = model_->forward(sequence, 0, nullptr);
      stats.prefilled_tokens = static_cast<int>(prompt.size());
    }
  }
  stats.prefill_ms = milliseconds_since(started);
  if (stats.prefilled_tokens > 0 && stats.prefill_ms > 0)
    stats.prefill_tokens_per_second = stats.prefilled_tokens * 1000.0 / stats.prefill_ms;

  // --- decode: one token per step ---
  // Steady state allocates nothing: every buffer below is sized before the first step, and the
  // cached path's steps write their logits into logits_ in place.
  Sampler sampler(config.sampling);
  const auto token_budget = static_cast<std::size_t>(std::max(0, config.max_new_tokens));
  std::vector<TokenId> recent;  // what the repetition penalty looks at
  recent.reserve(prompt.size() + token_budget);
  recent = prompt;
  result.generated.reserve(token_budget);
  if (cache_) history_.reserve(prompt.size() + token_budget);
  else sequence.reserve(prompt.size() + token_budget);
  const bool prefill_complete = logits.defined() &&
                                (cache_ ? static_cast<std::size_t>(cache_->size()) == prompt.size() : true);
  stats.stop_reason = StopReason::Stopped;
  Clock::time_point first_token_time = Clock::now();
  if (prefill_complete) {
    const std::int64_t vocab_size = model_config.vocab_size;
    logits_.resize(static_cast<std::size_t>(vocab_size));
    auto keep_logits = [&](const at::Tensor& row) {
      std::copy_n(row.contiguous().data_ptr<float>(), vocab_size, logits_.data());
    };
    keep_logits(logits);
    std::int64_t position = static_cast<std::int64_t>(prompt.size());  // where the next fed token goes
    while (true) {
      TokenId token = sampler.sample(logits_.data(), vocab_size, recent);
      if (result.generated.empty()) {
        first_token_time = Clock::now();
        stats.ttft_ms = milliseconds_since(started);
      }
      result.generated.push_back(token);
      recent.push_back(token);
      if (on_token) on_token(token);

      if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
        stats.stop_reason = StopReason::Eos;
        break;
      }
      if (static_cast<int>(result.generated.size()) >= config.max_new_tokens) {
        stats.stop_reason = StopReason::MaxTokens;
        break;
      }
      if (position >= context_limit) {  // no slot left for the token just sampled
        stats.stop_reason = StopReason::ContextFull;
        break;
      }
      if (stop_requested(stop)) {
        stats.stop_reason = StopReason::Stopped;
        break;
      }
      if (cache_) {
        model_->decode(token, position, *cache_, logits_.data());
        history_.push_back(token);
      } else {
        sequence.push_back(token);
        keep_logits(model_->forward(sequence, 0, nullptr));  // the O(n^2) path: recompute everything
      }
      ++position;
    }
  }
  stats.generated_tokens = static_cast<int>(result.generated.size());
  if (stats.generated_tokens > 1) {
    stats.decode_ms = std::chrono::duration<double, std::milli>(Clock::now() - first_token_time).count();
    if (stats.decode_ms > 0) stats.decode_tokens_per_second = (stats.generated_tokens - 1) * 1000.0 / stats.decode_ms;
  }
  stats.cache_tokens = cache_tokens();
  stats.cache_bytes = cache_bytes();
  stats.cache_capacity_tokens = cache_capacity_tokens();
  spdlog::debug("generate: {} prompt tokens ({} reused, {} prefilled in {:.1f} ms), {} generated at {:.1f} tok/s, stop: {}",
                stats.prompt_tokens, stats.reused_tokens, stats.prefilled_tokens, stats.prefill_ms,
                stats.generated_tokens, stats.decode_tokens_per_second, to_string(stats.stop_reason));
  return result;
}

}  // namespace kvchat
