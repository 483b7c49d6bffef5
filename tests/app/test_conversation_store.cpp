// ConversationStore: everything written comes back after reopening, edits behave, bad files fail clearly.
#include <QFile>
#include <QJsonArray>
#include <QRandomGenerator>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include "app/settings.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "app/store/message_stats_json.h"
#include "common/damaged_database.h"
#include "common/raw_sqlite.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_conversation_store {

using kvchat::app::ConversationRecord;
using kvchat::app::ConversationStore;
using kvchat::app::MessageRecord;
using kvchat::app::StoreError;
using kvchat::app::StoreOpenMode;
using kvchat::test::raw_query;

namespace {

MessageRecord make_message(qint64 conversation_id, const QString& role, const QString& text, bool complete = true) {
  MessageRecord message;
  message.conversation_id = conversation_id;
  message.role = kvchat::app::parse_message_role(role).value();
  message.text = text;
  message.complete = complete;
  return message;
}

QList<qint64> ids_of(const QList<ConversationRecord>& conversations) {
  QList<qint64> ids;
  for (const auto& conversation : conversations) ids.append(conversation.id);
  return ids;
}

QList<qint64> ids_of(const QList<MessageRecord>& messages) {
  QList<qint64> ids;
  for (const auto& message : messages) ids.append(message.id);
  return ids;
}

template <typename F>
QString store_error_of(F&& action) {
  try {
    action();
  } catch (const StoreError& error) {
    return QString::fromStdString(error.what());
  }
  return QString();
}

}  // namespace

class ConversationStoreTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void round_trip_after_reopen();
  void most_recently_updated_first();
  void edits_rename_prompt_delete();
  void delete_messages_from_truncates_a_conversation();
  void unknown_ids_are_errors();
  void journal_is_wal_and_schema_versioned();
  void two_connections_on_one_file();
  void garbage_file_is_not_a_database();
  void unwritable_folder_names_the_path();
  void existing_only_does_not_create();
  void newer_schema_is_refused();
  void reply_token_ids_are_kept_with_their_text();
  void version_two_file_gains_the_token_columns();
  void pinned_chats_are_listed_first_and_kept();
  void version_three_file_gains_the_pinned_column();
  void a_copied_chat_holds_every_field_of_every_message();
  void deleting_chosen_messages_is_all_or_nothing();
  void search_finds_words_prefixes_and_any_script();
  void search_treats_query_syntax_as_text();
  void version_four_file_gains_a_filled_search_index();
  void version_five_file_gains_the_generation_settings_column();
  void refused_newer_schema_is_left_untouched();
  void damaged_file_is_refused_for_writing();
  void damaged_file_is_read_with_what_is_missing();
  void edits_fork_branches_that_survive_a_reopen();
  void deleting_an_original_keeps_its_edits();
  void version_five_file_gains_the_branch_columns();
  void tool_calls_and_results_are_kept();
  void version_seven_file_gains_the_tool_role();
};

void ConversationStoreTest::round_trip_after_reopen() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  // Parent folders that do not exist yet must be created.
  const QString path = dir.filePath(QStringLiteral("nested/folder/chats.sqlite3"));

  kvchat::GenerationStats stats;
  stats.prompt_tokens = 57;
  stats.reused_tokens = 40;
  stats.prefilled_tokens = 17;
  stats.generated_tokens = 33;
  stats.prefill_ms = 4.25;
  stats.ttft_ms = 5.5;
  stats.decode_ms = 120.75;
  stats.prefill_tokens_per_second = 4000.0;
  stats.decode_tokens_per_second = 264.0;
  stats.cache_tokens = 90;
  stats.cache_bytes = 92160;
  stats.cache_capacity_tokens = 128;
  stats.cache_mode = kvchat::KvCacheMode::Contiguous;
  stats.stop_reason = kvchat::StopReason::Eos;
  const QJsonObject stats_json = kvchat::app::stats_to_json(stats);
  kvchat::app::ChatSettings settings;
  settings.temperature = 0.3;
  settings.seed = 1234;
  const QJsonObject settings_json = settings.to_json();

  qint64 first_id = 0, second_id = 0;
  QList<MessageRecord> written;
  {
    ConversationStore store(path);
    QCOMPARE(store.path(), QFileInfo(path).absoluteFilePath());
    first_id = store.create_conversation(QStringLiteral("Dragons"), QStringLiteral("You tell short stories."));
    second_id = store.create_conversation(QStringLiteral("Empty one"));
    QVERIFY(first_id > 0);
    QVERIFY(second_id != first_id);

    MessageRecord user = make_message(first_id, QStringLiteral("user"), QStringLiteral("Once upon a time — ünïcode ✓"));
    MessageRecord reply = make_message(first_id, QStringLiteral("assistant"), QStringLiteral("there was a dragon."));
    reply.model = QStringLiteral("stories260K");
    reply.settings = settings_json;
    reply.stats = stats_json;
    MessageRecord marker = make_message(first_id, QStringLiteral("marker"), QStringLiteral("2 older turns dropped"));
    MessageRecord partial = make_message(first_id, QStringLiteral("assistant"), QString(), false);
    partial.model = QStringLiteral("stories260K");
    for (MessageRecord* message : {&user, &reply, &marker, &partial}) {
      message->id = store.add_message(*message);
      QVERIFY(message->id > 0);
      written.append(*message);
    }
    store.update_message_text(partial.id, QStringLiteral("The dra"));
    store.update_message_text(partial.id, QStringLiteral("The dragon fle"));
    written[3].text = QStringLiteral("The dragon fle");
  }

  ConversationStore reopened(path);
  const auto first = reopened.conversation(first_id);
  QVERIFY(first.has_value());
  QCOMPARE(first->title, QStringLiteral("Dragons"));
  QCOMPARE(first->system_prompt, QStringLiteral("You tell short stories."));
  QCOMPARE(first->message_count, 4);
  QVERIFY(first->created_at.isValid());
  QVERIFY(first->updated_at >= first->created_at);
  const auto second = reopened.conversation(second_id);
  QVERIFY(second.has_value());
  QCOMPARE(second->title, QStringLiteral("Empty one"));
  QCOMPARE(second->system_prompt, QString());
  QCOMPARE(second->message_count, 0);
  QVERIFY(reopened.messages(second_id).isEmpty());

  const QList<MessageRecord> messages = reopened.messages(first_id);
  QCOMPARE(messages.size(), written.size());
  for (int i = 0; i < messages.size(); ++i) {
    QCOMPARE(messages[i].id, written[i].id);
    QCOMPARE(messages[i].conversation_id, first_id);
    QCOMPARE(messages[i].role, written[i].role);
    QCOMPARE(messages[i].text, written[i].text);
    QCOMPARE(messages[i].model, written[i].model);
    QCOMPARE(messages[i].settings, written[i].settings);
    QCOMPARE(messages[i].stats, written[i].stats);
    QCOMPARE(messages[i].complete, written[i].complete);
    QVERIFY(messages[i].created_at.isValid());
  }
  QCOMPARE(messages[3].complete, false);
  // The stats survive as numbers, not just as equal-looking JSON.
  const kvchat::GenerationStats back = kvchat::app::stats_from_json(messages[1].stats);
  QCOMPARE(back.generated_tokens, 33);
  QCOMPARE(back.cache_bytes, qint64(92160));
  QCOMPARE(back.stop_reason, kvchat::StopReason::Eos);

  // finish_message completes the streamed reply and attaches its stats.
  reopened.finish_message(written[3].id, QStringLiteral("The dragon flew home."), stats_json);
  const auto finished = reopened.message(written[3].id);
  QVERIFY(finished.has_value());
  QCOMPARE(finished->text, QStringLiteral("The dragon flew home."));
  QCOMPARE(finished->complete, true);
  QCOMPARE(finished->stats, stats_json);

  // A caller-supplied creation time is kept to the millisecond.
  MessageRecord dated = make_message(second_id, QStringLiteral("user"), QStringLiteral("dated"));
  dated.created_at = QDateTime(QDate(2023, 4, 5), QTime(6, 7, 8, 9), Qt::UTC);
  const qint64 dated_id = reopened.add_message(dated);
  QCOMPARE(reopened.message(dated_id)->created_at, dated.created_at);
}

