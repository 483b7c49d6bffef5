#include "engine/cache/session_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

namespace kvchat {

// Restores a prompt's prefix from the store's best-matching snapshot.
class SessionPool::Restorer final : public PrefixRestorer {
 public:
  explicit Restorer(const SessionPool& pool) : pool_(pool) {}

  RestoredPrefix restore(const std::vector<TokenId>& prompt, std::int64_t cached_tokens, KvCache& cache) override {
    SnapshotStore* store = pool_.snapshots_.get();
    if (!store) return {};
    if (store->shape().dtype != cache.shape().dtype) {
      spdlog::warn("KV snapshots here hold {} caches; this conversation's cache is {}: none restored",
                   to_string(store->shape().dtype), to_string(cache.shape().dtype));
      return {};
    }
    const auto started = std::chrono::steady_clock::now();
    // Either source ends here: the cache holds the snapshot's first `common` positions, and the log says so.
    auto restore_from = [&](const KvCacheShape& shape, const std::vector<TokenId>& tokens, const HugePageBuffer& data,
                            std::int64_t common, const std::string& key, const char* where) {
      restore_snapshot(shape, tokens, data, common, cache);
      const double milliseconds =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
      spdlog::info("restored {} of {} prompt tokens from KV snapshot {} ({}) in {:.1f} ms ({} bytes)", common,
                   prompt.size(), key, where, milliseconds, data.size());
      return RestoredPrefix{common, milliseconds, key};
    };
    std::int64_t wanted = cached_tokens + std::max<std::int64_t>(pool_.minimum_restore_tokens_, 1);
    // A snapshot saved but not yet on disk: as good as its file will be, and read from memory.
    const std::optional<SnapshotStore::PendingMatch> pending = store->best_pending_match(prompt, wanted);
    if (pending) wanted = pending->tokens + 1;  // a file must do better
    // A rejected file is deleted by the store, so the next lookup finds the next best one.
    for (int attempt = 0; attempt < 4; ++attempt) {
      const std::optional<SnapshotStore::Match> match = store->best_match(prompt, wanted);
      if (!match) break;
      const std::optional<LoadedSnapshot> loaded = store->load(*match);
      if (!loaded) continue;
      // The ids are compared again on what was read (the file may have been replaced since it was listed).
      const std::vector<TokenId>& tokens = loaded->header.tokens;
      std::int64_t common = 0;
      while (common < static_cast<std::int64_t>(std::min(tokens.size(), prompt.size())) &&
             tokens[common] == prompt[common])
        ++common;
      common = std::min(common, cache.shape().max_tokens);
      if (common < wanted) continue;
      return restore_from(loaded->header.shape, tokens, loaded->data, common, match->key, "read from its file");
    }
    if (!pending) return {};
    const KvSnapshot& snapshot = *pending->snapshot;
    return restore_from(snapshot.shape, snapshot.tokens, snapshot.data,
                        std::min(pending->tokens, cache.shape().max_tokens), pending->key,
                        "not yet written, from memory");
  }

