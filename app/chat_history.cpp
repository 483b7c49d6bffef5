#include "app/chat_history.h"

#include <algorithm>

namespace kvchat::app {

QList<MessageRecord> messages_in_context(const QList<MessageRecord>& messages) {
  qint64 context_start = 0;
  for (const MessageRecord& message : messages)
    if (message.role == "marker" && message.settings.contains(kMarkerContextStartKey))
      context_start = std::max<qint64>(context_start, message.settings.value(kMarkerContextStartKey).toInteger());
  QList<MessageRecord> in_context;
  for (const MessageRecord& message : messages) {
    if (message.id < context_start || (message.role != "user" && message.role != "assistant")) continue;
    // A reply that failed before its first token says nothing; templates dislike empty turns.
    if (message.role == "assistant" && message.text.isEmpty()) continue;
    in_context.push_back(message);
  }
  return in_context;
}

std::vector<ChatMessage> chat_messages_for_engine(const ConversationRecord& conversation,
                                                  const QList<MessageRecord>& messages) {
  std::vector<ChatMessage> chat;
  if (!conversation.system_prompt.trimmed().isEmpty())
    chat.push_back({"system", conversation.system_prompt.toStdString()});
  for (const MessageRecord& message : messages_in_context(messages))
    chat.push_back({message.role.toStdString(), message.text.toStdString()});
  return chat;
}

MessageRecord context_cut_marker(qint64 conversation_id, qint64 first_kept_message_id, int dropped_messages,
                                 int context_limit) {
  MessageRecord marker;
  marker.conversation_id = conversation_id;
  marker.role = "marker";
  marker.text = QStringLiteral("The %1 oldest messages no longer fit the context window (%2 tokens); "
                               "the model sees the chat from here on.")
                    .arg(dropped_messages)
                    .arg(context_limit);
  marker.settings.insert(kMarkerContextStartKey, first_kept_message_id);
  marker.complete = true;
  return marker;
}

}  // namespace kvchat::app
