#pragma once
// Conversation export: Markdown, JSON or plain text, and an atomic file writer.
#include <QList>
#include <QString>

#include "app/conversation_store.h"

namespace kvchat::app {

enum class ExportFormat { Markdown, Json, Text };

// "md"/"markdown", "json", "txt"/"text" (case-insensitive). Throws std::invalid_argument otherwise.
ExportFormat export_format_from_string(const QString& text);
QString export_conversation(const ConversationRecord& conversation, const QList<MessageRecord>& messages,
                            ExportFormat format);
// Atomic (QSaveFile); throws std::runtime_error naming the path and the reason (e.g. disk full, permission):
// nothing half-written is left behind.
void write_text_file(const QString& path, const QString& contents);

}  // namespace kvchat::app