void ConversationStoreTest::most_recently_updated_first() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath(QStringLiteral("order.sqlite3")));
  const qint64 a = store.create_conversation(QStringLiteral("A"));
  const qint64 b = store.create_conversation(QStringLiteral("B"));
  const qint64 c = store.create_conversation(QStringLiteral("C"));
  QCOMPARE(ids_of(store.conversations()), (QList<qint64>{c, b, a}));
  store.add_message(make_message(a, QStringLiteral("user"), QStringLiteral("hi")));
  QCOMPARE(ids_of(store.conversations()), (QList<qint64>{a, c, b}));
  store.rename_conversation(b, QStringLiteral("B2"));
  QCOMPARE(ids_of(store.conversations()), (QList<qint64>{b, a, c}));
  store.set_system_prompt(c, QStringLiteral("terse"));
  QCOMPARE(ids_of(store.conversations()), (QList<qint64>{c, b, a}));
  const qint64 reply = store.add_message(make_message(b, QStringLiteral("assistant"), QString(), false));
  QCOMPARE(ids_of(store.conversations()), (QList<qint64>{b, c, a}));
  store.finish_message(reply, QStringLiteral("done"), QJsonObject());
  store.add_message(make_message(a, QStringLiteral("user"), QStringLiteral("again")));
  store.finish_message(reply, QStringLiteral("done again"), QJsonObject());
  QCOMPARE(ids_of(store.conversations()), (QList<qint64>{b, a, c}));
  const auto listed = store.conversations();
  QCOMPARE(listed[0].title, QStringLiteral("B2"));
  QCOMPARE(listed[0].message_count, 1);
  QCOMPARE(listed[1].message_count, 2);
  QCOMPARE(listed[2].system_prompt, QStringLiteral("terse"));
}

void ConversationStoreTest::edits_rename_prompt_delete() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("edits.sqlite3"));
  qint64 keep = 0, drop = 0;
  {
    ConversationStore store(path);
    keep = store.create_conversation(QStringLiteral("Keep"), QStringLiteral("old prompt"));
    drop = store.create_conversation(QStringLiteral("Drop"));
    store.add_message(make_message(keep, QStringLiteral("user"), QStringLiteral("kept message")));
    store.add_message(make_message(drop, QStringLiteral("user"), QStringLiteral("doomed 1")));
    store.add_message(make_message(drop, QStringLiteral("assistant"), QStringLiteral("doomed 2")));
    store.rename_conversation(keep, QStringLiteral("Kept & renamed"));
    store.set_system_prompt(keep, QStringLiteral("new prompt"));
    store.delete_conversation(drop);
  }
  ConversationStore store(path);
  QCOMPARE(ids_of(store.conversations()), (QList<qint64>{keep}));
  QCOMPARE(store.conversation(keep)->title, QStringLiteral("Kept & renamed"));
  QCOMPARE(store.conversation(keep)->system_prompt, QStringLiteral("new prompt"));
  QVERIFY(!store.conversation(drop).has_value());
  QVERIFY(store.messages(drop).isEmpty());
  QCOMPARE(store.messages(keep).size(), 1);
  QCOMPARE(store.messages(keep)[0].text, QStringLiteral("kept message"));
  // The deleted conversation's messages are gone from the file, not merely hidden.
  QCOMPARE(raw_query(path, QStringLiteral("SELECT count(*) FROM messages")), QStringLiteral("1"));
  // Clearing the system prompt stores an empty one.
  store.set_system_prompt(keep, QString());
  QCOMPARE(store.conversation(keep)->system_prompt, QString());
}

void ConversationStoreTest::delete_messages_from_truncates_a_conversation() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath(QStringLiteral("truncate.sqlite3")));
  const qint64 a = store.create_conversation(QStringLiteral("A"));
  const qint64 b = store.create_conversation(QStringLiteral("B"));
  QList<qint64> a_ids;
  for (int i = 0; i < 5; ++i) {
    a_ids.append(store.add_message(
        make_message(a, i % 2 ? QStringLiteral("assistant") : QStringLiteral("user"), QStringLiteral("a%1").arg(i))));
    // Interleaved writes to another conversation must be untouched by A's truncation.
    store.add_message(make_message(b, QStringLiteral("user"), QStringLiteral("b%1").arg(i)));
  }
  store.delete_messages_from(a, a_ids[2]);
  QCOMPARE(ids_of(store.messages(a)), (QList<qint64>{a_ids[0], a_ids[1]}));
  QCOMPARE(store.messages(a)[1].text, QStringLiteral("a1"));
  QCOMPARE(store.messages(b).size(), 5);
  QCOMPARE(store.messages(b)[4].text, QStringLiteral("b4"));
  // New messages come after the survivors, with fresh ids (never a deleted one).
  const qint64 next = store.add_message(make_message(a, QStringLiteral("user"), QStringLiteral("a-new")));
  QVERIFY(next > a_ids[4]);
  QCOMPARE(ids_of(store.messages(a)), (QList<qint64>{a_ids[0], a_ids[1], next}));
  store.delete_messages_from(a, a_ids[0]);
  QVERIFY(store.messages(a).isEmpty());
}

void ConversationStoreTest::unknown_ids_are_errors() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath(QStringLiteral("unknown.sqlite3")));
  const qint64 a = store.create_conversation(QStringLiteral("A"));
  const qint64 b = store.create_conversation(QStringLiteral("B"));
  const qint64 message = store.add_message(make_message(a, QStringLiteral("user"), QStringLiteral("hi")));
  const qint64 missing = 987654;

  QVERIFY(store_error_of([&] {
            store.rename_conversation(missing, QStringLiteral("x"));
          }).contains(QStringLiteral("no conversation 987654")));
  QVERIFY(store_error_of([&] {
            store.set_system_prompt(missing, QStringLiteral("x"));
          }).contains(QStringLiteral("no conversation 987654")));
  QVERIFY(
      store_error_of([&] { store.delete_conversation(missing); }).contains(QStringLiteral("no conversation 987654")));
  QVERIFY(store_error_of([&] {
            store.update_message_text(missing, QStringLiteral("x"));
          }).contains(QStringLiteral("no message 987654")));
  QVERIFY(store_error_of([&] {
            store.finish_message(missing, QStringLiteral("x"), {});
          }).contains(QStringLiteral("no message 987654")));
  QVERIFY(store_error_of([&] {
            store.add_message(make_message(missing, QStringLiteral("user"), QStringLiteral("x")));
          }).contains(QStringLiteral("no such conversation")));
  // A role is one of four (the type says so); only those four names read back as one.
  for (kvchat::app::MessageRole role : {kvchat::app::MessageRole::System, kvchat::app::MessageRole::User,
                                        kvchat::app::MessageRole::Assistant, kvchat::app::MessageRole::Marker})
    QCOMPARE(kvchat::app::parse_message_role(kvchat::app::role_name(role)), std::optional(role));
  QVERIFY(!kvchat::app::parse_message_role(QStringLiteral("robot")));
  QVERIFY(!kvchat::app::parse_message_role(QStringLiteral("User")));
  // A message of conversation A is not a truncation point of conversation B.
  QVERIFY(store_error_of([&] {
            store.delete_messages_from(b, message);
          }).contains(QStringLiteral("no message %1 in conversation %2").arg(message).arg(b)));
  // Nothing was changed by the failed calls.
  QCOMPARE(store.messages(a).size(), 1);
  QCOMPARE(store.conversations().size(), 2);
  QCOMPARE(store.conversation(a)->title, QStringLiteral("A"));
}

void ConversationStoreTest::journal_is_wal_and_schema_versioned() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("wal.sqlite3"));
  { ConversationStore store(path); }
  QCOMPARE(raw_query(path, QStringLiteral("PRAGMA journal_mode")), QStringLiteral("wal"));
  QCOMPARE(raw_query(path, QStringLiteral("SELECT version FROM schema_version")),
           QString::number(ConversationStore::kSchemaVersion));
  ConversationStore store(path);
  QCOMPARE(store.integrity_check(), QStringLiteral("ok"));
}

void ConversationStoreTest::two_connections_on_one_file() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("shared.sqlite3"));
  ConversationStore writer(path);
  ConversationStore reader(path);
  const qint64 id = writer.create_conversation(QStringLiteral("seen by both"));
  const qint64 message = writer.add_message(make_message(id, QStringLiteral("assistant"), QStringLiteral("x"), false));
  writer.update_message_text(message, QStringLiteral("streamed so far"));
  // Each write is committed when the call returns, so the other connection sees it at once.
  QCOMPARE(reader.messages(id).size(), 1);
  QCOMPARE(reader.messages(id)[0].text, QStringLiteral("streamed so far"));
  QCOMPARE(reader.messages(id)[0].complete, false);
}

