#include "app/server/openai_sessions.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <random>

#include "app/compute_lock.h"
#include "engine/compute/compute_context.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

namespace kvchat::app::openai {

namespace {

std::size_t common_prefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  return static_cast<std::size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

// Fewer shared tokens than this are prefilled again rather than copied into another session: a handful
// of prefill steps costs about what the copy does, and the copy takes a session.
constexpr std::size_t kMinimumCopyTokens = 16;

}  // namespace

struct ServerSessions::PrefixRequest {
  Entry* destination = nullptr;
  const std::vector<TokenId>* prompt = nullptr;
  std::size_t wanted = 0;  // what the source shares with `prompt` once its prefill has got that far
  bool done = false;
};

struct ServerSessions::Entry {
  SessionPool::ConversationId id = 0;
  Session* session = nullptr;  // owned by the pool
  bool busy = false;           // leased to a request, or being copied from
  std::uint64_t last_used = 0;
  std::int64_t cache_bytes = 0;         // when it last started or finished a request (its thread may be growing it)
  std::int64_t reserved_bytes = 0;      // while a request runs here: that request's reservation (0 for a copy source)
  std::int64_t reserved_positions = 0;  // the positions it covers
  std::int64_t reply_limit_positions = 0;  // the most the request may hold: its prompt and max_tokens (or the context)
  // The ids of the last request it served that its cache still holds: a prompt that continues all of
  // them is that conversation's next turn (or the same turn again) and runs here.
  std::size_t prompt_tokens = 0;
  // While busy: the ids its cache holds once its request's prefill is done.
  std::vector<TokenId> prompt;
  // Other requests waiting for a copy of its prefix; served on the thread using it, guarded by mutex_.
  std::vector<PrefixRequest*> prefix_requests;
  std::atomic<bool> prefix_requested{false};  // !prefix_requests.empty(), read without the lock
};

struct ServerSessions::Placement {
  Entry* destination = nullptr;
  Entry* source = nullptr;  // to copy a prefix from; null when the destination has what it can reuse
  bool source_running = false;
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
      // A request holds at most two sessions (its own and the one it copies from), so some are idle.
      max_sessions_(static_cast<std::size_t>(std::max(16, 4 * parallel_))),
      budget_bytes_(std::max<std::int64_t>(0, budget_bytes)),
      prefill_chunk_tokens_(GenerationConfig{}.prefill_chunk_tokens),
      pool_(model.model, std::move(snapshots), "openai") {}

ServerSessions::Entry* ServerSessions::add_entry() {
  auto entry = std::make_unique<Entry>();
  entry->id = static_cast<SessionPool::ConversationId>(entries_.size() + 1);
  entry->session = &pool_.acquire(entry->id, KvCacheMode::Contiguous);
  entry->session->set_decode_batcher(decode_batcher());
  entries_.push_back(std::move(entry));
  return entries_.back().get();
}

ServerSessions::~ServerSessions() = default;

std::shared_ptr<DecodeBatcher> ServerSessions::decode_batcher() {
  if (batcher_decided_) return batcher_;
  batcher_decided_ = true;
  const ComputeScope scope(compute_.get());
  if (parallel_ > 1 && model_.model->rows_match_decode_steps()) {
    batcher_ = std::make_shared<DecodeBatcher>(model_.model, parallel_);
    spdlog::info("server: up to {} requests decode together, one pass over the weights per step", parallel_);
  } else if (parallel_ > 1) {
    spdlog::info("server: the model's products do not run on the engine kernels; {} requests decode side by side",
                 parallel_);
  }
  return batcher_;
}

std::string ServerSessions::architecture() const { return model_.config.model_type; }

int ServerSessions::context_limit() const { return runner_.effective_context_limit(0); }

void ServerSessions::set_prefill_chunk_tokens(int tokens) { prefill_chunk_tokens_ = std::max(1, tokens); }

void ServerSessions::check_not_shutting_down() const {
  if (shutting_down_.load())
    throw ApiError(503, "the server is shutting down: send the request again when it is back", "server_error", "",
                   "server_shutting_down");
}

void ServerSessions::shut_down() {
  std::lock_guard<std::mutex> lock(mutex_);
  shutting_down_.store(true);
  slot_freed_.notify_all();
  memory_freed_.notify_all();
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

// An idle session other than `keep` for a request that reuses nothing of it: a new one (an evicted
// session's snapshot stays on disk for its conversation's return), an idle one without a cache, or else
// the least recently used.
ServerSessions::Entry* ServerSessions::spare_entry(const Entry* keep) {
  if (entries_.size() < max_sessions_) return add_entry();
  Entry* oldest = nullptr;
  for (const auto& entry : entries_) {
    if (entry->busy || entry.get() == keep) continue;
    if (entry->session->history().empty()) return entry.get();
    if (!oldest || entry->last_used < oldest->last_used) oldest = entry.get();
  }
  return oldest;
}

ServerSessions::Placement ServerSessions::place(const std::vector<TokenId>& prompt_ids, PrefixRequest& request,
                                                std::int64_t reservation, std::int64_t reserved_positions,
                                                std::int64_t reply_limit_positions) {
  Entry* idle = nullptr;  // the idle session sharing the longest prefix with the prompt
  std::size_t idle_shared = 0;
  Entry* running = nullptr;  // the busy one whose cache will share the longest prefix
  std::size_t running_shared = 0;
  for (const auto& entry : entries_) {
    if (entry->busy) {
      const std::size_t shared = common_prefix(entry->prompt, prompt_ids);
      if (shared > running_shared) running = entry.get(), running_shared = shared;
    } else {
      const std::size_t shared = common_prefix(entry->session->history(), prompt_ids);
      if (shared > idle_shared) idle = entry.get(), idle_shared = shared;
    }
  }

  Placement placement;
  if (idle && idle_shared >= idle->prompt_tokens) {
    placement.destination = idle;  // the next turn of its conversation: what goes is at most its last reply
  } else {
    // Waiting for a running prefill pays when it saves at least what one of its chunks takes.
    const std::size_t wait_for =
        std::max(kMinimumCopyTokens, static_cast<std::size_t>(std::max(1, prefill_chunk_tokens_)));
    if (running && running_shared >= wait_for && running_shared >= idle_shared + wait_for) {
      placement.source = running;
      placement.source_running = true;
    } else if (idle && idle_shared >= kMinimumCopyTokens &&
               (budget_bytes_ == 0 || busy_bytes() + idle->session->cache_bytes() <= budget_bytes_)) {
      // Read while the copy runs, it cannot be evicted meanwhile: only where it fits beside the reservations.
      placement.source = idle;
    }
    placement.destination = spare_entry(placement.source);
    if (!placement.destination) {
      // Only the source itself is free: run there, giving up the rest of its cache.
      placement.destination = placement.source;
      placement.source = nullptr;
    }
  }

  Entry& destination = *placement.destination;
  pool_.acquire(destination.id, KvCacheMode::Contiguous);  // marks it used, attaches the snapshot restorer
  destination.busy = true;
  destination.prompt = prompt_ids;
  destination.prompt_tokens = prompt_ids.size();
  destination.last_used = ++use_clock_;
  destination.cache_bytes = destination.session->cache_bytes();
  destination.reserved_bytes = reservation;
  destination.reserved_positions = reserved_positions;
  destination.reply_limit_positions = reply_limit_positions;
  if (placement.source_running) {
    request = PrefixRequest{&destination, &prompt_ids, running_shared, false};
    placement.source->prefix_requests.push_back(&request);
    placement.source->prefix_requested.store(true);
    memory_freed_.notify_all();  // the source may be waiting to extend its reservation: it copies first
    ++waiting_for_prefix_;
  } else if (placement.source) {
    // Kept from other requests while it is read; they may ask it for a copy meanwhile.
    Entry& source = *placement.source;
    source.busy = true;
    source.prompt = source.session->history();
    source.cache_bytes = source.session->cache_bytes();
  }
  enforce_budget();
  spdlog::debug("request on session {} ({} prompt tokens; {} shared with session {}{})", destination.id,
                prompt_ids.size(), placement.source ? common_prefix(placement.source->prompt, prompt_ids) : 0,
                placement.source ? placement.source->id : destination.id,
                placement.source_running ? ", copied once its prefill holds them" : "");
  return placement;
}

std::int64_t ServerSessions::draft_positions() const {
  return speculative_.mode != SpeculativeMode::None ? std::max(0, speculative_.draft_tokens) : 0;
}

std::int64_t ServerSessions::reserved_positions(std::int64_t prompt_tokens, std::int64_t reply_tokens) const {
  const std::int64_t positions =
      std::min<std::int64_t>(prompt_tokens + reply_tokens + draft_positions(), context_limit());
  return (positions + kBudgetBlockTokens - 1) / kBudgetBlockTokens * kBudgetBlockTokens;
}

std::int64_t ServerSessions::first_reserved_positions(std::size_t prompt_tokens, int max_reply_tokens) const {
  const std::int64_t reply = max_reply_tokens > 0 ? std::min<std::int64_t>(max_reply_tokens, kReplyReservationTokens)
                                                  : kReplyReservationTokens;
  return reserved_positions(static_cast<std::int64_t>(prompt_tokens), reply);
}

std::int64_t ServerSessions::reservation_bytes(std::size_t prompt_tokens, int max_reply_tokens) const {
  return model_.model->cache_shape(kv_dtype_).bytes_for(first_reserved_positions(prompt_tokens, max_reply_tokens));
}

void ServerSessions::extend_reservation(Entry& entry, std::int64_t needed_positions) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::int64_t wanted = std::max(needed_positions, entry.reserved_positions + kReplyReservationTokens);
  const std::int64_t positions = std::min(entry.reply_limit_positions,
                                          (wanted + kBudgetBlockTokens - 1) / kBudgetBlockTokens * kBudgetBlockTokens);
  if (positions <= entry.reserved_positions) return;
  const KvCacheShape shape = model_.model->cache_shape(kv_dtype_);
  const std::int64_t extra = shape.bytes_for(positions) - shape.bytes_for(entry.reserved_positions);
  bool waited = false;
  while (budget_bytes_ > 0 && busy_bytes() + extra > budget_bytes_ && !shutting_down_.load()) {
    if (entry.prefix_requested.load()) {
      // A request waits for a copy of this cache's prefix: served first, or the two would wait for each other.
      lock.unlock();
      serve_prefix_requests(entry, /*prefill_done=*/true);
      lock.lock();
      continue;
    }
    if (extending_ + 1 >= admitted_) {
      // Every other running request waits to extend as well: one goes on past the budget, so that none waits for
      // another forever; its reservation counts, and new requests wait until the budget has room again.
      ++budget_overshoots_;
      spdlog::warn("a reply past {} positions extends its KV cache reservation beyond the budget of {} MiB",
                   entry.reserved_positions, budget_bytes_ >> 20);
      break;
    }
    if (!waited) spdlog::debug("a reply past {} positions waits to extend its reservation", entry.reserved_positions);
    waited = true;
    ++extending_;
    memory_freed_.wait(lock);
    --extending_;
  }
  reserved_bytes_ += extra;
  entry.reserved_bytes += extra;
  entry.reserved_positions = positions;
  ++reservation_extensions_;
  enforce_budget();
}

std::int64_t ServerSessions::busy_bytes() const {
  std::int64_t bytes = reserved_bytes_;
  for (const auto& entry : entries_)
    if (entry->busy && entry->reserved_bytes == 0) bytes += entry->cache_bytes;  // a cache being copied from
  return bytes;
}

void ServerSessions::wait_for_memory(std::unique_lock<std::mutex>& lock, std::int64_t reservation) {
  if (budget_bytes_ > 0) {
    const std::uint64_t ticket = next_ticket_++;
    memory_queue_.push_back(ticket);
    // Idle caches make room (enforce_budget evicts them once the request is placed); running requests' do not.
    const auto fits = [&] {
      if (shutting_down_.load()) return true;
      return memory_queue_.front() == ticket && extending_ == 0 &&
             (admitted_ == 0 || busy_bytes() + reservation <= budget_bytes_);
    };
    if (!fits()) {
      ++memory_waits_;
      spdlog::debug("a request waits for {} KiB of KV cache budget ({} KiB reserved by {} running requests)",
                    reservation >> 10, reserved_bytes_ >> 10, admitted_);
      memory_freed_.wait(lock, fits);
    }
    memory_queue_.erase(std::find(memory_queue_.begin(), memory_queue_.end(), ticket));
    memory_freed_.notify_all();  // the next in line may fit as well
    check_not_shutting_down();
    if (reservation > budget_bytes_)
      spdlog::warn("a request reserves {} MiB of KV cache, more than the budget of {} MiB: it runs alone",
                   reservation >> 20, budget_bytes_ >> 20);
  }
  reserved_bytes_ += reservation;
  ++admitted_;
}

std::unique_ptr<ServerSessions::Lease> ServerSessions::acquire_for_prompt(const std::vector<TokenId>& prompt_ids,
                                                                          int max_reply_tokens) {
  const std::int64_t positions = first_reserved_positions(prompt_ids.size(), max_reply_tokens);
  const std::int64_t reservation = model_.model->cache_shape(kv_dtype_).bytes_for(positions);
  const std::int64_t limit_positions = reserved_positions(static_cast<std::int64_t>(prompt_ids.size()),
                                                          max_reply_tokens > 0 ? max_reply_tokens : context_limit());
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for_slot(lock);
  try {
    wait_for_memory(lock, reservation);
  } catch (...) {
    --running_;
    slot_freed_.notify_one();
    throw;
  }
  PrefixRequest request;
  Placement placement;
  try {
    placement = place(prompt_ids, request, reservation, positions, limit_positions);
  } catch (...) {
    reserved_bytes_ -= reservation;
    --admitted_;
    memory_freed_.notify_all();
    --running_;
    slot_freed_.notify_one();
    throw;
  }
  lock.unlock();
  auto lease = std::make_unique<Lease>(this, placement.destination);
  if (placement.source_running) {
    // The source's thread copies the prefix between its prefill chunks or tokens, or when it is done.
    lock.lock();
    prefix_copied_.wait(lock, [&] { return request.done; });
    --waiting_for_prefix_;
    lock.unlock();
  } else if (placement.source) {
    copy_prefix(*placement.destination, *placement.source, prompt_ids);
    lock.lock();
    finish_use(*placement.source, lock);
    lock.unlock();
  }
  check_not_shutting_down();
  return lease;
}

std::int64_t ServerSessions::copy_prefix(Entry& destination, const Entry& source,
                                         const std::vector<TokenId>& prompt_ids) {
  const std::size_t shared = common_prefix(source.session->history(), prompt_ids);
  try {
    const std::int64_t copied =
        destination.session->copy_prefix_from(*source.session, static_cast<std::int64_t>(shared));
    spdlog::debug("copied {} cached tokens from session {} to session {}", copied, source.id, destination.id);
    std::lock_guard<std::mutex> lock(mutex_);
    if (copied > 0) ++prefix_copies_;
    return copied;
  } catch (const std::exception& error) {
    // Nothing is lost but time: the request prefills what it did not get.
    spdlog::error("copying {} cached tokens from session {} to session {} failed, prefilling them instead: {}", shared,
                  source.id, destination.id, error.what());
    destination.session->clear();
    return 0;
  }
}

// On the thread using `source` (it is busy): copies its prefix to the requests waiting for it, once its
// cache holds what they wait for (`prefill_done`: it holds all it will).
void ServerSessions::serve_prefix_requests(Entry& source, bool prefill_done) {
  if (!source.prefix_requested.load()) return;
  std::vector<PrefixRequest*> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<PrefixRequest*>& pending = source.prefix_requests;
    for (auto it = pending.begin(); it != pending.end();) {
      if (prefill_done || common_prefix(source.session->history(), *(*it)->prompt) >= (*it)->wanted) {
        ready.push_back(*it);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
    source.prefix_requested.store(!pending.empty());
  }
  if (ready.empty()) return;
  for (PrefixRequest* request : ready) copy_prefix(*request->destination, source, *request->prompt);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (PrefixRequest* request : ready) request->done = true;
  }
  prefix_copied_.notify_all();
}

// With `lock` held, on the thread that used `entry`: serves the copies still asked of it, then makes it idle.
void ServerSessions::finish_use(Entry& entry, std::unique_lock<std::mutex>& lock) {
  while (!entry.prefix_requests.empty()) {
    lock.unlock();
    serve_prefix_requests(entry, /*prefill_done=*/true);
    lock.lock();
  }
  entry.busy = false;
  entry.prompt.clear();
  entry.prompt.shrink_to_fit();
  entry.prompt_tokens = std::min(entry.prompt_tokens, entry.session->history().size());
  entry.cache_bytes = entry.session->cache_bytes();
  if (entry.reserved_bytes > 0) {
    // What its cache holds now counts instead (at most the reservation: a request stays within it).
    reserved_bytes_ -= entry.reserved_bytes;
    --admitted_;
    entry.reserved_bytes = 0;
    entry.reserved_positions = entry.reply_limit_positions = 0;
  }
  memory_freed_.notify_all();
}

void ServerSessions::release(Entry* entry) {
  std::unique_lock<std::mutex> lock(mutex_);
  finish_use(*entry, lock);
  // Written on the store's thread: the next request (or the next run of the server) restores from it.
  if (pool_.snapshots()) pool_.save_snapshot(entry->id);
  enforce_budget();
  --running_;
  slot_freed_.notify_one();
}

void ServerSessions::enforce_budget() {
  std::vector<SessionPool::ConversationId> in_use;
  for (const auto& entry : entries_)
    if (entry->busy) in_use.push_back(entry->id);
  const std::int64_t in_use_bytes = busy_bytes();
  for (const SessionPool::Evicted& evicted : pool_.enforce_budget(budget_bytes_, in_use, in_use_bytes)) {
    ++evictions_;
    entries_[static_cast<std::size_t>(evicted.conversation - 1)]->cache_bytes = 0;
  }
  std::int64_t counted = in_use_bytes;
  for (const auto& entry : entries_)
    if (!entry->busy) counted += entry->session->cache_bytes();
  peak_bytes_ = std::max(peak_bytes_, counted);
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
  status.reserved_bytes = reserved_bytes_;
  status.peak_bytes = peak_bytes_;
  status.waiting_for_memory = static_cast<int>(memory_queue_.size());
  status.memory_waits = memory_waits_;
  status.reservation_extensions = reservation_extensions_;
  status.budget_overshoots = budget_overshoots_;
  status.evictions = evictions_;
  status.waiting_for_prefix = waiting_for_prefix_;
  status.prefix_copies = prefix_copies_;
  if (batcher_) {
    const DecodeBatcher::Stats batched = batcher_->stats();
    status.batched_steps = batched.steps;
    status.batched_rows = batched.rows;
    status.largest_batch = batched.largest_batch;
  }
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

ToolCallFormat ServerSessions::tool_call_format() const {
  return tool_call_format_for_template(model_.formatter.template_source());
}

std::shared_ptr<const ConstraintVocabulary> ServerSessions::constraint_vocabulary() const {
  return model_.constraint_vocabulary();
}

std::vector<TokenId> ServerSessions::encode_chat(const std::vector<ChatMessage>& messages,
                                                 const std::string& tools_json) const {
  // Nothing known about the conversation: the same messages give the same ids on any server.
  std::vector<TokenId> ids;
  try {
    ids = runner_.encode_messages(messages, /*continue_reply=*/false, tools_json);
  } catch (const TemplateError& error) {
    // A template may refuse a conversation (roles out of order, a system message where it takes none).
    throw ApiError(400, std::string("the model's chat template cannot render these messages: ") + error.what(),
                   "invalid_request_error", "messages", "template_error");
  }
  if (ids.empty()) throw ApiError(400, "the messages encode to no tokens", "invalid_request_error", "messages");
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

std::vector<TokenId> ServerSessions::checked_prompt_ids(std::vector<TokenId> ids) const {
  const auto vocabulary = static_cast<TokenId>(model_.tokenizer->vocab_size());
  for (const TokenId id : ids)
    if (id < 0 || id >= vocabulary)
      throw ApiError(400,
                     "'prompt' token id " + std::to_string(id) + " is outside the vocabulary (ids 0 to " +
                         std::to_string(vocabulary - 1) + ")",
                     "invalid_request_error", "prompt", "invalid_value");
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
  config.kv_dtype = kv_dtype_;
  config.context_limit = context_limit();  // the engine stops the reply there (ContextFull)
  config.prefill_chunk_tokens = prefill_chunk_tokens_;
  config.sampled_vocabulary = model_.tokenizer->vocab_size();  // the reply is decoded: every id needs text
  config.sampling.temperature = request.temperature;
  config.sampling.top_p = request.top_p;
  config.sampling.top_k = request.top_k;
  config.sampling.min_p = request.min_p;
  config.sampling.repetition_penalty = request.repetition_penalty;
  config.sampling.repetition_window = request.repetition_window;
  config.top_logprobs = request.top_logprobs;
  config.speculative = speculative_;
  if (request.grammar) {
    config.grammar = request.grammar;
    config.grammar_vocabulary = constraint_vocabulary();
  }
  // Without a seed every request samples differently, as OpenAI's API does.
  config.sampling.seed = request.seed ? *request.seed : std::random_device{}();
  return config;
}

namespace {

// The reply text through the stop texts to the client; stops the generation at a stop text or when
// the client is gone.
class ReplyForwarder {
 public:
  ReplyForwarder(const std::vector<std::string>& stops, const TextSink& sink, std::atomic<bool>& stop,
                 const LogprobSink& logprob_sink)
      : filter_(stops), sink_(sink), stop_(stop), logprob_sink_(logprob_sink) {}
  // `chunk`: the text the decoder released with a token; `token_logprobs`: that token's, when asked for
  // (none for a special token, whose text is never part of the reply).
  void push(std::string_view chunk, int generated_tokens, std::optional<LogprobEntry> token_logprobs = std::nullopt) {
    if (stop_.load()) return;
    if (token_logprobs) pending_.push_back({std::move(*token_logprobs), kNoOffset});
    if (!chunk.empty()) {
      // The tokens still without text (the first parts of a character) start where this text starts.
      for (PendingLogprob& pending : pending_)
        if (pending.offset == kNoOffset) pending.offset = decoded_bytes_;
      decoded_bytes_ += chunk.size();
    }
    forward(filter_.push(std::string(chunk)), generated_tokens);
    if (filter_.matched()) stop_.store(true);
  }
  void finish(int generated_tokens) {
    if (!client_gone_) forward(filter_.finish(), generated_tokens);
  }
  // Before a prefill chunk: is the client still there? A long prompt's prefill stops when it is not.
  void check_client_during_prefill(std::int64_t cached_tokens, std::size_t prompt_tokens) {
    if (stop_.load() || !sink_ || sink_(std::string())) return;
    client_gone_ = true;
    stop_.store(true);
    spdlog::warn("client disconnected during the prefill ({} of {} prompt tokens cached): prefill stopped",
                 cached_tokens, prompt_tokens);
  }
  bool client_gone() const { return client_gone_; }
  bool stop_text_matched() const { return filter_.matched(); }
  std::string text;
  std::vector<LogprobEntry> logprobs;  // of the tokens whose text was forwarded

 private:
  static constexpr std::size_t kNoOffset = std::numeric_limits<std::size_t>::max();
  struct PendingLogprob {
    LogprobEntry entry;
    std::size_t offset;  // where its text starts in the decoded reply; kNoOffset until known
  };

  // An empty piece still asks the sink whether the client is there: a token may complete no text (part
  // of a character, the start of a stop text), and the client may leave meanwhile.
  void forward(const std::string& piece, int generated_tokens) {
    text += piece;
    // The tokens whose text now starts within the forwarded text go with this piece; those of a stop
    // text never do.
    std::size_t released = 0;
    while (released < pending_.size() && pending_[released].offset < text.size()) ++released;
    if (released > 0) {
      std::vector<LogprobEntry> batch;
      for (std::size_t i = 0; i < released; ++i) {
        pending_[i].entry.text_offset = pending_[i].offset;
        batch.push_back(std::move(pending_[i].entry));
      }
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(released));
      if (logprob_sink_) logprob_sink_(batch);
      logprobs.insert(logprobs.end(), batch.begin(), batch.end());
    }
    if (sink_ && !sink_(piece)) {
      client_gone_ = true;
      stop_.store(true);
      spdlog::warn("client disconnected after {} generated tokens: generation stopped", generated_tokens);
    }
  }
  StopTextFilter filter_;
  const TextSink& sink_;
  std::atomic<bool>& stop_;
  const LogprobSink& logprob_sink_;
  bool client_gone_ = false;
  std::vector<PendingLogprob> pending_;
  std::size_t decoded_bytes_ = 0;
};

// A candidate token's text: what it adds after `previous` (decoding it alone would lose a leading space
// that a SentencePiece decoder strips at the start of a text).
std::string candidate_text(const Tokenizer& tokenizer, TokenId previous, TokenId candidate) {
  const std::string before = tokenizer.decode({previous});
  const std::string both = tokenizer.decode({previous, candidate});
  if (both.size() >= before.size() && both.compare(0, before.size(), before) == 0) return both.substr(before.size());
  return tokenizer.decode({candidate});
}

}  // namespace

CompletionResult ServerSessions::run(const Lease& lease, const std::vector<TokenId>& prompt_ids,
                                     const SamplingRequest& request, const TextSink& sink, bool* stopped_by_client,
                                     const LogprobSink& logprob_sink) {
  const GenerationConfig config = generation_config(request);
  std::atomic<bool> stop{false};
  ReplyForwarder forwarder(request.stop, sink, stop, logprob_sink);
  const Tokenizer& tokenizer = *model_.tokenizer;
  TokenId previous = prompt_ids.back();
  StreamingDecoder decoder(*model_.tokenizer, /*skip_special_tokens=*/true,
                           request.exact_text || request.grammar ? std::optional<bool>(false) : std::nullopt);
  int generated = 0;
  Entry& entry = lease.entry();
  const std::int64_t proposals = draft_positions();
  const std::shared_lock<std::shared_mutex> compute_settings(compute_settings_mutex());
  GenerationResult result = entry.session->generate(
      prompt_ids, config, &stop,
      [&](TokenId token, const DecodeProgress& progress) {
        serve_prefix_requests(entry, /*prefill_done=*/true);
        generated = progress.generated_tokens;
        // The next step writes this token's position (and a speculative check its proposals' after it).
        const std::int64_t next_positions = static_cast<std::int64_t>(prompt_ids.size()) + generated + proposals;
        if (next_positions > entry.reserved_positions) extend_reservation(entry, next_positions);
        const std::string chunk = decoder.push(token);
        std::optional<LogprobEntry> entry;
        if (progress.logprobs && !tokenizer.is_special(token)) {
          entry.emplace();
          entry->chosen = {chunk, progress.logprobs->chosen.logprob};
          for (const TokenLogprob& top : progress.logprobs->top)
            // The chosen token among them reads as it does in the reply (a character's first bytes: "").
            entry->top.push_back(
                {top.token == token ? chunk : candidate_text(tokenizer, previous, top.token), top.logprob});
        }
        previous = token;
        forwarder.push(chunk, generated, std::move(entry));
        if (shutting_down_.load()) stop.store(true);
      },
      [&](std::int64_t cached_tokens) {
        serve_prefix_requests(entry, /*prefill_done=*/false);
        forwarder.check_client_during_prefill(cached_tokens, prompt_ids.size());
        if (shutting_down_.load()) stop.store(true);
      });
  forwarder.push(decoder.finish(), generated);
  forwarder.finish(generated);
  if (stopped_by_client) *stopped_by_client = forwarder.client_gone();
  CompletionResult completion;
  completion.text = forwarder.text;
  completion.finish_reason = finish_reason(result.stats.stop_reason, forwarder.stop_text_matched());
  completion.stats = result.stats;
  completion.has_logprobs = request.top_logprobs >= 0;
  completion.logprobs = std::move(forwarder.logprobs);
  return completion;
}

}  // namespace kvchat::app::openai
