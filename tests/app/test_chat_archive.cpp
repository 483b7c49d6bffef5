// Export all / import: every conversation in one file and back. An export of an import of an export is the same
// file; a single chat's JSON export imports as a new chat; a bad file (cut short, another version, an unknown
// role, too big) or a full disk imports nothing and the error says what is wrong.
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include "app/store/chat_archive.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "app/store/exporter.h"
#include "common/cli_runner.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_chat_archive {

using kvchat::app::ArchiveError;
using kvchat::app::ConversationStore;
using kvchat::app::ImportedConversation;
using kvchat::app::MessageRecord;
using kvchat::app::StoreError;

class ChatArchiveTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void export_import_export_is_the_same_file();
  void a_single_chat_json_export_imports_as_a_new_chat();
  void bad_files_import_nothing_and_say_why();
  void a_store_error_midway_imports_nothing();
  void a_full_disk_imports_nothing();
  void the_cli_exports_and_imports();
  void tool_calls_and_results_round_trip();
};

namespace {

QList<ImportedConversation> everything(const ConversationStore& store) { return kvchat::app::all_conversations(store); }

MessageRecord make_message(qint64 conversation_id, const QString& role, const QString& text) {
  MessageRecord message;
  message.conversation_id = conversation_id;
  message.role = kvchat::app::parse_message_role(role).value();
  message.text = text;
  return message;
}

// Three chats: a pinned one with a system prompt, a regenerated reply, a context cut and an edited message;
// one with a reply cut short; an empty one.
void fill(ConversationStore& store) {
  const qint64 trip = store.create_conversation(QStringLiteral("Trip to Zürich"), QStringLiteral("Be brief."));
  const auto add = [&](qint64 chat, const char* role, const char* text) {
    return store.add_message(make_message(chat, QString::fromLatin1(role), QString::fromUtf8(text)));
  };
  const qint64 question = add(trip, "user", "Which train?");
  const qint64 first = add(trip, "assistant", "");
  store.finish_message(first, QStringLiteral("The IC 8."), QJsonObject{{"generated_tokens", 3}, {"decode_ms", 1.5}},
                       {5, 128000, 7}, 0xFEDCBA9876543210ull);
  store.set_message_settings(first, QJsonObject{{"temperature", 0.7}, {"hidden_alternative", true}});
  const qint64 second = add(trip, "assistant", "");
  store.finish_message(second, QStringLiteral("The IC 6, at 9:02."), QJsonObject{{"stop_reason", "eos"}});
  const qint64 follow_up = add(trip, "user", "And back?");
  add(trip, "assistant", "The IC 5.");
  store.add_message(kvchat::app::context_cut_marker(trip, follow_up, 2, 512));
  store.fork_message(trip, question, QStringLiteral("Which train to Zürich?"));
  add(trip, "assistant", "Any IC.");
  store.set_pinned(trip, true);
  store.set_generation_settings(trip,
                                QJsonObject{{"preset", "Precise"}, {"temperature", 0.0}, {"stop", QJsonArray{"\n\n"}}});
  Q_UNUSED(second);

  const qint64 plain = store.create_conversation(QStringLiteral("Plain"));
  add(plain, "user", "Tell me a story");
  MessageRecord partial = make_message(plain, QStringLiteral("assistant"), QStringLiteral("Once upon"));
  partial.complete = false;
  partial.model = QStringLiteral("stories260K");
  partial.backend = QStringLiteral("local");
  store.add_message(partial);
  store.create_conversation(QStringLiteral("Empty"));
}

QString write_file(const QTemporaryDir& dir, const QString& name, const QByteArray& bytes) {
  const QString path = dir.filePath(name);
  QFile file(path);
  if (!file.open(QIODevice::WriteOnly) || file.write(bytes) != bytes.size()) return {};
  return path;
}

QString archive_error_of(const QString& path) {
  try {
    kvchat::app::read_chat_archive(path);
  } catch (const ArchiveError& error) {
    return QString::fromStdString(error.what());
  }
  return QString();
}

}  // namespace