void ConversationStoreTest::garbage_file_is_not_a_database() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("garbage.sqlite3"));
  QFile file(path);
  QVERIFY(file.open(QIODevice::WriteOnly));
  QByteArray garbage;
  for (int i = 0; i < 4096; ++i) garbage.append(static_cast<char>((i * 7919 + 13) & 0xff));
  file.write(garbage);
  file.close();

  const QString message = store_error_of([&] { ConversationStore store(path); });
  QVERIFY2(message.contains(path), qPrintable(message));
  QVERIFY2(message.contains(QStringLiteral("not a database")), qPrintable(message));
  // The garbage is left as it was: the store never overwrites what it cannot read.
  QVERIFY(file.open(QIODevice::ReadOnly));
  QCOMPARE(file.readAll(), garbage);
}

void ConversationStoreTest::unwritable_folder_names_the_path() {
  QTemporaryDir dir;
  // A regular file where a folder should be: no user (not even root) can create the database below it.
  const QString blocker = dir.filePath(QStringLiteral("blocker"));
  QFile file(blocker);
  QVERIFY(file.open(QIODevice::WriteOnly));
  file.write("x");
  file.close();
  const QString path = blocker + QStringLiteral("/sub/chats.sqlite3");
  const QString message = store_error_of([&] { ConversationStore store(path); });
  QVERIFY2(message.contains(path), qPrintable(message));

  // A folder given as the database path.
  const QString folder_message = store_error_of([&] { ConversationStore store(dir.path()); });
  QVERIFY2(folder_message.contains(dir.path()), qPrintable(folder_message));
  QVERIFY2(folder_message.contains(QStringLiteral("folder")), qPrintable(folder_message));
}

void ConversationStoreTest::existing_only_does_not_create() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("missing.sqlite3"));
  const QString message = store_error_of([&] { ConversationStore store(path, StoreOpenMode::ReadOnly); });
  QVERIFY2(message.contains(path), qPrintable(message));
  QVERIFY(!QFile::exists(path));

  // An SQLite file without kvchat's tables is refused and left alone.
  const QString foreign = dir.filePath(QStringLiteral("foreign.sqlite3"));
  raw_query(foreign, QStringLiteral("CREATE TABLE other (x INTEGER)"));
  QVERIFY(QFile::exists(foreign));
  const QString foreign_message = store_error_of([&] { ConversationStore store(foreign, StoreOpenMode::ReadOnly); });
  QVERIFY2(foreign_message.contains(QStringLiteral("not a kvchat database")), qPrintable(foreign_message));
  QCOMPARE(raw_query(foreign, QStringLiteral("SELECT count(*) FROM sqlite_master WHERE name = 'conversations'")),
           QStringLiteral("0"));

  { ConversationStore created(path); }
  ConversationStore existing(path, StoreOpenMode::ReadOnly);
  QVERIFY(existing.conversations().isEmpty());
}

void ConversationStoreTest::newer_schema_is_refused() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("future.sqlite3"));
  { ConversationStore store(path); }
  raw_query(path, QStringLiteral("UPDATE schema_version SET version = 99"));
  const QString message = store_error_of([&] { ConversationStore store(path); });
  QVERIFY2(message.contains(QStringLiteral("schema version 99")), qPrintable(message));
  QVERIFY2(message.contains(path), qPrintable(message));
}

// A reply's exact ids are kept with its text: finished with them, read back in order (ids above 2^24 and
// negative values round-trip as stored), cleared when the text changes, and a damaged column is dropped
// without losing the message.
void ConversationStoreTest::reply_token_ids_are_kept_with_their_text() {
  QTemporaryDir dir;
  const QString path = dir.filePath("tokens.sqlite3");
  ConversationStore store(path);
  const qint64 conversation = store.create_conversation("Tokens");
  MessageRecord reply;
  reply.conversation_id = conversation;
  reply.role = kvchat::app::MessageRole::Assistant;
  reply.complete = false;
  const qint64 id = store.add_message(reply);
  const std::vector<kvchat::TokenId> ids = {1, 128000, 16777217, 0, 42};
  const quint64 vocabulary = 0xF123456789ABCDEFull;
  store.finish_message(id, "Hello there", QJsonObject(), ids, vocabulary);
  QCOMPARE(store.message(id)->token_ids, ids);
  QCOMPARE(store.message(id)->token_vocabulary, vocabulary);
  QCOMPARE(ConversationStore(path, StoreOpenMode::ReadOnly).messages(conversation)[0].token_ids, ids);

  store.update_message_text(id, "Hello there, more");  // the ids no longer stand for the text
  QVERIFY(store.message(id)->token_ids.empty());
  QCOMPARE(store.message(id)->token_vocabulary, quint64(0));

  store.finish_message(id, "Hello there", QJsonObject(), ids, vocabulary);
  raw_query(path, QStringLiteral("UPDATE messages SET token_ids = x'010203' WHERE id = %1").arg(id));
  QCOMPARE(store.message(id)->text, QStringLiteral("Hello there"));
  QVERIFY(store.message(id)->token_ids.empty());

  // Added with ids (an import, a copied chat): kept too.
  reply.text = "Copied";
  reply.token_ids = {7, 8, 9};
  reply.token_vocabulary = 5;
  const qint64 copied = store.add_message(reply);
  QCOMPARE(store.message(copied)->token_ids, reply.token_ids);
  QCOMPARE(store.message(copied)->token_vocabulary, quint64(5));
}

// A version-2 file (no token columns): a reader reads it as it is, a writer migrates it, and its replies
// have no ids (their text is encoded).
void ConversationStoreTest::version_two_file_gains_the_token_columns() {
  QTemporaryDir dir;
  const QString path = dir.filePath("v2.sqlite3");
  qint64 id = 0;
  {
    ConversationStore store(path);
    MessageRecord reply;
    reply.conversation_id = store.create_conversation("Old");
    reply.role = kvchat::app::MessageRole::Assistant;
    reply.text = "old reply";
    id = store.add_message(reply);
  }
  raw_query(path, QStringLiteral("ALTER TABLE messages DROP COLUMN token_ids"));
  raw_query(path, QStringLiteral("ALTER TABLE messages DROP COLUMN token_vocabulary"));
  raw_query(path, QStringLiteral("ALTER TABLE conversations DROP COLUMN pinned"));
  raw_query(path, QStringLiteral("ALTER TABLE conversations DROP COLUMN generation_settings"));
  raw_query(path, QStringLiteral("ALTER TABLE messages DROP COLUMN branch"));
  raw_query(path, QStringLiteral("ALTER TABLE messages DROP COLUMN forked_from"));
  raw_query(path, QStringLiteral("DELETE FROM schema_version"));
  raw_query(path, QStringLiteral("INSERT INTO schema_version (version) VALUES (2)"));
  raw_query(path, QStringLiteral("ALTER TABLE conversations DROP COLUMN reply_format"));
  QCOMPARE(ConversationStore(path, StoreOpenMode::ReadOnly).message(id)->text, QStringLiteral("old reply"));
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")), QStringLiteral("2"));
  ConversationStore store(path);
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")),
           QString::number(ConversationStore::kSchemaVersion));
  QVERIFY(store.message(id)->token_ids.empty());
  store.finish_message(id, "old reply", QJsonObject(), {3, 4}, 9);
  QCOMPARE(store.message(id)->token_ids, (std::vector<kvchat::TokenId>{3, 4}));
}

// Pinned chats come before the others, each group most recently updated first; pinning is kept across opens
// and is not itself an update.
void ConversationStoreTest::pinned_chats_are_listed_first_and_kept() {
  QTemporaryDir dir;
  const QString path = dir.filePath("pinned.sqlite3");
  qint64 first = 0, second = 0, third = 0;
  {
    ConversationStore store(path);
    first = store.create_conversation("First");
    second = store.create_conversation("Second");
    third = store.create_conversation("Third");
    QVERIFY(!store.conversation(first)->pinned);
    store.set_pinned(first, true);
    const auto ids = [&] {
      QList<qint64> list;
      for (const ConversationRecord& record : store.conversations()) list << record.id;
      return list;
    };
    QCOMPARE(ids(), (QList<qint64>{first, third, second}));
    QVERIFY(store.conversation(first)->pinned);
    QVERIFY(!store.conversation(third)->pinned);
    store.set_pinned(second, true);
    QCOMPARE(ids(), (QList<qint64>{second, first, third}));
    store.rename_conversation(first, "First, renamed");  // an update: first among the pinned
    QCOMPARE(ids(), (QList<qint64>{first, second, third}));
    store.set_pinned(first, false);
    QCOMPARE(ids(), (QList<qint64>{second, first, third}));
    const QString message = store_error_of([&] { store.set_pinned(third + 100, true); });
    QCOMPARE(message, QStringLiteral("conversation store %1: no conversation %2").arg(store.path()).arg(third + 100));
  }
  ConversationStore reader(path, StoreOpenMode::ReadOnly);
  QVERIFY(reader.conversation(second)->pinned);
  QVERIFY(!reader.conversation(first)->pinned);
  QCOMPARE(reader.conversations().first().id, second);
}

