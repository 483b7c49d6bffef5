#include "app/engine_worker.h"

#include <spdlog/spdlog.h>

#include <QElapsedTimer>

#include <algorithm>
#include <exception>
#include <map>
#include <optional>

#include "engine/compute_options.h"
#include "engine/llama_model.h"
#include "engine/model_loader.h"
#include "engine/session.h"

namespace kvchat::app {

namespace {

// Coalesce streamed text so that a fast model does not flood the GUI thread with one event per token.
constexpr qint64 kTextBatchMilliseconds = 30;

struct ConversationCache {
  std::unique_ptr<Session> session;
  ConversationTokens transcript;
  quint64 last_used = 0;
};

}  // namespace

struct EngineWorker::State {
  std::shared_ptr<const LoadedModel> model;
  std::map<qint64, ConversationCache> conversations;
  quint64 use_clock = 0;
  int threads = -1;  // engine threads currently set; -1 = never set
};

EngineWorker::EngineWorker(QObject* parent) : QObject(parent), state_(std::make_unique<State>()) {}

EngineWorker::~EngineWorker() = default;

void EngineWorker::register_meta_types() {
  qRegisterMetaType<kvchat::app::ModelInfo>("kvchat::app::ModelInfo");
  qRegisterMetaType<kvchat::app::TurnRequest>("kvchat::app::TurnRequest");
  qRegisterMetaType<kvchat::app::DecodeTimings>("kvchat::app::DecodeTimings");
  qRegisterMetaType<kvchat::app::ConversationTokens>("kvchat::app::ConversationTokens");
  qRegisterMetaType<kvchat::GenerationStats>("kvchat::GenerationStats");
}

void EngineWorker::loadModel(const QString& directory, int threads) {
  QElapsedTimer timer;
  timer.start();
  try {
    LoadOptions options;
    options.threads = threads;
    auto model = std::make_shared<LoadedModel>(load_model(directory.toStdString(), options));
    if (!model->tokenizer)
      throw std::invalid_argument("model " + directory.toStdString() +
                                  " has no tokenizer (tokenizer.json or GGUF tokenizer metadata), so it cannot be used for chat");
    state_->threads = threads;
    // Caches belong to the model that filled them (listeners drop theirs on loaded()).
    state_->conversations.clear();
    state_->model = model;

    ModelInfo info;
    info.directory = directory;
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
    if (request.threads != state_->threads) {
      set_compute_threads(request.threads);
      state_->threads = request.threads;
    }
    ConversationCache& cache = state_->conversations[request.conversation_id];
    cache.last_used = ++state_->use_clock;
    if (!cache.session) cache.session = std::make_unique<Session>(model->model, request.generation.cache_mode);

    TurnOptions options;
    options.generation = request.generation;
    options.context_limit = request.context_limit;
    options.overflow = request.overflow;
    options.continue_reply = request.continue_reply;

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
    TurnOutcome outcome =
        runner.run(*cache.session, cache.transcript, request.messages, options, request.stop.get(), on_progress);
    flush();
    if (outcome.dropped_messages > 0) Q_EMIT contextTrimmed(turn_id, outcome.dropped_messages, outcome.context_limit);
    spdlog::debug("turn {}: {} prompt tokens ({} reused), {} generated, stop {}", turn_id,
                  outcome.stats.prompt_tokens, outcome.stats.reused_tokens, outcome.stats.generated_tokens,
                  to_string(outcome.stats.stop_reason));
    // Cache figures first, so that whoever handles finished() already sees the caches as they now are.
    enforce_budget(request.conversation_id, request.cache_budget_bytes);
    Q_EMIT transcriptUpdated(request.conversation_id, cache.transcript);
    DecodeTimings timings;
    timings.first_position = static_cast<int>(outcome.prompt_ids.size()) + 1;
    timings.step_ms = QList<double>(outcome.decode_step_ms.begin(), outcome.decode_step_ms.end());
    timings.cache_mode = outcome.stats.cache_mode;
    Q_EMIT decodeTimings(turn_id, timings);
    Q_EMIT finished(turn_id, outcome.stats);
  } catch (const std::exception& error) {
    spdlog::error("turn {} failed: {}", turn_id, error.what());
    Q_EMIT failed(turn_id, QString::fromStdString(error.what()));
  } catch (...) {
    spdlog::error("turn {} failed with an unknown error", turn_id);
    Q_EMIT failed(turn_id, QStringLiteral("unknown engine error"));
  }
}

qint64 EngineWorker::total_cache_bytes() const {
  qint64 total = 0;
  for (const auto& [conversation_id, cache] : state_->conversations)
    if (cache.session) total += cache.session->cache_bytes();
  return total;
}

void EngineWorker::enforce_budget(qint64 active_conversation, qint64 budget_bytes) {
  qint64 total = total_cache_bytes();
  if (budget_bytes > 0 && total > budget_bytes) {
    std::vector<std::pair<quint64, qint64>> by_age;  // (last used, conversation)
    for (const auto& [conversation_id, cache] : state_->conversations)
      if (conversation_id != active_conversation && cache.session && cache.session->cache_bytes() > 0)
        by_age.emplace_back(cache.last_used, conversation_id);
    std::sort(by_age.begin(), by_age.end());
    for (const auto& [last_used, conversation_id] : by_age) {
      if (total <= budget_bytes) break;
      Session& session = *state_->conversations[conversation_id].session;
      const qint64 freed = session.cache_bytes();
      // The token transcript stays: the next turn rebuilds exactly the same cache by prefill.
      session.clear();
      total -= freed;
      spdlog::info("cache budget {} bytes: evicted conversation {} ({} bytes)", budget_bytes, conversation_id, freed);
      Q_EMIT cacheEvicted(conversation_id);
      Q_EMIT cacheChanged(conversation_id, 0, 0, total, budget_bytes);
    }
    if (total > budget_bytes)
      spdlog::warn("the active conversation's cache alone ({} bytes) exceeds the budget of {} bytes", total,
                   budget_bytes);
  }
  auto it = state_->conversations.find(active_conversation);
  if (it != state_->conversations.end() && it->second.session)
    Q_EMIT cacheChanged(active_conversation, it->second.session->cache_tokens(), it->second.session->cache_bytes(),
                        total, budget_bytes);
}

void EngineWorker::forgetConversation(qint64 conversation_id) {
  if (state_->conversations.erase(conversation_id) == 0) return;
  Q_EMIT cacheChanged(conversation_id, 0, 0, total_cache_bytes(), 0);
}

}  // namespace kvchat::app
