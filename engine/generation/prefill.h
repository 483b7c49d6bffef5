#pragma once
// The prefill phase of a generation: runs the prompt tokens the cache does not hold yet, in chunks
// (checking the stop flag between them), and leaves the last position's logits for the first sample.
#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/types.h"

namespace kvchat {

class KvCache;
class LlamaModel;

struct PrefillResult {
  int prefilled_tokens = 0;
  double milliseconds = 0.0;
  bool complete = false;  // every prompt token ran and `logits` holds the last one's logits
};

// Called on the prefilling thread before each chunk with how many prompt tokens the cache holds so far:
// the caller's chance to look at the world (is the client still there?) and set the stop flag, which
// ends the prefill before that chunk.
using BeforePrefillChunk = std::function<void(std::int64_t cached_tokens)>;

// Runs one chunk's model work: at once, or when a DecodeBatcher gives it its turn between decode steps.
using ChunkRunner = std::function<void(const std::function<void()>& work)>;

class Prefiller {
 public:
  // Keeps a reference: `model` must outlive the prefiller. `run_chunk` (may be empty: at once) runs each chunk.
  Prefiller(const LlamaModel& model, int chunk_tokens, ChunkRunner run_chunk = {});

  // Cached: runs prompt[cache.size() ..] into the cache (the caller has truncated the cache to the
  // prefix it shares with the prompt, and left at least one token to run).
  PrefillResult run(const std::vector<TokenId>& prompt, KvCache& cache, std::vector<float>& logits,
                    const std::atomic<bool>* stop, const BeforePrefillChunk& before_chunk = {}) const;
  // Uncached: the whole sequence in one forward (the O(n^2) path's first step).
  // kv_dtype: what the keys and values are rounded through, as a cache of that dtype would store them.
  PrefillResult run_uncached(const std::vector<TokenId>& sequence, std::vector<float>& logits,
                             const std::atomic<bool>* stop, KvDtype kv_dtype = KvDtype::F32) const;

 private:
  const LlamaModel& model_;
  std::size_t chunk_tokens_;
  ChunkRunner run_chunk_;
};

}  // namespace kvchat
