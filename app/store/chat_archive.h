#pragma once
// Every conversation in one JSON file, and reading it (or a single chat's JSON export) back. The format,
// "kvchat-chats" version 1, is described in docs/DESIGN.md. It does not depend on the database's ids: a
// message refers to another (its branch, the message it is an edit of, a marker's context start) by its
// position in its conversation's list, so an export of an import of an export is the same file.
#include <QByteArray>
#include <QList>
#include <QString>

#include <stdexcept>

#include "app/store/conversation_store.h"

namespace kvchat::app {

inline constexpr const char* kChatArchiveFormat = "kvchat-chats";
inline constexpr int kChatArchiveVersion = 1;
// The largest file an import reads: reading and parsing it stays a bounded allocation.
inline constexpr qint64 kMaxImportBytes = qint64{256} << 20;

// What is wrong with a file to import, and where ("conversation 2 (“Trip”), message 5: ...").
struct ArchiveError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The archive of `conversations` in their order, each with every message of the conversation (all branches and
// alternatives) as ConversationStore::messages() returns them.
QString export_chat_archive(const QList<ImportedConversation>& conversations);
// Every conversation of `store` in its list order, with its generation settings and all its messages: what
// export_chat_archive writes of a whole store.
QList<ImportedConversation> all_conversations(const ConversationStore& store);

// Reads an archive or a single chat's JSON export (export_conversation, JSON): its conversations, their messages
// numbered 1, 2, ... for ConversationStore::import_conversations. Throws ArchiveError saying what is wrong and
// where; nothing is read past the first error.
QList<ImportedConversation> parse_chat_archive(const QByteArray& bytes);
// The same for a file, at most kMaxImportBytes; the error names the file.
QList<ImportedConversation> read_chat_archive(const QString& path);

}  // namespace kvchat::app
