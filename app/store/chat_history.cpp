#include "app/store/chat_history.h"

#include <algorithm>

#include <QHash>
#include <QJsonDocument>
#include <QSet>

namespace kvchat::app {

bool is_failed_reply(const MessageRecord& message) {
  return message.role == MessageRole::Assistant && message.stats.contains(kReplyErrorKey);
}

bool is_continuable_reply(const MessageRecord& message) {
  if (message.role != MessageRole::Assistant || is_failed_reply(message) || message.text.isEmpty()) return false;
  if (!message.complete) return true;
  const QString stop = message.stats.value(QStringLiteral("stop_reason")).toString();
  return stop == QLatin1String("max_tokens") || stop == QLatin1String("stopped");
}

QString reply_error(const MessageRecord& message) {
  return is_failed_reply(message) ? message.stats.value(kReplyErrorKey).toString() : QString();
}

bool is_hidden_alternative(const MessageRecord& message) {
  return message.role == MessageRole::Assistant && message.settings.value(kHiddenAlternativeKey).toBool();
}

namespace {

bool is_user(const MessageRecord& message) { return message.role == MessageRole::User; }

// Each group of branches by its original's id: the original (when it is still there) first, then its edits.
QHash<qint64, QList<const MessageRecord*>> branch_groups(const QList<MessageRecord>& messages) {
  QHash<qint64, QList<const MessageRecord*>> groups;
  for (const MessageRecord& message : messages)
    if (is_user(message) && message.forked_from != 0) groups[message.forked_from].push_back(&message);
  for (const MessageRecord& message : messages)
    if (is_user(message) && groups.contains(message.id)) groups[message.id].prepend(&message);
  return groups;
}

// The shown member: the newest not marked hidden; the newest of all when every one is (a switch cut short).
const MessageRecord* shown_member(const QList<const MessageRecord*>& members) {
  for (auto it = members.crbegin(); it != members.crend(); ++it)
    if (!(*it)->settings.value(kHiddenBranchKey).toBool()) return *it;
  return members.back();
}

struct SubtreeStart {
  qint64 branch = 0;
  qint64 first_id = 0;
};

// The messages from each start on along its branch, and every group forked inside them (each start's own
// group aside: its other members are not part of it).
QSet<qint64> subtree_ids(const QList<MessageRecord>& messages, const QHash<qint64, QList<const MessageRecord*>>& groups,
                         QList<SubtreeStart> pending) {
  QSet<qint64> ids;
  QSet<qint64> cascaded;
  while (!pending.isEmpty()) {
    const SubtreeStart start = pending.takeFirst();
    for (const MessageRecord& message : messages) {
      if (message.branch != start.branch || message.id < start.first_id) continue;
      ids.insert(message.id);
      if (message.id == start.first_id || cascaded.contains(message.id) || !groups.contains(message.id)) continue;
      cascaded.insert(message.id);
      for (const MessageRecord* member : groups.value(message.id))
        if (member->id != message.id) pending.push_back({member->branch, member->id});
    }
  }
  return ids;
}

}  // namespace

QList<qint64> branch_siblings(const QList<MessageRecord>& messages, qint64 user_message_id) {
  const auto it = std::find_if(messages.cbegin(), messages.cend(),
                               [&](const MessageRecord& message) { return message.id == user_message_id; });
  if (it == messages.cend() || !is_user(*it)) return {};
  const QList<const MessageRecord*> members =
      branch_groups(messages).value(it->forked_from != 0 ? it->forked_from : it->id);
  if (members.size() < 2) return {};
  QList<qint64> ids;
  for (const MessageRecord* member : members) ids.push_back(member->id);
  return ids;
}

QList<MessageRecord> messages_on_shown_path(const QList<MessageRecord>& messages) {
  const auto groups = branch_groups(messages);
  if (groups.isEmpty()) return messages;
  QList<SubtreeStart> hidden_starts;
  for (const QList<const MessageRecord*>& members : groups) {
    if (members.size() < 2) continue;
    const MessageRecord* shown = shown_member(members);
    for (const MessageRecord* member : members)
      if (member != shown) hidden_starts.push_back({member->branch, member->id});
  }
  const QSet<qint64> hidden = subtree_ids(messages, groups, hidden_starts);
  QList<MessageRecord> shown;
  for (const MessageRecord& message : messages)
    if (!hidden.contains(message.id)) shown.push_back(message);
  return shown;
}

QList<qint64> branch_subtree(const QList<MessageRecord>& messages, qint64 member_id) {
  const auto it = std::find_if(messages.cbegin(), messages.cend(),
                               [&](const MessageRecord& message) { return message.id == member_id; });
  if (it == messages.cend()) return {};
  const QSet<qint64> ids = subtree_ids(messages, branch_groups(messages), {{it->branch, it->id}});
  QList<qint64> ordered;
  for (const MessageRecord& message : messages)
    if (ids.contains(message.id)) ordered.push_back(message.id);
  return ordered;
}

QList<qint64> branches_hiding(const QList<MessageRecord>& messages, qint64 message_id) {
  QList<qint64> hiding;
  for (const MessageRecord& message : messages)
    if (message.settings.value(QLatin1String(kHiddenBranchKey)).toBool() &&
        (message.id == message_id || branch_subtree(messages, message.id).contains(message_id)))
      hiding.push_back(message.id);  // in id order: an outer group's member comes before those forked inside it
  return hiding;
}

qint64 branch_for_new_message(const QList<MessageRecord>& messages) {
  const QList<MessageRecord> shown = messages_on_shown_path(messages);
  return shown.isEmpty() ? 0 : shown.back().branch;
}

QList<qint64> reply_alternatives(const QList<MessageRecord>& all_messages, qint64 reply_id) {
  const QList<MessageRecord> messages = messages_on_shown_path(all_messages);
  QList<qint64> turn;  // the replies since the last user message
  bool found = false;
  for (const MessageRecord& message : messages) {
    if (message.role == MessageRole::User || message.role == MessageRole::Tool) {
      // A tool's result ends a turn too: the reply after it answers the result, it is no alternative.
      if (found) break;
      turn.clear();
    } else if (message.role == MessageRole::Assistant) {
      turn.push_back(message.id);
      found = found || message.id == reply_id;
    }
  }
  return found ? turn : QList<qint64>{};
}

QList<MessageRecord> messages_in_context(const QList<MessageRecord>& all_messages) {
  const QList<MessageRecord> messages = messages_on_shown_path(all_messages);
  qint64 context_start = 0;
  for (const MessageRecord& message : messages)
    if (message.role == MessageRole::Marker && message.settings.contains(kMarkerContextStartKey))
      context_start = std::max<qint64>(context_start, message.settings.value(kMarkerContextStartKey).toInteger());
  QList<MessageRecord> in_context;
  for (const MessageRecord& message : messages) {
    if (message.id < context_start || (message.role != MessageRole::User && message.role != MessageRole::Assistant &&
                                       message.role != MessageRole::Tool))
      continue;
    if (is_hidden_alternative(message)) continue;
    if (is_failed_reply(message)) {
      // The whole failed turn goes: the message it failed on would fail (or poison) every later turn.
      if (!in_context.isEmpty() && in_context.back().role == MessageRole::User) in_context.pop_back();
      continue;
    }
    // A reply that ended before its first token says nothing; templates dislike empty turns.
    if (message.role == MessageRole::Assistant && message.text.isEmpty() && message.tool_calls.isEmpty()) continue;
    in_context.push_back(message);
  }
  return in_context;
}

QList<MessageRecord> messages_in_reading_order(const QList<MessageRecord>& all_messages) {
  const QList<MessageRecord> messages = messages_on_shown_path(all_messages);
  QList<MessageRecord> ordered;
  QList<MessageRecord> markers;
  for (const MessageRecord& message : messages) {
    if (is_hidden_alternative(message)) continue;
    if (message.role == MessageRole::Marker && message.settings.contains(kMarkerContextStartKey))
      markers.push_back(message);
    else
      ordered.push_back(message);
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
  for (const MessageRecord& message : messages_in_context(messages)) {
    ChatMessage& added = chat.emplace_back();
    added.role = role_name(message.role).toStdString();
    added.content = message.text.toStdString();
    added.token_ids = message.token_ids;
    added.token_vocabulary = message.token_vocabulary;
    if (!message.tool_calls.isEmpty())
      added.tool_calls = QJsonDocument(message.tool_calls).toJson(QJsonDocument::Compact).toStdString();
    added.tool_call_id = message.tool_call_id.toStdString();
    added.name = message.tool_name.toStdString();
  }
  return chat;
}

MessageRecord context_cut_marker(qint64 conversation_id, qint64 first_kept_message_id, int dropped_messages,
                                 int context_limit) {
  MessageRecord marker;
  marker.conversation_id = conversation_id;
  marker.role = MessageRole::Marker;
  const QString dropped = dropped_messages == 1
                              ? QStringLiteral("The oldest message no longer fits")
                              : QStringLiteral("The %1 oldest messages no longer fit").arg(dropped_messages);
  marker.text = QStringLiteral("%1 the context window (%2 tokens); the model sees the chat from here on.")
                    .arg(dropped)
                    .arg(context_limit);
  marker.settings.insert(kMarkerContextStartKey, first_kept_message_id);
  marker.complete = true;
  return marker;
}

}  // namespace kvchat::app
