// kvchat-cli list / export over a database built here: stdout, files and exit codes.
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include "app/store/conversation_store.h"
#include "app/store/exporter.h"
#include "app/store/message_stats_json.h"
#include "common/cli_runner.h"
#include "common/damaged_database.h"
#include "common/terminal_cli_runner.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_data {

using kvchat::app::ConversationStore;
using kvchat::app::ExportFormat;
using kvchat::app::MessageRecord;
using kvchat::test::CliResult;
using kvchat::test::run_cli;

namespace {

MessageRecord message(qint64 conversation_id, const QString& role, const QString& text) {
  MessageRecord record;
  record.conversation_id = conversation_id;
  record.role = kvchat::app::parse_message_role(role).value();
  record.text = text;
  return record;
}

}  // namespace

class CliDataTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase();
  void list_prints_one_line_per_conversation();
  void list_escapes_control_characters_in_titles();
  void export_to_stdout_in_each_format();
  void export_to_file();
  void unknown_conversation_fails_clearly();
  void missing_database_is_reported_not_created();
  void bad_format_is_a_usage_error();
  void export_to_a_terminal_escapes_control_characters();
  void damaged_database_is_exported_with_what_is_missing();

 private:
  QTemporaryDir dir_;
  QString db_path_;
  qint64 story_id_ = 0;
  qint64 empty_id_ = 0;
  qint64 tabbed_id_ = 0;
};

void CliDataTest::initTestCase() {
  QVERIFY(dir_.isValid());
  db_path_ = dir_.filePath(QStringLiteral("chats.sqlite3"));
  ConversationStore store(db_path_);
  story_id_ = store.create_conversation(QStringLiteral("Bedtime story"), QStringLiteral("Tell gentle stories."));
  empty_id_ = store.create_conversation(QStringLiteral("Nothing yet"));
  tabbed_id_ = store.create_conversation(QStringLiteral("Tabs\tand\nbreaks"));
  store.add_message(message(tabbed_id_, QStringLiteral("user"), QStringLiteral("x")));
  // The story is written last so that it is the most recently updated.
  store.add_message(message(story_id_, QStringLiteral("user"), QStringLiteral("Once upon a time")));
  MessageRecord reply = message(story_id_, QStringLiteral("assistant"), QStringLiteral("there was a fox — Fuchs 狐."));
  reply.model = QStringLiteral("stories260K");
  kvchat::GenerationStats stats;
  stats.generated_tokens = 19;
  stats.decode_tokens_per_second = 640.5;
  stats.stop_reason = kvchat::StopReason::Eos;
  reply.stats = kvchat::app::stats_to_json(stats);
  store.add_message(reply);
  store.add_message(message(story_id_, QStringLiteral("marker"), QStringLiteral("1 older turn dropped")));
  store.add_message(message(story_id_, QStringLiteral("user"), QStringLiteral("More!")));
}

void CliDataTest::list_prints_one_line_per_conversation() {
  const CliResult result = run_cli({QStringLiteral("list"), QStringLiteral("--db"), db_path_});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  const QStringList lines = QString::fromStdString(result.out).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
  ConversationStore store(db_path_);
  const auto conversations = store.conversations();
  QCOMPARE(lines.size(), 3);
  QCOMPARE(conversations[0].id, story_id_);
  for (int i = 0; i < lines.size(); ++i) {
    const QStringList fields = lines[i].split(QLatin1Char('\t'));
    QCOMPARE(fields.size(), 4);
    QCOMPARE(fields[0].toLongLong(), conversations[i].id);
    QCOMPARE(QDateTime::fromString(fields[1], Qt::ISODateWithMs), conversations[i].updated_at);
    QCOMPARE(fields[2].toInt(), conversations[i].message_count);
  }
  QCOMPARE(lines[0], QStringLiteral("%1\t%2\t4\tBedtime story")
                         .arg(story_id_)
                         .arg(conversations[0].updated_at.toUTC().toString(Qt::ISODateWithMs)));
  QVERIFY(lines[1].endsWith(QStringLiteral("\t1\tTabs and breaks")));
  QVERIFY(lines[2].endsWith(QStringLiteral("\t0\tNothing yet")));
}

