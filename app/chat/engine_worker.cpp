#include "app/chat/engine_worker.h"

#include <spdlog/spdlog.h>

#include <QElapsedTimer>

#include <algorithm>
#include <exception>
#include <utility>

#include "app/compute_lock.h"
#include "app/snapshot_key.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/cache/session_pool.h"
#include "engine/compute/compute_context.h"
#include "engine/compute/compute_options.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/text/constraint/token_constraint.h"

namespace kvchat::app {

namespace {

// Coalesce streamed text so that a fast model does not flood the GUI thread with one event per token.
constexpr qint64 kTextBatchMilliseconds = 30;

}  // namespace

struct EngineWorker::State {
  std::shared_ptr<const LoadedModel> model;
  std::unique_ptr<SessionPool> pool;  // the loaded model's sessions (and snapshots)
  SnapshotOptions snapshot_options;
  // The KV dtype of the pool's snapshot store: the last turn's (a turn of another dtype opens the pool again).
  KvDtype kv_dtype = KvDtype::F32;
  // What this worker's turns compute with: the app's thread setting, in a context of its own (the server the
  // app hosts has another), so a new thread count needs no process-wide change.
  std::shared_ptr<const ComputeContext> compute;
  int compute_threads_setting = -1;  // what `compute` was made for (0: the machine's cores)
  // Speculative decoding's draft model, loaded on first use and kept while the setting names the same file.
  std::shared_ptr<const LlamaModel> draft_model;
  QString draft_model_path;

  const std::shared_ptr<const LlamaModel>& draft_for(const QString& path) {
    if (path.isEmpty())
      throw std::invalid_argument("speculative decoding with a draft model: choose the draft model's file in Settings");
    if (!draft_model || path != draft_model_path) {
      draft_model.reset();
      draft_model = load_model(path.toStdString()).model;
      draft_model_path = path;
      spdlog::info("draft model {} loaded: {} layers, {:.1f} MiB of weights ({})", path.toStdString(),
                   draft_model->config().num_hidden_layers, draft_model->weight_bytes() / 1048576.0,
                   draft_model->weight_types());
    }
    return draft_model;
  }

