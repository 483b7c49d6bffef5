// Hostile conversations and databases, end to end through kvchat-cli under the limits of
// common/hostile_case.h: a message far over the context, another program's SQLite file, a database in
// DELETE journal mode, NUL and control characters, an empty message, a damaged database, one of a newer
// schema. Model folders, templates, GGUF files, arguments and remote servers: test_hostile_inputs.cpp.
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include "app/store/conversation_store.h"
#include "common/chat_fixture.h"
#include "common/damaged_database.h"
#include "common/hostile_case.h"
#include "common/model_folder_copy.h"
#include "common/raw_sqlite.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_hostile_conversations {

using kvchat::app::ConversationStore;
using kvchat::app::StoreOpenMode;
using kvchat::test::LimitedCliResult;
using kvchat::test::raw_query;
using kvchat::test::run_case;

namespace {

QByteArray file_bytes(const QString& path) {
  QFile file(path);
  return file.open(QIODevice::ReadOnly) ? file.readAll() : QByteArray();
}

// The files SQLite leaves beside a database in WAL mode or during a DELETE-mode transaction.
bool has_side_files(const QString& db) {
  for (const char* suffix : {"-wal", "-shm", "-journal"})
    if (QFile::exists(db + suffix)) return true;
  return false;
}

}  // namespace

class HostileConversationsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() { QVERIFY(dir_.isValid()); }
  void message_over_the_context();
  void another_programs_database_is_refused();
  void reading_leaves_a_delete_mode_database_unchanged();
  void nul_and_control_characters();
  void empty_message_creates_no_conversation();
  void damaged_database_is_not_chatted_on();
  void newer_schema_is_left_byte_for_byte();

 private:
  QStringList chat(const QString& db, const QStringList& more) const {
    return QStringList{"chat", "--model", kvchat::test::stories_model_directory(), "--db", db, "--max-new-tokens",
                       "2"} +
           more;
  }
  QTemporaryDir dir_;
};

// 2 MB on stdin (an argument that long is refused by the kernel) is one message of a million tokens.
void HostileConversationsTest::message_over_the_context() {
  const QString db = dir_.filePath("long.sqlite3");
  std::string message;
  for (int i = 0; i < 1'000'000; ++i) message += "a ";
  LimitedCliResult result = run_case("2 MB message", chat(db, {}), message + "\n");
  // Tokenizing the 2 MB takes over a second of CPU by itself.
  const std::string problem = kvchat::test::failure_mismatch(
      result, 1, {"conversation: 1\n", "this conversation is 1000002 tokens long and the context limit is 512 tokens"},
      kvchat::test::kHeavyCaseCpuSeconds);
  QVERIFY2(problem.empty(), problem.c_str());

  result = run_case("next turn after the 2 MB message", chat(db, {"--conversation", "1", "--message", "Once upon"}));
  // The refused message and its failed reply are stored, marked failed, and left out of every later
  // prompt: the conversation goes on.
  QVERIFY2(result.exited_normally && result.exit_code == 0, kvchat::test::describe(result).c_str());
  QVERIFY2(result.cpu_seconds <= kvchat::test::kMaxCaseCpuSeconds, kvchat::test::describe(result).c_str());
}

void HostileConversationsTest::another_programs_database_is_refused() {
  const struct {
    const char* name;
    const char* table;
  } cases[] = {{"other.sqlite3", "other"}, {"lookalike.sqlite3", "conversations"}};
  for (const auto& c : cases) {
    const QString db = dir_.filePath(c.name);
    raw_query(db, QStringLiteral("CREATE TABLE %1(id INTEGER PRIMARY KEY, title TEXT)").arg(c.table));
    raw_query(db, QStringLiteral("INSERT INTO %1 VALUES (1, 'theirs')").arg(c.table));
    const QByteArray before = file_bytes(db);
    QVERIFY(!before.isEmpty());
    const QString refused = QStringLiteral(
                                "conversation store %1: not a kvchat database (application_id 0, tables: "
                                "%2); it was left unchanged")
                                .arg(db, c.table);
    KVCHAT_EXPECT_FAILURE(run_case(std::string("chat on ") + c.name, chat(db, {"--message", "hi"})), 1,
                          QStringList{refused});
    KVCHAT_EXPECT_FAILURE(run_case(std::string("list on ") + c.name, {"list", "--db", db}), 1, QStringList{refused});
    QCOMPARE(file_bytes(db), before);
    QVERIFY(!has_side_files(db));
  }
}

void HostileConversationsTest::reading_leaves_a_delete_mode_database_unchanged() {
  const QString db = dir_.filePath("delete-mode.sqlite3");
  KVCHAT_EXPECT_SUCCESS(run_case("chat to create", chat(db, {"--message", "Once upon"})));
  QCOMPARE(raw_query(db, QStringLiteral("PRAGMA journal_mode=DELETE")), QStringLiteral("delete"));
  QVERIFY(!has_side_files(db));
  const QByteArray before = file_bytes(db);
  const qint64 modified_before = QFileInfo(db).lastModified().toMSecsSinceEpoch();

  const LimitedCliResult listed = run_case("list, DELETE mode", {"list", "--db", db});
  KVCHAT_EXPECT_SUCCESS(listed);
  QVERIFY2(listed.out.rfind("1\t", 0) == 0 && listed.out.find("\t2\tOnce upon\n") != std::string::npos,
           listed.out.c_str());
  const LimitedCliResult exported =
      run_case("export, DELETE mode", {"export", "--db", db, "--conversation", "1", "--format", "txt"});
  KVCHAT_EXPECT_SUCCESS(exported);
  QVERIFY2(exported.out.find("User:\nOnce upon\n") != std::string::npos, exported.out.c_str());

  QCOMPARE(file_bytes(db), before);
  QCOMPARE(QFileInfo(db).lastModified().toMSecsSinceEpoch(), modified_before);
  QVERIFY(!has_side_files(db));
  QCOMPARE(raw_query(db, QStringLiteral("PRAGMA journal_mode")), QStringLiteral("delete"));
}

