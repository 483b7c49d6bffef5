#include "app/openai_sessions.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "app/compute_lock.h"
#include "app/snapshot_transcript.h"
#include "engine/model_loader.h"
#include "engine/session.h"

namespace kvchat::app::openai {

struct ServerSessions::Entry {
  SessionPool::ConversationId id = 0;
  Session* session = nullptr;     // owned by the pool
  ConversationTokens transcript;  // the exact ids of this session's chat turns (empty after a raw prompt)
  bool busy = false;
  std::uint64_t last_used = 0;
  std::int64_t cache_bytes = 0;  // when it last started or finished a request (its thread may be growing it)
};

ServerSessions::Lease::~Lease() { owner_->release(entry_); }

ServerSessions::ServerSessions(const LoadedModel& model, std::shared_ptr<SnapshotStore> snapshots, int parallel,
                               int max_queue, std::int64_t budget_bytes)
    : model_(model),
      runner_(model),
      parallel_(std::max(1, parallel)),
      max_queue_(std::max(0, max_queue)),
      // Idle sessions keep their caches for returning conversations, so a session per client taking
      // turns; their memory is bounded by the budget, the count only bounds the search for a match.
      max_sessions_(static_cast<std::size_t>(std::max(16, 4 * parallel_))),
      budget_bytes_(std::max<std::int64_t>(0, budget_bytes)),
      pool_(model.model, std::move(snapshots), "openai") {
  restore_transcripts();
}

void ServerSessions::restore_transcripts() {
  if (!pool_.snapshots()) return;
  // An earlier run's sessions, by their snapshots' keys: their caches are restored from disk when a request
  // continues them, and their transcripts give that request the exact ids of the earlier replies.
  for (std::size_t id = 1; id <= max_sessions_; ++id) {
    std::optional<ConversationTokens> transcript =
        transcript_from_snapshot(pool_, static_cast<SessionPool::ConversationId>(id), model_);
    if (!transcript) continue;
    while (entries_.size() < id) add_entry();
    entries_[id - 1]->transcript = std::move(*transcript);
  }
  if (!entries_.empty()) spdlog::info("{} sessions of an earlier run found in the KV snapshot folder", entries_.size());
}

ServerSessions::Entry* ServerSessions::add_entry() {
  auto entry = std::make_unique<Entry>();
  entry->id = static_cast<SessionPool::ConversationId>(entries_.size() + 1);
  entry->session = &pool_.acquire(entry->id, KvCacheMode::Contiguous);
  entries_.push_back(std::move(entry));
  return entries_.back().get();
}

ServerSessions::~ServerSessions() = default;

int ServerSessions::context_limit() const { return runner_.effective_context_limit(0); }

void ServerSessions::check_not_shutting_down() const {
  if (shutting_down_.load())
    throw ApiError(503, "the server is shutting down: send the request again when it is back", "server_error", "",
                   "server_shutting_down");
}

void ServerSessions::shut_down() {
  std::lock_guard<std::mutex> lock(mutex_);
  shutting_down_.store(true);
  slot_freed_.notify_all();
}

void ServerSessions::wait_for_slot(std::unique_lock<std::mutex>& lock) {
  check_not_shutting_down();
  if (running_ >= parallel_) {
    if (waiting_ >= max_queue_)
      throw ApiError(429,
                     "the server is busy: " + std::to_string(running_) + " requests are running and " +
                         std::to_string(waiting_) + " waiting (--max-queue " + std::to_string(max_queue_) + ")",
                     "rate_limit_error", "", "queue_full");
    ++waiting_;
    slot_freed_.wait(lock, [&] { return running_ < parallel_ || shutting_down_.load(); });
    --waiting_;
    check_not_shutting_down();
  }
  ++running_;
}

ServerSessions::Entry* ServerSessions::pick(const std::function<std::size_t(const Entry&)>& shared_tokens) {
  Entry* best = nullptr;
  std::size_t best_tokens = 0;
  Entry* oldest_idle = nullptr;
  for (const auto& entry : entries_) {
    if (entry->busy) continue;
    if (!oldest_idle || entry->last_used < oldest_idle->last_used) oldest_idle = entry.get();
    const std::size_t tokens = shared_tokens(*entry);
    if (tokens > best_tokens) best = entry.get(), best_tokens = tokens;
  }
  if (!best && entries_.size() < max_sessions_) best = add_entry();
  // running_ <= parallel_ < max_sessions_, so some session is idle.
  if (!best) {
    best = oldest_idle;
    best->transcript.clear();
  }
  pool_.acquire(best->id, KvCacheMode::Contiguous);  // marks it used, attaches the snapshot restorer
  best->busy = true;
  best->last_used = ++use_clock_;
  best->cache_bytes = best->session->cache_bytes();
  enforce_budget();
  spdlog::debug("request on session {} ({} tokens shared with its cache)", best->id, best_tokens);
  return best;
}

std::unique_ptr<ServerSessions::Lease> ServerSessions::acquire_for_chat(const std::vector<ChatMessage>& messages) {
  std::string rendered;
  try {
    rendered = model_.formatter.render_prompt(messages, /*add_generation_prompt=*/true).text;
  } catch (const std::exception& error) {
    // A template may refuse a conversation (roles out of order, a system message where it takes none).
    throw ApiError(400, std::string("the model's chat template cannot render these messages: ") + error.what(),
                   "invalid_request_error", "messages", "template_error");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for_slot(lock);
  try {
    Entry* entry = pick([&](const Entry& candidate) -> std::size_t {
      const ConversationTokens::Boundary* boundary = candidate.transcript.longest_boundary_in(rendered);
      return boundary ? boundary->token_count : 0;
    });
    return std::make_unique<Lease>(this, entry);
  } catch (...) {
    --running_;
    slot_freed_.notify_one();
    throw;
  }
}

std::unique_ptr<ServerSessions::Lease> ServerSessions::acquire_for_prompt(const std::vector<TokenId>& prompt_ids) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for_slot(lock);
  try {
    Entry* entry = pick([&](const Entry& candidate) -> std::size_t {
      const std::vector<TokenId>& history = candidate.session->history();
      return static_cast<std::size_t>(
          std::mismatch(history.begin(), history.end(), prompt_ids.begin(), prompt_ids.end()).first - history.begin());
    });
    return std::make_unique<Lease>(this, entry);
  } catch (...) {
    --running_;
    slot_freed_.notify_one();
    throw;
  }
}

void ServerSessions::release(Entry* entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Written on the store's thread: the next request (or the next run of the server) restores from it.
  if (pool_.snapshots()) pool_.save_snapshot(entry->id, entry->transcript.serialize());
  entry->busy = false;
  entry->cache_bytes = entry->session->cache_bytes();
  enforce_budget();
  --running_;
  slot_freed_.notify_one();
}

void ServerSessions::enforce_budget() {
  std::vector<SessionPool::ConversationId> in_use;
  std::int64_t in_use_bytes = 0;
  for (const auto& entry : entries_)
    if (entry->busy) in_use.push_back(entry->id), in_use_bytes += entry->cache_bytes;
  for (const SessionPool::Evicted& evicted : pool_.enforce_budget(budget_bytes_, in_use, in_use_bytes)) {
    ++evictions_;
    entries_[static_cast<std::size_t>(evicted.conversation - 1)]->cache_bytes = 0;
  }
}

ServerSessions::Status ServerSessions::status() {
  std::lock_guard<std::mutex> lock(mutex_);
  Status status;
  status.running = running_;
  status.waiting = waiting_;
  status.sessions = entries_.size();
  for (const auto& entry : entries_)
    status.cache_bytes += entry->busy ? entry->cache_bytes : entry->session->cache_bytes();
  status.budget_bytes = budget_bytes_;
  status.evictions = evictions_;
  return status;
}

namespace {
ApiError context_error(std::size_t prompt_tokens, int limit) {
  return ApiError(400,
                  "this request's prompt is " + std::to_string(prompt_tokens) +
                      " tokens long and the model's context limit is " + std::to_string(limit) +
                      " tokens (the prompt and the reply must fit in it): shorten the messages",
                  "invalid_request_error", "messages", "context_length_exceeded");
}
}  // namespace

std::vector<TokenId> ServerSessions::check_chat_prompt(const Lease& lease, const std::vector<ChatMessage>& messages) const {
  std::vector<TokenId> ids = runner_.encode_messages(messages, lease.entry().transcript);
  if (ids.size() >= static_cast<std::size_t>(context_limit())) throw context_error(ids.size(), context_limit());
  return ids;
}

std::vector<TokenId> ServerSessions::encode_prompt(const std::string& prompt) const {
  std::vector<TokenId> ids = model_.tokenizer->encode(prompt, /*add_special_tokens=*/true, /*parse_special=*/false);
  if (ids.empty()) throw ApiError(400, "the prompt encodes to no tokens", "invalid_request_error", "prompt");
  if (ids.size() >= static_cast<std::size_t>(context_limit())) {
    ApiError error = context_error(ids.size(), context_limit());
    error.param = "prompt";
    throw error;
  }
  return ids;
}

GenerationConfig ServerSessions::generation_config(const SamplingRequest& request) const {
  GenerationConfig config;
  config.max_new_tokens = request.max_tokens > 0 ? request.max_tokens : context_limit();
  config.cache_mode = KvCacheMode::Contiguous;
  config.sampling.temperature = request.temperature;
  config.sampling.top_p = request.top_p;
  // Without a seed every request samples differently, as OpenAI's API does.
  config.sampling.seed = request.seed ? *request.seed : std::random_device{}();
  return config;
}

namespace {

// The reply text through the stop texts to the client; stops the generation at a stop text or when
// the client is gone.
class ReplyForwarder {
 public:
  ReplyForwarder(const std::vector<std::string>& stops, const TextSink& sink, std::atomic<bool>& stop)
      : filter_(stops), sink_(sink), stop_(stop) {}
  void push(std::string_view chunk, int generated_tokens) {
    if (stop_.load()) return;
    forward(filter_.push(std::string(chunk)), generated_tokens);
    if (filter_.matched()) stop_.store(true);
  }
  void finish(int generated_tokens) {
    if (!client_gone_) forward(filter_.finish(), generated_tokens);
  }
  bool client_gone() const { return client_gone_; }
  bool stop_text_matched() const { return filter_.matched(); }
  std::string text;