// A title with a terminal escape sequence and a bell reaches the terminal as visible text, not raw.
void CliDataTest::list_escapes_control_characters_in_titles() {
  const QString db = dir_.filePath(QStringLiteral("controls.sqlite3"));
  ConversationStore store(db);
  store.create_conversation(QStringLiteral("Red\x1b[31m alert\x07 \u0085end\x7f"));
  // Bidirectional overrides would make "txt.exe" read as "exe.txt" (and reorder the fields after it).
  store.create_conversation(QStringLiteral("report\u202Etxt.exe\u2066x\u2069\u2028y"));
  const CliResult result = run_cli({QStringLiteral("list"), QStringLiteral("--db"), db});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  const QStringList lines = QString::fromStdString(result.out).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
  QCOMPARE(lines.size(), 2);
  QVERIFY2(lines[1].endsWith(QStringLiteral("\t0\tRed\\x1b[31m alert\\x07 \\x85end\\x7f")), result.out.c_str());
  QVERIFY2(lines[0].endsWith(QStringLiteral("\t0\treport\\u202etxt.exe\\u2066x\\u2069\\u2028y")), result.out.c_str());
  QVERIFY(result.out.find('\x1b') == std::string::npos);
  QVERIFY(result.out.find("\xE2\x80\xAE") == std::string::npos);  // U+202E in UTF-8
}

void CliDataTest::export_to_stdout_in_each_format() {
  ConversationStore store(db_path_);
  const auto conversation = store.conversation(story_id_);
  QVERIFY(conversation.has_value());
  const auto messages = store.messages(story_id_);
  const QString id = QString::number(story_id_);
  for (const auto& [name, format] :
       {std::pair{QStringLiteral("md"), ExportFormat::Markdown}, std::pair{QStringLiteral("json"), ExportFormat::Json},
        std::pair{QStringLiteral("txt"), ExportFormat::Text}}) {
    const CliResult result = run_cli({QStringLiteral("export"), QStringLiteral("--db"), db_path_,
                                      QStringLiteral("--conversation"), id, QStringLiteral("--format"), name});
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    QCOMPARE(QString::fromStdString(result.out), kvchat::app::export_conversation(*conversation, messages, format));
  }
  // The JSON carries every message in order.
  const CliResult json =
      run_cli({QStringLiteral("export"), QStringLiteral("--db"), db_path_, QStringLiteral("--conversation"), id,
               QStringLiteral("--format"), QStringLiteral("json")});
  const QJsonArray items =
      QJsonDocument::fromJson(QByteArray::fromStdString(json.out)).object().value(QStringLiteral("messages")).toArray();
  QCOMPARE(items.size(), 4);
  QCOMPARE(items[0].toObject()[QStringLiteral("text")].toString(), QStringLiteral("Once upon a time"));
  QCOMPARE(items[1].toObject()[QStringLiteral("text")].toString(), QStringLiteral("there was a fox — Fuchs 狐."));
  QCOMPARE(items[1].toObject()[QStringLiteral("stats")].toObject()[QStringLiteral("generated_tokens")].toInt(), 19);
  QCOMPARE(items[2].toObject()[QStringLiteral("role")].toString(), QStringLiteral("marker"));
  QCOMPARE(items[3].toObject()[QStringLiteral("text")].toString(), QStringLiteral("More!"));
  // Markdown is the default format.
  const CliResult markdown =
      run_cli({QStringLiteral("export"), QStringLiteral("--db"), db_path_, QStringLiteral("--conversation"), id});
  QCOMPARE(markdown.exit_code, 0);
  QVERIFY(markdown.out.rfind("# Bedtime story\n", 0) == 0);
}

void CliDataTest::export_to_file() {
  const QString out = dir_.filePath(QStringLiteral("exports/story.txt"));
  QVERIFY(QDir().mkpath(QFileInfo(out).absolutePath()));
  const CliResult result = run_cli({QStringLiteral("export"), QStringLiteral("--db"), db_path_,
                                    QStringLiteral("--conversation"), QString::number(story_id_),
                                    QStringLiteral("--format"), QStringLiteral("txt"), QStringLiteral("--out"), out});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  QVERIFY(result.out.empty());
  QFile file(out);
  QVERIFY(file.open(QIODevice::ReadOnly));
  ConversationStore store(db_path_);
  QCOMPARE(
      QString::fromUtf8(file.readAll()),
      kvchat::app::export_conversation(*store.conversation(story_id_), store.messages(story_id_), ExportFormat::Text));

  // An unwritable destination fails with the path on stderr.
  const QString blocked = dir_.filePath(QStringLiteral("chats.sqlite3/story.md"));
  const CliResult failed =
      run_cli({QStringLiteral("export"), QStringLiteral("--db"), db_path_, QStringLiteral("--conversation"),
               QString::number(story_id_), QStringLiteral("--out"), blocked});
  QVERIFY(failed.exit_code != 0);
  QVERIFY2(failed.err.find(blocked.toStdString()) != std::string::npos, failed.err.c_str());
}