void HostileConversationsTest::nul_and_control_characters() {
  const QString db = dir_.filePath("characters.sqlite3");
  KVCHAT_EXPECT_SUCCESS(run_case("NUL on stdin", chat(db, {}), std::string("Once upon\0 a time\n", 18)));
  KVCHAT_EXPECT_SUCCESS(run_case("ESC in the title", chat(db, {"--message", "\x1b[31mred\x07 bell\x7f"})));
  {
    ConversationStore store(db, StoreOpenMode::ReadOnly);
    QCOMPARE(store.messages(1).value(0).text, QStringLiteral("Once upon\uFFFD a time"));
    QCOMPARE(store.messages(2).value(0).text, QStringLiteral("\x1b[31mred\x07 bell\x7f"));
  }
  const LimitedCliResult listed = run_case("list with control characters", {"list", "--db", db});
  KVCHAT_EXPECT_SUCCESS(listed);
  QVERIFY2(listed.out.find("\t2\t\\x1b[31mred\\x07 bell\\x7f\n") != std::string::npos, listed.out.c_str());
  for (const char control : {'\x1b', '\x07', '\x7f'}) QVERIFY(listed.out.find(control) == std::string::npos);
}

void HostileConversationsTest::empty_message_creates_no_conversation() {
  const QString db = dir_.filePath("empty.sqlite3");
  KVCHAT_EXPECT_FAILURE(run_case("empty --message", chat(db, {"--message", ""})), 2, QStringList{"--message is empty"});
  QVERIFY(!QFile::exists(db) || ConversationStore(db, StoreOpenMode::ReadOnly).conversations().isEmpty());
}

// Pages damaged so that SQLite returns 3 of a conversation's 4 messages without an error: chat refuses the
// file (it would run on part of the history and write into the damage), export says what is missing.
void HostileConversationsTest::damaged_database_is_not_chatted_on() {
  for (const auto damage : {kvchat::test::Damage::LostIndexEntry, kvchat::test::Damage::LostTableRow}) {
    const QString db = dir_.filePath(QStringLiteral("damaged-%1.sqlite3").arg(static_cast<int>(damage)));
    QString why;
    QVERIFY2(kvchat::test::write_damaged_database(db, damage, &why), qPrintable(why));
    const QByteArray before = file_bytes(db);
    const LimitedCliResult chatted =
        run_case("chat on a damaged database", chat(db, {"--conversation", "2", "--message", "Once upon"}));
    const QString refused = QStringLiteral("conversation store %1: the file is damaged (").arg(db);
    KVCHAT_EXPECT_FAILURE(chatted, 1, QStringList{refused, "); nothing was written to it"});
    QCOMPARE(file_bytes(db), before);
    QVERIFY(!has_side_files(db));
    const QString missing =
        damage == kvchat::test::Damage::LostTableRow
            ? QStringLiteral("Conversation 2: message 7 cannot be read (1 of the 4 the index lists)")
            : QStringLiteral("Conversation 2: message 8 is missing from the index (its row was read)");
    KVCHAT_EXPECT_FAILURE(run_case("export of a damaged database", {"export", "--db", db, "--conversation", "2"}), 1,
                          QStringList{missing});
    QCOMPARE(file_bytes(db), before);
  }
}

// A database of a newer schema is refused by chat and by list, and left exactly as it was: in DELETE mode
// still, with no journal beside it.
void HostileConversationsTest::newer_schema_is_left_byte_for_byte() {
  const QString db = dir_.filePath("future.sqlite3");
  KVCHAT_EXPECT_SUCCESS(run_case("chat to create", chat(db, {"--message", "Once upon"})));
  QCOMPARE(raw_query(db, QStringLiteral("PRAGMA journal_mode=DELETE")), QStringLiteral("delete"));
  raw_query(db, QStringLiteral("INSERT INTO schema_version (version) VALUES (99)"));
  QVERIFY(!has_side_files(db));
  const QByteArray before = file_bytes(db);
  const QString refused =
      QStringLiteral("conversation store %1: schema version 99 is newer than this program's").arg(db);
  KVCHAT_EXPECT_FAILURE(run_case("chat on a newer schema", chat(db, {"--conversation", "1", "--message", "hi"})), 1,
                        QStringList{refused});
  KVCHAT_EXPECT_FAILURE(run_case("list on a newer schema", {"list", "--db", db}), 1, QStringList{refused});
  QCOMPARE(file_bytes(db), before);
  QVERIFY(!has_side_files(db));
  QCOMPARE(raw_query(db, QStringLiteral("PRAGMA journal_mode")), QStringLiteral("delete"));
}

KVCHAT_TEST_GUILESS_MAIN(HostileConversationsTest)

}  // namespace app_test_hostile_conversations

#include "test_hostile_conversations.moc"