// A version-3 file (no pinned column): a reader lists it unpinned without changing it, a writer migrates it
// and its chats keep their order and messages.
void ConversationStoreTest::version_three_file_gains_the_pinned_column() {
  QTemporaryDir dir;
  const QString path = dir.filePath("v3.sqlite3");
  qint64 older = 0, newer = 0;
  {
    ConversationStore store(path);
    older = store.create_conversation("Older");
    newer = store.create_conversation("Newer");
    MessageRecord message;
    message.conversation_id = older;
    message.role = kvchat::app::MessageRole::User;
    message.text = "kept";
    store.add_message(message);  // now the most recent
  }
  raw_query(path, QStringLiteral("ALTER TABLE conversations DROP COLUMN pinned"));
  raw_query(path, QStringLiteral("ALTER TABLE conversations DROP COLUMN generation_settings"));
  raw_query(path, QStringLiteral("ALTER TABLE messages DROP COLUMN branch"));
  raw_query(path, QStringLiteral("ALTER TABLE messages DROP COLUMN forked_from"));
  raw_query(path, QStringLiteral("DELETE FROM schema_version"));
  raw_query(path, QStringLiteral("INSERT INTO schema_version (version) VALUES (3)"));
  raw_query(path, QStringLiteral("ALTER TABLE conversations DROP COLUMN reply_format"));
  {
    ConversationStore reader(path, StoreOpenMode::ReadOnly);
    QCOMPARE(reader.conversations().size(), 2);
    QCOMPARE(reader.conversations()[0].id, older);
    QVERIFY(!reader.conversations()[0].pinned);
    QVERIFY(!reader.conversation(newer)->pinned);
  }
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")), QStringLiteral("3"));
  ConversationStore store(path);
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")),
           QString::number(ConversationStore::kSchemaVersion));
  QCOMPARE(store.conversations()[0].id, older);
  QCOMPARE(store.messages(older)[0].text, QStringLiteral("kept"));
  store.set_pinned(newer, true);
  QCOMPARE(store.conversations()[0].id, newer);
  QVERIFY(store.conversations()[0].pinned);
}

// A copy holds each message with every column as the original's (only its id and conversation differ), in the
// same order; a context-cut marker points at the copy of its message; the original is left as it was.
void ConversationStoreTest::a_copied_chat_holds_every_field_of_every_message() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath("copy.sqlite3"));
  const qint64 original = store.create_conversation(QStringLiteral("Trip to Zürich"), QStringLiteral("Be brief."));
  store.set_pinned(original, true);
  const auto add = [&](const QString& role, const QString& text) {
    MessageRecord message;
    message.conversation_id = original;
    message.role = kvchat::app::parse_message_role(role).value();
    message.text = text;
    return store.add_message(message);
  };
  add(QStringLiteral("user"), QStringLiteral("First question"));
  const qint64 reply = add(QStringLiteral("assistant"), QString());
  store.finish_message(reply, QStringLiteral("First answer"), QJsonObject{{"generated_tokens", 3}, {"decode_ms", 1.5}},
                       {5, 128000, -7}, 0xABCDEF0123ull);
  store.set_message_origin(reply, QStringLiteral("http://127.0.0.1:8080"), QStringLiteral("stories260K"));
  store.set_message_settings(reply, QJsonObject{{"temperature", 0.0}, {"hidden_alternative", true}});
  const qint64 kept = add(QStringLiteral("user"), QStringLiteral("Second question, ünïcode"));
  MessageRecord marker = kvchat::app::context_cut_marker(original, kept, 2, 128);
  store.add_message(marker);
  MessageRecord streaming;
  streaming.conversation_id = original;
  streaming.role = kvchat::app::MessageRole::Assistant;
  streaming.text = QStringLiteral("cut sh");
  streaming.complete = false;
  streaming.created_at = QDateTime::fromMSecsSinceEpoch(1234567, Qt::UTC);
  store.add_message(streaming);
  const QList<MessageRecord> before = store.messages(original);

  const qint64 copy = store.duplicate_conversation(original);
  QVERIFY(copy != original);
  QCOMPARE(store.conversation(copy)->title, QStringLiteral("Trip to Zürich (copy)"));
  QCOMPARE(store.conversation(copy)->system_prompt, QStringLiteral("Be brief."));
  QVERIFY(!store.conversation(copy)->pinned);
  const QList<MessageRecord> copies = store.messages(copy);
  QCOMPARE(copies.size(), before.size());
  for (int i = 0; i < before.size(); ++i) {
    const MessageRecord& a = before[i];
    const MessageRecord& b = copies[i];
    QVERIFY(b.id != a.id);
    QCOMPARE(b.conversation_id, copy);
    QCOMPARE(b.role, a.role);
    QCOMPARE(b.text, a.text);
    QCOMPARE(b.created_at, a.created_at);
    QCOMPARE(b.model, a.model);
    QCOMPARE(b.backend, a.backend);
    QCOMPARE(b.stats, a.stats);
    QCOMPARE(b.complete, a.complete);
    QCOMPARE(b.token_ids, a.token_ids);
    QCOMPARE(b.token_vocabulary, a.token_vocabulary);
    if (a.role == kvchat::app::MessageRole::Marker)
      QCOMPARE(b.settings.value(kvchat::app::kMarkerContextStartKey).toInteger(), copies[2].id);
    else
      QCOMPARE(b.settings, a.settings);
  }
  QCOMPARE(copies[1].token_ids, (std::vector<kvchat::TokenId>{5, 128000, -7}));
  QCOMPARE(copies[1].backend, QStringLiteral("http://127.0.0.1:8080"));
  QVERIFY(!copies[4].complete);
  // The model sees the same messages in the copy.
  QCOMPARE(kvchat::app::messages_in_context(copies).size(), kvchat::app::messages_in_context(before).size());
  const QList<MessageRecord> after = store.messages(original);
  QCOMPARE(after.size(), before.size());
  for (int i = 0; i < before.size(); ++i) QCOMPARE(after[i].settings, before[i].settings);
  QCOMPARE(store_error_of([&] { store.duplicate_conversation(copy + 100); }),
           QStringLiteral("conversation store %1: no conversation %2").arg(store.path()).arg(copy + 100));
}

// delete_messages removes exactly the ids given; an id of another chat (or none) refuses the whole call.
void ConversationStoreTest::deleting_chosen_messages_is_all_or_nothing() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath("delete.sqlite3"));
  const qint64 chat = store.create_conversation(QStringLiteral("Chat"));
  const qint64 other = store.create_conversation(QStringLiteral("Other"));
  QList<qint64> ids;
  for (int i = 0; i < 4; ++i) {
    MessageRecord message;
    message.conversation_id = i == 3 ? other : chat;
    message.role = i % 2 ? kvchat::app::MessageRole::Assistant : kvchat::app::MessageRole::User;
    message.text = QString::number(i);
    ids << store.add_message(message);
  }
  const QString message = store_error_of([&] { store.delete_messages(chat, {ids[1], ids[3]}); });
  QCOMPARE(message, QStringLiteral("conversation store %1: no message %2 in conversation %3")
                        .arg(store.path())
                        .arg(ids[3])
                        .arg(chat));
  QCOMPARE(store.messages(chat).size(), 3);
  store.delete_messages(chat, {ids[0], ids[1]});
  QCOMPARE(store.messages(chat).size(), 1);
  QCOMPARE(store.messages(chat)[0].id, ids[2]);
  QCOMPARE(store.messages(other).size(), 1);
}

namespace {

QList<qint64> hit_ids(const ConversationStore& store, const QString& query) {
  QList<qint64> ids;
  for (const kvchat::app::SearchHit& hit : store.search(query)) ids << hit.conversation_id;
  return ids;
}

}  // namespace

