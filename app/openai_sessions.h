#pragma once
// The server's sessions: which KV cache a request runs on, how many run at once, and the generation
// itself. Requests carry no conversation id (an OpenAI client sends the whole conversation every time),
// so a request runs on the idle session whose conversation its prompt continues furthest: a multi-turn
// client then prefills only its new turn. At most `parallel` requests generate at once, each on its own
// session (a session serves one request at a time); up to `max_queue` more wait for a slot, and any
// beyond that are refused at once (429) rather than left waiting.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "app/chat_turn_runner.h"
#include "app/openai_protocol.h"
#include "engine/session_pool.h"

namespace kvchat {
struct LoadedModel;
}

namespace kvchat::app::openai {

// Called with each piece of reply text as it is produced, and with "" after a token that completed no
// text; returns false when the client is gone (the generation then stops within a token).
using TextSink = std::function<bool(const std::string& text)>;

class ServerSessions {
 public:
  struct Entry;
  // A slot and a session held by one request until it is destroyed.
  class Lease {
   public:
    Lease(ServerSessions* owner, Entry* entry) : owner_(owner), entry_(entry) {}
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Entry& entry() const { return *entry_; }

   private:
    ServerSessions* owner_;
    Entry* entry_;
  };

  // `snapshots` may be null (no --cache-dir). `model` must outlive this.
  ServerSessions(const LoadedModel& model, std::shared_ptr<SnapshotStore> snapshots, int parallel, int max_queue);
  ~ServerSessions();

  // Waits for a free slot (ApiError 429 when `max_queue` requests already wait), then takes the idle
  // session whose conversation the rendered chat continues furthest (known turn boundaries), or whose
  // cached ids share the longest prefix with `prompt_ids` for a raw prompt.
  std::unique_ptr<Lease> acquire_for_chat(const std::vector<ChatMessage>& messages);
  std::unique_ptr<Lease> acquire_for_prompt(const std::vector<TokenId>& prompt_ids);

  // Renders and encodes the messages on the lease's session's known ids; ApiError 400 when the prompt
  // leaves no room in the context window.
  std::vector<TokenId> check_chat_prompt(const Lease& lease, const std::vector<ChatMessage>& messages) const;
  std::vector<TokenId> encode_prompt(const std::string& prompt) const;  // ApiError 400 when it does not fit

  // Generate on the lease's session, streaming text through `sink`. `stopped_by_client` is set when the
  // sink refused text.
  CompletionResult run_chat(const Lease& lease, const std::vector<ChatMessage>& messages, const SamplingRequest& request,
                            const TextSink& sink, bool* stopped_by_client);
  CompletionResult run_prompt(const Lease& lease, const std::vector<TokenId>& prompt_ids,
                              const SamplingRequest& request, const TextSink& sink, bool* stopped_by_client);

  int context_limit() const;

 private:
  void restore_transcripts();
  Entry* add_entry();
  void wait_for_slot(std::unique_lock<std::mutex>& lock);
  Entry* pick(const std::function<std::size_t(const Entry&)>& shared_tokens);
  void release(Entry* entry);
  GenerationConfig generation_config(const SamplingRequest& request) const;

  const LoadedModel& model_;
  ChatTurnRunner runner_;
  const int parallel_;
  const int max_queue_;
  const std::size_t max_sessions_;
  std::mutex mutex_;  // guards everything below and every call into pool_
  std::condition_variable slot_freed_;
  int running_ = 0;
  int waiting_ = 0;
  SessionPool pool_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::uint64_t use_clock_ = 0;
};

}  // namespace kvchat::app::openai
