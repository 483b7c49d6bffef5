// Export: Markdown, JSON and plain text carry every message in order with its role; the file writer is atomic
// and reports failures with the path.
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include "app/settings.h"
#include "app/store/chat_history.h"
#include "app/store/exporter.h"
#include "app/store/markdown_text.h"
#include "app/store/message_stats_json.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_exporter {

using kvchat::app::ConversationRecord;
using kvchat::app::ExportFormat;
using kvchat::app::MessageRecord;

namespace {

struct Fixture {
  ConversationRecord conversation;
  QList<MessageRecord> messages;
  kvchat::GenerationStats first_stats;
  kvchat::GenerationStats second_stats;
};

MessageRecord message(qint64 id, const QString& role, const QString& text, qint64 ms) {
  MessageRecord record;
  record.id = id;
  record.conversation_id = 7;
  record.role = kvchat::app::parse_message_role(role).value();
  record.text = text;
  record.created_at = QDateTime::fromMSecsSinceEpoch(ms, Qt::UTC);
  return record;
}

Fixture make_fixture() {
  Fixture f;
  f.conversation.id = 7;
  f.conversation.title = QStringLiteral("The lost kitten");
  f.conversation.system_prompt = QStringLiteral("You are a storyteller.");
  f.conversation.created_at = QDateTime(QDate(2024, 3, 1), QTime(9, 30, 0, 125), Qt::UTC);
  f.conversation.updated_at = QDateTime(QDate(2024, 3, 1), QTime(9, 41, 2, 500), Qt::UTC);
  const qint64 base = f.conversation.created_at.toMSecsSinceEpoch();

  f.first_stats.prompt_tokens = 21;
  f.first_stats.reused_tokens = 0;
  f.first_stats.prefilled_tokens = 21;
  f.first_stats.generated_tokens = 48;
  f.first_stats.ttft_ms = 3.0;
  f.first_stats.decode_tokens_per_second = 812.5;
  f.first_stats.cache_tokens = 69;
  f.first_stats.cache_bytes = 70656;
  f.first_stats.cache_mode = kvchat::KvCacheMode::Contiguous;
  f.first_stats.stop_reason = kvchat::StopReason::Eos;
  f.second_stats = f.first_stats;
  f.second_stats.prompt_tokens = 90;
  f.second_stats.reused_tokens = 69;
  f.second_stats.generated_tokens = 12;
  f.second_stats.cache_mode = kvchat::KvCacheMode::Off;
  f.second_stats.stop_reason = kvchat::StopReason::Stopped;

  kvchat::app::ChatSettings settings;
  settings.seed = 77;
  f.messages.append(message(101, QStringLiteral("user"), QStringLiteral("Where is the kitten?"), base + 1000));
  MessageRecord reply =
      message(102, QStringLiteral("assistant"), QStringLiteral("The kitten hid under the bed."), base + 2000);
  reply.model = QStringLiteral("stories260K");
  reply.settings = settings.to_json();
  reply.stats = kvchat::app::stats_to_json(f.first_stats);
  f.messages.append(reply);
  f.messages.append(message(103, QStringLiteral("marker"),
                            QStringLiteral("Older turns were dropped to fit the context."), base + 3000));
  f.messages.append(message(104, QStringLiteral("user"), QStringLiteral("And then?\nTell me more ✨"), base + 4000));
  MessageRecord second =
      message(105, QStringLiteral("assistant"), QStringLiteral("She found a ball of yarn"), base + 5000);
  second.model = QStringLiteral("stories260K");
  second.stats = kvchat::app::stats_to_json(f.second_stats);
  second.complete = false;
  f.messages.append(second);
  return f;
}

// Asserts that each needle occurs in `text`, each one after the previous.
void verify_in_order(const QString& text, const QStringList& needles) {
  qsizetype from = 0;
  for (const QString& needle : needles) {
    const qsizetype at = text.indexOf(needle, from);
    QVERIFY2(at >= 0, qPrintable(QStringLiteral("'%1' missing (or out of order) in:\n%2").arg(needle, text)));
    from = at + needle.size();
  }
}

}  // namespace

class ExporterTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void format_names();
  void markdown_has_every_message_in_order();
  void text_has_role_blocks_in_order();
  void json_parses_back_with_stats();
  void write_text_file_writes_utf8_atomically();
  void write_text_file_reports_the_path();
  void every_format_places_the_cut_where_the_context_began();
  void a_failed_turn_is_exported_with_its_error();
  void regenerated_replies_are_exported_as_other_versions();
  void a_turn_showing_none_of_its_replies_still_exports_them();
  void markdown_keeps_the_line_breaks_the_window_shows();
  void tool_calls_and_results_are_exported();
};

void ExporterTest::format_names() {
  QCOMPARE(kvchat::app::export_format_from_string(QStringLiteral("md")), ExportFormat::Markdown);
  QCOMPARE(kvchat::app::export_format_from_string(QStringLiteral("Markdown")), ExportFormat::Markdown);
  QCOMPARE(kvchat::app::export_format_from_string(QStringLiteral("json")), ExportFormat::Json);
  QCOMPARE(kvchat::app::export_format_from_string(QStringLiteral("txt")), ExportFormat::Text);
  QCOMPARE(kvchat::app::export_format_from_string(QStringLiteral("text")), ExportFormat::Text);
  try {
    kvchat::app::export_format_from_string(QStringLiteral("pdf"));
    QFAIL("pdf was accepted");
  } catch (const std::invalid_argument& error) {
    QVERIFY2(QString::fromUtf8(error.what()).contains(QStringLiteral("'pdf'")), error.what());
  }
}

void ExporterTest::markdown_has_every_message_in_order() {
  const Fixture f = make_fixture();
  const QString md = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Markdown);
  QVERIFY(md.startsWith(QStringLiteral("# The lost kitten\n")));
  verify_in_order(md, {
                          QStringLiteral("Created: 2024-03-01T09:30:00.125Z"),
                          QStringLiteral("> You are a storyteller."),
                          QStringLiteral("## User\n\nWhere is the kitten?\n"),
                          QStringLiteral("## Assistant\n\nThe kitten hid under the bed.\n"),
                          QStringLiteral("stories260K · ") + kvchat::app::stats_summary(f.messages[1].stats),
                          QStringLiteral("## Marker\n\n> Older turns were dropped to fit the context.\n"),
                          QStringLiteral("## User\n\nAnd then?  \nTell me more ✨\n"),
                          QStringLiteral("## Assistant\n\nShe found a ball of yarn\n"),
                          QStringLiteral("*(incomplete)*"),
                          QStringLiteral("stop: stopped"),
                      });
  // The stats line is built from the numbers of that reply.
  const QString summary = kvchat::app::stats_summary(f.messages[1].stats);
  QVERIFY2(summary.contains(QStringLiteral("48 tokens")), qPrintable(summary));
  QVERIFY2(summary.contains(QStringLiteral("812.5 tok/s")), qPrintable(summary));
  QVERIFY2(summary.contains(QStringLiteral("cache on 69 tokens, 69.0 KiB")), qPrintable(summary));
  QVERIFY2(summary.contains(QStringLiteral("stop: eos")), qPrintable(summary));
  QVERIFY(kvchat::app::stats_summary(f.messages[4].stats).contains(QStringLiteral("cache off")));
  QCOMPARE(md.count(QStringLiteral("\n## ")), 5);
}

