#pragma once
// Every conversation's Session (its KV cache) under one memory budget. The desktop app's engine
// thread, the CLI and a server share this one policy: a conversation's cache stays resident until the
// budget needs its memory, and then the least recently used conversation's cache goes first (its
// next turn rebuilds it by prefill, or from a snapshot). The conversation being served is never
// evicted, so the budget may be exceeded by at most that one session.
//
// Ownership: the pool owns its sessions; a reference from acquire() is valid until that id is
// forgotten or the pool is destroyed (eviction clears a session's cache, it does not destroy it).
// Not thread-safe: one thread (the engine's) uses it.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "engine/session.h"

namespace kvchat {

class SessionPool {
 public:
  using ConversationId = std::int64_t;

  struct Resident {
    ConversationId conversation = 0;
    std::int64_t tokens = 0;
    std::int64_t bytes = 0;
  };
  struct Evicted {
    ConversationId conversation = 0;
    std::int64_t bytes = 0;  // freed
  };

  explicit SessionPool(std::shared_ptr<const LlamaModel> model);

  // The conversation's session, made on first use; marks it the most recently used.
  Session& acquire(ConversationId conversation, KvCacheMode cache_mode);
  // Null when the conversation has no session (never used, or forgotten).
  Session* find(ConversationId conversation);
  // Drops the session (the conversation was deleted or its cache cleared).
  bool forget(ConversationId conversation);

  // Clears least recently used caches (never `active`'s) until the total is within `budget_bytes`
  // (0 = no budget). Returns what was evicted, oldest first.
  std::vector<Evicted> enforce_budget(std::int64_t budget_bytes, ConversationId active);

  // Sessions holding a cache, most recently used first.
  std::vector<Resident> resident() const;
  std::int64_t total_bytes() const;
  std::int64_t total_tokens() const;
  std::size_t size() const { return entries_.size(); }  // sessions, with a cache or not

 private:
  struct Entry {
    std::unique_ptr<Session> session;
    std::uint64_t last_used = 0;
  };
  std::shared_ptr<const LlamaModel> model_;
  std::map<ConversationId, Entry> entries_;
  std::uint64_t use_clock_ = 0;
};

}  // namespace kvchat
