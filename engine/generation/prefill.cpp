#include "engine/generation/prefill.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "engine/cache/kv_cache.h"
#include "engine/model/llama_model.h"

namespace kvchat {

namespace {
using Clock = std::chrono::steady_clock;
bool stop_requested(const std::atomic<bool>* stop) { return stop && stop->load(std::memory_order_relaxed); }
}  // namespace

Prefiller::Prefiller(const LlamaModel& model, int chunk_tokens, ChunkRunner run_chunk)
    : model_(model),
      chunk_tokens_(static_cast<std::size_t>(std::max(1, chunk_tokens))),
      run_chunk_(std::move(run_chunk)) {}

PrefillResult Prefiller::run(const std::vector<TokenId>& prompt, KvCache& cache, std::vector<float>& logits,
                             const std::atomic<bool>* stop, const BeforePrefillChunk& before_chunk) const {
  const auto started = Clock::now();
  PrefillResult result;
  at::Tensor last;
  for (auto begin = static_cast<std::size_t>(cache.size()); begin < prompt.size(); begin += chunk_tokens_) {
    if (before_chunk) before_chunk(cache.size());
    if (stop_requested(stop)) break;
    const std::vector<TokenId> piece(
        prompt.begin() + static_cast<std::ptrdiff_t>(begin),
        prompt.begin() + static_cast<std::ptrdiff_t>(std::min(prompt.size(), begin + chunk_tokens_)));
    const auto chunk = [&] { last = model_.forward(piece, cache.size(), &cache); };
    if (run_chunk_)
      run_chunk_(chunk);
    else
      chunk();
    result.prefilled_tokens += static_cast<int>(piece.size());
  }
  result.complete = last.defined() && static_cast<std::size_t>(cache.size()) == prompt.size();
  if (result.complete) copy_logits(last, logits);
  result.milliseconds = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  return result;
}

PrefillResult Prefiller::run_uncached(const std::vector<TokenId>& sequence, std::vector<float>& logits,
                                      const std::atomic<bool>* stop, KvDtype kv_dtype) const {
  const auto started = Clock::now();
  PrefillResult result;
  if (!stop_requested(stop)) {
    copy_logits(model_.forward(sequence, 0, nullptr, false, kv_dtype), logits);
    result.prefilled_tokens = static_cast<int>(sequence.size());
    result.complete = true;
  }
  result.milliseconds = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  return result;
}

}  // namespace kvchat