void ExporterTest::text_has_role_blocks_in_order() {
  const Fixture f = make_fixture();
  const QString text = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Text);
  QVERIFY(text.startsWith(QStringLiteral("The lost kitten\n")));
  verify_in_order(text, {
                            QStringLiteral("System prompt:\nYou are a storyteller.\n"),
                            QStringLiteral("\nUser:\nWhere is the kitten?\n"),
                            QStringLiteral("\nAssistant:\nThe kitten hid under the bed.\n[stories260K · 48 tokens"),
                            QStringLiteral("\nMarker:\nOlder turns were dropped to fit the context.\n"),
                            QStringLiteral("\nUser:\nAnd then?\nTell me more ✨\n"),
                            QStringLiteral("\nAssistant:\nShe found a ball of yarn\n(incomplete)\n"),
                        });
  QCOMPARE(text.count(QStringLiteral("\nUser:\n")), 2);
  QCOMPARE(text.count(QStringLiteral("\nAssistant:\n")), 2);
  // Plain text means plain: no Markdown headings.
  QVERIFY(!text.contains(QStringLiteral("## ")));
}

void ExporterTest::json_parses_back_with_stats() {
  const Fixture f = make_fixture();
  const QString json = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Json);
  QJsonParseError error{};
  const QJsonDocument document = QJsonDocument::fromJson(json.toUtf8(), &error);
  QVERIFY2(error.error == QJsonParseError::NoError, qPrintable(error.errorString()));
  const QJsonObject root = document.object();
  QCOMPARE(root.value(QStringLiteral("id")).toInteger(), 7);
  QCOMPARE(root.value(QStringLiteral("title")).toString(), QStringLiteral("The lost kitten"));
  QCOMPARE(root.value(QStringLiteral("system_prompt")).toString(), QStringLiteral("You are a storyteller."));
  QCOMPARE(QDateTime::fromString(root.value(QStringLiteral("created_at")).toString(), Qt::ISODateWithMs),
           f.conversation.created_at);
  QCOMPARE(QDateTime::fromString(root.value(QStringLiteral("updated_at")).toString(), Qt::ISODateWithMs),
           f.conversation.updated_at);
  const QJsonArray messages = root.value(QStringLiteral("messages")).toArray();
  QCOMPARE(messages.size(), f.messages.size());
  for (int i = 0; i < messages.size(); ++i) {
    const QJsonObject item = messages[i].toObject();
    QCOMPARE(item.value(QStringLiteral("id")).toInteger(), f.messages[i].id);
    QCOMPARE(item.value(QStringLiteral("role")).toString(), kvchat::app::role_name(f.messages[i].role));
    QCOMPARE(item.value(QStringLiteral("text")).toString(), f.messages[i].text);
    QCOMPARE(item.value(QStringLiteral("model")).toString(), f.messages[i].model);
    QCOMPARE(item.value(QStringLiteral("settings")).toObject(), f.messages[i].settings);
    QCOMPARE(item.value(QStringLiteral("stats")).toObject(), f.messages[i].stats);
    QCOMPARE(item.value(QStringLiteral("complete")).toBool(), f.messages[i].complete);
    QCOMPARE(QDateTime::fromString(item.value(QStringLiteral("created_at")).toString(), Qt::ISODateWithMs),
             f.messages[i].created_at);
  }
  // Each reply's stats come back as the same numbers.
  const kvchat::GenerationStats first =
      kvchat::app::stats_from_json(messages[1].toObject()[QStringLiteral("stats")].toObject());
  QCOMPARE(first.generated_tokens, f.first_stats.generated_tokens);
  QCOMPARE(first.cache_bytes, f.first_stats.cache_bytes);
  QCOMPARE(first.decode_tokens_per_second, f.first_stats.decode_tokens_per_second);
  const kvchat::GenerationStats second =
      kvchat::app::stats_from_json(messages[4].toObject()[QStringLiteral("stats")].toObject());
  QCOMPARE(second.reused_tokens, 69);
  QCOMPARE(second.cache_mode, kvchat::KvCacheMode::Off);
  QCOMPARE(second.stop_reason, kvchat::StopReason::Stopped);
  QCOMPARE(messages[1].toObject()[QStringLiteral("settings")].toObject()[QStringLiteral("seed")].toString(),
           QStringLiteral("77"));
}

