#pragma once
// What the model is given of a stored conversation, and how a context cut is recorded in it. Shared by the
// desktop app's controller and `kvchat-cli chat` so both send the engine the same history.
#include <QList>
#include <QString>

#include <vector>

#include "app/conversation_store.h"
#include "engine/types.h"

namespace kvchat::app {

// A "marker" message's settings key: the id of the first message still in the model's context.
inline constexpr const char* kMarkerContextStartKey = "context_starts_at";

// The user/assistant messages the model sees: those from the last context cut on, without empty replies.
QList<MessageRecord> messages_in_context(const QList<MessageRecord>& messages);

// The conversation's system prompt (if any) followed by messages_in_context().
std::vector<ChatMessage> chat_messages_for_engine(const ConversationRecord& conversation,
                                                  const QList<MessageRecord>& messages);

// The marker written when the oldest `dropped_messages` were left out to fit `context_limit` tokens;
// `first_kept_message_id` is the first message the model still sees.
MessageRecord context_cut_marker(qint64 conversation_id, qint64 first_kept_message_id, int dropped_messages,
                                 int context_limit);

}  // namespace kvchat::app