  // The context for the `threads` setting, made anew when the setting changed.
  const std::shared_ptr<const ComputeContext>& compute_for(int threads) {
    if (!compute || threads != compute_threads_setting) {
      compute = std::make_shared<const ComputeContext>(ComputeContext::Options{threads, fast_kernels_enabled()});
      compute_threads_setting = threads;
    }
    return compute;
  }
};

EngineWorker::EngineWorker(QObject* parent) : TurnBackend(parent), state_(std::make_unique<State>()) {}

EngineWorker::~EngineWorker() {
  // The pool's store finishes writing what is queued (the last replies' snapshots) before it goes.
  if (state_->pool && state_->pool->snapshots()) state_->pool->snapshots()->set_written_callback({});
}

void EngineWorker::open_snapshots() {
  if (state_->pool && state_->pool->snapshots()) state_->pool->snapshots()->set_written_callback({});
  state_->pool.reset();  // its store writes what is queued first
  if (!state_->model) return;
  const SnapshotOptions& options = state_->snapshot_options;
  std::shared_ptr<SnapshotStore> store;
  if (options.enabled && !options.directory.isEmpty()) {
    try {
      store = open_snapshot_store(options.directory.toStdString(), options.disk_budget_bytes, *state_->model->model,
                                  state_->kv_dtype);
      const std::string prefix = options.key_prefix.toStdString() + "-";
      const qint64 budget = options.disk_budget_bytes;
      store->set_written_callback([this, prefix, budget](const std::string& key, std::int64_t tokens,
                                                         std::int64_t file_bytes, std::int64_t folder_bytes) {
        if (key.rfind(prefix, 0) != 0) return;
        Q_EMIT snapshotWritten(std::stoll(key.substr(prefix.size())), tokens, file_bytes, folder_bytes, budget);
      });
    } catch (const std::exception& error) {
      spdlog::error("KV snapshots are off for this model: {}", error.what());
    }
  }
  state_->pool = std::make_unique<SessionPool>(state_->model->model, store, options.key_prefix.toStdString());
  state_->pool->set_compute_context(state_->compute);
}

void EngineWorker::configureSnapshots(const SnapshotOptions& options) {
  const SnapshotOptions old = std::exchange(state_->snapshot_options, options);
  if (old.enabled == options.enabled && old.directory == options.directory && old.key_prefix == options.key_prefix) {
    if (state_->pool && state_->pool->snapshots())
      state_->pool->snapshots()->set_disk_budget(options.disk_budget_bytes);
    return;
  }
  if (!state_->model) return;
  // A new pool: caches in memory are rebuilt (from the new folder's snapshots, or by prefill).
  std::vector<qint64> resident;
  if (state_->pool)
    for (const auto& entry : state_->pool->resident()) resident.push_back(entry.conversation);
  open_snapshots();
  for (qint64 conversation_id : resident) Q_EMIT cacheChanged(conversation_id, 0, 0, 0, 0);
}

void EngineWorker::clearAllCachedState() {
  if (!state_->pool) return;
  std::vector<qint64> resident;
  for (const auto& entry : state_->pool->resident()) resident.push_back(entry.conversation);
  state_->pool->forget_all();
  for (qint64 conversation_id : resident) Q_EMIT cacheChanged(conversation_id, 0, 0, 0, 0);
  if (state_->pool->snapshots()) Q_EMIT snapshotWritten(0, 0, 0, 0, state_->snapshot_options.disk_budget_bytes);
}

void EngineWorker::describeSnapshot(qint64 conversation_id) {
  SnapshotStore* store = state_->pool ? state_->pool->snapshots() : nullptr;
  if (!store) return;
  const auto header = store->describe(state_->pool->snapshot_key(conversation_id));
  if (!header) return;  // none written yet, or not one of this model's
  Q_EMIT snapshotWritten(conversation_id, header->token_count, header->file_bytes, store->folder_bytes(),
                         state_->snapshot_options.disk_budget_bytes);
}

void EngineWorker::register_meta_types() {
  qRegisterMetaType<kvchat::app::ModelInfo>("kvchat::app::ModelInfo");
  qRegisterMetaType<kvchat::app::TurnRequest>("kvchat::app::TurnRequest");
  qRegisterMetaType<kvchat::app::SnapshotOptions>("kvchat::app::SnapshotOptions");
  qRegisterMetaType<kvchat::app::DecodeTimings>("kvchat::app::DecodeTimings");
  qRegisterMetaType<kvchat::app::ReplyTokens>("kvchat::app::ReplyTokens");
  qRegisterMetaType<kvchat::GenerationStats>("kvchat::GenerationStats");
}

void EngineWorker::loadModel(const QString& directory, int threads, bool long_context) {
  QElapsedTimer timer;
  timer.start();
  try {
    LoadOptions options;
    options.threads = threads;
    options.long_context = long_context ? LoadOptions::LongContext::WhereSupported : LoadOptions::LongContext::Off;
    std::unique_lock<std::shared_mutex> compute_settings(compute_settings_mutex());  // loading sets the threads
    auto model = std::make_shared<LoadedModel>(load_model(directory.toStdString(), options));
    compute_settings.unlock();
    if (!model->tokenizer)
      throw std::invalid_argument(
          "model " + directory.toStdString() +
          " has no tokenizer (tokenizer.json or GGUF tokenizer metadata), so it cannot be used for chat");
    state_->compute_for(threads);
    // Caches belong to the model that made them (listeners drop theirs on loaded()).
    state_->model = model;
    open_snapshots();

    ModelInfo info;
    info.path = directory;
    info.name = QString::fromStdString(model->path);
    info.name = info.name.section('/', -1, -1, QString::SectionSkipEmpty);
    info.architecture = QString::fromStdString(model->config.model_type);
    info.format = QString::fromStdString(model->format);
    info.weight_format = QString::fromStdString(model->weight_format);
    info.file_bytes = model->file_bytes;
    info.weight_bytes = model->model->weight_bytes();
    info.parameter_count = model->config.parameter_count();
    info.context_length = static_cast<int>(model->config.max_position_embeddings);
    info.layers = static_cast<int>(model->config.num_hidden_layers);
    info.kv_bytes_per_token = model->config.kv_bytes_per_token();
    info.has_chat_template = model->formatter.has_template();
    info.load_seconds = timer.elapsed() / 1000.0;
    info.model = model;
    spdlog::info("loaded model {} ({} parameters, context {}) in {:.2f} s", directory.toStdString(),
                 info.parameter_count, info.context_length, info.load_seconds);
    Q_EMIT loaded(info);
  } catch (const std::exception& error) {
    spdlog::error("cannot load model {}: {}", directory.toStdString(), error.what());
    Q_EMIT loadFailed(directory, QString::fromStdString(error.what()));
  } catch (...) {
    spdlog::error("cannot load model {}: unknown error", directory.toStdString());
    Q_EMIT loadFailed(directory, QStringLiteral("unknown error while loading %1").arg(directory));
  }
}

void EngineWorker::runTurn(const TurnRequest& request) {
  const quint64 turn_id = request.turn_id;
  try {
    if (!state_->model) throw std::runtime_error("no model is loaded");
    const std::shared_ptr<const LoadedModel> model = state_->model;
    if (request.generation.kv_dtype != state_->kv_dtype) {
      // Every cache is rebuilt in the new dtype anyway; the store then keeps (and restores) that dtype's snapshots.
      spdlog::info("KV cache dtype {} -> {}: the conversations' caches are dropped", to_string(state_->kv_dtype),
                   to_string(request.generation.kv_dtype));
      state_->kv_dtype = request.generation.kv_dtype;
      open_snapshots();
    }
    SessionPool& pool = *state_->pool;
    pool.set_compute_context(state_->compute_for(request.threads));
    Session& session = pool.acquire(request.conversation_id, request.generation.cache_mode);

    TurnOptions options;
    options.generation = request.generation;
    if (options.generation.speculative.mode == SpeculativeMode::DraftModel)
      options.generation.speculative.draft_model = state_->draft_for(request.draft_model_path);
    options.context_limit = request.context_limit;
    options.overflow = request.overflow;
    options.continue_reply = request.continue_reply;
    // A chat whose replies are JSON: every token keeps the reply within the format.
    options.generation.grammar = request.reply_format.grammar();
    if (options.generation.grammar) {
      options.generation.grammar_vocabulary = model->constraint_vocabulary();
    }

    std::string pending;
    QElapsedTimer since_flush;
    since_flush.start();
    int generated = 0;
    double decode_rate = 0.0;
    auto flush = [&] {
      if (!pending.empty()) Q_EMIT textReady(turn_id, QString::fromStdString(pending));
      pending.clear();
      Q_EMIT tokenStats(turn_id, generated, decode_rate);
      since_flush.restart();
    };
    auto on_progress = [&](const ReplyProgress& progress) {
      pending.append(progress.chunk);
      generated = progress.generated_tokens;
      decode_rate = progress.decode_tokens_per_second;
      if (generated == 1 || since_flush.elapsed() >= kTextBatchMilliseconds) flush();
    };

    const ChatTurnRunner runner(*model);
    TurnOutcome outcome = runner.run(session, request.messages, options, request.stop.get(), on_progress);
    flush();
    pool.save_snapshot(request.conversation_id);  // written on the store's thread
    if (outcome.dropped_messages > 0) Q_EMIT contextTrimmed(turn_id, outcome.dropped_messages, outcome.context_limit);
    spdlog::debug("turn {}: {} prompt tokens ({} reused), {} generated, stop {}", turn_id, outcome.stats.prompt_tokens,
                  outcome.stats.reused_tokens, outcome.stats.generated_tokens, to_string(outcome.stats.stop_reason));
    // Cache figures first, so that whoever handles finished() already sees the caches as they now are.
    enforce_budget(request.conversation_id, request.cache_budget_bytes);
    DecodeTimings timings;
    timings.first_position = static_cast<int>(outcome.prompt_ids.size()) + 1;
    timings.step_ms = QList<double>(outcome.decode_step_ms.begin(), outcome.decode_step_ms.end());
    timings.from_proposal =
        QList<bool>(outcome.decode_step_from_proposal.begin(), outcome.decode_step_from_proposal.end());
    timings.cache_mode = outcome.stats.cache_mode;
    Q_EMIT decodeTimings(turn_id, timings);
    Q_EMIT replyTokens(turn_id, ReplyTokens{std::move(outcome.reply_ids), outcome.reply_vocabulary});
    Q_EMIT finished(turn_id, outcome.stats);
  } catch (const std::exception& error) {
    spdlog::error("turn {} failed: {}", turn_id, error.what());
    Q_EMIT failed(turn_id, QString::fromStdString(error.what()));
  } catch (...) {
    spdlog::error("turn {} failed with an unknown error", turn_id);
    Q_EMIT failed(turn_id, QStringLiteral("unknown engine error"));
  }
}

void EngineWorker::generateTitle(qint64 conversation_id, const std::vector<ChatMessage>& messages,
                                 const GenerationConfig& generation, int context_limit) {
  try {
    if (!state_->model) throw std::runtime_error("no model is loaded");
    const std::shared_ptr<const LoadedModel> model = state_->model;
    // Not from the pool: the chat's own session keeps exactly the tokens of its conversation.
    Session session(model->model, KvCacheMode::Contiguous);
    session.set_compute_context(state_->compute);
    TurnOptions options;
    options.generation = generation;
    options.generation.cache_mode = KvCacheMode::Contiguous;
    options.context_limit = context_limit;
    options.overflow = ContextOverflowPolicy::DropOldestTurns;
    const std::shared_lock<std::shared_mutex> compute_settings(compute_settings_mutex());
    const TurnOutcome outcome = ChatTurnRunner(*model).run(session, messages, options, nullptr, {});
    spdlog::debug("conversation {}: title generated ({} tokens)", conversation_id, outcome.stats.generated_tokens);
    Q_EMIT titleReady(conversation_id, QString::fromStdString(outcome.reply));
  } catch (const std::exception& error) {
    spdlog::warn("conversation {}: no title from the model: {}", conversation_id, error.what());
    Q_EMIT titleFailed(conversation_id, QString::fromStdString(error.what()));
  }
}

qint64 EngineWorker::total_cache_bytes() const { return state_->pool ? state_->pool->total_bytes() : 0; }

void EngineWorker::enforce_budget(qint64 active_conversation, qint64 budget_bytes) {
  SessionPool& pool = *state_->pool;
  for (const SessionPool::Evicted& evicted : pool.enforce_budget(budget_bytes, active_conversation)) {
    Q_EMIT cacheEvicted(evicted.conversation);
    Q_EMIT cacheChanged(evicted.conversation, 0, 0, pool.total_bytes(), budget_bytes);
  }
  if (const Session* session = pool.find(active_conversation))
    Q_EMIT cacheChanged(active_conversation, session->cache_tokens(), session->cache_bytes(), pool.total_bytes(),
                        budget_bytes);
}

void EngineWorker::forgetConversation(qint64 conversation_id) {
  if (!state_->pool) return;
  if (state_->pool->forget(conversation_id)) Q_EMIT cacheChanged(conversation_id, 0, 0, total_cache_bytes(), 0);
  if (SnapshotStore* store = state_->pool->snapshots())
    Q_EMIT snapshotWritten(conversation_id, 0, 0, store->folder_bytes(), state_->snapshot_options.disk_budget_bytes);
}

}  // namespace kvchat::app
