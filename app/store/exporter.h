#pragma once
// Conversation export: Markdown, JSON or plain text, and an atomic file writer.
#include <QList>
#include <QString>

#include "app/store/conversation_store.h"

namespace kvchat::app {

enum class ExportFormat { Markdown, Json, Text };

// "md"/"markdown", "json", "txt"/"text" (case-insensitive). Throws std::invalid_argument otherwise.
ExportFormat export_format_from_string(const QString& text);
// The shown path (branches not shown are left out; see chat_history.h): every message in reading order with
// its model and figures, and each regenerated turn's other replies with it, marked as such: JSON gives a reply
// an "alternatives" array (its turn's other replies, oldest first, each a message object); Markdown and text
// follow the reply with an "Other version i of n" block for each. Markdown writes the text as the window shows it:
// single line breaks of prose as hard breaks, code blocks as written.
QString export_conversation(const ConversationRecord& conversation, const QList<MessageRecord>& messages,
                            ExportFormat format);

// What an export of `messages` holds, for the export dialog to say.
struct ExportContents {
  int messages = 0;        // in reading order (markers included)
  int other_versions = 0;  // replies kept by Regenerate that the chat does not show
};
ExportContents export_contents(const QList<MessageRecord>& messages);
// Atomic (QSaveFile); throws std::runtime_error naming the path and the reason (e.g. disk full, permission):
// nothing half-written is left behind.
void write_text_file(const QString& path, const QString& contents);

}  // namespace kvchat::app