void ExporterTest::write_text_file_writes_utf8_atomically() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("chat.md"));
  kvchat::app::write_text_file(path, QStringLiteral("first version\n"));
  const QString contents = QStringLiteral("Drache über den Hügeln — 竜 ✨\n");
  kvchat::app::write_text_file(path, contents);
  QFile file(path);
  QVERIFY(file.open(QIODevice::ReadOnly));
  QCOMPARE(file.readAll(), contents.toUtf8());
  // No temporary left beside the target.
  QCOMPARE(QDir(dir.path()).entryList(QDir::Files | QDir::Hidden), QStringList{QStringLiteral("chat.md")});
}

void ExporterTest::write_text_file_reports_the_path() {
  QTemporaryDir dir;
  // A regular file where a folder should be: unwritable for every user, root included.
  const QString blocker = dir.filePath(QStringLiteral("not-a-folder"));
  kvchat::app::write_text_file(blocker, QStringLiteral("x"));
  const QString path = blocker + QStringLiteral("/export.md");
  try {
    kvchat::app::write_text_file(path, QStringLiteral("never written"));
    QFAIL("writing below a regular file succeeded");
  } catch (const std::runtime_error& error) {
    QVERIFY2(QString::fromUtf8(error.what()).contains(path), error.what());
  }
  QVERIFY(!QFile::exists(path));
  QCOMPARE(QDir(dir.path()).entryList(QDir::Files | QDir::Hidden), QStringList{QStringLiteral("not-a-folder")});

  // An existing folder as the target is refused, and the folder is left alone.
  const QString folder = dir.filePath(QStringLiteral("a-folder"));
  QVERIFY(QDir().mkpath(folder));
  try {
    kvchat::app::write_text_file(folder, QStringLiteral("never written"));
    QFAIL("writing over a folder succeeded");
  } catch (const std::runtime_error& error) {
    QVERIFY2(QString::fromUtf8(error.what()).contains(folder), error.what());
  }
  QVERIFY(QFileInfo(folder).isDir());
}

void ExporterTest::every_format_places_the_cut_where_the_context_began() {
  Fixture f = make_fixture();
  f.messages.clear();
  const QStringList texts{"first question", "first answer",   "second question",
                          "second answer",  "third question", "third answer"};
  for (int i = 0; i < texts.size(); ++i)
    f.messages.append(
        message(201 + i, i % 2 == 0 ? QStringLiteral("user") : QStringLiteral("assistant"), texts[i], 1000 * i));
  // Written after the turn that needed it; the model's context began at message 203.
  MessageRecord marker = kvchat::app::context_cut_marker(7, 203, 2, 96);
  marker.id = 207;
  f.messages.append(marker);
  const QString md = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Markdown);
  verify_in_order(md, {"first answer", "## Marker\n\n> The 2 oldest messages no longer fit",
                       "## User\n\nsecond question", "third answer"});
  const QString text = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Text);
  verify_in_order(text,
                  {"first answer", "\nMarker:\nThe 2 oldest messages", "\nUser:\nsecond question", "third answer"});
  QVERIFY(!text.endsWith(marker.text + "\n"));
  const QJsonArray items =
      QJsonDocument::fromJson(kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Json).toUtf8())
          .object()
          .value("messages")
          .toArray();
  QList<qint64> ids;
  for (const auto& item : items) ids << item.toObject().value("id").toInteger();
  QCOMPARE(ids, (QList<qint64>{201, 202, 207, 203, 204, 205, 206}));
  // One dropped message is singular.
  QVERIFY(kvchat::app::context_cut_marker(7, 203, 1, 96)
              .text.startsWith("The oldest message no longer fits the context window"));
}