void ChatArchiveTest::export_import_export_is_the_same_file() {
  QTemporaryDir dir;
  ConversationStore original(dir.filePath(QStringLiteral("original.sqlite3")));
  fill(original);
  const QString first = kvchat::app::export_chat_archive(everything(original));
  const QString path = write_file(dir, QStringLiteral("all.json"), first.toUtf8());
  QVERIFY(!path.isEmpty());

  // The documented shape: versioned, positions rather than ids.
  const QJsonObject root = QJsonDocument::fromJson(first.toUtf8()).object();
  QCOMPARE(root.value("format").toString(), QStringLiteral("kvchat-chats"));
  QCOMPARE(root.value("version").toInt(), 1);
  const QJsonArray chats = root.value("conversations").toArray();
  QCOMPARE(chats.size(), 3);
  const QJsonObject trip = chats[0].toObject();
  QCOMPARE(trip.value("title").toString(), QStringLiteral("Trip to Zürich"));
  QCOMPARE(trip.value("system_prompt").toString(), QStringLiteral("Be brief."));
  QVERIFY(trip.value("pinned").toBool());
  QCOMPARE(trip.value("generation_settings").toObject().value("preset").toString(), QStringLiteral("Precise"));
  const QJsonArray trip_messages = trip.value("messages").toArray();
  QCOMPARE(trip_messages.size(), 8);
  QCOMPARE(trip_messages[1].toObject().value("token_vocabulary").toString(), QStringLiteral("18364758544493064720"));
  QCOMPARE(trip_messages[1].toObject().value("token_ids").toArray(), (QJsonArray{5, 128000, 7}));
  QCOMPARE(trip_messages[5].toObject().value("role").toString(), QStringLiteral("marker"));
  QCOMPARE(trip_messages[5].toObject().value("context_starts_at").toInt(), 4);
  QCOMPARE(trip_messages[6].toObject().value("branch").toInt(), 7);
  QCOMPARE(trip_messages[6].toObject().value("forked_from").toInt(), 1);
  QCOMPARE(trip_messages[7].toObject().value("branch").toInt(), 7);
  QVERIFY(!trip_messages[6].toObject().contains("id"));

  ConversationStore copy(dir.filePath(QStringLiteral("copy.sqlite3")));
  const QList<qint64> ids = copy.import_conversations(kvchat::app::read_chat_archive(path));
  QCOMPARE(ids.size(), 3);
  const QString second = kvchat::app::export_chat_archive(everything(copy));
  QCOMPARE(second, first);
  // The imported chats read as the originals: the shown path, the marker's cut, the branches.
  const QList<MessageRecord> shown = kvchat::app::messages_on_shown_path(copy.messages(ids[0]));
  QCOMPARE(shown.size(), 2);
  QCOMPARE(shown[0].text, QStringLiteral("Which train to Zürich?"));
  QCOMPARE(kvchat::app::branch_siblings(copy.messages(ids[0]), shown[0].id).size(), 2);
  QVERIFY(copy.conversation(ids[0])->pinned);
  QCOMPARE(copy.generation_settings(ids[0]),
           (QJsonObject{{"preset", "Precise"}, {"temperature", 0.0}, {"stop", QJsonArray{"\n\n"}}}));
  QCOMPARE(copy.generation_settings(ids[1]), QJsonObject());

  // Imported again: new chats beside the first ones, nothing overwritten.
  const QList<qint64> again = copy.import_conversations(kvchat::app::read_chat_archive(path));
  QCOMPARE(copy.conversations().size(), 6);
  for (const qint64 id : again) QVERIFY(!ids.contains(id));
  QCOMPARE(copy.conversation(ids[2])->title, QStringLiteral("Plain"));
  QCOMPARE(copy.messages(ids[2]).size(), 2);
  QVERIFY(!copy.messages(ids[2])[1].complete);
}

