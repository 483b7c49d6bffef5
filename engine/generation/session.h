#pragma once
// One conversation's run state: its token history and its KV cache. A generation is two phases, each
// its own class: the Prefiller (prompt tokens the cache lacks) and the TokenGenerator (one token per
// step); the Session matches the prompt against what it holds, runs them and assembles the stats.
//
// Ownership: a Session shares the (immutable) model and owns its cache and its decode buffers. It is
// used from one thread at a time (the engine worker); the stop flag is the only thing other threads
// touch. After every call history().size() equals the number of tokens the cache holds (when on).
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/generation/prefill.h"
#include "engine/generation/token_generator.h"
#include "engine/model/decode_context.h"
#include "engine/types.h"

namespace kvchat {

class LlamaModel;
class KvCache;
class Drafter;
class DecodeBatcher;
class KvBlockPool;
class ComputeContext;
struct KvSnapshot;

// Supplies a cached prefix from outside the session's memory: the SessionPool's snapshots on disk.
struct RestoredPrefix {
  std::int64_t tokens = 0;    // the cache now holds prompt[0, tokens); 0 = nothing was restored
  double milliseconds = 0.0;  // reading, checking and copying
  std::string source;         // where it came from (a snapshot's name)
};
class PrefixRestorer {
 public:
  virtual ~PrefixRestorer() = default;
  // Called before a prefill with the prompt and how many of its first tokens `cache` already holds.
  // Either leaves `cache` untouched and returns tokens 0, or replaces its contents with a longer prefix
  // of `prompt` (token ids compared exactly, K/V validated) and returns its length.
  virtual RestoredPrefix restore(const std::vector<TokenId>& prompt, std::int64_t cached_tokens, KvCache& cache) = 0;
};

struct GenerationResult {
  std::vector<TokenId> generated;  // sampled tokens, the stop token included when the reason is Eos
  GenerationStats stats;
};

class Session {
 public:
  Session(std::shared_ptr<const LlamaModel> model, KvCacheMode cache_mode);
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // Continues the conversation whose full token sequence is `prompt` (every turn so far). The one
  // place a prompt is matched against the cache: the longest common prefix of `prompt` and history()
  // stays cached (token ids compared exactly), only the rest is prefilled; then up to
  // config.max_new_tokens tokens are sampled. The last sampled token is never fed, so after a stop on
  // an end-of-sequence id the cache ends with the reply's last real token: the next turn's prompt
  // continues from there. The cache mode of `config` applies from this call on (switching drops the
  // cache), and so does its KV dtype. `stop` may be null. Throws std::invalid_argument for an empty prompt or one
  // longer than the context limit. `before_prefill_chunk` runs on this thread before each prefill chunk (history() then
  // holds the prompt's ids the cache holds so far): a long prompt's prefill can be stopped part way
  // through by setting `stop` there, and another session may copy the prefix prefilled so far.
  GenerationResult generate(const std::vector<TokenId>& prompt, const GenerationConfig& config,
                            const std::atomic<bool>* stop = nullptr, const TokenCallback& on_token = {},
                            const BeforePrefillChunk& before_prefill_chunk = {});

  // The context this session computes with (its threads, kernels and pool), entered on the calling thread
  // for the length of each generate(); null: the process-wide settings. Shared, not owned alone: the
  // sessions of one pool or server use one context.
  void set_compute_context(std::shared_ptr<const ComputeContext> context) { compute_ = std::move(context); }
  const std::shared_ptr<const ComputeContext>& compute_context() const { return compute_; }

  // Continuous batching with the other sessions of `batcher` (null: none): while the cache is on, this session's
  // decode steps run as rows of the batcher's steps and its prefill chunks and speculative checks between them,
  // giving the same tokens. Throws std::invalid_argument for a batcher of another model. Not during generate().
  void set_decode_batcher(std::shared_ptr<DecodeBatcher> batcher);
  const std::shared_ptr<DecodeBatcher>& decode_batcher() const { return batcher_; }

  // Keeps this session's cache in `pool`'s blocks (null: a contiguous cache of its own), from now on (the cache is
  // dropped). Sessions of one pool hold a copied prefix once (copy_prefix_from shares its blocks) and share the pool's
  // block budget: a step past it throws std::length_error (nothing is written then). Only for the cache mode
  // Contiguous, a pool of this model's shape and KV dtype, and a model without sliding-window layers; other
  // configurations keep a contiguous cache. The pool is shared: it lives while a session uses it.
  void set_block_pool(std::shared_ptr<KvBlockPool> pool);
  bool paged() const;

  const std::vector<TokenId>& history() const { return history_; }  // tokens the cache holds
  std::int64_t cache_tokens() const;
  std::int64_t cache_bytes() const;
  std::int64_t cache_capacity_tokens() const;
  KvCacheMode cache_mode() const { return cache_mode_; }
  KvDtype kv_dtype() const { return kv_dtype_; }
  const LlamaModel& model() const { return *model_; }

  // Not owned; null for none. Consulted by generate() whenever the cache is on.
  void set_prefix_restorer(PrefixRestorer* restorer) { restorer_ = restorer; }
  // A copy of the cache's positions and their ids, for a snapshot (null when nothing is cached).
  std::unique_ptr<KvSnapshot> capture() const;

  // Replaces this session's cache with a copy of `source`'s first `tokens` cached positions and their ids
  // (a branch: another conversation sharing that prefix continues from it without prefilling it).
  // Returns how many positions were copied (fewer when `source` holds fewer; 0 when either cache is
  // off). Not while either session generates on another thread: the caller serialises them.
  std::int64_t copy_prefix_from(const Session& source, std::int64_t tokens);

  void truncate(std::int64_t tokens);  // keep the first `tokens` cached positions
  void clear();                        // drop the cache and its memory (e.g. evicted under a budget)

 private:
  void set_cache_mode(KvCacheMode mode, KvDtype dtype);
  // A new, empty cache for the mode and dtype: paged where set_block_pool allows it.
  std::unique_ptr<KvCache> make_cache() const;
  std::int64_t context_limit(const GenerationConfig& config) const;
  // At most this many positions of a reply are reserved in the cache before its prompt runs.
  static constexpr int kReservedReplyTokens = 1024;
  // Keeps the prompt's longest common prefix with history() (at least one token left to run, since
  // logits come from running one); returns how many tokens were reused.
  int keep_common_prefix(const std::vector<TokenId>& prompt);
  // Asks the restorer for a longer prefix of `prompt` than the cache holds; never throws.
  RestoredPrefix restore_prefix(const std::vector<TokenId>& prompt);

  // The proposer of speculative decoding for `config` (null for none): kept from one generate() to the next,
  // so that a draft model's cache follows the conversation instead of prefilling it again every turn.
  Drafter* drafter_for(const SpeculativeConfig& config);

  std::shared_ptr<const LlamaModel> model_;
  KvCacheMode cache_mode_;
  KvDtype kv_dtype_ = KvDtype::F32;
  std::shared_ptr<KvBlockPool> block_pool_;  // before cache_: a paged cache must go before its pool
  std::unique_ptr<KvCache> cache_;           // null when the cache is off
  std::vector<TokenId> history_;
  DecodeContext decode_context_;  // decode steps' buffers and the current logits, reused by every step
  PrefixRestorer* restorer_ = nullptr;
  std::shared_ptr<const ComputeContext> compute_;
  std::unique_ptr<Drafter> drafter_;
  SpeculativeConfig drafter_config_;  // what drafter_ was made for
  std::shared_ptr<DecodeBatcher> batcher_;
};

}  // namespace kvchat