void ExporterTest::a_failed_turn_is_exported_with_its_error() {
  Fixture f = make_fixture();
  f.messages.clear();
  f.messages.append(message(301, QStringLiteral("user"), QStringLiteral("a very long message"), 1000));
  MessageRecord failed = message(302, QStringLiteral("assistant"), QString(), 2000);
  failed.model = QStringLiteral("stories260K");
  failed.stats = QJsonObject{{kvchat::app::kReplyErrorKey, "the last message alone is 900 tokens long"}};
  f.messages.append(failed);
  const QString expected = QStringLiteral("Failed: the last message alone is 900 tokens long");
  for (ExportFormat format : {ExportFormat::Markdown, ExportFormat::Text}) {
    const QString out = kvchat::app::export_conversation(f.conversation, f.messages, format);
    QVERIFY2(out.contains(expected), qPrintable(out));
    QVERIFY2(!out.contains("stories260K · 0 tokens"), qPrintable(out));
    QVERIFY2(!out.contains("stop: max_tokens"), qPrintable(out));
  }
  const QJsonObject item =
      QJsonDocument::fromJson(kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Json).toUtf8())
          .object()
          .value("messages")
          .toArray()[1]
          .toObject();
  QCOMPARE(item.value("error").toString(), QStringLiteral("the last message alone is 900 tokens long"));
  // And the model never sees that turn again.
  f.messages.append(message(303, QStringLiteral("user"), QStringLiteral("short"), 3000));
  const auto context = kvchat::app::messages_in_context(f.messages);
  QCOMPARE(context.size(), 1);
  QCOMPARE(context[0].id, 303);
}

namespace {

// A turn answered three times: reply 9 first, then 10 (Regenerate), then 11 (Regenerate); the chat shows 10.
QList<MessageRecord> regenerated_turn() {
  QList<MessageRecord> messages;
  messages.append(message(8, QStringLiteral("user"), QStringLiteral("Tell me a story"), 1000));
  const QStringList texts{"Once there was a fox.", "Once there was a bear.\nIt slept.", "Once there was an owl."};
  for (int i = 0; i < texts.size(); ++i) {
    MessageRecord reply = message(9 + i, QStringLiteral("assistant"), texts[i], 2000 + i);
    reply.model = QStringLiteral("stories260K");
    kvchat::GenerationStats stats;
    stats.generated_tokens = 6 + i;
    reply.stats = kvchat::app::stats_to_json(stats);
    if (9 + i != 10) reply.settings.insert(kvchat::app::kHiddenAlternativeKey, true);
    messages.append(reply);
  }
  messages.append(message(12, QStringLiteral("user"), QStringLiteral("And then?"), 5000));
  return messages;
}

}  // namespace

// Regenerate keeps the replies it replaces; an export used to leave them out without a word (ids 8, 10, 12).
void ExporterTest::regenerated_replies_are_exported_as_other_versions() {
  Fixture f = make_fixture();
  f.messages = regenerated_turn();
  const QJsonArray items =
      QJsonDocument::fromJson(kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Json).toUtf8())
          .object()
          .value("messages")
          .toArray();
  QList<qint64> ids;
  for (const auto& item : items) ids << item.toObject().value("id").toInteger();
  QCOMPARE(ids, (QList<qint64>{8, 10, 12}));
  const QJsonArray alternatives = items[1].toObject().value("alternatives").toArray();
  QCOMPARE(alternatives.size(), 2);
  QCOMPARE(alternatives[0].toObject().value("id").toInteger(), 9);
  QCOMPARE(alternatives[0].toObject().value("text").toString(), QStringLiteral("Once there was a fox."));
  QCOMPARE(alternatives[1].toObject().value("id").toInteger(), 11);
  QCOMPARE(alternatives[1].toObject().value("role").toString(), QStringLiteral("assistant"));
  QCOMPARE(alternatives[1].toObject().value("stats").toObject().value("generated_tokens").toInt(), 8);
  QVERIFY(alternatives[1].toObject().value("alternatives").isUndefined());
  QCOMPARE(items[0].toObject().value("alternatives").isUndefined(), true);  // a user message has none

  const QString md = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Markdown);
  const QString note =
      QStringLiteral("*Kept by Regenerate; the chat shows version 2, and only that one is given to the model.*");
  verify_in_order(
      md,
      {"## User\n\nTell me a story\n", "## Assistant\n\nOnce there was a bear.  \nIt slept.\n",
       "stories260K · 7 tokens", "\n### Other version 1 of 3 of this reply\n\n" + note + "\n\nOnce there was a fox.\n",
       "stories260K · 6 tokens", "\n### Other version 3 of 3 of this reply\n\n" + note + "\n\nOnce there was an owl.\n",
       "stories260K · 8 tokens", "## User\n\nAnd then?\n"});
  QCOMPARE(md.count(QStringLiteral("\n## ")), 3);  // the other versions are not messages of the chat

  const QString text = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Text);
  verify_in_order(text, {"\nAssistant:\nOnce there was a bear.\nIt slept.\n[stories260K · 7 tokens",
                         "\nOther version 1 of 3 of this reply (Kept by Regenerate; the chat shows version 2, and only "
                         "that one is given to the model):\nOnce there was a fox.\n[stories260K · 6 tokens",
                         "\nOther version 3 of 3 of this reply (",
                         "):\nOnce there was an owl.\n[stories260K · 8 tokens", "\nUser:\nAnd then?\n"});
  QCOMPARE(text.count(QStringLiteral("\nAssistant:\n")), 1);

  const kvchat::app::ExportContents contents = kvchat::app::export_contents(f.messages);
  QCOMPARE(contents.messages, 3);
  QCOMPARE(contents.other_versions, 2);
}

