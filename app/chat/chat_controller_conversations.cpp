// ChatController, conversation management: create, select, rename, delete, list and export conversations.
#include "app/chat/chat_controller.h"
#include "app/store/chat_archive.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>

namespace kvchat::app {

QString ChatController::newConversationTitle() { return QStringLiteral("New chat"); }

QList<ConversationRecord> ChatController::conversations() const { return store_->conversations(); }

std::optional<ConversationRecord> ChatController::conversation(qint64 conversation_id) const {
  return store_->conversation(conversation_id);
}

QList<SearchHit> ChatController::searchConversations(const QString& query) {
  try {
    return store_->search(query);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return {};
  }
}

QList<MessageRecord> ChatController::currentMessages() const {
  if (current_conversation_ == 0) return {};
  return messages_on_shown_path(current_records());
}

const QList<MessageRecord>& ChatController::current_records() const {
  if (!current_records_ || current_records_conversation_ != current_conversation_) {
    current_records_.reset();  // a failed read leaves nothing cached
    current_records_conversation_ = current_conversation_;
    current_records_ = current_conversation_ > 0 ? store_->messages(current_conversation_) : QList<MessageRecord>{};
  }
  return *current_records_;
}

QList<MessageRecord> ChatController::stored_messages(qint64 conversation_id) const {
  if (conversation_id == current_conversation_ && conversation_id > 0) return current_records();
  return store_->messages(conversation_id);
}

MessageRecord* ChatController::cached_record(qint64 conversation_id, qint64 message_id) {
  if (!current_records_ || current_records_conversation_ != conversation_id) return nullptr;
  // The message written is nearly always one of the last.
  for (auto it = current_records_->rbegin(); it != current_records_->rend(); ++it)
    if (it->id == message_id) return &*it;
  return nullptr;
}

void ChatController::cache_message(qint64 conversation_id, qint64 message_id) {
  if (!current_records_ || current_records_conversation_ != conversation_id) return;
  const std::optional<MessageRecord> record = store_->message(message_id);
  if (!record) {
    forget_records(conversation_id);
    return;
  }
  cache_record(*record);
}

void ChatController::cache_record(const MessageRecord& record) {
  if (!current_records_ || current_records_conversation_ != record.conversation_id) return;
  if (MessageRecord* cached = cached_record(record.conversation_id, record.id)) {
    *cached = record;
    return;
  }
  // In id order, as the store lists them.
  auto at = std::find_if(current_records_->begin(), current_records_->end(),
                         [&](const MessageRecord& other) { return other.id > record.id; });
  current_records_->insert(at, record);
}

void ChatController::forget_records(qint64 conversation_id) {
  if (current_records_conversation_ == conversation_id) current_records_.reset();
}

QHash<qint64, QList<qint64>> ChatController::currentBranches() const {
  QHash<qint64, QList<qint64>> branches;
  if (current_conversation_ == 0) return branches;
  const QList<MessageRecord>& all = current_records();
  for (const MessageRecord& message : messages_on_shown_path(all)) {
    if (message.role != MessageRole::User) continue;
    const QList<qint64> group = branch_siblings(all, message.id);
    if (!group.isEmpty()) branches.insert(message.id, group);
  }
  return branches;
}

qint64 ChatController::newConversation() {
  try {
    // Clicking "New chat" twice must not leave a trail of saved empty chats.
    for (const ConversationRecord& existing : store_->conversations()) {
      // An empty chat whose system prompt was edited is the user's work in progress, not a spare one.
      if (existing.message_count != 0 || existing.title != newConversationTitle() ||
          existing.system_prompt != settings_.default_system_prompt)
        continue;
      selectConversation(existing.id);
      return existing.id;
    }
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
  describe_snapshot(conversation_id);
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

void ChatController::setPinned(qint64 conversation_id, bool pinned) {
  try {
    store_->set_pinned(conversation_id, pinned);
    Q_EMIT conversationsChanged();
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

qint64 ChatController::duplicateConversation(qint64 conversation_id) {
  try {
    const qint64 copy = store_->duplicate_conversation(conversation_id);
    spdlog::info("conversation {}: copied to conversation {}", conversation_id, copy);
    Q_EMIT conversationsChanged();
    selectConversation(copy);
    return copy;
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return 0;
  }
}

bool ChatController::deleteMessage(qint64 message_id) {
  const qint64 conversation_id = current_conversation_;
  if ((active_ && active_->conversation_id == conversation_id) || isQueued(conversation_id)) {
    Q_EMIT errorOccurred(QStringLiteral("A reply is still being generated in this chat: stop it first."));
    return false;
  }
  try {
    const QList<MessageRecord> records = currentMessages();
    auto it =
        std::find_if(records.cbegin(), records.cend(), [&](const MessageRecord& r) { return r.id == message_id; });
    if (it == records.cend() || (it->role != MessageRole::User && it->role != MessageRole::Assistant)) {
      Q_EMIT errorOccurred(QStringLiteral("Message %1 is not a message of this chat.").arg(message_id));
      return false;
    }
    QList<qint64> doomed{message_id};
    std::optional<qint64> shown_instead;
    if (it->role == MessageRole::User && !branch_siblings(current_records(), message_id).isEmpty()) {
      // An edited message (or an edit): its branch goes, the rest of its group stays.
      forget_records(conversation_id);
      store_->delete_branch(conversation_id, message_id);
      spdlog::info("conversation {}: deleted the branch of message {}", conversation_id, message_id);
      Q_EMIT conversationsChanged();
      Q_EMIT messagesReset();
      return true;
    }
    if (it->role == MessageRole::User) {
      // Its replies: the assistant messages up to the next user message (context-cut markers stay).
      for (auto next = it + 1; next != records.cend() && next->role != MessageRole::User; ++next)
        if (next->role == MessageRole::Assistant) doomed << next->id;
    } else if (!is_hidden_alternative(*it)) {
      QList<qint64> others = reply_alternatives(records, message_id);
      others.removeAll(message_id);
      if (!others.isEmpty()) shown_instead = others.back();
    }
    forget_records(conversation_id);
    store_->delete_messages(conversation_id, doomed);
    if (shown_instead) {
      const std::optional<MessageRecord> reply = store_->message(*shown_instead);
      QJsonObject settings = reply->settings;
      settings.remove(kHiddenAlternativeKey);
      store_->set_message_settings(*shown_instead, settings);
    }
    spdlog::info("conversation {}: deleted {} message(s) from message {}", conversation_id, doomed.size(), message_id);
    Q_EMIT conversationsChanged();
    Q_EMIT messagesReset();
    return true;
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
    return false;
  }
}

void ChatController::deleteConversation(qint64 conversation_id) {
  try {
    if (active_ && active_->conversation_id == conversation_id) {
      // Nothing of this turn may be written any more: forget it (its late signals are then stale).
      active_->stop->store(true);
      end_turn();
    }
    queued_conversations_.removeAll(conversation_id);
    forget_records(conversation_id);
    store_->delete_conversation(conversation_id);
    QMetaObject::invokeMethod(
        engine(), [worker = engine(), conversation_id] { worker->forgetConversation(conversation_id); },
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
    start_queued_turn();
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

void ChatController::setSystemPrompt(qint64 conversation_id, const QString& system_prompt) {
  try {
    store_->set_system_prompt(conversation_id, system_prompt);
    Q_EMIT systemPromptChanged(conversation_id);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

std::optional<GenerationPreset> ChatController::chatGenerationSettings(qint64 conversation_id) const {
  try {
    const QJsonObject json = store_->generation_settings(conversation_id);
    if (json.isEmpty()) return std::nullopt;
    return GenerationPreset::from_json(json);
  } catch (const std::exception& error) {
    spdlog::warn("conversation {}: its own generation settings cannot be read ({}); the global ones apply",
                 conversation_id, error.what());
    return std::nullopt;
  }
}

ChatSettings ChatController::turnSettings(qint64 conversation_id) const {
  return settings_with(chatGenerationSettings(conversation_id));
}

ChatSettings ChatController::settings_with(const std::optional<GenerationPreset>& own) const {
  ChatSettings settings = settings_;
  if (own) own->apply_to(settings);
  return settings;
}

void ChatController::setChatGenerationSettings(qint64 conversation_id,
                                               const std::optional<GenerationPreset>& settings) {
  try {
    store_->set_generation_settings(conversation_id, settings ? settings->to_json() : QJsonObject());
    spdlog::info("conversation {}: generation settings {}", conversation_id,
                 settings ? (settings->name.isEmpty() ? std::string("set by hand")
                                                      : "from preset " + settings->name.toStdString())
                          : std::string("follow the global ones"));
    Q_EMIT chatGenerationSettingsChanged(conversation_id);
  } catch (const std::exception& error) {
    Q_EMIT errorOccurred(QString::fromStdString(error.what()));
  }
}

ReplyFormat ChatController::chatReplyFormat(qint64 conversation_id) const {
  try {
    return ReplyFormat::from_json(store_->reply_format(conversation_id));
  } catch (const std::exception& error) {
    spdlog::warn("conversation {}: its reply format cannot be read ({}); replies are free text", conversation_id,
                 error.what());
    return {};
  }
}

QString ChatController::setChatReplyFormat(qint64 conversation_id, const ReplyFormat& format) {
  const QString problem = format.problem();
  if (!problem.isEmpty()) return problem;
  try {
    store_->set_reply_format(conversation_id, format.to_json());
    spdlog::info("conversation {}: replies are {}", conversation_id,
                 format.kind == ReplyFormat::Kind::Text         ? "free text"
                 : format.kind == ReplyFormat::Kind::JsonObject ? "JSON objects"
                                                                : "JSON valid against the chat's schema");
    Q_EMIT chatGenerationSettingsChanged(conversation_id);
  } catch (const std::exception& error) {
    return QString::fromStdString(error.what());
  }
  return {};
}

QList<GenerationPreset> ChatController::presets() const { return built_in_presets() + user_presets_; }

QString ChatController::presetNameProblem(const QString& name) const {
  if (name.trimmed().isEmpty()) return QStringLiteral("A preset needs a name.");
  for (const GenerationPreset& built_in : built_in_presets())
    if (built_in.name.compare(name.trimmed(), Qt::CaseInsensitive) == 0)
      return QStringLiteral("\u201c%1\u201d is a built-in preset: choose another name.").arg(built_in.name);
  return {};
}

bool ChatController::saveUserPreset(const GenerationPreset& preset) {
  const QString name = preset.name.trimmed();
  const QString reason = presetNameProblem(name);
  if (!reason.isEmpty()) {
    Q_EMIT errorOccurred(reason);
    return false;
  }
  GenerationPreset saved = preset;
  saved.name = name;
  auto same_name = [&](const GenerationPreset& other) { return other.name == name; };
  const auto existing = std::find_if(user_presets_.begin(), user_presets_.end(), same_name);
  if (existing != user_presets_.end())
    *existing = saved;
  else
    user_presets_.append(saved);
  save_user_presets(*settings_storage_, user_presets_);
  Q_EMIT presetsChanged();
  return true;
}

void ChatController::removeUserPreset(const QString& name) {
  const auto removed = std::remove_if(user_presets_.begin(), user_presets_.end(),
                                      [&](const GenerationPreset& preset) { return preset.name == name; });
  if (removed == user_presets_.end()) return;
  user_presets_.erase(removed, user_presets_.end());
  save_user_presets(*settings_storage_, user_presets_);
  Q_EMIT presetsChanged();
}

void ChatController::exportConversation(qint64 conversation_id, const QString& path, ExportFormat format) const {
  const auto conversation = store_->conversation(conversation_id);
  if (!conversation) throw std::invalid_argument("no conversation with id " + std::to_string(conversation_id));
  write_text_file(path, export_conversation(*conversation, store_->messages(conversation_id), format));
  spdlog::info("exported conversation {} to {}", conversation_id, path.toStdString());
}

void ChatController::exportAllConversations(const QString& path) const {
  const QList<ImportedConversation> conversations = all_conversations(*store_);
  write_text_file(path, export_chat_archive(conversations));
  spdlog::info("exported {} conversation(s) to {}", conversations.size(), path.toStdString());
}

int ChatController::importConversations(const QString& path) {
  const QList<ImportedConversation> conversations = read_chat_archive(path);
  const QList<qint64> ids = store_->import_conversations(conversations);
  spdlog::info("imported {} conversation(s) from {}", ids.size(), path.toStdString());
  Q_EMIT conversationsChanged();
  return static_cast<int>(ids.size());
}

}  // namespace kvchat::app
