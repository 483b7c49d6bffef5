// ChatController, the turn lifecycle: send, regenerate, edit, stop; the reply streaming in, saved, its stats.
#include "app/chat/chat_controller.h"

#include <spdlog/spdlog.h>

#include <QJsonArray>

#include <algorithm>
#include <exception>

#include "app/chat/reply_committer.h"
#include "app/store/message_stats_json.h"

namespace kvchat::app {

namespace {

// The live speed gauge refreshes at least this often while generating.
constexpr int kSpeedIntervalMs = 250;
constexpr int kTitleLength = 40;

QString title_from_text(const QString& text) {
  QString title = text.simplified();
  if (title.size() > kTitleLength) title = title.left(kTitleLength - 1).trimmed() + QChar(0x2026);
  return title;
}

// What the model wrote, as a title: its first line that has any text, without quotes or a "Title:" label around
// it, cut like a message's title. "" when nothing is left.
QString title_from_model_text(const QString& text) {
  for (QString line : text.split(QLatin1Char('\n'))) {
    line = line.simplified();
    if (line.startsWith(QLatin1String("Title:"), Qt::CaseInsensitive)) line = line.mid(6).trimmed();
    while (!line.isEmpty() && QStringLiteral("\"'*#").contains(line.front())) line.remove(0, 1);
    while (!line.isEmpty() && QStringLiteral("\"'*").contains(line.back())) line.chop(1);
    line = line.trimmed();
    if (!line.isEmpty()) return title_from_text(line);
  }
  return {};
}

// The request for a title: the chat's first message and the reply, in a message of their own.
constexpr const char* kTitleInstruction =
    "Write a title of at most six words for this conversation. Answer with the "
    "title only.";
constexpr int kTitleMaxTokens = 16;
constexpr int kTitleSourceCharacters = 1000;  // of each message: a title needs the start, not a long reply

}  // namespace

void ChatController::set_up_turns() {
  // Both backends report a turn with TurnBackend's signals: the rest of the turn is the same for either.
  for (TurnBackend* backend : {backend_->turnBackend(BackendKind::Local), backend_->turnBackend(BackendKind::Remote)}) {
    connect(backend, &TurnBackend::textReady, this, &ChatController::on_text_ready);
    connect(backend, &TurnBackend::tokenStats, this, &ChatController::on_token_stats);
    connect(backend, &TurnBackend::contextTrimmed, this, &ChatController::on_context_trimmed);
    connect(backend, &TurnBackend::decodeTimings, this, [this](quint64 turn_id, const DecodeTimings& timings) {
      if (!active_ || active_->turn_id != turn_id) return;
      previous_timings_ = last_timings_;
      last_timings_ = timings;
      Q_EMIT decodeTimingsChanged();
    });
    connect(backend, &TurnBackend::replyTokens, this, [this](quint64 turn_id, const ReplyTokens& tokens) {
      if (active_ && active_->turn_id == turn_id) active_->reply_tokens = tokens;
    });
    connect(backend, &TurnBackend::replyDetails, this,
            [this](quint64 turn_id, const QString& backend_url, const QString& model, const QJsonObject& details) {
              if (!active_ || active_->turn_id != turn_id) return;
              active_->remote_details = details;
              try {
                store_->set_message_origin(active_->message_id, backend_url, model);
                // The cached reply keeps the text streamed so far; only its origin changed.
                if (MessageRecord* cached = cached_record(active_->conversation_id, active_->message_id)) {
                  cached->backend = backend_url;
                  cached->model = model;
                }
              } catch (const std::exception& error) {
                spdlog::error("cannot record which server answered: {}", error.what());
              }
            });
    connect(backend, &TurnBackend::finished, this, &ChatController::on_finished);
    connect(backend, &TurnBackend::interrupted, this, &ChatController::on_interrupted);
    connect(backend, &TurnBackend::failed, this, &ChatController::on_failed);
  }
  connect(engine(), &EngineWorker::titleReady, this, &ChatController::on_title_ready);
  connect(engine(), &EngineWorker::titleFailed, this,
          [this](qint64 conversation_id, const QString&) { on_title_ready(conversation_id, QString()); });
  speed_timer_.setInterval(kSpeedIntervalMs);
  connect(&speed_timer_, &QTimer::timeout, this,
          [this] { Q_EMIT decodeSpeedChanged(live_decode_rate_, live_generated_); });
}

std::vector<ChatMessage> ChatController::engineMessages(qint64 conversation_id) const {
  const auto conversation = store_->conversation(conversation_id);
  if (!conversation) return {};
  return chat_messages_for_engine(*conversation, stored_messages(conversation_id));
}

bool ChatController::can_start_turn() {
  QString reason;
  if (active_ && active_->conversation_id == current_conversation_)
    reason = QStringLiteral("A reply is still being generated: stop it first.");
  else if (active_)
    reason = QStringLiteral("Another chat (\u201c%1\u201d) is generating a reply: wait for it or stop it there.")
                 .arg(store_->conversation(active_->conversation_id).value_or(ConversationRecord{}).title);
  else if (usesRemoteBackend() && settings_.remote_base_url.trimmed().isEmpty())
    reason = QStringLiteral("No server is set: enter its base URL in Settings > Backend.");
  else if (usesRemoteBackend())
    return true;
  else if (backend_->isModelLoading() && !backend_->isModelLoaded())
    reason = QStringLiteral("The model is still loading.");
  else if (!backend_->isModelLoaded())
    reason = QStringLiteral("No model is loaded: open a model directory first.");
  else
    return true;
  Q_EMIT errorOccurred(reason);
  return false;
}

bool ChatController::send(const QString& text) {
  // Another chat's reply streaming does not block this one: the message waits for it (queued below).
  const bool queue =
      active_ && active_->conversation_id != current_conversation_ && current_conversation_ != 0 && isBackendReady();
  if (!queue && !can_start_turn()) return false;
  if (text.trimmed().isEmpty()) return false;
  try {
    if (current_conversation_ == 0 || !store_->conversation(current_conversation_)) newConversation();
    const qint64 conversation_id = current_conversation_;
    const auto conversation = store_->conversation(conversation_id);
    if (conversation && conversation->title == newConversationTitle() && conversation->message_count == 0) {
      store_->rename_conversation(conversation_id, title_from_text(text));
    }
    cache_message(conversation_id, TurnRecorder::add_user_message(*store_, conversation_id, text));
    Q_EMIT conversationsChanged();
    if (queue) {
      if (!queued_conversations_.contains(conversation_id)) queued_conversations_.push_back(conversation_id);
      spdlog::info("conversation {}: message queued behind conversation {}'s reply", conversation_id,
                   active_->conversation_id);
      Q_EMIT messagesReset();
      Q_EMIT turnQueued(conversation_id, active_->conversation_id);
      return true;
    }
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
    const MessageRecord* last_reply = nullptr;
    for (auto it = records.crbegin(); it != records.crend(); ++it) {
      if (it->role == MessageRole::Marker || is_hidden_alternative(*it)) continue;
      if (it->role == MessageRole::Assistant) last_reply = &*it;
      break;
    }
    if (!last_reply) {
      Q_EMIT errorOccurred(QStringLiteral("There is no reply to regenerate."));
      return false;
    }
    // Kept as an alternative of its turn (the window switches between them), no longer shown or sent.
    QJsonObject settings = last_reply->settings;
    settings.insert(kHiddenAlternativeKey, true);
    store_->set_message_settings(last_reply->id, settings);
    cache_message(current_conversation_, last_reply->id);
    return start_turn(current_conversation_);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::showAlternative(qint64 message_id) {
  if (active_ && active_->conversation_id == current_conversation_) {
    Q_EMIT errorOccurred(QStringLiteral("A reply is still being generated: stop it first."));
    return false;
  }
  try {
    const QList<MessageRecord> records = currentMessages();
    const QList<qint64> alternatives = reply_alternatives(records, message_id);
    if (alternatives.isEmpty()) {
      Q_EMIT errorOccurred(QStringLiteral("Message %1 is not a reply of this chat.").arg(message_id));
      return false;
    }
    for (const MessageRecord& record : records) {
      if (!alternatives.contains(record.id)) continue;
      const bool hide = record.id != message_id;
      if (is_hidden_alternative(record) == hide) continue;
      QJsonObject settings = record.settings;
      if (hide)
        settings.insert(kHiddenAlternativeKey, true);
      else
        settings.remove(kHiddenAlternativeKey);
      store_->set_message_settings(record.id, settings);
      cache_message(current_conversation_, record.id);
    }
    spdlog::info("conversation {}: showing reply {} of its turn", current_conversation_, message_id);
    Q_EMIT messagesReset();
    return true;
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

std::optional<MessageRecord> ChatController::continuableReply() const {
  // A chat-completions server always starts a new reply: going on with one is the local engine's.
  if (current_conversation_ == 0 || usesRemoteBackend()) return std::nullopt;
  // A constrained reply cannot be taken up mid-way (ChatTurnRunner): Regenerate gives a whole one.
  if (!chatReplyFormat(current_conversation_).is_text()) return std::nullopt;
  const QList<MessageRecord> records = currentMessages();
  for (auto it = records.crbegin(); it != records.crend(); ++it) {
    if (it->role == MessageRole::Marker || is_hidden_alternative(*it)) continue;
    if (is_continuable_reply(*it)) return *it;
    break;
  }
  return std::nullopt;
}

bool ChatController::continueReply() {
  if (!can_start_turn()) return false;
  try {
    const std::optional<MessageRecord> reply = continuableReply();
    if (!reply && !chatReplyFormat(current_conversation_).is_text()) {
      Q_EMIT errorOccurred(
          QStringLiteral("A reply in JSON cannot be continued: regenerate it (or raise max tokens) "
                         "to get a whole JSON reply."));
      return false;
    }
    if (!reply) {
      Q_EMIT errorOccurred(
          QStringLiteral("The last reply is not one that was cut short: there is nothing to continue."));
      return false;
    }
    return start_turn(current_conversation_, &*reply);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::editLastUserMessage(const QString& text) {
  try {
    const QList<MessageRecord> records = currentMessages();
    for (auto it = records.crbegin(); it != records.crend(); ++it)
      if (it->role == MessageRole::User) return editMessage(it->id, text);
    Q_EMIT errorOccurred(QStringLiteral("There is no message to edit."));
    return false;
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::editMessage(qint64 message_id, const QString& text) {
  if (isQueued(current_conversation_)) {
    Q_EMIT errorOccurred(QStringLiteral("A message of this chat waits to be answered: withdraw it first."));
    return false;
  }
  if (!can_start_turn()) return false;
  if (text.trimmed().isEmpty()) return false;
  try {
    const QList<MessageRecord> records = currentMessages();
    const auto it =
        std::find_if(records.cbegin(), records.cend(), [&](const MessageRecord& r) { return r.id == message_id; });
    if (it == records.cend() || it->role != MessageRole::User) {
      Q_EMIT errorOccurred(QStringLiteral("Message %1 is not a message of yours in this chat.").arg(message_id));
      return false;
    }
    // The engine session keeps the longest common prefix, so only the edit and what follows it are prefilled.
    forget_records(current_conversation_);
    const qint64 edit_id = store_->fork_message(current_conversation_, message_id, text);
    spdlog::info("conversation {}: message {} edited as {} (a new branch)", current_conversation_, message_id, edit_id);
    Q_EMIT conversationsChanged();
    return start_turn(current_conversation_);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::showBranch(qint64 message_id) {
  if ((active_ && active_->conversation_id == current_conversation_) || isQueued(current_conversation_)) {
    Q_EMIT errorOccurred(QStringLiteral("A reply is still being generated in this chat: stop it first."));
    return false;
  }
  try {
    if (current_conversation_ == 0 || branch_siblings(current_records(), message_id).isEmpty()) {
      Q_EMIT errorOccurred(QStringLiteral("Message %1 starts no branch of this chat.").arg(message_id));
      return false;
    }
    forget_records(current_conversation_);
    store_->show_branch(current_conversation_, message_id);
    spdlog::info("conversation {}: showing branch {}", current_conversation_, message_id);
    Q_EMIT messagesReset();
    Q_EMIT cacheGaugeChanged();
    return true;
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::revealMessage(qint64 message_id) {
  if (current_conversation_ == 0) return false;
  try {
    const QList<qint64> hiding = branches_hiding(current_records(), message_id);
    for (const qint64 member : hiding)
      if (!showBranch(member)) return false;
    const QList<MessageRecord> shown = messages_on_shown_path(current_records());
    return std::any_of(shown.cbegin(), shown.cend(),
                       [&](const MessageRecord& message) { return message.id == message_id; });
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

bool ChatController::start_turn(qint64 conversation_id, const MessageRecord* continued) {
  const std::vector<ChatMessage> messages = engineMessages(conversation_id);
  if (messages.empty() || messages.back().role != (continued ? "assistant" : "user")) {
    Q_EMIT errorOccurred(continued ? QStringLiteral("The conversation does not end with a reply to continue.")
                                   : QStringLiteral("The conversation does not end with a message to answer."));
    Q_EMIT messagesReset();
    return false;
  }
  ActiveTurn turn;
  turn.turn_id = next_turn_id_++;
  turn.conversation_id = conversation_id;
  turn.stop = std::make_shared<std::atomic<bool>>(false);
  // The growing reply is committed at least every kReplyCommitInterval, so a crash loses at most
  // kReplyCommitBound of it.
  turn.recorder = std::make_unique<TurnRecorder>(*store_, conversation_id, TurnRecorder::Cadence::EventLoopTimer);
  turn.recorder->set_commit_error_handler([this](const QString& error) { Q_EMIT errorOccurred(error); });
  // The request's non-system messages map back to these ids (a context cut is recorded against them).
  std::vector<qint64> prompt_ids;
  for (const MessageRecord& record : messages_in_context(stored_messages(conversation_id)))
    prompt_ids.push_back(record.id);
  turn.recorder->set_prompt_message_ids(std::move(prompt_ids));

  // The chat's own settings over the global ones, from this turn on.
  const std::optional<GenerationPreset> own_settings = chatGenerationSettings(conversation_id);
  const ChatSettings turn_settings = settings_with(own_settings);
  const std::vector<std::string> stop_texts = own_settings ? own_settings->stop_strings() : std::vector<std::string>{};
  const ReplyFormat reply_format = chatReplyFormat(conversation_id);
  if (!stop_texts.empty()) turn.stop_filter = std::make_shared<StopTextFilter>(stop_texts);

  if (continued) {
    // The reply grows in place: same message, its text so far, its figures kept should the turn fail.
    turn.message_id = continued->id;
    turn.recorder->continue_reply(*continued);
    turn.continuing = true;
    // Kept should going on fail before any text arrives (a finished turn replaces them with all the ids).
    turn.reply_tokens = ReplyTokens{continued->token_ids, continued->token_vocabulary};
  } else {
    MessageRecord reply;
    // A remote reply's model and server are recorded when the server names its model (replyDetails).
    reply.model = usesRemoteBackend() ? settings_.remote_model : backend_->modelInfo().name;
    reply.backend = usesRemoteBackend()
                        ? QString::fromStdString(displayed_base_url(settings_.remote_base_url.trimmed().toStdString()))
                        : QStringLiteral("local");
    reply.settings = turn_settings.to_json();
    if (!usesRemoteBackend()) reply.settings.insert(kReplyModelPathKey, backend_->modelInfo().path);
    if (own_settings) {
      reply.settings.insert(QStringLiteral("preset"), own_settings->name);
      reply.settings.insert(QStringLiteral("stop"), QJsonArray::fromStringList(own_settings->stop_texts));
    }
    if (!reply_format.is_text()) reply.settings.insert(QStringLiteral("reply_format"), reply_format.to_json());
    turn.message_id = turn.recorder->start_reply(reply);
    cache_message(conversation_id, turn.message_id);
  }

  TurnRequest request;
  request.turn_id = turn.turn_id;
  request.conversation_id = conversation_id;
  request.messages = messages;
  request.generation = turn_settings.to_generation_config();
  request.context_limit = settings_.context_limit;
  request.overflow = settings_.context_overflow;
  request.cache_budget_bytes = settings_.effective_cache_budget_bytes();
  request.threads = settings_.threads;
  request.stop = turn.stop;
  request.continue_reply = continued != nullptr;
  request.draft_model_path = settings_.draft_model_path;
  request.reply_format = reply_format;

  turn.remote = usesRemoteBackend();
  active_ = std::move(turn);
  live_decode_rate_ = 0.0;
  live_generated_ = 0;
  spdlog::debug("turn {} queued for conversation {} ({} messages)", request.turn_id, conversation_id,
                request.messages.size());
  dispatch_turn(request);
  speed_timer_.start();
  if (conversation_id == current_conversation_) Q_EMIT messagesReset();
  Q_EMIT generatingChanged(true);
  return true;
}

void ChatController::dispatch_turn(const TurnRequest& request) {
  TurnBackend* backend = backend_->turnBackend(settings_.backend);
  if (usesRemoteBackend()) {
    RemoteEndpoint endpoint;
    endpoint.base_url = settings_.remote_base_url.trimmed().toStdString();
    endpoint.api_key = settings_.remote_api_key.toStdString();
    endpoint.model = settings_.remote_model.trimmed().toStdString();
    endpoint.idle_timeout_s = settings_.remote_idle_timeout_s;
    endpoint.total_timeout_s = settings_.remote_reply_timeout_s;
    // Queued before the turn on the same thread, so the turn runs on it.
    QMetaObject::invokeMethod(
        backend_->remote(), [worker = backend_->remote(), endpoint] { worker->setEndpoint(endpoint); },
        Qt::QueuedConnection);
  }
  QMetaObject::invokeMethod(
      backend, [backend, request] { backend->runTurn(request); }, Qt::QueuedConnection);
}

void ChatController::stop() {
  if (!active_) return;
  spdlog::info("stop requested for turn {}", active_->turn_id);
  active_->stop->store(true);
}

void ChatController::stopForQuit() {
  if (!active_) return;
  active_->quitting = true;
  stop();
}

std::optional<QString> ChatController::cancelQueued(qint64 conversation_id) {
  if (!queued_conversations_.removeAll(conversation_id)) return std::nullopt;
  std::optional<QString> text;
  try {
    const QList<MessageRecord> records = stored_messages(conversation_id);
    // What waits is the chat's last message (send() queued it unanswered).
    if (!records.isEmpty() && records.back().role == MessageRole::User) {
      text = records.back().text;
      forget_records(conversation_id);
      store_->delete_messages_from(conversation_id, records.back().id);
    }
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
  spdlog::info("conversation {}: queued message withdrawn", conversation_id);
  Q_EMIT conversationsChanged();
  if (conversation_id == current_conversation_) Q_EMIT messagesReset();
  return text.value_or(QString());
}

void ChatController::end_turn() {
  active_.reset();
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
  if (!reply) return;
  cache_record(*reply);
  Q_EMIT replyFinished(*reply);
}

void ChatController::on_text_ready(quint64 turn_id, const QString& text) {
  if (!active_ || active_->turn_id != turn_id) return;  // a stale turn (deleted conversation)
  QString chunk = text;
  if (active_->stop_filter) {
    // Text after a stop text is neither shown nor kept; the turn ends there (a few more tokens may come
    // before the engine sees the flag: the filter drops them).
    const bool matched_before = active_->stop_filter->matched();
    chunk = QString::fromStdString(active_->stop_filter->push(text.toStdString()));
    if (!matched_before && active_->stop_filter->matched()) {
      spdlog::info("turn {}: stop text reached", turn_id);
      active_->stop->store(true);
    }
  }
  if (chunk.isEmpty()) return;
  active_->recorder->append(chunk);
  if (MessageRecord* cached = cached_record(active_->conversation_id, active_->message_id)) cached->text += chunk;
  Q_EMIT replyTextAppended(active_->conversation_id, active_->message_id, chunk);
}

void ChatController::on_token_stats(quint64 turn_id, int generated_tokens, double tokens_per_second) {
  if (!active_ || active_->turn_id != turn_id) return;
  live_generated_ = generated_tokens;
  live_decode_rate_ = tokens_per_second;
}

void ChatController::on_context_trimmed(quint64 turn_id, int dropped_messages, int context_limit) {
  if (!active_ || active_->turn_id != turn_id) return;
  try {
    const std::optional<MessageRecord> marker = active_->recorder->mark_context_cut(dropped_messages, context_limit);
    if (!marker) return;
    cache_message(active_->conversation_id, marker->id);
    if (active_->conversation_id == current_conversation_) Q_EMIT messagesReset();
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

void ChatController::flush_stop_filter() {
  if (!active_->stop_filter) return;
  const QString held = QString::fromStdString(active_->stop_filter->finish());
  if (held.isEmpty()) return;
  active_->recorder->append(held);
  if (MessageRecord* cached = cached_record(active_->conversation_id, active_->message_id)) cached->text += held;
  Q_EMIT replyTextAppended(active_->conversation_id, active_->message_id, held);
}

void ChatController::on_finished(quint64 turn_id, const kvchat::GenerationStats& stats) {
  if (!active_ || active_->turn_id != turn_id) return;
  const qint64 conversation_id = active_->conversation_id;
  const qint64 message_id = active_->message_id;
  flush_stop_filter();
  const bool stop_text_reached = active_->stop_filter && active_->stop_filter->matched();
  if (stop_text_reached) {
    // The ids go on past the cut text: the next prompt encodes the text kept instead.
    active_->reply_tokens.ids.clear();
  }
  try {
    QJsonObject saved = stats_to_json(stats);
    if (stop_text_reached) {
      // The reply ended where the chat asked it to, as at an end-of-sequence token: nothing to continue.
      saved.insert(QStringLiteral("stop_reason"), QString::fromLatin1(kvchat::to_string(StopReason::Eos)));
      saved.insert(kReplyStopTextKey, true);
    }
    for (auto it = active_->remote_details.constBegin(); it != active_->remote_details.constEnd(); ++it)
      saved.insert(it.key(), it.value());
    if (active_->quitting && stats.stop_reason == StopReason::Stopped) saved.insert(kReplyClosedByAppKey, true);
    if (active_->continuing) {
      saved.insert(kReplyContinuedKey, true);
      // The reply's earlier parts keep their figures: this turn's are only the last part's.
      QJsonArray parts = active_->recorder->continued_stats().value(kReplyEarlierPartsKey).toArray();
      QJsonObject previous = active_->recorder->continued_stats();
      for (const char* key : {kReplyEarlierPartsKey, kReplyContinuedKey, kReplyClosedByAppKey}) previous.remove(key);
      if (!previous.isEmpty()) parts.append(previous);
      if (!parts.isEmpty()) saved.insert(kReplyEarlierPartsKey, parts);
    }
    active_->recorder->finish(saved, active_->reply_tokens.ids, active_->reply_tokens.vocabulary);
  } catch (const std::exception& error) {
    spdlog::error("cannot save the reply: {}", error.what());
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
  live_generated_ = stats.generated_tokens;
  live_decode_rate_ = stats.decode_tokens_per_second;
  auto& figures = cache_figures_[conversation_id];
  figures.reused_tokens = stats.reused_tokens;
  figures.prefilled_tokens = stats.prefilled_tokens;
  figures.restored_tokens = stats.restored_tokens;
  figures.restore_ms = stats.restore_ms;
  figures.has_turn = true;
  figures.turn_on_server = active_->remote;
  if (stats.cache_mode == KvCacheMode::Off) {
    total_cache_bytes_ -= figures.bytes;
    figures.tokens = 0;
    figures.bytes = 0;
  }
  if (conversation_id == current_conversation_) {
    last_stats_ = stats;
    last_stats_from_server_ = active_->remote;
  }
  const bool local_new_reply = !active_->continuing && !active_->remote;
  end_turn();
  Q_EMIT decodeSpeedChanged(live_decode_rate_, live_generated_);
  emit_reply_finished(message_id);
  if (local_new_reply && settings_.model_titles) request_model_title(conversation_id);
  Q_EMIT lastReplyStatsChanged();
  Q_EMIT cacheGaugeChanged();
  Q_EMIT conversationsChanged();
  start_queued_turn();
}

void ChatController::on_failed(quint64 turn_id, const QString& message) {
  if (!active_ || active_->turn_id != turn_id) return;
  const qint64 conversation_id = active_->conversation_id;
  const qint64 message_id = active_->message_id;
  const bool continuing = active_->continuing;
  flush_stop_filter();
  try {
    // A failed continuation puts the reply back as it was (with anything that did arrive).
    active_->recorder->fail(message, active_->failure_stats);
  } catch (const std::exception& error) {
    spdlog::error("cannot save the failed reply: {}", error.what());
  }
  end_turn();
  emit_reply_finished(message_id);
  // Shown once: a failed turn's error is in its reply; a failed continuation has no reply of its own.
  if (continuing)
    Q_EMIT errorOccurred(message);
  else
    Q_EMIT replyFailed(conversation_id, message_id, message);
  Q_EMIT conversationsChanged();
  start_queued_turn();
}

// The server went away mid-reply: the text that arrived is kept, marked, and saved as a failed turn (the
// window shows the error and offers Regenerate; the cut-short text is not given to the model again).
void ChatController::on_interrupted(quint64 turn_id, const QString& message, const kvchat::GenerationStats& stats) {
  if (!active_ || active_->turn_id != turn_id) return;
  active_->failure_stats = stats_to_json(stats);
  for (auto it = active_->remote_details.constBegin(); it != active_->remote_details.constEnd(); ++it)
    active_->failure_stats.insert(it.key(), it.value());
  on_failed(turn_id, message);
}

void ChatController::request_model_title(qint64 conversation_id) {
  try {
    const auto conversation = store_->conversation(conversation_id);
    if (!conversation || titles_awaited_.contains(conversation_id)) return;
    const QList<MessageRecord> records = stored_messages(conversation_id);
    const MessageRecord* first_user = nullptr;
    const MessageRecord* first_reply = nullptr;
    int replies = 0;
    for (const MessageRecord& record : records) {
      if (record.role == MessageRole::User && !first_user) first_user = &record;
      if (record.role == MessageRole::Assistant && !is_failed_reply(record)) {
        if (!first_reply) first_reply = &record;
        ++replies;
      }
    }
    // Only the first reply of a chat still titled from its first message: never over a title the user chose.
    if (!first_user || !first_reply || replies != 1 || conversation->title != title_from_text(first_user->text)) return;
    std::vector<ChatMessage> messages;
    messages.push_back(ChatMessage{"user", (first_user->text.left(kTitleSourceCharacters) + QStringLiteral("\n\n") +
                                            first_reply->text.left(kTitleSourceCharacters) + QStringLiteral("\n\n") +
                                            QString::fromLatin1(kTitleInstruction))
                                               .toStdString()});
    ChatSettings title_settings = settings_;
    title_settings.temperature = 0.0;  // the likeliest title: the same chat gets the same one
    title_settings.max_new_tokens = kTitleMaxTokens;
    const GenerationConfig generation = title_settings.to_generation_config();
    const int context_limit = settings_.context_limit;
    titles_awaited_.insert(conversation_id, conversation->title);
    spdlog::info("conversation {}: asking the model for a title", conversation_id);
    QMetaObject::invokeMethod(
        engine(),
        [worker = engine(), conversation_id, messages, generation, context_limit] {
          worker->generateTitle(conversation_id, messages, generation, context_limit);
        },
        Qt::QueuedConnection);
  } catch (const std::exception& error) {
    spdlog::error("conversation {}: cannot ask for a title: {}", conversation_id, error.what());
  }
}

void ChatController::on_title_ready(qint64 conversation_id, const QString& text) {
  if (!titles_awaited_.contains(conversation_id)) return;
  const QString title_before = titles_awaited_.take(conversation_id);
  try {
    const auto conversation = store_->conversation(conversation_id);
    if (!conversation) return;  // deleted meanwhile
    const QString title = title_from_model_text(text);
    // Renamed meanwhile, or nothing usable: the chat keeps the title it has.
    if (title.isEmpty() || conversation->title != title_before) {
      spdlog::info("conversation {}: model title not used ({})", conversation_id,
                   title.isEmpty() ? "empty" : "renamed meanwhile");
      Q_EMIT conversationTitled(conversation_id, conversation->title);
      return;
    }
    store_->rename_conversation(conversation_id, title);
    spdlog::info("conversation {}: titled by the model", conversation_id);
    Q_EMIT conversationsChanged();
    Q_EMIT conversationTitled(conversation_id, title);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

void ChatController::start_queued_turn() {
  while (!active_ && !queued_conversations_.isEmpty()) {
    const qint64 conversation_id = queued_conversations_.takeFirst();
    if (!store_->conversation(conversation_id)) continue;
    spdlog::info("conversation {}: starting its queued turn", conversation_id);
    try {
      start_turn(conversation_id);
    } catch (const std::exception& error) {
      Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    }
  }
}

}  // namespace kvchat::app
