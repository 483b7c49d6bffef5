#include "engine/session_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kvchat {

SessionPool::SessionPool(std::shared_ptr<const LlamaModel> model) : model_(std::move(model)) {}

Session& SessionPool::acquire(ConversationId conversation, KvCacheMode cache_mode) {
  Entry& entry = entries_[conversation];
  entry.last_used = ++use_clock_;
  if (!entry.session) entry.session = std::make_unique<Session>(model_, cache_mode);
  return *entry.session;
}

Session* SessionPool::find(ConversationId conversation) {
  auto it = entries_.find(conversation);
  return it == entries_.end() ? nullptr : it->second.session.get();
}

bool SessionPool::forget(ConversationId conversation) { return entries_.erase(conversation) != 0; }

std::vector<SessionPool::Evicted> SessionPool::enforce_budget(std::int64_t budget_bytes, ConversationId active) {
  std::vector<Evicted> evicted;
  std::int64_t total = total_bytes();
  if (budget_bytes <= 0 || total <= budget_bytes) return evicted;
  std::vector<std::pair<std::uint64_t, ConversationId>> by_age;  // (last used, conversation)
  for (const auto& [conversation, entry] : entries_)
    if (conversation != active && entry.session->cache_bytes() > 0) by_age.emplace_back(entry.last_used, conversation);
  std::sort(by_age.begin(), by_age.end());
  for (const auto& [last_used, conversation] : by_age) {
    if (total <= budget_bytes) break;
    Session& session = *entries_[conversation].session;
    const std::int64_t freed = session.cache_bytes();
    session.clear();  // the caller's token history stays: a later turn rebuilds the same cache
    total -= freed;
    evicted.push_back({conversation, freed});
    spdlog::info("cache budget {} bytes: evicted conversation {} ({} bytes)", budget_bytes, conversation, freed);
  }
  if (total > budget_bytes)
    spdlog::warn("the active conversation's cache alone ({} bytes) exceeds the budget of {} bytes", total, budget_bytes);
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