void CliDataTest::unknown_conversation_fails_clearly() {
  const CliResult result = run_cli({QStringLiteral("export"), QStringLiteral("--db"), db_path_,
                                    QStringLiteral("--conversation"), QStringLiteral("424242")});
  QVERIFY(result.exit_code != 0);
  QVERIFY(result.out.empty());
  const QList<QByteArray> lines = QByteArray::fromStdString(result.err).trimmed().split('\n');
  QCOMPARE(lines.size(), 1);
  QVERIFY2(lines[0].contains("no conversation 424242"), result.err.c_str());
}

void CliDataTest::missing_database_is_reported_not_created() {
  const QString missing = dir_.filePath(QStringLiteral("no-such.sqlite3"));
  for (const QStringList& arguments : {QStringList{QStringLiteral("list"), QStringLiteral("--db"), missing},
                                       QStringList{QStringLiteral("export"), QStringLiteral("--db"), missing,
                                                   QStringLiteral("--conversation"), QStringLiteral("1")}}) {
    const CliResult result = run_cli(arguments);
    QVERIFY(result.exit_code != 0);
    QVERIFY(result.out.empty());
    QCOMPARE(QByteArray::fromStdString(result.err).trimmed().split('\n').size(), 1);
    QVERIFY2(result.err.find(missing.toStdString()) != std::string::npos, result.err.c_str());
    QVERIFY(!QFile::exists(missing));
  }
}

void CliDataTest::bad_format_is_a_usage_error() {
  const CliResult result =
      run_cli({QStringLiteral("export"), QStringLiteral("--db"), db_path_, QStringLiteral("--conversation"),
               QString::number(story_id_), QStringLiteral("--format"), QStringLiteral("pdf")});
  QCOMPARE(result.exit_code, 2);
  QVERIFY2(result.err.find("'pdf'") != std::string::npos, result.err.c_str());
  const CliResult no_id = run_cli({QStringLiteral("export"), QStringLiteral("--db"), db_path_});
  QCOMPARE(no_id.exit_code, 2);
  QVERIFY2(no_id.err.find("--conversation") != std::string::npos, no_id.err.c_str());
}

// A title or a message holding escape sequences (a window title, a clipboard write, a cleared screen) reaches a
// terminal as visible text; a pipe or a file still gets the exact text.
void CliDataTest::export_to_a_terminal_escapes_control_characters() {
  const QString db = dir_.filePath(QStringLiteral("escapes.sqlite3"));
  qint64 id = 0;
  {
    ConversationStore store(db);
    id = store.create_conversation(QStringLiteral("Title\x1b]0;owned\x07\x1b[2J \u009b6n done"));
    store.add_message(message(id, QStringLiteral("user"), QStringLiteral("copy \x1b]52;c;aGk=\x07\ttab\r\nnext")));
  }
  const QStringList arguments = {
      QStringLiteral("export"),   QStringLiteral("--db"), db, QStringLiteral("--conversation"), QString::number(id),
      QStringLiteral("--format"), QStringLiteral("txt")};
  const CliResult shown = kvchat::test::run_cli_on_terminal(arguments);
  QVERIFY2(shown.exit_code == 0, shown.err.c_str());
  QVERIFY2(shown.out.rfind("Title\\x1b]0;owned\\x07\\x1b[2J \\x9b6n done\n", 0) == 0, shown.out.c_str());
  QVERIFY2(shown.out.find("\nUser:\ncopy \\x1b]52;c;aGk=\\x07\ttab\\x0d\nnext\n") != std::string::npos,
           shown.out.c_str());
  QVERIFY(shown.out.find('\x1b') == std::string::npos);
  QVERIFY(shown.out.find('\x07') == std::string::npos);
  QVERIFY(shown.out.find("\xC2\x9B") == std::string::npos);  // U+009B (CSI) in UTF-8

  const CliResult piped = run_cli(arguments);
  QVERIFY2(piped.exit_code == 0, piped.err.c_str());
  ConversationStore store(db, kvchat::app::StoreOpenMode::ReadOnly);
  QCOMPARE(QString::fromStdString(piped.out),
           kvchat::app::export_conversation(*store.conversation(id), store.messages(id), ExportFormat::Text));
  QVERIFY(piped.out.find("\x1b]52;c;aGk=\x07") != std::string::npos);
}

