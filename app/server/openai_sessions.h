#pragma once
// The server's sessions: which KV cache a request runs on, how many run at once, and the generation
// itself. Requests carry no conversation id (an OpenAI client sends the whole conversation every time),
// so a request's prompt ids are its messages encoded whole, as a server that never saw the conversation
// would encode them: the prompt, and so the reply, is a function of the request and the model alone,
// whichever caches happen to be resident. What a cache holds is reused as far as its token ids equal the
// prompt's, and only the rest is prefilled: a multi-turn client's next turn continues its own session,
// and a request sharing a prefix with another conversation (a long system prompt, an edited last
// message) gets a copy of that prefix in a session of its own, leaving the other conversation's cache
// whole. When the session sharing the most is generating, the copy is made on its thread once its
// prefill holds the shared prefix (worth the wait only for at least one prefill chunk of tokens).
//
// At most `parallel` requests generate at once, each on its own session (a session serves one request at
// a time), their decode steps batched (DecodeBatcher: one pass over the weights computes the next token of
// every running request, each as it would be alone); up to `max_queue` more wait for a slot, and any beyond that are
// refused at once (429) rather than left waiting. A client that leaves is noticed before every prefill chunk and after
// every token, and its generation stops there. Once shut_down() is called, waiting and new requests are refused with
// 503 and running generations stop.
//
// Memory: the sessions' KV caches live in one SessionPool under a byte budget, counted in blocks of
// kBudgetBlockTokens positions. A request is admitted only when its reservation fits beside the running requests'
// and the caches being copied from: the bytes of its prompt and of its first kReplyReservationTokens reply tokens
// (fewer where max_tokens or the context allows fewer), in whole blocks. The least recently used idle caches are
// evicted to make room (with a cache folder their snapshots are written first, so a returning conversation restores
// instead of prefilling); a request that does not fit waits, first come first served, for running ones to finish, and
// one larger than the whole budget runs when no other does. A reply about to outgrow its reservation extends it by
// kReplyReservationTokens before its next step, evicting idle caches or waiting for a running request to finish; only
// when every other running request waits to extend too does it go on beyond the budget (counted: budget_overshoots),
// so that they never wait for each other. After every request its reservation gives way to what its cache holds.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "app/chat/chat_turn_runner.h"
#include "app/server/openai_protocol.h"
#include "engine/cache/session_pool.h"
#include "engine/generation/decode_batcher.h"
#include "engine/text/constraint/token_constraint.h"
#include "engine/text/tool_calls.h"

namespace kvchat {
struct LoadedModel;
}

namespace kvchat::app::openai {

// Called with each piece of reply text as it is produced, and with "" after a token that completed no
// text; returns false when the client is gone (the generation then stops within a token).
using TextSink = std::function<bool(const std::string& text)>;
// Called, when the request asked for logprobs, just before the text sink with the entries of the tokens
// that piece of text completes.
using LogprobSink = std::function<void(const std::vector<LogprobEntry>& entries)>;

class ServerSessions {
 public:
  // Reservations are whole blocks of this many positions, and a reply's are made and extended this many at a time.
  static constexpr std::int64_t kBudgetBlockTokens = 16;
  static constexpr std::int64_t kReplyReservationTokens = 8 * kBudgetBlockTokens;
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

  // `snapshots` may be null (no --cache-dir). `model` must outlive this. `budget_bytes` 0: no budget.
  ServerSessions(const LoadedModel& model, std::shared_ptr<SnapshotStore> snapshots, int parallel, int max_queue,
                 std::int64_t budget_bytes = 0);
  ~ServerSessions();
  // What every session computes with (SessionPool::set_compute_context); before the first request.
  void set_compute_context(std::shared_ptr<const ComputeContext> context) {
    compute_ = context;
    pool_.set_compute_context(std::move(context));
  }
  // Speculative decoding for every request (the same replies, sooner where they repeat the prompt); before
  // the first request.
  void set_speculative(const SpeculativeConfig& speculative) { speculative_ = speculative; }
  void set_kv_dtype(KvDtype dtype) { kv_dtype_ = dtype; }