void ChatArchiveTest::a_single_chat_json_export_imports_as_a_new_chat() {
  QTemporaryDir dir;
  ConversationStore original(dir.filePath(QStringLiteral("original.sqlite3")));
  fill(original);
  const qint64 trip = original.conversations().first().id;
  original.show_branch(trip, original.messages(trip).first().id);  // the branch with the alternatives and the cut
  const QString json = kvchat::app::export_conversation(*original.conversation(trip), original.messages(trip),
                                                        kvchat::app::ExportFormat::Json);
  const QString path = write_file(dir, QStringLiteral("trip.json"), json.toUtf8());

  ConversationStore copy(dir.filePath(QStringLiteral("copy.sqlite3")));
  const QList<qint64> ids = copy.import_conversations(kvchat::app::read_chat_archive(path));
  QCOMPARE(ids.size(), 1);
  QCOMPARE(copy.conversation(ids[0])->title, QStringLiteral("Trip to Zürich"));
  QCOMPARE(copy.conversation(ids[0])->system_prompt, QStringLiteral("Be brief."));
  const QList<MessageRecord> messages = copy.messages(ids[0]);
  QCOMPARE(messages.size(), 6);
  QCOMPARE(messages[1].text, QStringLiteral("The IC 8."));
  QVERIFY(kvchat::app::is_hidden_alternative(messages[1]));
  QCOMPARE(messages[2].text, QStringLiteral("The IC 6, at 9:02."));
  QCOMPARE(kvchat::app::reply_alternatives(messages, messages[2].id), (QList<qint64>{messages[1].id, messages[2].id}));
  // The marker's cut points at the imported "And back?".
  const QList<MessageRecord> in_context = kvchat::app::messages_in_context(messages);
  QCOMPARE(in_context.size(), 2);
  QCOMPARE(in_context[0].text, QStringLiteral("And back?"));
  // Exported again as one chat: the same, but for the ids.
  QJsonObject before = QJsonDocument::fromJson(json.toUtf8()).object();
  QJsonObject after = QJsonDocument::fromJson(kvchat::app::export_conversation(*copy.conversation(ids[0]), messages,
                                                                               kvchat::app::ExportFormat::Json)
                                                  .toUtf8())
                          .object();
  for (QJsonObject* object : {&before, &after}) {
    object->remove("id");
    object->remove("updated_at");
    QJsonArray items = object->value("messages").toArray();
    for (auto item = items.begin(); item != items.end(); ++item) {
      QJsonObject message = item->toObject();
      message.remove("id");
      QJsonObject settings = message.value("settings").toObject();
      settings.remove(kvchat::app::kMarkerContextStartKey);
      message.insert("settings", settings);
      QJsonArray alternatives = message.value("alternatives").toArray();
      for (auto alternative = alternatives.begin(); alternative != alternatives.end(); ++alternative) {
        QJsonObject copy_of = alternative->toObject();
        copy_of.remove("id");
        *alternative = copy_of;
      }
      if (message.contains("alternatives")) message.insert("alternatives", alternatives);
      *item = message;
    }
    object->insert("messages", items);
  }
  QCOMPARE(after, before);
}

