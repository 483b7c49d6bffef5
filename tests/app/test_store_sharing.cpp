// The conversation store among other programs: another app's SQLite file is refused untouched, readers
// open read-only, and a write waits for another connection's write instead of failing.
#include <QCryptographicHash>
#include <QFile>
#include <QSqlDatabase>
#include <QSqlError>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <chrono>
#include <future>
#include <thread>

#include "app/store/conversation_store.h"
#include "common/raw_sqlite.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_store_sharing {

using kvchat::app::ConversationStore;
using kvchat::app::MessageRecord;
using kvchat::app::StoreError;
using kvchat::app::StoreOpenMode;
using kvchat::test::raw_query;

namespace {

QByteArray file_hash(const QString& path) {
  QFile file(path);
  if (!file.open(QIODevice::ReadOnly)) return {};
  return QCryptographicHash::hash(file.readAll(), QCryptographicHash::Sha256);
}

QString store_error_of(const QString& path, StoreOpenMode mode) {
  try {
    ConversationStore store(path, mode);
  } catch (const StoreError& error) {
    return QString::fromStdString(error.what());
  }
  return QString();
}

MessageRecord user_message(qint64 conversation_id, const QString& text) {
  MessageRecord message;
  message.conversation_id = conversation_id;
  message.role = kvchat::app::MessageRole::User;
  message.text = text;
  return message;
}

}  // namespace

class StoreSharingTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  // Another program's databases, one with a table named like kvchat's: refused with a clear error, and
  // not one byte changed (no WAL switch, no tables added).
  void foreign_databases_are_refused_untouched() {
    QTemporaryDir dir;
    struct Case {
      const char* name;
      QString setup;
      QString expected;
    };
    const Case cases[] = {
        {"other.sqlite3", QStringLiteral("CREATE TABLE other (x INTEGER)"),
         QStringLiteral("application_id 0, tables: other")},
        {"lookalike.sqlite3", QStringLiteral("CREATE TABLE conversations (id INTEGER, body TEXT)"),
         QStringLiteral("application_id 0, tables: conversations")},
        {"other-app.sqlite3", QStringLiteral("PRAGMA application_id = 305419896"),
         QStringLiteral("application_id 305419896, tables: none")},
    };
    for (const Case& c : cases) {
      const QString path = dir.filePath(QString::fromLatin1(c.name));
      raw_query(path, c.setup);
      const QByteArray before = file_hash(path);
      QVERIFY(!before.isEmpty());
      for (StoreOpenMode mode : {StoreOpenMode::CreateIfMissing, StoreOpenMode::ReadOnly}) {
        const QString message = store_error_of(path, mode);
        QCOMPARE(message, QStringLiteral("conversation store %1: not a kvchat database (%2); it was left unchanged")
                              .arg(path, c.expected));
        QCOMPARE(file_hash(path), before);
        QVERIFY(!QFile::exists(path + QStringLiteral("-wal")));
        QCOMPARE(raw_query(path, QStringLiteral("PRAGMA journal_mode")), QStringLiteral("delete"));
      }
    }
  }

  // A database written before kvchat set its application_id is still kvchat's, and gets the id.
  void databases_without_the_id_are_adopted() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("old.sqlite3"));
    qint64 id = 0;
    {
      ConversationStore store(path);
      id = store.create_conversation(QStringLiteral("kept"));
    }
    QCOMPARE(raw_query(path, QStringLiteral("PRAGMA application_id")), QStringLiteral("1802912616"));
    raw_query(path, QStringLiteral("PRAGMA application_id = 0"));
    ConversationStore store(path);
    QCOMPARE(store.conversation(id)->title, QStringLiteral("kept"));
    QCOMPARE(raw_query(path, QStringLiteral("PRAGMA application_id")), QStringLiteral("1802912616"));
  }

  // list and export read without writing: the journal mode of a database stays as it is, and a write
  // through a read-only store is refused by SQLite itself.
  void readers_open_read_only() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("chats.sqlite3"));
    qint64 id = 0;
    {
      ConversationStore store(path);
      id = store.create_conversation(QStringLiteral("hello"));
      store.add_message(user_message(id, QStringLiteral("hi")));
    }
    QCOMPARE(raw_query(path, QStringLiteral("PRAGMA journal_mode = DELETE")), QStringLiteral("delete"));
    const QByteArray before = file_hash(path);
    {
      ConversationStore reader(path, StoreOpenMode::ReadOnly);
      QCOMPARE(reader.conversations().size(), 1);
      QCOMPARE(reader.messages(id).first().text, QStringLiteral("hi"));
      bool refused = false;
      try {
        reader.create_conversation(QStringLiteral("write"));
      } catch (const StoreError& error) {
        refused = QString::fromUtf8(error.what()).contains(QStringLiteral("readonly"));
      }
      QVERIFY(refused);
    }
    QCOMPARE(file_hash(path), before);
    QCOMPARE(raw_query(path, QStringLiteral("PRAGMA journal_mode")), QStringLiteral("delete"));
    QCOMPARE(
        store_error_of(dir.filePath(QStringLiteral("missing.sqlite3")), StoreOpenMode::ReadOnly),
        QStringLiteral("conversation store %1: no such file").arg(dir.filePath(QStringLiteral("missing.sqlite3"))));
  }

  // Another connection holds the write lock for 0.7 s and commits: a write that reads first (every
  // store write does) must wait and then succeed. With a deferred BEGIN, SQLite refused it at once
  // ("database is locked") because its read snapshot had gone stale.
  void a_write_waits_for_another_writer() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("busy.sqlite3"));
    ConversationStore store(path);
    const qint64 id = store.create_conversation(QStringLiteral("busy"));
    store.add_message(user_message(id, QStringLiteral("first")));

    std::promise<void> locked;
    std::thread other_writer([&] {
      const QString name = QStringLiteral("other-writer");
      {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), name);
        db.setDatabaseName(path);
        db.open();
        QSqlQuery query(db);
        query.exec(QStringLiteral("BEGIN IMMEDIATE"));
        query.exec(QStringLiteral("UPDATE conversations SET title = 'renamed elsewhere'"));
        locked.set_value();
        std::this_thread::sleep_for(std::chrono::milliseconds(700));
        query.exec(QStringLiteral("COMMIT"));
        db.close();
      }
      QSqlDatabase::removeDatabase(name);
    });
    locked.get_future().wait();
    // Reads see the last commit while the other writer holds the lock; then the write waits for it.
    QCOMPARE(store.messages(id).size(), 1);
    QString error;
    try {
      store.add_message(user_message(id, QStringLiteral("second")));
    } catch (const StoreError& e) {
      error = QString::fromUtf8(e.what());
    }
    other_writer.join();
    QCOMPARE(error, QString());
    QCOMPARE(store.messages(id).size(), 2);
    QCOMPARE(store.conversation(id)->title, QStringLiteral("renamed elsewhere"));
  }
};

KVCHAT_TEST_GUILESS_MAIN(StoreSharingTest)

}  // namespace app_test_store_sharing

#include "test_store_sharing.moc"