  // A request's prompt ids: the messages rendered by the model's template (the generation prompt added)
  // and encoded whole, or the raw prompt encoded. ApiError 400 when the template refuses the messages,
  // or the prompt is empty or leaves no room in the context window.
  // `tools_json`: the request's tool definitions for the template ("" for none).
  std::vector<TokenId> encode_chat(const std::vector<ChatMessage>& messages, const std::string& tools_json = {}) const;
  // The chat template's format of tool calls (ToolCallFormat::None when it renders no tools).
  ToolCallFormat tool_call_format() const;
  // The served tokenizer's bytes for constrained decoding (LoadedModel::constraint_vocabulary: made once per model).
  std::shared_ptr<const ConstraintVocabulary> constraint_vocabulary() const;
  std::vector<TokenId> encode_prompt(const std::string& prompt) const;
  // A prompt given as token ids: checked against the vocabulary and the context limit (ApiError naming
  // 'prompt'), else returned as it is.
  std::vector<TokenId> checked_prompt_ids(std::vector<TokenId> ids) const;

  // Waits for a free slot (ApiError 429 when `max_queue` requests already wait) and for room in the budget for a
  // reply of at most `max_reply_tokens` (0: up to the context limit), then takes the session the prompt reuses the
  // most of (see above), copying a shared prefix into it first where that keeps another conversation's cache whole.
  std::unique_ptr<Lease> acquire_for_prompt(const std::vector<TokenId>& prompt_ids, int max_reply_tokens = 0);
  // The bytes a request reserves when it is admitted: its prompt and its first kReplyReservationTokens reply tokens
  // (at most `max_reply_tokens`, 0: up to the context limit), and the positions a speculative check writes beyond
  // them, in whole blocks.
  std::int64_t reservation_bytes(std::size_t prompt_tokens, int max_reply_tokens) const;

  // Generate on the lease's session, streaming text through `sink`. `stopped_by_client` is set when the
  // sink refused text or said the client is gone (then the prefill or the generation stopped there).
  // The result's logprobs are those of the tokens of its text (none of a stop text or an end-of-sequence
  // token), when the request asked for them.
  CompletionResult run(const Lease& lease, const std::vector<TokenId>& prompt_ids, const SamplingRequest& request,
                       const TextSink& sink, bool* stopped_by_client, const LogprobSink& logprob_sink = {});

  int context_limit() const;
  // The served model's architecture ("llama", "qwen3", "gemma2", ...).
  std::string architecture() const;
  // Prompt tokens a prefill runs at once (GenerationConfig's default unless set). Between chunks the
  // client is asked whether it is still there, and other requests get the prefix prefilled so far:
  // smaller chunks notice both sooner, at some cost in prefill speed. Set before serving.
  void set_prefill_chunk_tokens(int tokens);

  // Refuses waiting and new requests (503) and stops running generations; for a server going down.
  void shut_down();

  // What GET /health reports, and how sessions shared prefixes.
  struct Status {
    int running = 0;
    int waiting = 0;
    std::size_t sessions = 0;
    std::int64_t cache_bytes = 0;  // idle sessions' caches + running ones' as they were when they started
    std::int64_t budget_bytes = 0;
    std::int64_t reserved_bytes = 0;  // the running requests' reservations
    // The most the budget has counted at once so far: idle caches, reservations and caches being copied from.
    std::int64_t peak_bytes = 0;
    int waiting_for_memory = 0;               // requests holding a slot, waiting for room in the budget
    std::int64_t memory_waits = 0;            // requests that have waited for room in the budget so far
    std::int64_t reservation_extensions = 0;  // replies that outgrew their reservation and extended it
    std::int64_t budget_overshoots = 0;       // of those, extended past the budget (every other one waiting)
    std::int64_t evictions = 0;               // caches evicted under the budget so far
    int waiting_for_prefix = 0;               // requests waiting for a running one's prefill to copy its prefix
    std::int64_t prefix_copies = 0;           // prefixes copied from one session into another so far
    // Continuous batching (all zero with --parallel 1 or where the model's rows are not batched).
    std::int64_t batched_steps = 0, batched_rows = 0, largest_batch = 0;
  };
  Status status();