void ChatArchiveTest::bad_files_import_nothing_and_say_why() {
  QTemporaryDir dir;
  ConversationStore original(dir.filePath(QStringLiteral("original.sqlite3")));
  fill(original);
  const QByteArray good = kvchat::app::export_chat_archive(everything(original)).toUtf8();

  const QByteArray cut = good.left(good.size() / 2);
  QJsonParseError parse_error{};
  QJsonDocument::fromJson(cut, &parse_error);
  const QString truncated = write_file(dir, QStringLiteral("truncated.json"), cut);
  QCOMPARE(archive_error_of(truncated),
           QStringLiteral("cannot import %1: it is not valid JSON (%2 at byte %3 of %4; is the file cut short?)")
               .arg(truncated, parse_error.errorString())
               .arg(parse_error.offset)
               .arg(cut.size()));

  QByteArray newer = good;
  newer.replace("\"version\": 1", "\"version\": 2");
  const QString newer_path = write_file(dir, QStringLiteral("newer.json"), newer);
  QCOMPARE(archive_error_of(newer_path),
           QStringLiteral("cannot import %1: the archive is version 2 of the kvchat-chats format; this program reads "
                          "version 1")
               .arg(newer_path));

  QByteArray robot = good;
  robot.replace("\"role\": \"assistant\"", "\"role\": \"robot\"");
  const QString robot_path = write_file(dir, QStringLiteral("robot.json"), robot);
  QCOMPARE(archive_error_of(robot_path),
           QStringLiteral("cannot import %1: conversation 1 (\u201cTrip to Zürich\u201d), message 2: unknown role "
                          "\u201crobot\u201d (expected system, user, assistant, tool or marker)")
               .arg(robot_path));

  const QString foreign = write_file(dir, QStringLiteral("foreign.json"), R"({"format": "other-app", "chats": []})");
  QCOMPARE(archive_error_of(foreign),
           QStringLiteral("cannot import %1: it is not a kvchat export: its \"format\" is \u201cother-app\u201d, not "
                          "\"kvchat-chats\"")
               .arg(foreign));

  const QString list = write_file(dir, QStringLiteral("list.json"), "[1, 2, 3]");
  QCOMPARE(
      archive_error_of(list),
      QStringLiteral("cannot import %1: it is not a kvchat export: the JSON is an array, not an object").arg(list));

  QByteArray dangling = good;
  dangling.replace("\"forked_from\": 1", "\"forked_from\": 99");
  const QString dangling_path = write_file(dir, QStringLiteral("dangling.json"), dangling);
  QCOMPARE(archive_error_of(dangling_path),
           QStringLiteral("cannot import %1: conversation 1 (\u201cTrip to Zürich\u201d), message 7: \"forked_from\" "
                          "must be a whole number from 0 to 6")
               .arg(dangling_path));

  QByteArray no_text = good;
  no_text.replace("\"text\": \"And back?\"", "\"text\": 42");
  const QString no_text_path = write_file(dir, QStringLiteral("no-text.json"), no_text);
  QCOMPARE(archive_error_of(no_text_path),
           QStringLiteral("cannot import %1: conversation 1 (\u201cTrip to Zürich\u201d), message 4: \"text\" is a "
                          "number, not a string")
               .arg(no_text_path));

  // Too big: refused by its size, before anything is read.
  const QString huge = dir.filePath(QStringLiteral("huge.json"));
  {
    QFile file(huge);
    QVERIFY(file.open(QIODevice::WriteOnly));
    QVERIFY(file.resize(kvchat::app::kMaxImportBytes + 1));  // sparse: nothing written
  }
  QCOMPARE(archive_error_of(huge), QStringLiteral("cannot import %1: it is %2 bytes; an import reads at most %3")
                                       .arg(huge)
                                       .arg(kvchat::app::kMaxImportBytes + 1)
                                       .arg(kvchat::app::kMaxImportBytes));

  QCOMPARE(archive_error_of(dir.filePath(QStringLiteral("missing.json"))).left(15), QStringLiteral("cannot import /"));
}

void ChatArchiveTest::a_store_error_midway_imports_nothing() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath(QStringLiteral("store.sqlite3")));
  fill(store);
  const QList<ImportedConversation> before = everything(store);
  QList<ImportedConversation> bad = before;
  // The first conversation's last message refers to a message it does not hold. The others are written before it
  // (the last first): they go with the rest.
  bad[0].messages.last().forked_from = 12345;
  QString error;
  try {
    store.import_conversations(bad);
  } catch (const StoreError& e) {
    error = QString::fromStdString(e.what());
  }
  QCOMPARE(error, QStringLiteral("conversation store %1: cannot import conversation 1 (\u201cTrip to Zürich\u201d): "
                                 "message %2's forked_from refers to message 12345, which it does not hold")
                      .arg(store.path())
                      .arg(bad[0].messages.last().id));
  QCOMPARE(kvchat::app::export_chat_archive(everything(store)), kvchat::app::export_chat_archive(before));
}