 private:
  const SessionPool& pool_;
};

SessionPool::SessionPool(std::shared_ptr<const LlamaModel> model, std::shared_ptr<SnapshotStore> snapshots,
                         std::string key_prefix)
    : model_(std::move(model)),
      snapshots_(std::move(snapshots)),
      key_prefix_(std::move(key_prefix)),
      restorer_(std::make_unique<Restorer>(*this)) {}

SessionPool::~SessionPool() = default;

std::string SessionPool::snapshot_key(ConversationId conversation) const {
  return key_prefix_ + "-" + std::to_string(conversation);
}

bool SessionPool::save_snapshot(ConversationId conversation) {
  auto it = entries_.find(conversation);
  if (!snapshots_ || it == entries_.end()) return false;
  Entry& entry = it->second;
  const Session& session = *entry.session;
  if (session.history().empty() || session.history() == entry.saved_tokens) return false;
  std::unique_ptr<KvSnapshot> snapshot = session.capture();
  if (!snapshot) return false;
  if (snapshot->shape.dtype != snapshots_->shape().dtype) {
    spdlog::info("conversation {}: its {} KV cache is not saved where snapshots hold {} caches", conversation,
                 to_string(snapshot->shape.dtype), to_string(snapshots_->shape().dtype));
    return false;
  }
  snapshots_->save(snapshot_key(conversation), std::move(*snapshot));
  entry.saved_tokens = session.history();
  return true;
}

void SessionPool::forget_all() {
  entries_.clear();
  if (snapshots_) snapshots_->remove_all();
}

void SessionPool::set_compute_context(std::shared_ptr<const ComputeContext> context) {
  compute_ = std::move(context);
  for (auto& [conversation, entry] : entries_) entry.session->set_compute_context(compute_);
}

Session& SessionPool::acquire(ConversationId conversation, KvCacheMode cache_mode) {
  Entry& entry = entries_[conversation];
  entry.last_used = ++use_clock_;
  if (!entry.session) {
    entry.session = std::make_unique<Session>(model_, cache_mode);
    entry.session->set_prefix_restorer(restorer_.get());
    entry.session->set_compute_context(compute_);
  }
  return *entry.session;
}

Session* SessionPool::find(ConversationId conversation) {
  auto it = entries_.find(conversation);
  return it == entries_.end() ? nullptr : it->second.session.get();
}

bool SessionPool::forget(ConversationId conversation) {
  if (snapshots_) snapshots_->remove(snapshot_key(conversation));
  return entries_.erase(conversation) != 0;
}

std::vector<SessionPool::Evicted> SessionPool::enforce_budget(std::int64_t budget_bytes, ConversationId active) {
  Session* session = find(active);
  return enforce_budget(budget_bytes, {active}, session ? session->cache_bytes() : 0);
}

std::vector<SessionPool::Evicted> SessionPool::enforce_budget(std::int64_t budget_bytes,
                                                              const std::vector<ConversationId>& in_use,
                                                              std::int64_t in_use_bytes) {
  std::vector<Evicted> evicted;
  if (budget_bytes <= 0) return evicted;
  auto used = [&](ConversationId conversation) {
    return std::find(in_use.begin(), in_use.end(), conversation) != in_use.end();
  };
  std::int64_t total = in_use_bytes;
  std::vector<std::pair<std::uint64_t, ConversationId>> by_age;  // (last used, conversation)
  for (const auto& [conversation, entry] : entries_) {
    if (used(conversation)) continue;
    const std::int64_t bytes = entry.session->cache_bytes();
    total += bytes;
    if (bytes > 0) by_age.emplace_back(entry.last_used, conversation);
  }
  if (total <= budget_bytes) return evicted;
  std::sort(by_age.begin(), by_age.end());
  for (const auto& [last_used, conversation] : by_age) {
    if (total <= budget_bytes) break;
    Session& session = *entries_[conversation].session;
    const std::int64_t freed = session.cache_bytes();
    save_snapshot(conversation);  // on disk, the next turn restores it instead of prefilling
    session.clear();              // the caller's token history stays: a later turn rebuilds the same cache
    total -= freed;
    evicted.push_back({conversation, freed});
    spdlog::info("cache budget {} bytes: evicted conversation {} ({} bytes)", budget_bytes, conversation, freed);
  }
  if (total > budget_bytes)
    spdlog::warn("the caches in use alone ({} bytes) exceed the budget of {} bytes", total, budget_bytes);
  return evicted;
}

std::vector<SessionPool::Resident> SessionPool::resident() const {
  std::vector<std::pair<std::uint64_t, Resident>> by_use;
  for (const auto& [conversation, entry] : entries_)
    if (entry.session->cache_tokens() > 0)
      by_use.push_back({entry.last_used, {conversation, entry.session->cache_tokens(), entry.session->cache_bytes()}});
  std::sort(by_use.begin(), by_use.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Resident> out;
  for (const auto& [last_used, resident] : by_use) out.push_back(resident);
  return out;
}

std::int64_t SessionPool::total_bytes() const {
  std::int64_t total = 0;
  for (const auto& [conversation, entry] : entries_) total += entry.session->cache_bytes();
  return total;
}

std::int64_t SessionPool::total_tokens() const {
  std::int64_t total = 0;
  for (const auto& [conversation, entry] : entries_) total += entry.session->cache_tokens();
  return total;
}

}  // namespace kvchat