 private:
  struct PrefixRequest;
  struct Placement;
  Entry* add_entry();
  void wait_for_slot(std::unique_lock<std::mutex>& lock);
  // With mutex_ held: waits until `reservation` fits beside the running requests' (or none runs), then counts it.
  void wait_for_memory(std::unique_lock<std::mutex>& lock, std::int64_t reservation);
  // With mutex_ held: the bytes of busy entries (a running request's reservation, a copy source's cache).
  std::int64_t busy_bytes() const;
  // The rows a speculative check writes past its position before it knows how many stay (0 without one).
  std::int64_t draft_positions() const;
  // The positions a reservation covers for a prompt and a reply of at most `reply_tokens`, in whole blocks.
  std::int64_t reserved_positions(std::int64_t prompt_tokens, std::int64_t reply_tokens) const;
  // Those of a request's first reservation: its prompt and its first kReplyReservationTokens reply tokens (at most
  // `max_reply_tokens`, 0: no limit).
  std::int64_t first_reserved_positions(std::size_t prompt_tokens, int max_reply_tokens) const;
  // On the request's thread, before a step that would write past its reservation.
  void extend_reservation(Entry& entry, std::int64_t needed_positions);
  Placement place(const std::vector<TokenId>& prompt_ids, PrefixRequest& request, std::int64_t reservation,
                  std::int64_t reserved_positions, std::int64_t reply_limit_positions);
  Entry* spare_entry(const Entry* keep);
  std::int64_t copy_prefix(Entry& destination, const Entry& source, const std::vector<TokenId>& prompt_ids);
  void serve_prefix_requests(Entry& source, bool prefill_done);
  void finish_use(Entry& entry, std::unique_lock<std::mutex>& lock);
  void release(Entry* entry);
  void enforce_budget();  // with mutex_ held
  // The batcher every session decodes through, made with the first session (the compute context decides whether
  // the model's rows are batched); null for one request at a time.
  std::shared_ptr<DecodeBatcher> decode_batcher();
  void check_not_shutting_down() const;
  GenerationConfig generation_config(const SamplingRequest& request) const;

  const LoadedModel& model_;
  ChatTurnRunner runner_;
  const int parallel_;
  const int max_queue_;
  const std::size_t max_sessions_;
  const std::int64_t budget_bytes_;
  int prefill_chunk_tokens_;
  SpeculativeConfig speculative_;
  KvDtype kv_dtype_ = KvDtype::F32;
  std::atomic<bool> shutting_down_{false};
  std::mutex mutex_;  // guards everything below and every call into pool_
  std::condition_variable slot_freed_;
  std::condition_variable prefix_copied_;
  std::condition_variable memory_freed_;
  int running_ = 0;
  int waiting_ = 0;
  int waiting_for_prefix_ = 0;
  SessionPool pool_;
  std::shared_ptr<const ComputeContext> compute_;
  bool batcher_decided_ = false;
  std::shared_ptr<DecodeBatcher> batcher_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::uint64_t use_clock_ = 0;
  std::int64_t evictions_ = 0;
  std::int64_t prefix_copies_ = 0;
  std::int64_t reserved_bytes_ = 0;  // of the admitted requests
  int admitted_ = 0;                 // requests holding a reservation
  int extending_ = 0;                // of those, waiting to extend it
  std::int64_t reservation_extensions_ = 0;
  std::int64_t budget_overshoots_ = 0;
  std::deque<std::uint64_t> memory_queue_;  // tickets of the requests waiting for memory, oldest first
  std::int64_t memory_waits_ = 0;
  std::uint64_t next_ticket_ = 0;
  std::int64_t peak_bytes_ = 0;
};

}  // namespace kvchat::app::openai