// Words and their beginnings, case and accents aside, in any script; every word must be in one message; the
// index follows edits and deletes; each hit names its first matching message.
void ConversationStoreTest::search_finds_words_prefixes_and_any_script() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath("search.sqlite3"));
  QVERIFY(store.has_search_index());
  const auto chat_with = [&](const QString& title, const QStringList& texts) {
    const qint64 id = store.create_conversation(title);
    for (const QString& text : texts) {
      MessageRecord message;
      message.conversation_id = id;
      message.role = kvchat::app::MessageRole::User;
      message.text = text;
      store.add_message(message);
    }
    return id;
  };
  const qint64 trains = chat_with("Travel", {"Which trains leave Zürich early?", "The 6:02 to Geneva."});
  const qint64 cooking = chat_with("Kitchen", {"A recipe for crêpes", "Flour, eggs, milk and a train of thought"});
  const qint64 russian = chat_with("Москва", {"Поезд отправляется в семь", "日本語のテキストです"});
  QCOMPARE(hit_ids(store, "trains"), (QList<qint64>{trains}));
  QCOMPARE(hit_ids(store, "TRAIN"), (QList<qint64>{cooking, trains}));  // a prefix: "trains" and "train"
  QCOMPARE(hit_ids(store, "zurich"), (QList<qint64>{trains}));          // accents aside
  QCOMPARE(hit_ids(store, "Zürich"), (QList<qint64>{trains}));
  QCOMPARE(hit_ids(store, "crepe"), (QList<qint64>{cooking}));
  QCOMPARE(hit_ids(store, "поезд"), (QList<qint64>{russian}));
  QCOMPARE(hit_ids(store, "Поез"), (QList<qint64>{russian}));
  QCOMPARE(hit_ids(store, "日本語"), (QList<qint64>{russian}));
  QCOMPARE(hit_ids(store, "москва"), (QList<qint64>{russian}));  // the title
  QCOMPARE(hit_ids(store, "flour milk"), (QList<qint64>{cooking}));
  QCOMPARE(hit_ids(store, "flour geneva"), QList<qint64>{});  // not in one message
  QCOMPARE(hit_ids(store, "submarine"), QList<qint64>{});
  QCOMPARE(hit_ids(store, "   "), QList<qint64>{});
  const QList<kvchat::app::SearchHit> hits = store.search("geneva");
  QCOMPARE(hits.size(), 1);
  QCOMPARE(hits[0].first_message_id, store.messages(trains)[1].id);

  // Kept in step: an edited text, deleted messages, a deleted chat.
  const qint64 edited = store.messages(cooking)[1].id;
  store.update_message_text(edited, QStringLiteral("Flour, eggs and a submarine"));
  QCOMPARE(hit_ids(store, "submarine"), (QList<qint64>{cooking}));
  QCOMPARE(hit_ids(store, "milk"), QList<qint64>{});
  store.finish_message(edited, QStringLiteral("Butter"), QJsonObject());
  QCOMPARE(hit_ids(store, "submarine"), QList<qint64>{});
  QCOMPARE(hit_ids(store, "butter"), (QList<qint64>{cooking}));
  store.delete_messages_from(trains, store.messages(trains)[1].id);
  QCOMPARE(hit_ids(store, "geneva"), QList<qint64>{});
  store.delete_conversation(russian);
  QCOMPARE(hit_ids(store, "поезд"), QList<qint64>{});
  QCOMPARE(store.integrity_check(), QStringLiteral("ok"));
}

// Quotes, AND/OR/NOT, *, -, ^, colons and parentheses are text: no query error, and they match as typed.
void ConversationStoreTest::search_treats_query_syntax_as_text() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath("syntax.sqlite3"));
  const auto chat_with = [&](const QString& text) {
    const qint64 id = store.create_conversation(QStringLiteral("Chat"));
    MessageRecord message;
    message.conversation_id = id;
    message.role = kvchat::app::MessageRole::User;
    message.text = text;
    store.add_message(message);
    return id;
  };
  const qint64 logic = chat_with("cats AND dogs, \"quoted words\" and a-b testing");
  const qint64 math = chat_with("2 * 3 - 1 = 5 (text: yes)");
  const qint64 plain = chat_with("nothing special here");
  for (const QString& query : {QStringLiteral("\""), QStringLiteral("\"quoted"), QStringLiteral("AND"),
                               QStringLiteral("OR"), QStringLiteral("NOT"), QStringLiteral("*"), QStringLiteral("-"),
                               QStringLiteral("a-b"), QStringLiteral("(text:"), QStringLiteral("cats AND"),
                               QStringLiteral("NEAR(cats dogs)"), QStringLiteral("^cats"), QStringLiteral("text:")})
    store.search(query);                                    // none throws
  QCOMPARE(hit_ids(store, "AND"), (QList<qint64>{logic}));  // the word, not the operator
  QCOMPARE(hit_ids(store, "cats AND dogs"), (QList<qint64>{logic}));
  QCOMPARE(hit_ids(store, "NOT"), (QList<qint64>{plain}));  // "nothing" starts with "not"
  QCOMPARE(hit_ids(store, "\"quoted words\""), (QList<qint64>{logic}));
  QCOMPARE(hit_ids(store, "*"), (QList<qint64>{math}));         // punctuation alone: as typed
  QCOMPARE(hit_ids(store, "-"), (QList<qint64>{math, logic}));  // most recently updated first
  QCOMPARE(hit_ids(store, "a-b"), (QList<qint64>{logic}));
  QCOMPARE(hit_ids(store, "(text:"), (QList<qint64>{math}));
  QCOMPARE(hit_ids(store, "cats -dogs"), (QList<qint64>{logic}));  // "-dogs" is the word dogs, not its exclusion
  QCOMPARE(hit_ids(store, "OR"), QList<qint64>{});
}

// A version-4 file (no index): a reader searches it by its text, a writer builds the index from its messages.
void ConversationStoreTest::version_four_file_gains_a_filled_search_index() {
  QTemporaryDir dir;
  const QString path = dir.filePath("v4.sqlite3");
  qint64 chat = 0;
  {
    ConversationStore store(path);
    chat = store.create_conversation(QStringLiteral("Old"));
    MessageRecord message;
    message.conversation_id = chat;
    message.role = kvchat::app::MessageRole::User;
    message.text = QStringLiteral("Elephants remember");
    store.add_message(message);
  }
  for (const char* statement :
       {"DROP TRIGGER messages_fts_insert", "DROP TRIGGER messages_fts_delete", "DROP TRIGGER messages_fts_update",
        "DROP TABLE messages_fts", "ALTER TABLE messages DROP COLUMN branch",
        "ALTER TABLE messages DROP COLUMN forked_from", "ALTER TABLE conversations DROP COLUMN generation_settings",
        "DELETE FROM schema_version", "INSERT INTO schema_version (version) VALUES (4)",
        "ALTER TABLE conversations DROP COLUMN reply_format"})
    raw_query(path, QString::fromLatin1(statement));
  {
    ConversationStore reader(path, StoreOpenMode::ReadOnly);
    QVERIFY(!reader.has_search_index());
    QCOMPARE(hit_ids(reader, "elephants"), (QList<qint64>{chat}));
    QCOMPARE(hit_ids(reader, "zebras"), QList<qint64>{});
  }
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")), QStringLiteral("4"));
  ConversationStore store(path);
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")),
           QString::number(ConversationStore::kSchemaVersion));
  QVERIFY(store.has_search_index());
  QCOMPARE(hit_ids(store, "elephant"), (QList<qint64>{chat}));
}

