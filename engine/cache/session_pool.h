#pragma once
// Every conversation's Session (its KV cache) under one memory budget. The desktop app's engine
// thread, the CLI and a server share this one policy: a conversation's cache stays resident until the
// budget needs its memory, and then the least recently used conversation's cache goes first (its
// next turn rebuilds it by prefill, or from a snapshot). The conversation being served is never
// evicted, so the budget may be exceeded by at most that one session.
//
// With a SnapshotStore, a conversation's cache also lives on disk: save_snapshot() after each reply and
// every eviction hand a copy to the store (written on its thread), and a session whose cache lacks a
// prompt's prefix gets it restored from the snapshot sharing the longest prefix with the prompt, of
// this conversation or any other of the same model (a shared system prompt, a branched chat).
//
// Ownership: the pool owns its sessions; a reference from acquire() is valid until that id is
// forgotten or the pool is destroyed (eviction clears a session's cache, it does not destroy it).
// Not thread-safe: one thread at a time uses it (the engine's; a server's under its own lock).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/cache/snapshot_store.h"
#include "engine/generation/session.h"

namespace kvchat {

class ComputeContext;

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

  // `snapshots` may be null (memory only). Snapshot keys are `key_prefix`-<conversation id>: the
  // prefix tells apart conversations of different databases sharing one snapshot folder.
  explicit SessionPool(std::shared_ptr<const LlamaModel> model, std::shared_ptr<SnapshotStore> snapshots = nullptr,
                       std::string key_prefix = "c");
  ~SessionPool();
  SessionPool(const SessionPool&) = delete;
  SessionPool& operator=(const SessionPool&) = delete;

  // The context every session of the pool computes with, from its next generate() on (null: the
  // process-wide settings). Not while one of them generates on another thread.
  void set_compute_context(std::shared_ptr<const ComputeContext> context);

  // The conversation's session, made on first use; marks it the most recently used.
  Session& acquire(ConversationId conversation, KvCacheMode cache_mode);
  // Null when the conversation has no session (never used, or forgotten).
  Session* find(ConversationId conversation);
  // Drops the session and its snapshot (the conversation was deleted, or its cached state cleared).
  bool forget(ConversationId conversation);
  // Drops every session and every snapshot in the snapshot folder.
  void forget_all();

  // Hands a copy of the conversation's cache to the snapshot store, unless the newest one it was given
  // holds the same tokens. Returns whether a snapshot was queued.
  bool save_snapshot(ConversationId conversation);
  SnapshotStore* snapshots() const { return snapshots_.get(); }
  std::string snapshot_key(ConversationId conversation) const;
  // A snapshot is restored only when it gives at least this many more tokens than the cache holds
  // (reading a file to save a handful of prefill steps is not worth it).
  void set_minimum_restore_tokens(std::int64_t tokens) { minimum_restore_tokens_ = tokens; }

  // Clears least recently used caches (never `active`'s) until the total is within `budget_bytes`
  // (0 = no budget). Returns what was evicted, oldest first.
  std::vector<Evicted> enforce_budget(std::int64_t budget_bytes, ConversationId active);
  // For a caller that runs several sessions at once on other threads (a server): the `in_use` sessions
  // are neither evicted nor read (another thread may be growing their caches); `in_use_bytes`, the
  // caller's figure for them, counts toward the budget instead.
  std::vector<Evicted> enforce_budget(std::int64_t budget_bytes, const std::vector<ConversationId>& in_use,
                                      std::int64_t in_use_bytes);

  // Sessions holding a cache, most recently used first.
  std::vector<Resident> resident() const;
  std::int64_t total_bytes() const;
  std::int64_t total_tokens() const;
  std::size_t size() const { return entries_.size(); }  // sessions, with a cache or not

 private:
  struct Entry {
    std::unique_ptr<Session> session;
    std::uint64_t last_used = 0;
    std::vector<TokenId> saved_tokens;  // of the newest snapshot handed to the store
  };
  class Restorer;
  std::shared_ptr<const LlamaModel> model_;
  std::shared_ptr<const ComputeContext> compute_;
  std::shared_ptr<SnapshotStore> snapshots_;
  std::string key_prefix_;
  std::unique_ptr<Restorer> restorer_;
  std::int64_t minimum_restore_tokens_ = 16;
  std::map<ConversationId, Entry> entries_;
  std::uint64_t use_clock_ = 0;
};

}  // namespace kvchat
