#include "engine/generation/session.h"

#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/cache/kv_block_pool.h"
#include "engine/cache/kv_cache.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/cache/paged_kv_cache.h"
#include "engine/compute/compute_context.h"
#include "engine/generation/decode_batcher.h"
#include "engine/generation/draft.h"
#include "engine/generation/prefill.h"
#include "engine/model/llama_model.h"

namespace kvchat {

namespace {

// The one place GenerationStats is put together from the phases' results.
GenerationStats assemble_stats(std::size_t prompt_tokens, int reused_tokens, const RestoredPrefix& restored,
                               const PrefillResult& prefill, const DecodeResult& decode, const Session& session) {
  GenerationStats stats;
  stats.cache_mode = session.cache_mode();
  stats.kv_dtype = session.kv_dtype();
  stats.prompt_tokens = static_cast<int>(prompt_tokens);
  stats.reused_tokens = reused_tokens;
  // A fully restored prompt still re-runs its last token (for its logits): that one is not reused.
  stats.restored_tokens = static_cast<int>(std::min<std::int64_t>(restored.tokens, reused_tokens));
  stats.restore_ms = restored.milliseconds;
  stats.restored_from = restored.tokens > 0 ? restored.source : std::string();
  stats.prefilled_tokens = prefill.prefilled_tokens;
  stats.prefill_ms = prefill.milliseconds;
  if (prefill.prefilled_tokens > 0 && prefill.milliseconds > 0)
    stats.prefill_tokens_per_second = prefill.prefilled_tokens * 1000.0 / prefill.milliseconds;
  stats.generated_tokens = static_cast<int>(decode.generated.size());
  stats.ttft_ms = decode.ttft_ms;
  stats.decode_ms = decode.decode_ms;
  stats.decode_tokens_per_second = decode.decode_tokens_per_second;
  stats.stop_reason = decode.stop_reason;
  stats.drafted_tokens = decode.drafted_tokens;
  stats.accepted_tokens = decode.accepted_tokens;
  stats.draft_checks = decode.draft_checks;
  stats.cache_tokens = session.cache_tokens();
  stats.cache_bytes = session.cache_bytes();
  stats.cache_capacity_tokens = session.cache_capacity_tokens();
  return stats;
}

}  // namespace

Session::Session(std::shared_ptr<const LlamaModel> model, KvCacheMode cache_mode)
    : model_(std::move(model)), cache_mode_(cache_mode) {
  if (!model_) throw std::invalid_argument("Session needs a model");
  cache_ = make_kv_cache(cache_mode_, model_->cache_shape());
}

std::unique_ptr<KvCache> Session::make_cache() const {
  const KvCacheShape shape = model_->cache_shape(kv_dtype_);
  if (block_pool_ && cache_mode_ == KvCacheMode::Contiguous && block_pool_->shape().dtype == kv_dtype_ &&
      PagedKvCache::accepts(shape))
    return std::make_unique<PagedKvCache>(*block_pool_);
  return make_kv_cache(cache_mode_, shape);
}

void Session::set_block_pool(std::shared_ptr<KvBlockPool> pool) {
  if (pool) {
    const KvCacheShape &have = pool->shape(), want = model_->cache_shape(have.dtype);
    if (have.layers != want.layers || have.kv_heads != want.kv_heads || have.head_dim != want.head_dim)
      throw std::invalid_argument("Session: the block pool's shape is not this model's");
  }
  cache_.reset();  // before the pool it may live in
  block_pool_ = std::move(pool);
  clear();
}

bool Session::paged() const { return dynamic_cast<const PagedKvCache*>(cache_.get()) != nullptr; }

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

std::int64_t Session::cache_tokens() const { return cache_ ? cache_->size() : 0; }
std::int64_t Session::cache_bytes() const { return cache_ ? cache_->bytes() : 0; }
std::int64_t Session::cache_capacity_tokens() const { return cache_ ? cache_->capacity() : 0; }

void Session::set_cache_mode(KvCacheMode mode, KvDtype dtype) {
  if (mode == cache_mode_ && dtype == kv_dtype_) return;
  cache_mode_ = mode;
  kv_dtype_ = dtype;
  clear();
}

std::int64_t Session::copy_prefix_from(const Session& source, std::int64_t tokens) {
  if (&source == this) return 0;
  tokens = std::clamp<std::int64_t>(tokens, 0, static_cast<std::int64_t>(source.history_.size()));
  if (!cache_ || !source.cache_ || tokens == 0) return 0;
  if (!source.cache_->holds_every_position()) return 0;  // a sliding layer dropped rows: prefill instead
  const KvCacheShape &from = source.cache_->shape(), &to = cache_->shape();
  if (from.layers != to.layers || from.kv_heads != to.kv_heads || from.head_dim != to.head_dim ||
      from.dtype != to.dtype)
    throw std::invalid_argument("copy_prefix_from: the sessions' caches have different shapes");
  // Two caches in one block pool: the prefix's blocks are shared, not copied (the block it ends in is copied when
  // either side writes into it).
  const auto* paged_source = dynamic_cast<const PagedKvCache*>(source.cache_.get());
  if (paged_source && paged() && block_pool_ == source.block_pool_) {
    std::unique_ptr<PagedKvCache> forked = paged_source->fork();
    forked->truncate(tokens);
    cache_ = std::move(forked);
    history_.assign(source.history_.begin(), source.history_.begin() + tokens);
    return tokens;
  }
  // The cache's buffers may have been made under inference mode (a generation grew them), and such
  // tensors may be written only under it.
  c10::InferenceMode inference_guard;
  cache_->truncate(0);
  for (std::int64_t layer = 0; layer < to.layers; ++layer) {
    const auto [keys, values] = source.cache_->view(layer, tokens);
    cache_->append(layer, keys, values);
  }
  cache_->commit(tokens);
  history_.assign(source.history_.begin(), source.history_.begin() + tokens);
  return tokens;
}

void Session::truncate(std::int64_t tokens) {
  tokens = std::clamp<std::int64_t>(tokens, 0, static_cast<std::int64_t>(history_.size()));
  if (cache_) tokens = cache_->truncate(tokens);  // 0 where a sliding layer no longer holds that window
  history_.resize(static_cast<std::size_t>(tokens));
}

void Session::clear() {
  cache_.reset();  // releases the old buffers (or blocks) first
  cache_ = make_cache();
  history_.clear();
}

std::int64_t Session::context_limit(const GenerationConfig& config) const {
  const std::int64_t model_limit = model_->config().max_position_embeddings;
  return config.context_limit > 0 ? std::min<std::int64_t>(config.context_limit, model_limit) : model_limit;
}

int Session::keep_common_prefix(const std::vector<TokenId>& prompt) {
  std::size_t common = 0;
  while (common < history_.size() && common < prompt.size() && history_[common] == prompt[common]) ++common;
  if (common == prompt.size()) --common;  // a fully cached prompt re-runs its last token for its logits
  truncate(static_cast<std::int64_t>(common));
  return static_cast<int>(history_.size());
}

std::unique_ptr<KvSnapshot> Session::capture() const {
  if (!cache_ || history_.empty()) return nullptr;
  // A sliding layer that dropped its older rows cannot give back the whole prefix a snapshot stands for.
  if (!cache_->holds_every_position()) {
    spdlog::debug("no snapshot: the sliding-window layers hold only the last {} positions", cache_->shape().window(0));
    return nullptr;
  }
  return std::make_unique<KvSnapshot>(capture_snapshot(*cache_, history_));
}

RestoredPrefix Session::restore_prefix(const std::vector<TokenId>& prompt) {
  if (!restorer_ || !cache_) return {};
  std::size_t common = 0;
  while (common < history_.size() && common < prompt.size() && history_[common] == prompt[common]) ++common;
  try {
    const RestoredPrefix restored = restorer_->restore(prompt, static_cast<std::int64_t>(common), *cache_);
    if (restored.tokens <= static_cast<std::int64_t>(common)) return {};
    history_.assign(prompt.begin(), prompt.begin() + restored.tokens);
    return restored;
  } catch (const std::exception& error) {
    // A restore that failed half way leaves a cache that matches nothing: start from scratch.
    spdlog::error("restoring a cached prefix failed, prefilling instead: {}", error.what());
    clear();
    return {};
  }
}

Drafter* Session::drafter_for(const SpeculativeConfig& config) {
  const SpeculativeConfig& made_for = drafter_config_;
  const bool same = drafter_ && made_for.mode == config.mode && made_for.draft_model == config.draft_model &&
                    made_for.max_ngram == config.max_ngram && made_for.min_ngram == config.min_ngram;
  if (!same || made_for.draft_tokens != config.draft_tokens) {
    drafter_ = make_drafter(config, *model_, compute_);  // checks every setting
    drafter_config_ = config;
  }
  return drafter_.get();
}

void Session::set_decode_batcher(std::shared_ptr<DecodeBatcher> batcher) {
  if (batcher && &batcher->model() != model_.get())
    throw std::invalid_argument("Session: the decode batcher serves another model");
  batcher_ = std::move(batcher);
}

GenerationResult Session::generate(const std::vector<TokenId>& prompt, const GenerationConfig& config,
                                   const std::atomic<bool>* stop, const TokenCallback& on_token,
                                   const BeforePrefillChunk& before_prefill_chunk) {
  // The guard belongs to the thread that runs the model, so it is made here, not at load.
  c10::InferenceMode inference_guard;
  const ComputeScope compute_scope(compute_.get());
  const ModelConfig& model_config = model_->config();
  const std::int64_t limit = context_limit(config);
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (static_cast<std::int64_t>(prompt.size()) > limit)
    throw std::invalid_argument(
        "the prompt has " + std::to_string(prompt.size()) + " tokens, more than " +
        (limit == model_config.max_position_embeddings ? "the model's context" : "the context limit") + " of " +
        std::to_string(limit));
  model_->check_files_unchanged();
  set_cache_mode(config.cache_mode, config.kv_dtype);
  const auto started = std::chrono::steady_clock::now();
  const std::int64_t vocab_size = model_config.vocab_size;
  std::vector<float>& logits = decode_context_.logits;
  logits.resize(static_cast<std::size_t>(vocab_size));

  // With the cache on and a batcher, decode steps are rows of shared steps and other model work takes turns with them.
  DecodeBatcher* batcher = cache_ && model_->rows_match_decode_steps() ? batcher_.get() : nullptr;
  ChunkRunner run_chunk;
  if (batcher) run_chunk = [batcher](const std::function<void()>& work) { batcher->exclusive(work); };

  // Prefill: only what the cache does not hold yet.
  const Prefiller prefiller(*model_, config.prefill_chunk_tokens, run_chunk);
  int reused_tokens = 0;
  RestoredPrefix restored;
  PrefillResult prefill;
  std::vector<TokenId> sequence;  // the uncached path's whole sequence
  if (cache_) {
    // Room for the prompt and the reply ahead of time (a bounded share of a long one): otherwise the first decode
    // step after a prompt that filled the buffer copies the whole cache into one twice its size. Unused room is
    // address space only; the pages are touched as positions are written.
    cache_->reserve(std::min<std::int64_t>(
        limit, static_cast<std::int64_t>(prompt.size()) + std::min(config.max_new_tokens, kReservedReplyTokens)));
    restored = restore_prefix(prompt);
    reused_tokens = keep_common_prefix(prompt);
    BeforePrefillChunk before_chunk;
    if (before_prefill_chunk)
      before_chunk = [&](std::int64_t cached_tokens) {
        history_.assign(prompt.begin(), prompt.begin() + cached_tokens);  // what the cache holds so far
        before_prefill_chunk(cached_tokens);
      };
    prefill = prefiller.run(prompt, *cache_, logits, stop, before_chunk);
    history_.assign(prompt.begin(), prompt.begin() + cache_->size());
  } else {
    sequence = prompt;
    if (before_prefill_chunk) before_prefill_chunk(0);
    prefill = prefiller.run_uncached(sequence, logits, stop, kv_dtype_);
  }

  // Decode: one token per step, through the cache, or by recomputing the whole sequence (O(n^2)).
  DecodeResult decode;
  if (prefill.complete) {
    // The context limit bounds the reply whatever max_new_tokens says.
    const std::size_t total = static_cast<std::size_t>(
        std::min<std::int64_t>(limit, static_cast<std::int64_t>(prompt.size()) + std::max(0, config.max_new_tokens)));
    TokenGenerator::FeedToken feed;
    std::optional<DecodeBatcher::Member> member;  // in the batch from the first decode step to the last
    if (batcher) member.emplace(*batcher);
    if (member) {
      history_.reserve(total);
      feed = [this, &member](TokenId token, std::int64_t position) {
        if (position != cache_->size()) throw std::logic_error("decode: a step out of place in a batched session");
        member->decode(token, *cache_, decode_context_.logits);
        history_.push_back(token);
        return decode_context_.logits.data();
      };
    } else if (cache_) {
      history_.reserve(total);
      feed = [this](TokenId token, std::int64_t position) {
        model_->decode(token, position, *cache_, decode_context_);
        history_.push_back(token);
        return decode_context_.logits.data();
      };
    } else {
      sequence.reserve(total);
      feed = [&](TokenId token, std::int64_t) {
        sequence.push_back(token);
        copy_logits(model_->forward(sequence, 0, nullptr, false, kv_dtype_), logits);
        return logits.data();
      };
    }
    // Speculative decoding needs a cache to roll back and rows computed as decode steps compute them; without
    // either, plain decoding gives the same tokens.
    Drafter* drafter = drafter_for(config.speculative);
    DraftChecking checking;
    if (drafter && cache_ && model_->rows_match_decode_steps()) {
      checking.drafter = drafter;
      checking.max_draft_tokens = config.speculative.draft_tokens;
      checking.feed_rows = [this, &member](const TokenId* tokens, int count, std::int64_t position) {
        const auto rows = [&] { model_->decode_rows(tokens, count, position, *cache_, decode_context_); };
        if (member)
          member->exclusive(rows);
        else
          rows();
        history_.insert(history_.end(), tokens, tokens + count);
        return static_cast<const float*>(decode_context_.row_logits.data());
      };
      checking.keep = [this](std::int64_t positions) {
        if (cache_->truncate(positions) != positions)
          throw std::logic_error("speculative decoding: the cache could not keep its first " +
                                 std::to_string(positions) + " positions");
        history_.resize(static_cast<std::size_t>(positions));
      };
    }
    const auto& stop_ids = config.stop_token_ids.empty() ? model_config.eos_token_ids : config.stop_token_ids;
    const TokenGenerator generator(config, stop_ids, limit);
    decode = generator.run(prompt, logits.data(), vocab_size, feed, stop, on_token, started,
                           checking.drafter ? &checking : nullptr);
  }

  GenerationResult result;
  result.stats = assemble_stats(prompt.size(), reused_tokens, restored, prefill, decode, *this);
  result.generated = std::move(decode.generated);
  const GenerationStats& stats = result.stats;
  spdlog::debug(
      "generate: {} prompt tokens ({} reused, {} of them restored from disk in {:.1f} ms; {} prefilled in {:.1f} ms), "
      "{} generated at {:.1f} tok/s ({} of {} proposed tokens accepted), stop: {}",
      stats.prompt_tokens, stats.reused_tokens, stats.restored_tokens, stats.restore_ms, stats.prefilled_tokens,
      stats.prefill_ms, stats.generated_tokens, stats.decode_tokens_per_second, stats.accepted_tokens,
      stats.drafted_tokens, to_string(stats.stop_reason));
  return result;
}

}  // namespace kvchat
