#include "app/chat/chat_controller.h"

#include <spdlog/spdlog.h>

#include <QCoreApplication>
#include <QSettings>

#include <algorithm>
#include <exception>

#include "app/chat/chat_turn_runner.h"
#include "app/chat/draft_counter.h"
#include "app/model_catalog.h"
#include "app/model_locator.h"
#include "engine/model/model_loader.h"

namespace kvchat::app {

ChatController::ChatController(const QString& database_path, QSettings* settings_storage, QObject* parent)
    : QObject(parent),
      store_(std::make_unique<ConversationStore>(database_path)),
      settings_storage_(settings_storage),
      settings_(ChatSettings::load(*settings_storage)),
      user_presets_(load_user_presets(*settings_storage)),
      local_server_(new LocalServerHost(settings_storage, this)),
      backend_(new BackendHost(settings_storage, this)) {
  // Connected before anyone else can connect: the controller's own state follows a model change first.
  connect(backend_, &BackendHost::modelLoading, this, [this] { apply_local_server(); });  // stopped meanwhile
  connect(backend_, &BackendHost::modelLoaded, this, [this](const ModelInfo& info) {
    cache_figures_.clear();
    total_cache_bytes_ = 0;
    snapshots_described_.clear();
    last_stats_.reset();  // the previous model's figures describe nothing on this one
    if (!remember_model_path_.isEmpty() && remember_model_path_ == info.path) {
      settings_.model_path = info.path;
      settings_.save(*settings_storage_);
      settings_storage_->sync();
      spdlog::info("model {} saved in the settings", info.path.toStdString());
    }
    remember_model_path_.clear();
    apply_local_server();  // on the new model
    Q_EMIT lastReplyStatsChanged();
    Q_EMIT cacheGaugeChanged();
    describe_snapshot(current_conversation_);
  });
  connect(backend_, &BackendHost::modelLoadFailed, this, [this] {
    remember_model_path_.clear();  // the previous model stays, and so does the setting
    apply_local_server();          // back on the previous model, if there is one
  });
  connect(engine(), &EngineWorker::cacheChanged, this, &ChatController::on_cache_changed);
  connect(engine(), &EngineWorker::cacheEvicted, this, &ChatController::on_cache_evicted);
  connect(engine(), &EngineWorker::snapshotWritten, this, &ChatController::on_snapshot_written);
  set_up_turns();
  connect(backend_->draftCounter(), &DraftCounter::counted, this, &ChatController::draftMeasured);
  snapshot_key_prefix_ = snapshot_key_prefix(database_path);  // conversation ids are per database
  configure_snapshots();

  const auto existing = store_->conversations();
  if (!existing.isEmpty()) current_conversation_ = existing.first().id;
}

ChatController::~ChatController() {
  local_server_->stop();
  stopForQuit();  // generate() returns within a token
  backend_->shutdown();
  // The stopped turn's last chunks and its finished() are still queued here: deliver them, so the reply is
  // saved complete with its stats rather than left as an interrupted one.
  QCoreApplication::sendPostedEvents(this, QEvent::MetaCall);
  if (active_) {
    try {
      active_->recorder->finish(QJsonObject{{"stop_reason", "stopped"}, {kReplyClosedByAppKey, true}});
    } catch (const std::exception& error) {
      spdlog::error("cannot save the reply being generated at exit: {}", error.what());
    }
  }
}

void ChatController::applySettings(const ChatSettings& settings) {
  const QString old_model = resolve_model_path(settings_.model_path);
  const bool old_long_context = settings_.long_context;
  settings_ = settings;
  settings_.save(*settings_storage_);
  settings_storage_->sync();
  spdlog::info("settings saved (kv cache {}, temperature {}, context limit {})",
               settings_.kv_cache_enabled ? "on" : "off", settings_.temperature, settings_.context_limit);
  configure_snapshots();
  apply_local_server();  // the budget may have changed
  Q_EMIT settingsChanged();
  Q_EMIT cacheGaugeChanged();
  // Opened again when the long context changes too: its RoPE factors decide every cached key.
  if (resolve_model_path(settings_.model_path) != old_model || settings_.long_context != old_long_context ||
      !backend_->isModelLoaded())
    loadModel(QString());
}

void ChatController::apply_local_server() {
  // No model while one loads: the server stops first, so it never runs on a model being replaced.
  local_server_->serve(backend_->isModelLoading() ? nullptr : backend_->modelInfo().model,
                       settings_.effective_cache_budget_bytes(), settings_.threads);
}

void ChatController::setFontPointSize(int points) {
  if (settings_.font_point_size == points) return;
  settings_.font_point_size = points;
  settings_.save(*settings_storage_);
  settings_storage_->sync();
}

void ChatController::setAppearance(const QString& appearance) {
  if (settings_.appearance == appearance) return;
  settings_.appearance = appearance;
  settings_.save(*settings_storage_);
  settings_storage_->sync();
}

void ChatController::setExportDirectory(const QString& directory) {
  if (settings_.export_directory == directory) return;
  settings_.export_directory = directory;
  settings_.save(*settings_storage_);
  settings_storage_->sync();
}

void ChatController::loadModel(const QString& path, bool remember) {
  const QString resolved = path.isEmpty() ? resolve_model_path(settings_.model_path) : path;
  remember_model_path_ = remember ? resolved : QString();
  backend_->loadModel(resolved, settings_.threads, settings_.long_context);
}

std::optional<ChatController::ModelUse> ChatController::lastModelOf(qint64 conversation_id) const {
  const QList<MessageRecord> records = stored_messages(conversation_id);
  for (auto it = records.crbegin(); it != records.crend(); ++it) {
    if (it->role != MessageRole::Assistant || is_hidden_alternative(*it)) continue;
    const QString path = it->settings.value(kReplyModelPathKey).toString();
    if (path.isEmpty()) return std::nullopt;  // the last reply does not say (remote, or written before the key)
    return ModelUse{path, it->model};
  }
  return std::nullopt;
}

bool ChatController::isBackendReady() const {
  return usesRemoteBackend() ? !settings_.remote_base_url.trimmed().isEmpty() : backend_->isModelLoaded();
}

CacheGauge ChatController::cacheGauge() const {
  CacheGauge gauge;
  gauge.on_server = usesRemoteBackend();
  gauge.cache_enabled = settings_.kv_cache_enabled;
  const int model_limit = backend_->modelInfo().context_length;
  gauge.context_limit = (settings_.context_limit <= 0 || (model_limit > 0 && settings_.context_limit > model_limit))
                            ? model_limit
                            : settings_.context_limit;
  const auto figures = cache_figures_.value(current_conversation_);
  gauge.conversation_tokens = figures.tokens;
  gauge.conversation_bytes = figures.bytes;
  gauge.kv_dtype = settings_.kv_dtype;
  gauge.reused_tokens = figures.reused_tokens;
  gauge.prefilled_tokens = figures.prefilled_tokens;
  // A turn's figures describe the backend that ran it: a server's cached_tokens are no local reuse.
  gauge.has_turn = figures.has_turn && figures.turn_on_server == gauge.on_server;
  gauge.total_bytes = total_cache_bytes_;
  gauge.budget_bytes = settings_.effective_cache_budget_bytes();
  gauge.restored_tokens = figures.restored_tokens;
  gauge.restore_ms = figures.restore_ms;
  gauge.snapshots_enabled = settings_.kv_snapshots_enabled && settings_.kv_cache_enabled;
  gauge.snapshot_tokens = figures.snapshot_tokens;
  gauge.snapshot_bytes = figures.snapshot_bytes;
  gauge.disk_bytes = snapshot_folder_bytes_;
  gauge.disk_budget_bytes = settings_.snapshot_disk_budget_bytes;
  return gauge;
}

std::optional<DraftMeasure> ChatController::measureDraft(const QString& draft, bool replacing_last_message) const {
  return measure_on_counter_thread(draft_request(draft, replacing_last_message, 0));
}

std::optional<DraftMeasure> ChatController::measureEdit(const QString& draft, qint64 message_id) const {
  return measure_on_counter_thread(draft_request(draft, false, message_id));
}

std::optional<DraftMeasure> ChatController::measure_on_counter_thread(
    const std::optional<DraftRequest>& request) const {
  if (!request) return std::nullopt;
  // Counted where every count is; this thread waits for it.
  std::optional<DraftMeasure> measure;
  QMetaObject::invokeMethod(
      backend_->draftCounter(), [&measure, &request] { measure = measure_draft(*request); },
      Qt::BlockingQueuedConnection);
  return measure;
}

quint64 ChatController::requestDraftMeasure(const QString& draft, qint64 editing_message_id) {
  std::optional<DraftRequest> request = draft_request(draft, false, editing_message_id);
  const quint64 id = next_draft_request_++;
  DraftCounter* counter = backend_->draftCounter();
  counter->supersede(id);
  if (!request) {
    // Queued all the same, so that the answer comes after any earlier one.
    QMetaObject::invokeMethod(
        counter, [counter, id] { Q_EMIT counter->counted(id, false, DraftMeasure{}); }, Qt::QueuedConnection);
    return id;
  }
  request->id = id;
  QMetaObject::invokeMethod(
      counter, [counter, request = std::move(*request)] { counter->count(request); }, Qt::QueuedConnection);
  return id;
}

std::optional<DraftRequest> ChatController::draft_request(const QString& draft, bool replacing_last_message,
                                                          qint64 replacing_message_id) const {
  // A server counts with its own tokenizer: the local one's count would be a guess.
  const ModelInfo& model = backend_->modelInfo();
  if (usesRemoteBackend() || !backend_->isModelLoaded() || !model.model || !model.model->tokenizer) return std::nullopt;
  DraftRequest request;
  request.model = model.model;
  request.context_limit = cacheGauge().context_limit;
  request.overflow = settings_.context_overflow;
  std::vector<ChatMessage>& messages = request.messages;
  if (current_conversation_ != 0 && (replacing_last_message || replacing_message_id != 0)) {
    // What the edit keeps: the shown messages before the edited one (the edit starts a branch there).
    if (const auto conversation = store_->conversation(current_conversation_)) {
      QList<MessageRecord> records = messages_on_shown_path(current_records());
      for (qsizetype i = records.size() - 1; i >= 0; --i)
        if (records[i].role == MessageRole::User &&
            (replacing_message_id == 0 || records[i].id == replacing_message_id)) {
          records.resize(i);
          break;
        }
      messages = chat_messages_for_engine(*conversation, records);
    }
  } else if (current_conversation_ != 0) {
    messages = engineMessages(current_conversation_);
  }
  if (messages.empty() && !settings_.default_system_prompt.trimmed().isEmpty() && current_conversation_ == 0)
    messages.push_back({"system", settings_.default_system_prompt.toStdString()});
  messages.push_back({"user", draft.toStdString()});
  return request;
}

QList<ChatController::HeldCache> ChatController::heldCaches() const {
  QList<HeldCache> held;
  for (auto it = cache_figures_.cbegin(); it != cache_figures_.cend(); ++it)
    if (it->bytes > 0) held.push_back({it.key(), it->tokens, it->bytes});
  std::sort(held.begin(), held.end(), [](const HeldCache& a, const HeldCache& b) { return a.bytes > b.bytes; });
  return held;
}

bool ChatController::clearCache(qint64 conversation_id) {
  if (active_ && active_->conversation_id == conversation_id) {
    Q_EMIT errorOccurred(QStringLiteral("This chat is generating a reply: its cache cannot be cleared now."));
    return false;
  }
  spdlog::info("clearing the cached state of conversation {} (memory and disk)", conversation_id);
  QMetaObject::invokeMethod(
      engine(), [worker = engine(), conversation_id] { worker->forgetConversation(conversation_id); },
      Qt::QueuedConnection);
  return true;
}

bool ChatController::clearAllCachedState() {
  if (active_) {
    Q_EMIT errorOccurred(QStringLiteral("A reply is being generated: cached state cannot be cleared now."));
    return false;
  }
  spdlog::info("clearing every conversation's cached state (memory and disk)");
  for (auto& figures : cache_figures_) figures = ConversationCacheFigures{};
  QMetaObject::invokeMethod(
      engine(), [worker = engine()] { worker->clearAllCachedState(); }, Qt::QueuedConnection);
  Q_EMIT cacheGaugeChanged();
  return true;
}

void ChatController::setSnapshotDirectoryOverride(const QString& directory) {
  snapshot_directory_override_ = directory;
  configure_snapshots();
}

QString ChatController::snapshotDirectory() const {
  return snapshot_directory_override_.isEmpty() ? settings_.effective_snapshot_directory()
                                                : snapshot_directory_override_;
}

void ChatController::configure_snapshots() {
  SnapshotOptions options;
  options.enabled = settings_.kv_snapshots_enabled;
  options.directory = snapshotDirectory();
  options.disk_budget_bytes = settings_.snapshot_disk_budget_bytes;
  options.key_prefix = snapshot_key_prefix_;
  QMetaObject::invokeMethod(
      engine(), [worker = engine(), options] { worker->configureSnapshots(options); }, Qt::QueuedConnection);
  snapshots_described_.clear();  // another folder, or none: ask again
  describe_snapshot(current_conversation_);
}

void ChatController::describe_snapshot(qint64 conversation_id) {
  if (conversation_id <= 0 || !backend_->isModelLoaded() || usesRemoteBackend() ||
      snapshots_described_.contains(conversation_id))
    return;
  if (!settings_.kv_snapshots_enabled || !settings_.kv_cache_enabled) return;
  snapshots_described_.insert(conversation_id);
  QMetaObject::invokeMethod(
      engine(), [worker = engine(), conversation_id] { worker->describeSnapshot(conversation_id); },
      Qt::QueuedConnection);
}

void ChatController::on_snapshot_written(qint64 conversation_id, qint64 tokens, qint64 file_bytes, qint64 folder_bytes,
                                         qint64 budget) {
  (void)budget;  // the gauge shows the current settings' budget
  snapshot_folder_bytes_ = folder_bytes;
  if (conversation_id != 0 && store_->conversation(conversation_id)) {
    auto& figures = cache_figures_[conversation_id];
    figures.snapshot_tokens = tokens;
    figures.snapshot_bytes = file_bytes;
  }
  Q_EMIT cacheGaugeChanged();
}

void ChatController::on_cache_changed(qint64 conversation_id, qint64 tokens, qint64 bytes, qint64 total_bytes,
                                      qint64 budget_bytes) {
  (void)budget_bytes;  // the gauge shows the current settings' budget
  total_cache_bytes_ = total_bytes;
  if (store_->conversation(conversation_id)) {
    auto& figures = cache_figures_[conversation_id];
    figures.tokens = tokens;
    figures.bytes = bytes;
  } else {
    cache_figures_.remove(conversation_id);  // a late report about a deleted conversation
  }
  Q_EMIT cacheGaugeChanged();
}

void ChatController::on_cache_evicted(qint64 conversation_id) {
  auto& figures = cache_figures_[conversation_id];
  figures.tokens = 0;
  figures.bytes = 0;
  Q_EMIT cacheEvicted(conversation_id);
  Q_EMIT cacheGaugeChanged();
}

}  // namespace kvchat::app
