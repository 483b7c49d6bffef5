#pragma once
// What the model is given of a stored conversation, and how a context cut is recorded in it. Shared by the
// desktop app's controller and `kvchat-cli chat` so both send the engine the same history.
#include <QList>
#include <QString>

#include <vector>

#include "app/store/conversation_store.h"
#include "engine/types.h"

namespace kvchat::app {

// A "marker" message's settings key: the id of the first message still in the model's context.
inline constexpr const char* kMarkerContextStartKey = "context_starts_at";

// A reply's stats key holding why its turn failed (context full with the "stop" policy, a message longer
// than the window, an engine error).
inline constexpr const char* kReplyErrorKey = "error";

// The one rule for a failed turn, everywhere (store, prompt, window, exports): the user message and the reply
// are kept, the reply complete with its partial text (usually none) and stats {"error": why}; the window and
// every export show that error instead of reply figures; and neither message is given to the model again,
// so one rejected message cannot make every later turn of the chat fail.
bool is_failed_reply(const MessageRecord& message);
// A reply's stats key set when its text was written in more than one turn (Continue).
inline constexpr const char* kReplyContinuedKey = "continued";
// A continued reply's stats key: the figures of its earlier parts (each as stats_to_json writes a turn's),
// oldest first; the reply's own keys are its last part's.
inline constexpr const char* kReplyEarlierPartsKey = "earlier_parts";
// A reply's stats key set when it was stopped because the app was quit (not by Stop).
inline constexpr const char* kReplyClosedByAppKey = "closed_by_app";
// A reply's stats key set when it ended at one of its chat's stop texts (cut before it; stop_reason "eos").
inline constexpr const char* kReplyStopTextKey = "stop_text";
// A local reply's settings key: the path of the model that wrote it (a .gguf file or a model folder, as loaded).
inline constexpr const char* kReplyModelPathKey = "model_file";
// A reply that can be continued: not failed, some text, and cut short rather than finished: left incomplete
// (the app closed mid-reply), or stopped by max tokens or the Stop button.
bool is_continuable_reply(const MessageRecord& message);
QString reply_error(const MessageRecord& message);  // empty unless is_failed_reply()

// Regenerate keeps the replies it replaces: each is marked with this settings key (true) and stays with its turn
// as an alternative the window can switch back to. One reply per turn is shown; only the shown one is given
// to the model, exported, continued or regenerated.
inline constexpr const char* kHiddenAlternativeKey = "hidden_alternative";
bool is_hidden_alternative(const MessageRecord& message);
// The ids of the replies of `reply_id`'s turn (the assistant messages between its user message and the next),
// oldest first, `reply_id` included; empty when there is no such reply.
QList<qint64> reply_alternatives(const QList<MessageRecord>& messages, qint64 reply_id);

// Branches. Editing a user message forks the chat: the edit is a new user message that starts a new branch
// (MessageRecord::branch is its own id, forked_from the id of the message it is an edit of, or of that one's
// original when it is itself an edit), and the old message with everything after it stays as it was. The
// original and its edits form a group of which one is shown; the others carry this settings key (true) and are
// hidden together with their whole continuation: the later messages of their branch, and every group forked
// inside it. A message belongs to the branch of the shown path's last message when it is written.
inline constexpr const char* kHiddenBranchKey = "hidden_branch";
// The group of `user_message_id` (its original first, then its edits, oldest first), when it has more than one
// member; else empty.
QList<qint64> branch_siblings(const QList<MessageRecord>& messages, qint64 user_message_id);
// The messages on the shown path, in id order: those of hidden branches left out (hidden alternatives kept:
// they belong to a shown turn). Every function below takes the whole conversation and applies this first;
// applied to its own result it changes nothing.
QList<MessageRecord> messages_on_shown_path(const QList<MessageRecord>& messages);
// The ids of `member_id` (a user message) and everything that depends on it: the later messages of its branch
// and every group forked from those; what deleting that branch removes.
QList<qint64> branch_subtree(const QList<MessageRecord>& messages, qint64 member_id);
// The branch a new message of the conversation belongs to (the shown path's last message's; 0 when empty).
qint64 branch_for_new_message(const QList<MessageRecord>& messages);
// The hidden branch members that must be shown, outermost first, for `message_id` to be on the shown path
// (empty when it is already, or is no message of `messages`): what a search hit in another branch opens.
QList<qint64> branches_hiding(const QList<MessageRecord>& messages, qint64 message_id);

// The user, assistant and tool messages the model sees: those from the last context cut on, without empty
// replies (a reply with tool calls and no text is not empty), hidden alternatives and failed turns (see
// is_failed_reply).
QList<MessageRecord> messages_in_context(const QList<MessageRecord>& messages);

// The messages in the order a reader should see them: each context-cut marker just above the first message
// the model still saw (a marker is written after the turn that needed the cut, so its id comes later), and
// hidden alternatives left out. The window and every export use this order.
QList<MessageRecord> messages_in_reading_order(const QList<MessageRecord>& messages);

// The conversation's system prompt (if any) followed by messages_in_context(), with their tool calls and the
// calls their tool results answer.
std::vector<ChatMessage> chat_messages_for_engine(const ConversationRecord& conversation,
                                                  const QList<MessageRecord>& messages);

// The marker written when the oldest `dropped_messages` were left out to fit `context_limit` tokens;
// `first_kept_message_id` is the first message the model still sees.
MessageRecord context_cut_marker(qint64 conversation_id, qint64 first_kept_message_id, int dropped_messages,
                                 int context_limit);

}  // namespace kvchat::app