void ChatArchiveTest::a_full_disk_imports_nothing() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath(QStringLiteral("store.sqlite3")));
  fill(store);
  const QString before = kvchat::app::export_chat_archive(everything(store));
  QList<ImportedConversation> big = everything(store);
  big[0].messages[0].text = QString(200000, QLatin1Char('x'));  // more than the pages left
  // The store's connection may not grow the file past its size now: SQLite's "database or disk is full".
  int limited = 0;
  for (const QString& name : QSqlDatabase::connectionNames()) {
    QSqlDatabase db = QSqlDatabase::database(name, false);
    if (!name.startsWith(QLatin1String("kvchat-store-")) || db.databaseName() != store.path()) continue;
    QSqlQuery pages(db);
    QVERIFY(pages.exec(QStringLiteral("PRAGMA page_count")) && pages.next());
    const qint64 count = pages.value(0).toLongLong();
    pages.finish();
    QSqlQuery limit(db);
    QVERIFY(limit.exec(QStringLiteral("PRAGMA max_page_count = %1").arg(count + 2)));
    ++limited;
  }
  QCOMPARE(limited, 1);
  QString error;
  try {
    store.import_conversations(big);
  } catch (const StoreError& e) {
    error = QString::fromStdString(e.what());
  }
  QVERIFY2(error.contains(QLatin1String("database or disk is full")), qPrintable(error));
  QVERIFY2(error.startsWith(QStringLiteral("conversation store %1: cannot import conversation").arg(store.path())),
           qPrintable(error));
  QCOMPARE(kvchat::app::export_chat_archive(everything(store)), before);
  QCOMPARE(store.integrity_check(), QStringLiteral("ok"));
}

void ChatArchiveTest::the_cli_exports_and_imports() {
  QTemporaryDir dir;
  const QString original = dir.filePath(QStringLiteral("original.sqlite3"));
  {
    ConversationStore store(original);
    fill(store);
  }
  const QString file = dir.filePath(QStringLiteral("all.json"));
  const auto exported = kvchat::test::run_cli({"export-all", "--db", original, "--out", file});
  QCOMPARE(exported.exit_code, 0);
  QCOMPARE(QString::fromStdString(exported.out), QStringLiteral("exported 3 conversation(s) to %1\n").arg(file));
  const QString copy = dir.filePath(QStringLiteral("copy.sqlite3"));
  const auto imported = kvchat::test::run_cli({"import", "--db", copy, "--in", file});
  QCOMPARE(imported.exit_code, 0);
  QCOMPARE(QString::fromStdString(imported.out),
           QStringLiteral("imported 3 conversation(s) from %1: 3 2 1\n").arg(file));
  const QString again = dir.filePath(QStringLiteral("again.json"));
  QCOMPARE(kvchat::test::run_cli({"export-all", "--db", copy, "--out", again}).exit_code, 0);
  QFile first(file), second(again);
  QVERIFY(first.open(QIODevice::ReadOnly) && second.open(QIODevice::ReadOnly));
  QCOMPARE(second.readAll(), first.readAll());

  const QString cut = write_file(dir, QStringLiteral("cut.json"), QByteArray("{\"format\": \"kvchat-chats\", \"vers"));
  const auto refused = kvchat::test::run_cli({"import", "--db", copy, "--in", cut});
  QCOMPARE(refused.exit_code, 1);
  QVERIFY2(
      QString::fromStdString(refused.err)
          .startsWith(QStringLiteral("kvchat-cli import: error: cannot import %1: it is not valid JSON (").arg(cut)),
      refused.err.c_str());
  ConversationStore reader(copy, kvchat::app::StoreOpenMode::ReadOnly);
  QCOMPARE(reader.conversations().size(), 3);
}