// A damaged file: what can be read is exported and listed, the damage and what is missing are named on
// stderr, and the exit status says it is not the whole conversation.
void CliDataTest::damaged_database_is_exported_with_what_is_missing() {
  const QString db = dir_.filePath(QStringLiteral("damaged.sqlite3"));
  QString why;
  QVERIFY2(kvchat::test::write_damaged_database(db, kvchat::test::Damage::LostTableRow, &why), qPrintable(why));
  const CliResult exported =
      run_cli({QStringLiteral("export"), QStringLiteral("--db"), db, QStringLiteral("--conversation"),
               QStringLiteral("2"), QStringLiteral("--format"), QStringLiteral("json")});
  QCOMPARE(exported.exit_code, 1);
  const std::string damaged = "kvchat-cli export: error: conversation store " + db.toStdString() + " is damaged (";
  QVERIFY2(exported.err.find(damaged) != std::string::npos, exported.err.c_str());
  QVERIFY2(exported.err.find("). Conversation 2: message 7 cannot be read (1 of the 4 the index lists); the export "
                             "holds the 3 message(s) that could be read\n") != std::string::npos,
           exported.err.c_str());
  const QJsonArray items = QJsonDocument::fromJson(QByteArray::fromStdString(exported.out))
                               .object()
                               .value(QStringLiteral("messages"))
                               .toArray();
  QCOMPARE(items.size(), 3);
  QCOMPARE(items[0].toObject()[QStringLiteral("text")].toString(), kvchat::test::damaged_database_text(5));
  QCOMPARE(items[2].toObject()[QStringLiteral("text")].toString(), kvchat::test::damaged_database_text(8));

  // Through a damaged index: every message is still read from the table; the file is still damaged.
  const QString index_db = dir_.filePath(QStringLiteral("damaged-index.sqlite3"));
  QVERIFY2(kvchat::test::write_damaged_database(index_db, kvchat::test::Damage::LostIndexEntry, &why), qPrintable(why));
  const CliResult whole =
      run_cli({QStringLiteral("export"), QStringLiteral("--db"), index_db, QStringLiteral("--conversation"),
               QStringLiteral("2"), QStringLiteral("--format"), QStringLiteral("txt")});
  QCOMPARE(whole.exit_code, 1);
  QVERIFY2(whole.err.find("Conversation 2: message 8 is missing from the index (its row was read); the export holds "
                          "the 4 message(s) that could be read") != std::string::npos,
           whole.err.c_str());
  for (qint64 id = 5; id <= 8; ++id)
    QVERIFY(whole.out.find(kvchat::test::damaged_database_text(id).toStdString()) != std::string::npos);

  // list: what it can, then the damage and the conversation known to miss messages.
  const CliResult listed = run_cli({QStringLiteral("list"), QStringLiteral("--db"), index_db});
  QCOMPARE(listed.exit_code, 1);
  QVERIFY2(listed.out.find("\t3\tDamaged\n") != std::string::npos, listed.out.c_str());
  QVERIFY2(listed.err.find("kvchat-cli list: error: conversation store " + index_db.toStdString() + " is damaged (") !=
               std::string::npos,
           listed.err.c_str());
  QVERIFY2(listed.err.find("); this list may be incomplete\nkvchat-cli list: conversation 2: message 8 is missing from "
                           "the index (its row was read)\n") != std::string::npos,
           listed.err.c_str());
}

KVCHAT_TEST_GUILESS_MAIN(CliDataTest)

}  // namespace app_test_cli_data

#include "test_cli_data.moc"