void ExporterTest::a_turn_showing_none_of_its_replies_still_exports_them() {
  Fixture f = make_fixture();
  f.messages = regenerated_turn();
  f.messages[2].settings.insert(kvchat::app::kHiddenAlternativeKey, true);  // the shown one too
  const QJsonArray items =
      QJsonDocument::fromJson(kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Json).toUtf8())
          .object()
          .value("messages")
          .toArray();
  QList<qint64> ids;
  for (const auto& item : items) ids << item.toObject().value("id").toInteger();
  QCOMPARE(ids, (QList<qint64>{8, 9, 10, 11, 12}));
  QCOMPARE(items[2].toObject().value("settings").toObject().value("hidden_alternative").toBool(), true);
  const QString md = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Markdown);
  verify_in_order(md, {"## User\n\nTell me a story\n",
                       "### Other version 1 of 3 of this reply\n\n*Kept by Regenerate; the chat shows no version of "
                       "this reply.*\n\nOnce there was a fox.",
                       "### Other version 2 of 3", "### Other version 3 of 3", "## User\n\nAnd then?"});
  const QString text = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Text);
  verify_in_order(text, {"\nUser:\nTell me a story\n",
                         "\nOther version 1 of 3 of this reply (Kept by Regenerate; "
                         "the chat shows no version of this reply):\nOnce there was a fox.\n",
                         "Other version 3 of 3"});
}

// The window shows a reply's single line breaks as breaks (and a user's words as typed); Markdown viewers join
// lines into one paragraph unless the break is a hard one.
void ExporterTest::markdown_keeps_the_line_breaks_the_window_shows() {
  Fixture f = make_fixture();
  f.conversation.system_prompt = QStringLiteral("Be brief.\nBe kind.");
  f.messages = {
      message(1, QStringLiteral("user"), QStringLiteral("line one\nline two"), 1000),
      message(2, QStringLiteral("assistant"),
              QStringLiteral("First paragraph,\nits second line.\n\nSecond paragraph.\n```\nint a;\nint b;\n```\n"
                             "After the code\nand on."),
              2000)};
  const QString md = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Markdown);
  verify_in_order(md, {"> Be brief.  \n> Be kind.\n", "## User\n\nline one  \nline two\n",
                       "## Assistant\n\nFirst paragraph,  \nits second line.\n\nSecond paragraph.\n```\nint a;\n"
                       "int b;\n```\nAfter the code  \nand on.\n"});
  // The text export is the text as written.
  const QString text = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Text);
  QVERIFY2(text.contains("\nAssistant:\nFirst paragraph,\nits second line.\n\nSecond paragraph.\n```\nint a;"),
           qPrintable(text));
  // The same rule as the window's, fence by fence: a block that never closes stays code to the end.
  QCOMPARE(kvchat::app::markdown_with_hard_line_breaks("a\nb\n~~~\nc\nd"), QStringLiteral("a  \nb\n~~~\nc\nd"));
  QCOMPARE(kvchat::app::markdown_with_hard_line_breaks("a\\\nb  \nc"), QStringLiteral("a\\\nb  \nc"));
}