 private:
  // An empty piece still asks the sink whether the client is there: a token may complete no text (part
  // of a character, the start of a stop text), and the client may leave meanwhile.
  void forward(const std::string& piece, int generated_tokens) {
    text += piece;
    if (sink_ && !sink_(piece)) {
      client_gone_ = true;
      stop_.store(true);
      spdlog::warn("client disconnected after {} generated tokens: generation stopped", generated_tokens);
    }
  }
  StopTextFilter filter_;
  const TextSink& sink_;
  std::atomic<bool>& stop_;
  bool client_gone_ = false;
};

}  // namespace

CompletionResult ServerSessions::run_chat(const Lease& lease, const std::vector<ChatMessage>& messages,
                                          const SamplingRequest& request, const TextSink& sink,
                                          bool* stopped_by_client) {
  TurnOptions options;
  options.generation = generation_config(request);
  options.overflow = ContextOverflowPolicy::Stop;
  std::atomic<bool> stop{false};
  ReplyForwarder forwarder(request.stop, sink, stop);
  int generated = 0;
  Entry& entry = lease.entry();
  TurnOutcome outcome;
  const std::shared_lock<std::shared_mutex> compute_settings(compute_settings_mutex());
  try {
    outcome = runner_.run(*entry.session, entry.transcript, messages, options, &stop,
                          [&](const ReplyProgress& progress) {
                            generated = progress.generated_tokens;
                            forwarder.push(progress.chunk, progress.generated_tokens);
                            if (shutting_down_.load()) stop.store(true);
                          });
  } catch (const ContextLimitError& error) {
    throw ApiError(400, error.what(), "invalid_request_error", "messages", "context_length_exceeded");
  }
  forwarder.finish(generated);
  if (stopped_by_client) *stopped_by_client = forwarder.client_gone();
  return CompletionResult{forwarder.text, finish_reason(outcome.stats.stop_reason, forwarder.stop_text_matched()),
                          outcome.stats};
}

CompletionResult ServerSessions::run_prompt(const Lease& lease, const std::vector<TokenId>& prompt_ids,
                                            const SamplingRequest& request, const TextSink& sink,
                                            bool* stopped_by_client) {
  GenerationConfig config = generation_config(request);
  config.context_limit = context_limit();
  std::atomic<bool> stop{false};
  ReplyForwarder forwarder(request.stop, sink, stop);
  StreamingDecoder decoder(*model_.tokenizer, /*skip_special_tokens=*/true);
  int generated = 0;
  Entry& entry = lease.entry();
  entry.transcript.clear();  // a raw prompt has no chat turns to continue
  const std::shared_lock<std::shared_mutex> compute_settings(compute_settings_mutex());
  GenerationResult result =
      entry.session->generate(prompt_ids, config, &stop, [&](TokenId token, const DecodeProgress& progress) {
        generated = progress.generated_tokens;
        forwarder.push(decoder.push(token), generated);
        if (shutting_down_.load()) stop.store(true);
      });
  forwarder.push(decoder.finish(), generated);
  forwarder.finish(generated);
  if (stopped_by_client) *stopped_by_client = forwarder.client_gone();
  return CompletionResult{forwarder.text, finish_reason(result.stats.stop_reason, forwarder.stop_text_matched()),
                          result.stats};
}

}  // namespace kvchat::app::openai