// A version-5 file (no generation settings): a reader reads every chat as following the global settings
// without changing the file, a writer migrates it and keeps its chats; a chat's settings are then kept, copied
// with the chat, and cleared with {}.
void ConversationStoreTest::version_five_file_gains_the_generation_settings_column() {
  QTemporaryDir dir;
  const QString path = dir.filePath("v5.sqlite3");
  qint64 chat = 0;
  {
    ConversationStore store(path);
    chat = store.create_conversation(QStringLiteral("Old"), QStringLiteral("Be brief."));
    MessageRecord message;
    message.conversation_id = chat;
    message.role = kvchat::app::MessageRole::User;
    message.text = QStringLiteral("kept");
    store.add_message(message);
  }
  raw_query(path, QStringLiteral("ALTER TABLE conversations DROP COLUMN generation_settings"));
  raw_query(path, QStringLiteral("ALTER TABLE messages DROP COLUMN branch"));
  raw_query(path, QStringLiteral("ALTER TABLE messages DROP COLUMN forked_from"));
  raw_query(path, QStringLiteral("DELETE FROM schema_version"));
  raw_query(path, QStringLiteral("INSERT INTO schema_version (version) VALUES (5)"));
  raw_query(path, QStringLiteral("ALTER TABLE conversations DROP COLUMN reply_format"));
  {
    ConversationStore reader(path, StoreOpenMode::ReadOnly);
    QCOMPARE(reader.generation_settings(chat), QJsonObject());
    QCOMPARE(reader.conversation(chat)->generation_settings, QJsonObject());
    QCOMPARE(reader.messages(chat)[0].text, QStringLiteral("kept"));
  }
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")), QStringLiteral("5"));
  ConversationStore store(path);
  QCOMPARE(ConversationStore::kSchemaVersion, 8);
  QCOMPARE(raw_query(path, QStringLiteral("SELECT group_concat(version, ',') FROM schema_version")),
           QStringLiteral("5,6,7,8"));
  QCOMPARE(store.conversation(chat)->system_prompt, QStringLiteral("Be brief."));
  QCOMPARE(store.messages(chat)[0].text, QStringLiteral("kept"));
  QCOMPARE(store.generation_settings(chat), QJsonObject());
  const QJsonObject settings{{"preset", "Precise"}, {"temperature", 0.0}, {"stop", QJsonArray{"\n\n"}}};
  store.set_generation_settings(chat, settings);
  QCOMPARE(store.generation_settings(chat), settings);
  QCOMPARE(store.conversation(chat)->generation_settings, settings);
  const qint64 copy = store.duplicate_conversation(chat);
  QCOMPARE(store.generation_settings(copy), settings);
  store.set_generation_settings(chat, QJsonObject());
  QCOMPARE(store.generation_settings(chat), QJsonObject());
  QCOMPARE(raw_query(path, QStringLiteral("SELECT generation_settings FROM conversations WHERE id = %1").arg(chat)),
           QString());
  QCOMPARE(store_error_of([&] { store.set_generation_settings(copy + 100, settings); }),
           QStringLiteral("conversation store %1: no conversation %2").arg(store.path()).arg(copy + 100));
}

// A file refused for its schema is refused before anything is written to it: its journal mode included.
void ConversationStoreTest::refused_newer_schema_is_left_untouched() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("future-delete-mode.sqlite3"));
  { ConversationStore store(path); }
  QCOMPARE(raw_query(path, QStringLiteral("PRAGMA journal_mode=DELETE")), QStringLiteral("delete"));
  raw_query(path, QStringLiteral("UPDATE schema_version SET version = 99"));
  QFile file(path);
  QVERIFY(file.open(QIODevice::ReadOnly));
  const QByteArray before = file.readAll();
  file.close();
  for (const StoreOpenMode mode : {StoreOpenMode::CreateIfMissing, StoreOpenMode::ReadOnly}) {
    const QString message = store_error_of([&] { ConversationStore store(path, mode); });
    QCOMPARE(message, QStringLiteral("conversation store %1: schema version 99 is newer than this program's %2")
                          .arg(path)
                          .arg(ConversationStore::kSchemaVersion));
  }
  QVERIFY(file.open(QIODevice::ReadOnly));
  QCOMPARE(file.readAll(), before);
  for (const char* suffix : {"-wal", "-shm", "-journal"}) QVERIFY2(!QFile::exists(path + suffix), suffix);
  QCOMPARE(raw_query(path, QStringLiteral("PRAGMA journal_mode")), QStringLiteral("delete"));
}

// Damaged pages let SQLite return part of a conversation without an error: a writer refuses the file,
// naming it and the damage, and writes nothing.
void ConversationStoreTest::damaged_file_is_refused_for_writing() {
  QTemporaryDir dir;
  for (const auto damage : {kvchat::test::Damage::LostTableRow, kvchat::test::Damage::LostIndexEntry}) {
    const QString path = dir.filePath(QStringLiteral("damaged-%1.sqlite3").arg(static_cast<int>(damage)));
    QString why;
    QVERIFY2(kvchat::test::write_damaged_database(path, damage, &why), qPrintable(why));
    QFile file(path);
    QVERIFY(file.open(QIODevice::ReadOnly));
    const QByteArray before = file.readAll();
    file.close();
    const QString message = store_error_of([&] { ConversationStore store(path); });
    QVERIFY2(message.startsWith(QStringLiteral("conversation store %1: the file is damaged (").arg(path)),
             qPrintable(message));
    QVERIFY2(message.contains(QStringLiteral("); nothing was written to it. Keep a copy of it")), qPrintable(message));
    QVERIFY(file.open(QIODevice::ReadOnly));
    QCOMPARE(file.readAll(), before);
    QVERIFY(!QFile::exists(path + QStringLiteral("-wal")));
  }
}

// A reader opens a damaged file (what is intact can still be saved), says it is damaged, reads the messages
// from the table rather than from a damaged index, and names the ones it cannot read.
void ConversationStoreTest::damaged_file_is_read_with_what_is_missing() {
  QTemporaryDir dir;
  using kvchat::test::damaged_database_text;
  const QString lost_row = dir.filePath(QStringLiteral("lost-row.sqlite3"));
  QString why;
  QVERIFY2(kvchat::test::write_damaged_database(lost_row, kvchat::test::Damage::LostTableRow, &why), qPrintable(why));
  {
    ConversationStore store(lost_row, StoreOpenMode::ReadOnly);
    QVERIFY(!store.damage().isEmpty());
    QCOMPARE(store.missing_messages(1), QString());
    QCOMPARE(ids_of(store.messages(1)), (QList<qint64>{1, 2, 3, 4}));
    QCOMPARE(store.missing_messages(2), QStringLiteral("message 7 cannot be read (1 of the 4 the index lists)"));
    const QList<MessageRecord> read = store.messages(2);
    QCOMPARE(ids_of(read), (QList<qint64>{5, 6, 8}));
    QCOMPARE(read[2].text, damaged_database_text(8));
  }
  const QString lost_entry = dir.filePath(QStringLiteral("lost-entry.sqlite3"));
  QVERIFY2(kvchat::test::write_damaged_database(lost_entry, kvchat::test::Damage::LostIndexEntry, &why),
           qPrintable(why));
  ConversationStore store(lost_entry, StoreOpenMode::ReadOnly);
  QVERIFY(!store.damage().isEmpty());
  QCOMPARE(ids_of(store.messages(2)), (QList<qint64>{5, 6, 7, 8}));
  QCOMPARE(store.missing_messages(2), QStringLiteral("message 8 is missing from the index (its row was read)"));

  // A sound file: nothing to say.
  const QString sound = dir.filePath(QStringLiteral("sound.sqlite3"));
  { ConversationStore created(sound); }
  ConversationStore reader(sound, StoreOpenMode::ReadOnly);
  QCOMPARE(reader.damage(), QString());
  QCOMPARE(reader.missing_messages(1), QString());
}

KVCHAT_TEST_GUILESS_MAIN(ConversationStoreTest)

namespace {

QList<qint64> shown_ids(const ConversationStore& store, qint64 conversation_id) {
  return ids_of(kvchat::app::messages_on_shown_path(store.messages(conversation_id)));
}

}  // namespace

