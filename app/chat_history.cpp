#include "app/chat_history.h"

#include <algorithm>

namespace kvchat::app {

bool is_failed_reply(const MessageRecord& message) {
  return message.role == QLatin1String("assistant") && message.stats.contains(kReplyErrorKey);
}

bool is_continuable_reply(const MessageRecord& message) {
  if (message.role != QLatin1String("assistant") || is_failed_reply(message) || message.text.isEmpty()) return false;
  if (!message.complete) return true;
  const QString stop = message.stats.value(QStringLiteral("stop_reason")).toString();
  return stop == QLatin1String("max_tokens") || stop == QLatin1String("stopped");
}

QString reply_error(const MessageRecord& message) {
  return is_failed_reply(message) ? message.stats.value(kReplyErrorKey).toString() : QString();
}

bool is_hidden_alternative(const MessageRecord& message) {
  return message.role == QLatin1String("assistant") && message.settings.value(kHiddenAlternativeKey).toBool();
}

QList<qint64> reply_alternatives(const QList<MessageRecord>& messages, qint64 reply_id) {
  QList<qint64> turn;  // the replies since the last user message
  bool found = false;
  for (const MessageRecord& message : messages) {
    if (message.role == QLatin1String("user")) {
      if (found) break;
      turn.clear();
    } else if (message.role == QLatin1String("assistant")) {
      turn.push_back(message.id);
      found = found || message.id == reply_id;
    }
  }
  return found ? turn : QList<qint64>{};
}

QList<MessageRecord> messages_in_context(const QList<MessageRecord>& messages) {
  qint64 context_start = 0;
  for (const MessageRecord& message : messages)
    if (message.role == "marker" && message.settings.contains(kMarkerContextStartKey))
      context_start = std::max<qint64>(context_start, message.settings.value(kMarkerContextStartKey).toInteger());
  QList<MessageRecord> in_context;
  for (const MessageRecord& message : messages) {
    if (message.id < context_start || (message.role != "user" && message.role != "assistant")) continue;
    if (is_hidden_alternative(message)) continue;
    if (is_failed_reply(message)) {
      // The whole failed turn goes: the message it failed on would fail (or poison) every later turn.
      if (!in_context.isEmpty() && in_context.back().role == QLatin1String("user")) in_context.pop_back();
      continue;
    }
    // A reply that ended before its first token says nothing; templates dislike empty turns.
    if (message.role == "assistant" && message.text.isEmpty()) continue;
    in_context.push_back(message);
  }
  return in_context;
}

QList<MessageRecord> messages_in_reading_order(const QList<MessageRecord>& messages) {
  QList<MessageRecord> ordered;
  QList<MessageRecord> markers;
  for (const MessageRecord& message : messages) {
    if (is_hidden_alternative(message)) continue;
    if (message.role == "marker" && message.settings.contains(kMarkerContextStartKey)) markers.push_back(message);
    else ordered.push_back(message);
  }
  for (const MessageRecord& marker : markers) {
    const qint64 before_id = marker.settings.value(kMarkerContextStartKey).toInteger();
    qsizetype position = ordered.size();
    for (qsizetype i = 0; i < ordered.size(); ++i)
      if (ordered[i].id == before_id) {
        position = i;
        break;
      }
    ordered.insert(position, marker);
  }
  return ordered;
}

std::vector<ChatMessage> chat_messages_for_engine(const ConversationRecord& conversation,
                                                  const QList<MessageRecord>& messages) {
  std::vector<ChatMessage> chat;
  if (!conversation.system_prompt.trimmed().isEmpty())
    chat.push_back({"system", conversation.system_prompt.toStdString()});
  for (const MessageRecord& message : messages_in_context(messages))
    chat.push_back({message.role.toStdString(), message.text.toStdString(), message.token_ids, message.token_vocabulary});
  return chat;
}

MessageRecord context_cut_marker(qint64 conversation_id, qint64 first_kept_message_id, int dropped_messages,
                                 int context_limit) {
  MessageRecord marker;
  marker.conversation_id = conversation_id;
  marker.role = "marker";
  const QString dropped = dropped_messages == 1 ? QStringLiteral("The oldest message no longer fits")
                                                : QStringLiteral("The %1 oldest messages no longer fit").arg(dropped_messages);
  marker.text = QStringLiteral("%1 the context window (%2 tokens); the model sees the chat from here on.")
                    .arg(dropped)
                    .arg(context_limit);
  marker.settings.insert(kMarkerContextStartKey, first_kept_message_id);
  marker.complete = true;
  return marker;
}

}  // namespace kvchat::app
