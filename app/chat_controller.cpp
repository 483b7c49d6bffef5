#include "app/chat_controller.h"

#include <spdlog/spdlog.h>

#include <QCoreApplication>
#include <QSettings>

#include <exception>

#include "app/model_locator.h"
#include "app/stats_json.h"

namespace kvchat::app {

namespace {

// The growing reply is committed at least this often, so a crash loses under a second of it.
constexpr int kCommitIntervalMs = 500;
// The live speed gauge refreshes at least this often while generating.
constexpr int kSpeedIntervalMs = 250;
constexpr int kTitleLength = 40;

QString title_from_text(const QString& text) {
  QString title = text.simplified();
  if (title.size() > kTitleLength) title = title.left(kTitleLength - 1).trimmed() + QChar(0x2026);
  return title;
}

}  // namespace

QString ChatController::newConversationTitle() { return QStringLiteral("New chat"); }

ChatController::ChatController(const QString& database_path, QSettings* settings_storage, QObject* parent)
    : QObject(parent),
      store_(std::make_unique<ConversationStore>(database_path)),
      settings_storage_(settings_storage),
      settings_(ChatSettings::load(*settings_storage)) {
  EngineWorker::register_meta_types();
  worker_ = new EngineWorker;
  worker_->moveToThread(&engine_thread_);
  engine_thread_.setObjectName("engine");

  connect(worker_, &EngineWorker::loaded, this, [this](const ModelInfo& info) {
    model_info_ = info;
    model_loaded_ = true;
    model_loading_ = false;
    cache_figures_.clear();
    total_cache_bytes_ = 0;
    if (!remember_model_directory_.isEmpty() && remember_model_directory_ == info.directory) {
      settings_.model_directory = info.directory;
      settings_.save(*settings_storage_);
      settings_storage_->sync();
      spdlog::info("model directory {} saved in the settings", info.directory.toStdString());
    }
    remember_model_directory_.clear();
    Q_EMIT modelLoaded(info);
    Q_EMIT cacheGaugeChanged();
  });
  connect(worker_, &EngineWorker::loadFailed, this, [this](const QString& directory, const QString& message) {
    model_loading_ = false;
    remember_model_directory_.clear();  // the previous model stays, and so does the setting
    Q_EMIT modelLoadFailed(directory, message);
  });
  connect(worker_, &EngineWorker::textReady, this, &ChatController::on_text_ready);
  connect(worker_, &EngineWorker::tokenStats, this, &ChatController::on_token_stats);
  connect(worker_, &EngineWorker::contextTrimmed, this, &ChatController::on_context_trimmed);
  connect(worker_, &EngineWorker::finished, this, &ChatController::on_finished);
  connect(worker_, &EngineWorker::failed, this, &ChatController::on_failed);
  connect(worker_, &EngineWorker::cacheChanged, this, &ChatController::on_cache_changed);
  connect(worker_, &EngineWorker::cacheEvicted, this, &ChatController::on_cache_evicted);
  engine_thread_.start();

  commit_timer_.setInterval(kCommitIntervalMs);
  connect(&commit_timer_, &QTimer::timeout, this, &ChatController::commit_growing_reply);
  speed_timer_.setInterval(kSpeedIntervalMs);
  connect(&speed_timer_, &QTimer::timeout, this,
          [this] { Q_EMIT decodeSpeedChanged(live_decode_rate_, live_generated_); });

  const auto existing = store_->conversations();
  if (!existing.isEmpty()) current_conversation_ = existing.first().id;
}

ChatController::~ChatController() {
  if (active_) active_->stop->store(true);  // generate() returns within a token
  engine_thread_.quit();
  engine_thread_.wait();
  delete worker_;
  // The stopped turn's last chunks and its finished() are still queued here: deliver them, so the reply is
  // saved complete with its stats rather than left as an interrupted one.
  QCoreApplication::sendPostedEvents(this, QEvent::MetaCall);
  if (active_) {
    try {
      store_->finish_message(active_->message_id, active_->text, QJsonObject{{"stop_reason", "stopped"}});
    } catch (const std::exception& error) {
      spdlog::error("cannot save the reply being generated at exit: {}", error.what());
    }
  }
}

void ChatController::applySettings(const ChatSettings& settings) {
  const QString old_model = resolve_model_directory(settings_.model_directory);
  settings_ = settings;
  settings_.save(*settings_storage_);
  settings_storage_->sync();
  spdlog::info("settings saved (kv cache {}, temperature {}, context limit {})",
               settings_.kv_cache_enabled ? "on" : "off", settings_.temperature, settings_.context_limit);
  Q_EMIT settingsChanged();
  Q_EMIT cacheGaugeChanged();
  if (resolve_model_directory(settings_.model_directory) != old_model || !model_loaded_) loadModel(QString());
}

void ChatController::loadModel(const QString& directory, bool remember) {
  const QString resolved = directory.isEmpty() ? resolve_model_directory(settings_.model_directory) : directory;
  remember_model_directory_ = remember ? resolved : QString();
  model_loading_ = true;
  Q_EMIT modelLoading(resolved);
  const int threads = settings_.threads;
  QMetaObject::invokeMethod(worker_, [worker = worker_, resolved, threads] { worker->loadModel(resolved, threads); },
                            Qt::QueuedConnection);
}

QList<ConversationRecord> ChatController::conversations() const { return store_->conversations(); }

std::optional<ConversationRecord> ChatController::conversation(qint64 conversation_id) const {
  return store_->conversation(conversation_id);
}

QList<MessageRecord> ChatController::currentMessages() const {
  if (current_conversation_ == 0) return {};
  return store_->messages(current_conversation_);
}

std::vector<ChatMessage> ChatController::engineMessages(qint64 conversation_id) const {
  const auto conversation = store_->conversation(conversation_id);
  if (!conversation) return {};
  return chat_messages_for_engine(*conversation, store_->messages(conversation_id));
}

CacheGauge ChatController::cacheGauge() const {
  CacheGauge gauge;
  gauge.cache_enabled = settings_.kv_cache_enabled;
  const int model_limit = model_info_.context_length;
  gauge.context_limit = (settings_.context_limit <= 0 || (model_limit > 0 && settings_.context_limit > model_limit))
                            ? model_limit
                            : settings_.context_limit;
  const auto figures = cache_figures_.value(current_conversation_);
  gauge.conversation_tokens = figures.tokens;
  gauge.conversation_bytes = figures.bytes;
  gauge.reused_tokens = figures.reused_tokens;
  gauge.prefilled_tokens = figures.prefilled_tokens;
  gauge.has_turn = figures.has_turn;
  gauge.total_bytes = total_cache_bytes_;
  gauge.budget_bytes = settings_.effective_cache_budget_bytes();
  return gauge;
}

qint64 ChatController::newConversation() {
  try {
    const qint64 id = store_->create_conversation(newConversationTitle(), settings_.default_system_prompt);
    spdlog::info("new conversation {}", id);
    Q_EMIT conversationsChanged();
    selectConversation(id);
    return id;
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return 0;
  }
}

void ChatController::selectConversation(qint64 conversation_id) {
  if (conversation_id == current_conversation_) return;
  current_conversation_ = conversation_id;
  last_stats_.reset();
  Q_EMIT currentConversationChanged(conversation_id);
  Q_EMIT messagesReset();
  Q_EMIT cacheGaugeChanged();
  Q_EMIT lastReplyStatsChanged();
}

void ChatController::renameConversation(qint64 conversation_id, const QString& title) {
  try {
    store_->rename_conversation(conversation_id, title.trimmed().isEmpty() ? newConversationTitle() : title.trimmed());
    Q_EMIT conversationsChanged();
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

void ChatController::deleteConversation(qint64 conversation_id) {
  try {
    if (active_ && active_->conversation_id == conversation_id) {
      // Nothing of this turn may be written any more: forget it (its late signals are then stale).
      active_->stop->store(true);
      end_turn();
    }
    store_->delete_conversation(conversation_id);
    QMetaObject::invokeMethod(worker_, [worker = worker_, conversation_id] { worker->forgetConversation(conversation_id); },
                              Qt::QueuedConnection);
    if (cache_figures_.contains(conversation_id)) {
      total_cache_bytes_ -= cache_figures_.value(conversation_id).bytes;
      cache_figures_.remove(conversation_id);
    }
    spdlog::info("deleted conversation {}", conversation_id);
    Q_EMIT conversationsChanged();
    if (conversation_id == current_conversation_) {
      const auto remaining = store_->conversations();
      current_conversation_ = -1;  // force the change notification below
      selectConversation(remaining.isEmpty() ? 0 : remaining.first().id);
    }
    Q_EMIT cacheGaugeChanged();
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

void ChatController::setSystemPrompt(qint64 conversation_id, const QString& system_prompt) {
  try {
    store_->set_system_prompt(conversation_id, system_prompt);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

bool ChatController::can_start_turn() {
  QString reason;
  if (active_) reason = QStringLiteral("A reply is still being generated: stop it first.");
  else if (model_loading_ && !model_loaded_) reason = QStringLiteral("The model is still loading.");
  else if (!model_loaded_) reason = QStringLiteral("No model is loaded: open a model directory first.");
  else return true;
  Q_EMIT errorOccurred(reason);
  return false;
}

bool ChatController::send(const QString& text) {
  if (!can_start_turn()) return false;
  if (text.trimmed().isEmpty()) return false;
  try {
    if (current_conversation_ == 0 || !store_->conversation(current_conversation_)) newConversation();
    const qint64 conversation_id = current_conversation_;
    const auto conversation = store_->conversation(conversation_id);
    if (conversation && conversation->title == newConversationTitle() && conversation->message_count == 0) {
      store_->rename_conversation(conversation_id, title_from_text(text));
    }
    MessageRecord user;
    user.conversation_id = conversation_id;
    user.role = "user";
    user.text = text;
    user.complete = true;
    store_->add_message(user);
    Q_EMIT conversationsChanged();
    return start_turn(conversation_id);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::regenerate() {
  if (!can_start_turn()) return false;
  try {
    const QList<MessageRecord> records = currentMessages();
    const MessageRecord* last_assistant = nullptr;
    for (auto it = records.crbegin(); it != records.crend(); ++it) {
      if (it->role == "marker") continue;
      if (it->role == "assistant") last_assistant = &*it;
      break;
    }
    if (!last_assistant) {
      Q_EMIT errorOccurred(QStringLiteral("There is no reply to regenerate."));
      return false;
    }
    store_->delete_messages_from(current_conversation_, last_assistant->id);
    return start_turn(current_conversation_);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::editLastUserMessage(const QString& text) {
  if (!can_start_turn()) return false;
  if (text.trimmed().isEmpty()) return false;
  try {
    const QList<MessageRecord> records = currentMessages();
    for (auto it = records.crbegin(); it != records.crend(); ++it) {
      if (it->role != "user") continue;
      // The engine session keeps the longest common prefix, so only the edited tail is prefilled again.
      store_->delete_messages_from(current_conversation_, it->id);
      return send(text);
    }
    Q_EMIT errorOccurred(QStringLiteral("There is no message to edit."));
    return false;
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::start_turn(qint64 conversation_id) {
  const std::vector<ChatMessage> messages = engineMessages(conversation_id);
  if (messages.empty() || messages.back().role != "user") {
    Q_EMIT errorOccurred(QStringLiteral("The conversation does not end with a message to answer."));
    Q_EMIT messagesReset();
    return false;
  }
  ActiveTurn turn;
  turn.turn_id = next_turn_id_++;
  turn.conversation_id = conversation_id;
  turn.stop = std::make_shared<std::atomic<bool>>(false);
  // The request's non-system messages map back to these ids (a context cut is recorded against them).
  for (const MessageRecord& record : messages_in_context(store_->messages(conversation_id)))
    turn.engine_message_ids.push_back(record.id);

  MessageRecord reply;
  reply.conversation_id = conversation_id;
  reply.role = "assistant";
  reply.model = model_info_.name;
  reply.settings = settings_.to_json();
  reply.complete = false;
  turn.message_id = store_->add_message(reply);

  TurnRequest request;
  request.turn_id = turn.turn_id;
  request.conversation_id = conversation_id;
  request.messages = messages;
  request.generation = settings_.to_generation_config();
  request.context_limit = settings_.context_limit;
  request.overflow = settings_.context_overflow;
  request.cache_budget_bytes = settings_.effective_cache_budget_bytes();
  request.threads = settings_.threads;
  request.stop = turn.stop;

  active_ = std::move(turn);
  live_decode_rate_ = 0.0;
  live_generated_ = 0;
  spdlog::debug("turn {} queued for conversation {} ({} messages)", request.turn_id, conversation_id,
                request.messages.size());
  QMetaObject::invokeMethod(worker_, [worker = worker_, request] { worker->runTurn(request); }, Qt::QueuedConnection);
  commit_timer_.start();
  speed_timer_.start();
  if (conversation_id == current_conversation_) Q_EMIT messagesReset();
  Q_EMIT generatingChanged(true);
  return true;
}

void ChatController::stop() {
  if (!active_) return;
  spdlog::info("stop requested for turn {}", active_->turn_id);
  active_->stop->store(true);
}

void ChatController::exportConversation(qint64 conversation_id, const QString& path, ExportFormat format) const {
  const auto conversation = store_->conversation(conversation_id);
  if (!conversation) throw std::invalid_argument("no conversation with id " + std::to_string(conversation_id));
  write_text_file(path, export_conversation(*conversation, store_->messages(conversation_id), format));
  spdlog::info("exported conversation {} to {}", conversation_id, path.toStdString());
}

void ChatController::commit_growing_reply() {
  if (!active_ || active_->text == active_->committed_text) return;
  try {
    store_->update_message_text(active_->message_id, active_->text);
    active_->committed_text = active_->text;
  } catch (const std::exception& error) {
    spdlog::error("cannot save the growing reply: {}", error.what());
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

void ChatController::end_turn() {
  active_.reset();
  commit_timer_.stop();
  speed_timer_.stop();
  Q_EMIT generatingChanged(false);
}

void ChatController::emit_reply_finished(qint64 message_id) {
  // Read back, not rebuilt from the turn: listeners get the record as saved (after a failed save, the
  // text last committed), the same as a reload would show.
  std::optional<MessageRecord> reply;
  try {
    reply = store_->message(message_id);
  } catch (const std::exception& error) {
    spdlog::error("cannot read back the finished reply {}: {}", message_id, error.what());
  }
  if (reply) Q_EMIT replyFinished(*reply);
}

void ChatController::on_text_ready(quint64 turn_id, const QString& chunk) {
  if (!active_ || active_->turn_id != turn_id) return;  // a stale turn (deleted conversation)
  active_->text += chunk;
  Q_EMIT replyTextAppended(active_->conversation_id, active_->message_id, chunk);
}

void ChatController::on_token_stats(quint64 turn_id, int generated_tokens, double tokens_per_second) {
  if (!active_ || active_->turn_id != turn_id) return;
  live_generated_ = generated_tokens;
  live_decode_rate_ = tokens_per_second;
}

void ChatController::on_context_trimmed(quint64 turn_id, int dropped_messages, int context_limit) {
  if (!active_ || active_->turn_id != turn_id) return;
  const auto& ids = active_->engine_message_ids;
  if (dropped_messages <= 0 || static_cast<size_t>(dropped_messages) >= ids.size()) return;
  try {
    store_->add_message(context_cut_marker(active_->conversation_id, ids[static_cast<size_t>(dropped_messages)],
                                           dropped_messages, context_limit));
    spdlog::info("conversation {}: context cut before message {}", active_->conversation_id,
                 ids[static_cast<size_t>(dropped_messages)]);
    if (active_->conversation_id == current_conversation_) Q_EMIT messagesReset();
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

void ChatController::on_finished(quint64 turn_id, const kvchat::GenerationStats& stats) {
  if (!active_ || active_->turn_id != turn_id) return;
  const qint64 conversation_id = active_->conversation_id;
  const qint64 message_id = active_->message_id;
  try {
    store_->finish_message(message_id, active_->text, stats_to_json(stats));
  } catch (const std::exception& error) {
    spdlog::error("cannot save the reply: {}", error.what());
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
  live_generated_ = stats.generated_tokens;
  live_decode_rate_ = stats.decode_tokens_per_second;
  auto& figures = cache_figures_[conversation_id];
  figures.reused_tokens = stats.reused_tokens;
  figures.prefilled_tokens = stats.prefilled_tokens;
  figures.has_turn = true;
  if (stats.cache_mode == KvCacheMode::Off) {
    total_cache_bytes_ -= figures.bytes;
    figures.tokens = 0;
    figures.bytes = 0;
  }
  if (conversation_id == current_conversation_) last_stats_ = stats;
  end_turn();
  Q_EMIT decodeSpeedChanged(live_decode_rate_, live_generated_);
  emit_reply_finished(message_id);
  Q_EMIT lastReplyStatsChanged();
  Q_EMIT cacheGaugeChanged();
  Q_EMIT conversationsChanged();
}

void ChatController::on_failed(quint64 turn_id, const QString& message) {
  if (!active_ || active_->turn_id != turn_id) return;
  const qint64 message_id = active_->message_id;
  try {
    QJsonObject stats;
    stats.insert("error", message);
    store_->finish_message(message_id, active_->text, stats);
  } catch (const std::exception& error) {
    spdlog::error("cannot save the failed reply: {}", error.what());
  }
  end_turn();
  emit_reply_finished(message_id);
  Q_EMIT errorOccurred(message);
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