// A chat with tool use (a reply that calls a tool, the tool's result, the answer) and a JSON reply format comes
// back from an archive and from a single chat's JSON export with its calls, the call its result answers and its
// format; tool use where it cannot be is refused, saying where.
void ChatArchiveTest::tool_calls_and_results_round_trip() {
  QTemporaryDir dir;
  ConversationStore original(dir.filePath(QStringLiteral("original.sqlite3")));
  const qint64 chat = original.create_conversation(QStringLiteral("Weather"));
  original.add_message(make_message(chat, QStringLiteral("user"), QStringLiteral("Weather in Paris?")));
  MessageRecord call = make_message(chat, QStringLiteral("assistant"), QStringLiteral("Let me look."));
  const QJsonArray calls{
      QJsonObject{{"id", "call_1"},
                  {"type", "function"},
                  {"function", QJsonObject{{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}};
  call.tool_calls = calls;
  original.add_message(call);
  MessageRecord result = make_message(chat, QStringLiteral("tool"), QStringLiteral("21 C"));
  result.tool_call_id = QStringLiteral("call_1");
  result.tool_name = QStringLiteral("get_weather");
  original.add_message(result);
  original.add_message(make_message(chat, QStringLiteral("assistant"), QStringLiteral("It is 21 C.")));
  const QJsonObject reply_format{{"type", "json_schema"}, {"schema", "{\"type\": \"object\"}"}};
  original.set_reply_format(chat, reply_format);

  const QString archive = kvchat::app::export_chat_archive(everything(original));
  QCOMPARE(
      QJsonDocument::fromJson(archive.toUtf8()).object().value("conversations")[0].toObject().value("reply_format"),
      QJsonValue(reply_format));
  const QJsonArray items = QJsonDocument::fromJson(archive.toUtf8())
                               .object()
                               .value("conversations")[0]
                               .toObject()
                               .value("messages")
                               .toArray();
  QCOMPARE(items[1].toObject().value("tool_calls").toArray(), calls);
  QCOMPARE(items[2].toObject().value("role").toString(), QStringLiteral("tool"));
  QCOMPARE(items[2].toObject().value("tool_call_id").toString(), QStringLiteral("call_1"));
  QCOMPARE(items[2].toObject().value("name").toString(), QStringLiteral("get_weather"));
  QVERIFY(!items[3].toObject().contains("tool_calls"));
  const QString archive_path = write_file(dir, QStringLiteral("all.json"), archive.toUtf8());
  const QString single_path =
      write_file(dir, QStringLiteral("chat.json"),
                 kvchat::app::export_conversation(*original.conversation(chat), original.messages(chat),
                                                  kvchat::app::ExportFormat::Json)
                     .toUtf8());

  ConversationStore copy(dir.filePath(QStringLiteral("copy.sqlite3")));
  for (const QString& path : {archive_path, single_path}) {
    const QList<qint64> ids = copy.import_conversations(kvchat::app::read_chat_archive(path));
    const QList<MessageRecord> messages = copy.messages(ids[0]);
    QCOMPARE(messages.size(), 4);
    QCOMPARE(messages[1].text, QStringLiteral("Let me look."));
    QCOMPARE(messages[1].tool_calls, calls);
    QCOMPARE(messages[2].role, kvchat::app::MessageRole::Tool);
    QCOMPARE(messages[2].tool_call_id, QStringLiteral("call_1"));
    QCOMPARE(messages[2].tool_name, QStringLiteral("get_weather"));
    QCOMPARE(messages[3].text, QStringLiteral("It is 21 C."));
    QCOMPARE(copy.reply_format(ids[0]), reply_format);
  }
  QCOMPARE(kvchat::app::export_chat_archive({everything(copy).first()}), archive);

  const auto error_with = [&](const char* from, const char* to) {
    QByteArray bad = archive.toUtf8();
    bad.replace(from, to);
    return archive_error_of(write_file(dir, QStringLiteral("bad.json"), bad)).section(QStringLiteral(": "), 1);
  };
  QCOMPARE(
      error_with("\"role\": \"assistant\",\n                    \"settings\"", "\"role\": \"user\",\n \"settings\""),
      QStringLiteral("conversation 1 (\u201cWeather\u201d), message 2: \"tool_calls\" on a message that is not "
                     "the assistant's"));
  QCOMPARE(error_with("\"name\": \"get_weather\"\n", "\"name\": \"\"\n"),
           QStringLiteral("conversation 1 (\u201cWeather\u201d), message 2: tool call 1 has no function name"));
  QCOMPARE(error_with("\"tool_call_id\": \"call_1\"", "\"tool_call_id\": 7"),
           QStringLiteral("conversation 1 (\u201cWeather\u201d), message 3: \"tool_call_id\" is not text"));
  QCOMPARE(
      error_with("\"role\": \"tool\"", "\"role\": \"user\""),
      QStringLiteral("conversation 1 (\u201cWeather\u201d), message 3: \"tool_call_id\" on a message that is not a "
                     "tool result"));
}

KVCHAT_TEST_MAIN(ChatArchiveTest)

}  // namespace app_test_chat_archive

#include "test_chat_archive.moc"