// A reply that calls a tool (text before the call, arguments with backticks), the tool's result and the answer:
// Markdown shows each call's name, id and arguments in a code block whose fence outlasts the backticks, and the
// result as a block of its own; text says the same; JSON carries the calls and the answered call's id.
void ExporterTest::tool_calls_and_results_are_exported() {
  Fixture f = make_fixture();
  f.conversation.system_prompt.clear();
  f.messages.clear();
  f.messages.append(message(401, QStringLiteral("user"), QStringLiteral("Run it"), 1000));
  MessageRecord call = message(402, QStringLiteral("assistant"), QStringLiteral("Running."), 2000);
  call.tool_calls = QJsonArray{
      QJsonObject{{"id", "call_9"},
                  {"type", "function"},
                  {"function", QJsonObject{{"name", "shell"}, {"arguments", "{\"command\":\"echo ```\"}"}}}}};
  f.messages.append(call);
  MessageRecord result = message(403, QStringLiteral("tool"), QStringLiteral("```\n"), 3000);
  result.tool_call_id = QStringLiteral("call_9");
  result.tool_name = QStringLiteral("shell");
  f.messages.append(result);
  f.messages.append(message(404, QStringLiteral("assistant"), QStringLiteral("Done."), 4000));

  const QString markdown = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Markdown);
  const QString expected_markdown = QStringLiteral(
      "\n## User\n\nRun it\n"
      "\n## Assistant\n\nRunning.\n\n**Tool call** `shell` (call `call_9`):\n\n````json\n{\n    \"command\": "
      "\"echo ```\"\n}\n````\n"
      "\n## Tool result\n\n*shell, call call_9*\n\n````\n```\n\n````\n"
      "\n## Assistant\n\nDone.\n");
  QVERIFY2(markdown.endsWith(expected_markdown), qPrintable(markdown));

  const QString text = kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Text);
  QVERIFY2(text.endsWith(QStringLiteral("\nUser:\nRun it\n"
                                        "\nAssistant:\nRunning.\nTool call shell (call call_9):\n{\n    \"command\": "
                                        "\"echo ```\"\n}\n"
                                        "\nTool result:\n(shell, call call_9)\n```\n\n"
                                        "\nAssistant:\nDone.\n")),
           qPrintable(text));

  const QJsonArray items =
      QJsonDocument::fromJson(kvchat::app::export_conversation(f.conversation, f.messages, ExportFormat::Json).toUtf8())
          .object()
          .value("messages")
          .toArray();
  QCOMPARE(items.size(), 4);
  QCOMPARE(items[1].toObject().value("tool_calls").toArray(), call.tool_calls);
  QCOMPARE(items[2].toObject().value("role").toString(), QStringLiteral("tool"));
  QCOMPARE(items[2].toObject().value("tool_call_id").toString(), QStringLiteral("call_9"));
  QCOMPARE(items[2].toObject().value("name").toString(), QStringLiteral("shell"));
  QVERIFY(!items[3].toObject().contains("tool_calls"));
  // The answer after the result is its own turn: no alternatives of the call.
  QCOMPARE(items[3].toObject().value("alternatives").toArray().size(), 0);
  QCOMPARE(items[1].toObject().value("alternatives").toArray().size(), 0);
}

KVCHAT_TEST_GUILESS_MAIN(ExporterTest)

}  // namespace app_test_exporter

#include "test_exporter.moc"
