#pragma once
// A kvchat database damaged the way a torn write or a bad sector does it, such that SQLite reads it
// without an error and returns part of the rows. Two conversations ("Kept" and "Damaged") of four
// messages each (ids 1-4 and 5-8), each message long enough to fill a table page of its own; then one
// count in a page header is lowered by one:
//   LostTableRow    the table's root page forgets its pointer to message 7's page: a scan of the
//                   table misses it (a lookup through the index fails as malformed)
//   LostIndexEntry  the index forgets message 8: a read through the index misses it, silently
// The file is in DELETE journal mode, so that it is one file, byte for byte what a copy would see.
#include <QFile>
#include <QString>

#include "app/store/conversation_store.h"
#include "common/raw_sqlite.h"

namespace kvchat::test {

enum class Damage { LostTableRow, LostIndexEntry };

// The text of message `id` of the damaged database (1-8).
inline QString damaged_database_text(qint64 id) {
  return QStringLiteral("message %1 ").arg(id).repeated(300).left(3000);
}

// Writes the database to `path`; false (with `why`) when the file did not come out as this expects.
inline bool write_damaged_database(const QString& path, Damage damage, QString* why) {
  {
    kvchat::app::ConversationStore store(path);
    qint64 id = 0;
    for (const char* title : {"Kept", "Damaged"}) {
      const qint64 conversation = store.create_conversation(QString::fromLatin1(title));
      for (int i = 0; i < 4; ++i) {
        kvchat::app::MessageRecord message;
        message.conversation_id = conversation;
        message.role = i % 2 == 0 ? kvchat::app::MessageRole::User : kvchat::app::MessageRole::Assistant;
        message.text = damaged_database_text(++id);
        store.add_message(message);
      }
    }
  }
  if (raw_query(path, QStringLiteral("PRAGMA journal_mode=DELETE")) != QStringLiteral("delete")) {
    *why = QStringLiteral("cannot leave WAL mode");
    return false;
  }
  const bool table = damage == Damage::LostTableRow;
  const int page_size = raw_query(path, QStringLiteral("PRAGMA page_size")).toInt();
  const int root = raw_query(path, QStringLiteral("SELECT rootpage FROM sqlite_master WHERE name = '%1'")
                                       .arg(table ? "messages" : "messages_by_conversation"))
                       .toInt();
  // An interior table page (0x05) over the eight one-message leaves; the index: one leaf page (0x0A).
  const char expected_type = table ? '\x05' : '\x0a';
  const int expected_cells = table ? 7 : 8;
  QFile file(path);
  if (page_size <= 0 || root <= 1 || !file.open(QIODevice::ReadWrite) || !file.seek(qint64(root - 1) * page_size)) {
    *why = QStringLiteral("cannot open page %1 of %2").arg(root).arg(path);
    return false;
  }
  const QByteArray header = file.read(5);
  const int cells = (static_cast<unsigned char>(header[3]) << 8) | static_cast<unsigned char>(header[4]);
  if (header.size() != 5 || header[0] != expected_type || cells != expected_cells) {
    *why = QStringLiteral("page %1 has type %2 and %3 cells").arg(root).arg(int(header[0])).arg(cells);
    return false;
  }
  const char lowered[2] = {static_cast<char>((cells - 1) >> 8), static_cast<char>((cells - 1) & 0xff)};
  file.seek(qint64(root - 1) * page_size + 3);
  return file.write(lowered, 2) == 2;
}

}  // namespace kvchat::test
