#pragma once
// One conversation: its token history and its KV cache. After every call history().size() equals
// the number of tokens the cache holds (when the cache is on).
//
// Ownership: a Session shares the (immutable) model and owns its cache. It is used from one thread
// at a time (the engine worker); the stop flag is the only thing other threads touch.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/types.h"

namespace kvchat {

class LlamaModel;
class KvCache;

struct GenerationResult {
  std::vector<TokenId> generated;  // sampled tokens, the stop token included when the reason is Eos
  GenerationStats stats;
};

// Called with each new token as soon as it is sampled. Runs on the generating thread.
using TokenCallback = std::function<void(TokenId token)>;

class Session {
 public:
  Session(std::shared_ptr<const LlamaModel> model, KvCacheMode cache_mode);
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // Continues the conversation whose full token sequence is `prompt` (every turn so far). Keeps the
  // longest common prefix of `prompt` and history() in the cache, prefills only the rest (in chunks,
  // checking `stop` between them), then samples up to config.max_new_tokens tokens. The cache mode
  // of `config` applies from this call on (switching drops the cache).
  // `stop` may be null. Throws std::invalid_argument for an empty prompt or one longer than the context.
  GenerationResult generate(const std::vector<TokenId>& prompt, const GenerationConfig& config,
                            const std::atomic<bool>* stop = nullptr, const TokenCallback& on_token = {});

  const std::vector<TokenId>& history() const { return history_; }  // tokens the cache holds
  std::int64_t cache_tokens() const;
  std::int64_t cache_bytes() const;
  std::int64_t cache_capacity_tokens() const;
  KvCacheMode cache_mode() const { return cache_mode_; }
  const LlamaModel& model() const { return *model_; }

  void truncate(std::int64_t tokens);  // keep the first `tokens` cached positions
  void clear();                        // drop the cache and its memory (e.g. evicted under a budget)

 private:
  void set_cache_mode(KvCacheMode mode);

  std::shared_ptr<const LlamaModel> model_;
  KvCacheMode cache_mode_;
  std::unique_ptr<KvCache> cache_;  // null when the cache is off
  std::vector<TokenId> history_;
  std::vector<float> logits_;  // the last step's logits [vocab], reused by every step
};

}  // namespace kvchat