// Editing a message forks the chat: the edit and its reply are the shown path, the original and everything
// after it stay as a branch that comes back exactly, also after the file is reopened; an edit of an edit joins
// the same group, and a branch forked inside another keeps its choice while that one is hidden.
void ConversationStoreTest::edits_fork_branches_that_survive_a_reopen() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("branches.sqlite3"));
  qint64 chat = 0, u1 = 0, a1 = 0, u2 = 0, a2 = 0, edit = 0, edit_reply = 0;
  {
    ConversationStore store(path);
    chat = store.create_conversation(QStringLiteral("Branches"));
    const auto add = [&](const char* role, const char* text) {
      return store.add_message(make_message(chat, QString::fromLatin1(role), QString::fromLatin1(text)));
    };
    u1 = add("user", "First question");
    a1 = add("assistant", "First answer");
    u2 = add("user", "Second question");
    a2 = add("assistant", "Second answer");
    edit = store.fork_message(chat, u1, QStringLiteral("First question, reworded"));
    edit_reply = add("assistant", "Reworded answer");
    QCOMPARE(shown_ids(store, chat), (QList<qint64>{edit, edit_reply}));
    QCOMPARE(ids_of(store.messages(chat)), (QList<qint64>{u1, a1, u2, a2, edit, edit_reply}));
  }
  ConversationStore store(path);
  const QList<MessageRecord> all = store.messages(chat);
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{edit, edit_reply}));
  QCOMPARE(all[4].text, QStringLiteral("First question, reworded"));
  QCOMPARE(all[4].branch, edit);
  QCOMPARE(all[4].forked_from, u1);
  QCOMPARE(all[5].branch, edit);
  QCOMPARE(all[0].branch, 0);
  QVERIFY(all[0].settings.value(kvchat::app::kHiddenBranchKey).toBool());
  QCOMPARE(kvchat::app::branch_siblings(all, edit), (QList<qint64>{u1, edit}));
  QCOMPARE(kvchat::app::branch_siblings(all, u1), (QList<qint64>{u1, edit}));
  QCOMPARE(kvchat::app::branch_siblings(all, u2), QList<qint64>{});
  // What the model is given: only the shown path.
  const QList<MessageRecord> in_context = kvchat::app::messages_in_context(all);
  QCOMPARE(ids_of(in_context), (QList<qint64>{edit, edit_reply}));

  store.show_branch(chat, u1);
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{u1, a1, u2, a2}));
  const QList<MessageRecord> restored = kvchat::app::messages_on_shown_path(store.messages(chat));
  for (int i = 0; i < 4; ++i) QCOMPARE(restored[i].text, all[i].text);
  // A message written now joins the shown branch.
  const qint64 u3 = store.add_message(make_message(chat, QStringLiteral("user"), QStringLiteral("Third question")));
  QCOMPARE(store.message(u3)->branch, 0);
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{u1, a1, u2, a2, u3}));

  // A branch inside the original one: its choice is kept while the original is hidden.
  const qint64 u2_edit = store.fork_message(chat, u2, QStringLiteral("Second question, reworded"));
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{u1, a1, u2_edit}));
  store.show_branch(chat, edit);
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{edit, edit_reply}));
  store.show_branch(chat, u1);
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{u1, a1, u2_edit}));

  // An edit of an edit is one more member of the same group.
  store.show_branch(chat, edit);
  const qint64 edit2 = store.fork_message(chat, edit, QStringLiteral("First question, third wording"));
  QCOMPARE(kvchat::app::branch_siblings(store.messages(chat), edit2), (QList<qint64>{u1, edit, edit2}));
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{edit2}));

  QCOMPARE(store_error_of([&] { store.fork_message(chat, a1, QStringLiteral("x")); }),
           QStringLiteral("conversation store %1: cannot edit message %2 of conversation %3: no user message %2 in it")
               .arg(store.path())
               .arg(a1)
               .arg(chat));
  QCOMPARE(
      store_error_of([&] { store.show_branch(chat, u3); }),
      QStringLiteral("conversation store %1: cannot show branch %2 of conversation %3: message %2 starts no branch")
          .arg(store.path())
          .arg(u3)
          .arg(chat));

  // A copy holds the branches, mapped to its own messages.
  const qint64 copy = store.duplicate_conversation(chat);
  const QList<MessageRecord> copied = store.messages(copy);
  QCOMPARE(copied.size(), store.messages(chat).size());
  const QList<MessageRecord> copied_shown = kvchat::app::messages_on_shown_path(copied);
  QCOMPARE(copied_shown.size(), 1);
  QCOMPARE(copied_shown[0].text, QStringLiteral("First question, third wording"));
  QCOMPARE(kvchat::app::branch_siblings(copied, copied_shown[0].id).size(), 3);
  QCOMPARE(copied_shown[0].branch, copied_shown[0].id);
}

// Deleting a branch deletes it and what follows it; deleting the original of a group leaves its edits, the
// oldest in its place, and the newest of them shown when the deleted one was.
void ConversationStoreTest::deleting_an_original_keeps_its_edits() {
  QTemporaryDir dir;
  ConversationStore store(dir.filePath(QStringLiteral("delete-branches.sqlite3")));
  const qint64 chat = store.create_conversation(QStringLiteral("Branches"));
  const auto add = [&](const char* role, const char* text) {
    return store.add_message(make_message(chat, QString::fromLatin1(role), QString::fromLatin1(text)));
  };
  const qint64 u1 = add("user", "Hello");
  const qint64 a1 = add("assistant", "Hi");
  const qint64 edit = store.fork_message(chat, u1, QStringLiteral("Hello there"));
  const qint64 edit_reply = add("assistant", "Hi there");
  const qint64 edit_follow_up = add("user", "How are you?");
  const qint64 edit2 = store.fork_message(chat, u1, QStringLiteral("Good morning"));
  const qint64 edit2_reply = add("assistant", "Morning");
  store.show_branch(chat, u1);
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{u1, a1}));

  store.delete_branch(chat, u1);
  QCOMPARE(ids_of(store.messages(chat)), (QList<qint64>{edit, edit_reply, edit_follow_up, edit2, edit2_reply}));
  const QList<MessageRecord> after = store.messages(chat);
  QCOMPARE(after[0].forked_from, 0);
  QCOMPARE(after[0].branch, 0);
  QCOMPARE(after[2].branch, 0);
  QCOMPARE(after[3].forked_from, edit);
  QCOMPARE(kvchat::app::branch_siblings(after, edit2), (QList<qint64>{edit, edit2}));
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{edit2, edit2_reply}));

  store.delete_branch(chat, edit2);
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{edit, edit_reply, edit_follow_up}));
  QVERIFY(!store.message(edit)->settings.contains(kvchat::app::kHiddenBranchKey));
  QCOMPARE(kvchat::app::branch_siblings(store.messages(chat), edit), QList<qint64>{});
}

// A version-5 file (no branch columns): a reader reads every message on the one branch, a writer adds the
// columns and the chat can be forked.
void ConversationStoreTest::version_five_file_gains_the_branch_columns() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("v5.sqlite3"));
  qint64 chat = 0, question = 0, answer = 0;
  {
    ConversationStore store(path);
    chat = store.create_conversation(QStringLiteral("Old"));
    question = store.add_message(make_message(chat, QStringLiteral("user"), QStringLiteral("Kept question")));
    answer = store.add_message(make_message(chat, QStringLiteral("assistant"), QStringLiteral("Kept answer")));
  }
  for (const char* statement :
       {"ALTER TABLE messages DROP COLUMN forked_from", "ALTER TABLE messages DROP COLUMN branch",
        "ALTER TABLE conversations DROP COLUMN generation_settings", "DELETE FROM schema_version",
        "INSERT INTO schema_version (version) VALUES (5)", "ALTER TABLE conversations DROP COLUMN reply_format"})
    raw_query(path, QString::fromLatin1(statement));
  {
    ConversationStore reader(path, StoreOpenMode::ReadOnly);
    QCOMPARE(shown_ids(reader, chat), (QList<qint64>{question, answer}));
    QCOMPARE(reader.messages(chat)[1].text, QStringLiteral("Kept answer"));
    QCOMPARE(reader.messages(chat)[1].branch, 0);
  }
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")), QStringLiteral("5"));
  ConversationStore store(path);
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")),
           QString::number(ConversationStore::kSchemaVersion));
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{question, answer}));
  const qint64 edit = store.fork_message(chat, question, QStringLiteral("Asked again"));
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{edit}));
  store.show_branch(chat, question);
  QCOMPARE(shown_ids(store, chat), (QList<qint64>{question, answer}));
}

namespace {

// A two-step tool use: the question, a reply that calls a tool, the tool's result, the answer.
struct ToolUseChat {
  qint64 chat = 0, question = 0, call = 0, result = 0, answer = 0;
};

const QJsonArray kWeatherCalls{
    QJsonObject{{"id", "call_7"},
                {"type", "function"},
                {"function", QJsonObject{{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}};

ToolUseChat add_tool_use_chat(ConversationStore& store) {
  ToolUseChat ids;
  ids.chat = store.create_conversation(QStringLiteral("Weather"));
  ids.question = store.add_message(make_message(ids.chat, QStringLiteral("user"), QStringLiteral("Weather in Paris?")));
  MessageRecord call = make_message(ids.chat, QStringLiteral("assistant"), QString());
  call.tool_calls = kWeatherCalls;
  ids.call = store.add_message(call);
  MessageRecord result = make_message(ids.chat, QStringLiteral("tool"), QStringLiteral("{\"celsius\": 21}"));
  result.tool_call_id = QStringLiteral("call_7");
  result.tool_name = QStringLiteral("get_weather");
  ids.result = store.add_message(result);
  ids.answer = store.add_message(make_message(ids.chat, QStringLiteral("assistant"), QStringLiteral("It is 21 C.")));
  return ids;
}

void check_tool_use_chat(const ConversationStore& store, const ToolUseChat& ids) {
  const QList<MessageRecord> messages = store.messages(ids.chat);
  QCOMPARE(ids_of(messages), (QList<qint64>{ids.question, ids.call, ids.result, ids.answer}));
  QCOMPARE(messages[1].tool_calls, kWeatherCalls);
  QCOMPARE(messages[1].text, QString());
  QCOMPARE(messages[2].role, kvchat::app::MessageRole::Tool);
  QCOMPARE(messages[2].tool_call_id, QStringLiteral("call_7"));
  QCOMPARE(messages[2].tool_name, QStringLiteral("get_weather"));
  for (const int plain : {0, 3}) {
    QVERIFY(messages[plain].tool_calls.isEmpty());
    QVERIFY(messages[plain].tool_call_id.isEmpty());
  }
}

}  // namespace

// A reply's tool calls and a tool's result come back after a reopen, in a copied chat, and to the model: the
// reply that called the tool (no text) and the result are both in context, and the answer after the result is
// its own turn, not an alternative of the call.
void ConversationStoreTest::tool_calls_and_results_are_kept() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("tools.sqlite3"));
  ToolUseChat ids;
  {
    ConversationStore store(path);
    ids = add_tool_use_chat(store);
  }
  ConversationStore store(path);
  check_tool_use_chat(store, ids);
  QCOMPARE(
      raw_query(path, QStringLiteral("SELECT role || ' ' || tool_use FROM messages WHERE id = %1").arg(ids.result)),
      QStringLiteral("tool {\"name\":\"get_weather\",\"tool_call_id\":\"call_7\"}"));
  QCOMPARE(raw_query(path, QStringLiteral("SELECT tool_use FROM messages WHERE id = %1").arg(ids.answer)), QString());

  const ToolUseChat copy{store.duplicate_conversation(ids.chat), ids.answer + 1, ids.answer + 2, ids.answer + 3,
                         ids.answer + 4};
  check_tool_use_chat(store, copy);

  const QList<MessageRecord> messages = store.messages(ids.chat);
  QCOMPARE(kvchat::app::reply_alternatives(messages, ids.answer), (QList<qint64>{ids.answer}));
  QCOMPARE(kvchat::app::reply_alternatives(messages, ids.call), (QList<qint64>{ids.call}));
  const std::vector<kvchat::ChatMessage> chat =
      kvchat::app::chat_messages_for_engine(*store.conversation(ids.chat), messages);
  QCOMPARE(chat.size(), std::size_t{4});
  QCOMPARE(chat[1].role, std::string("assistant"));
  QCOMPARE(chat[1].content, std::string());
  QCOMPARE(chat[1].tool_calls, std::string(R"([{"function":{"arguments":"{\"city\": \"Paris\"}","name":"get_weather"},)"
                                           R"("id":"call_7","type":"function"}])"));
  QCOMPARE(chat[2].role, std::string("tool"));
  QCOMPARE(chat[2].content, std::string(R"({"celsius": 21})"));
  QCOMPARE(chat[2].tool_call_id, std::string("call_7"));
  QCOMPARE(chat[2].name, std::string("get_weather"));
  QCOMPARE(chat[3].content, std::string("It is 21 C."));

  // A damaged column loses the tool use, not the message.
  raw_query(path, QStringLiteral("UPDATE messages SET tool_use = '{\"tool_calls\": 5}' WHERE id = %1").arg(ids.call));
  QCOMPARE(store.message(ids.call)->tool_calls, QJsonArray());
  QCOMPARE(store.message(ids.call)->role, kvchat::app::MessageRole::Assistant);
}

// A version-7 file (roles without "tool", no tool_use column) as that version wrote it: a reader reads it as it
// is; a writer rebuilds the messages table, keeping every message, its id, the search index and the id counter
// (a deleted last message's id is not given out again), and then takes tool calls and results.
void ConversationStoreTest::version_seven_file_gains_the_tool_role() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("v7.sqlite3"));
  qint64 chat = 0, question = 0, answer = 0, deleted = 0;
  {
    ConversationStore store(path);
    chat = store.create_conversation(QStringLiteral("Old"));
    question = store.add_message(make_message(chat, QStringLiteral("user"), QStringLiteral("Kept zebra question")));
    answer = store.add_message(make_message(chat, QStringLiteral("assistant"), QStringLiteral("Kept answer")));
    deleted = store.add_message(make_message(chat, QStringLiteral("user"), QStringLiteral("Deleted")));
    store.delete_messages(chat, {deleted});
  }
  // Version 7's messages table, exactly as it was created, with its index and the search index's triggers.
  const QStringList triggers =
      raw_query(path, QStringLiteral("SELECT group_concat(sql, ';;') FROM sqlite_master WHERE type = 'trigger'"))
          .split(QStringLiteral(";;"));
  QCOMPARE(triggers.size(), 3);
  const QString columns = QStringLiteral(
      "id, conversation_id, role, text, created_at, model, backend, settings, stats, complete, token_ids,"
      " token_vocabulary, branch, forked_from");
  QStringList statements{
      QStringLiteral(
          "CREATE TABLE messages_v7 (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL"
          " REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL CHECK (role IN ('system', 'user',"
          " 'assistant', 'marker')), text TEXT NOT NULL, created_at INTEGER NOT NULL, model TEXT NOT NULL DEFAULT '',"
          " backend TEXT NOT NULL DEFAULT '', settings TEXT NOT NULL DEFAULT '{}', stats TEXT NOT NULL DEFAULT '{}',"
          " complete INTEGER NOT NULL DEFAULT 1, token_ids BLOB, token_vocabulary INTEGER NOT NULL DEFAULT 0,"
          " branch INTEGER NOT NULL DEFAULT 0, forked_from INTEGER NOT NULL DEFAULT 0)"),
      QStringLiteral("INSERT INTO messages_v7 (%1) SELECT %1 FROM messages").arg(columns),
      QStringLiteral("DROP TABLE messages"),
      QStringLiteral("ALTER TABLE messages_v7 RENAME TO messages"),
      QStringLiteral("UPDATE sqlite_sequence SET seq = %1 WHERE name = 'messages'").arg(deleted),
      QStringLiteral("CREATE INDEX messages_by_conversation ON messages (conversation_id, id)"),
      QStringLiteral("DELETE FROM schema_version"),
      QStringLiteral("INSERT INTO schema_version (version) VALUES (7)"),
      QStringLiteral("ALTER TABLE conversations DROP COLUMN reply_format")};
  statements << triggers;
  for (const QString& statement : statements) raw_query(path, statement);
  QCOMPARE(raw_query(path, QStringLiteral("SELECT count(*) FROM sqlite_master WHERE sql LIKE '%tool%'")),
           QStringLiteral("0"));
  {
    ConversationStore reader(path, StoreOpenMode::ReadOnly);
    QCOMPARE(ids_of(reader.messages(chat)), (QList<qint64>{question, answer}));
    QCOMPARE(reader.messages(chat)[1].text, QStringLiteral("Kept answer"));
    QVERIFY(reader.messages(chat)[1].tool_calls.isEmpty());
  }
  QCOMPARE(raw_query(path, QStringLiteral("SELECT max(version) FROM schema_version")), QStringLiteral("7"));

  ConversationStore store(path);
  QCOMPARE(raw_query(path, QStringLiteral("SELECT group_concat(version, ',') FROM schema_version")),
           QStringLiteral("7,8"));
  QCOMPARE(ids_of(store.messages(chat)), (QList<qint64>{question, answer}));
  QCOMPARE(store.messages(chat)[0].text, QStringLiteral("Kept zebra question"));
  QCOMPARE(store.search(QStringLiteral("zebra")).size(), 1);
  QCOMPARE(store.integrity_check(), QStringLiteral("ok"));
  const ToolUseChat ids = add_tool_use_chat(store);
  QVERIFY(ids.question > deleted);
  check_tool_use_chat(store, ids);
  // The search index follows the rebuilt table: new messages are found, and so are edits.
  QCOMPARE(store.search(QStringLiteral("Paris")).size(), 1);
  store.update_message_text(answer, QStringLiteral("Changed okapi"));
  QCOMPARE(store.search(QStringLiteral("okapi")).size(), 1);
  QCOMPARE(store.search(QStringLiteral("Kept answer")).size(), 0);
}

}  // namespace app_test_conversation_store

#include "test_conversation_store.moc"
