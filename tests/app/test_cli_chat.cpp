// kvchat-cli chat as a separate process: one turn with --message, continuing a stored conversation,
// the interactive mode over stdin, and usage errors. Replies are checked against the same turn computed
// in this process, so the CLI and the app share one chat path.
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include "app/chat/chat_turn_runner.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "app/store/message_stats_json.h"
#include "common/chat_fixture.h"
#include "common/cli_runner.h"
#include "common/test_paths.h"
#include "common/tiny_llama3_chat_model.h"
#include "engine/generation/session.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_chat {

using kvchat::app::ConversationStore;
using kvchat::app::StoreOpenMode;
using kvchat::test::CliResult;
using kvchat::test::run_cli;

namespace {}  // namespace

class CliChatTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase();
  void one_turn_with_message();
  void continuing_a_stored_conversation();
  void interactive_lines_from_stdin_reuse_the_cache();
  void usage_errors_are_clear();
  void empty_messages_and_nul_bytes();
  void a_later_run_restores_the_conversation_from_its_snapshot();
  void replies_do_not_depend_on_the_cache_or_a_restart();

 private:
  std::string expected_reply(const std::vector<kvchat::ChatMessage>& messages, int max_new_tokens) const;
  kvchat::LoadedModel model_;
  QTemporaryDir dir_;
};

void CliChatTest::initTestCase() {
  QVERIFY(dir_.isValid());
  model_ = kvchat::load_model_directory(kvchat::test::stories_model_directory().toStdString());
}

std::string CliChatTest::expected_reply(const std::vector<kvchat::ChatMessage>& messages, int max_new_tokens) const {
  const kvchat::app::ChatTurnRunner runner(model_);
  kvchat::Session session(model_.model, kvchat::KvCacheMode::Contiguous);
  kvchat::app::TurnOptions options;
  options.generation.max_new_tokens = max_new_tokens;
  return runner.run(session, messages, options, nullptr, {}).reply;
}

void CliChatTest::one_turn_with_message() {
  const QString db = dir_.filePath("one.sqlite3");
  const CliResult result = run_cli({"chat", "--model", kvchat::test::stories_model_directory(), "--db", db, "--message",
                                    "Once upon a time", "--max-new-tokens", "30"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  QVERIFY2(result.err.find("conversation: 1\n") != std::string::npos, result.err.c_str());

  ConversationStore store(db, StoreOpenMode::ReadOnly);
  const auto messages = store.messages(1);
  QCOMPARE(messages.size(), 2);
  QCOMPARE(messages[0].role, kvchat::app::MessageRole::User);
  QCOMPARE(messages[0].text, QStringLiteral("Once upon a time"));
  QCOMPARE(messages[1].role, kvchat::app::MessageRole::Assistant);
  QVERIFY(messages[1].complete);
  QCOMPARE(QString::fromStdString(result.out), messages[1].text + "\n");
  QCOMPARE(messages[1].text.toStdString(), expected_reply({{"user", "Once upon a time"}}, 30));
  QCOMPARE(kvchat::app::stats_from_json(messages[1].stats).generated_tokens, 30);
}

void CliChatTest::continuing_a_stored_conversation() {
  const QString db = dir_.filePath("continue.sqlite3");
  const CliResult first = run_cli({"chat", "--model", kvchat::test::stories_model_directory(), "--db", db, "--message",
                                   "Tom had a red ball", "--max-new-tokens", "20"});
  QVERIFY2(first.exit_code == 0, first.err.c_str());
  const CliResult second = run_cli({"chat", "--model", kvchat::test::stories_model_directory(), "--db", db,
                                    "--conversation", "1", "--message", "Lily smiled", "--max-new-tokens", "20"});
  QVERIFY2(second.exit_code == 0, second.err.c_str());

  ConversationStore store(db, StoreOpenMode::ReadOnly);
  QCOMPARE(store.conversations().size(), 1);
  const auto messages = store.messages(1);
  QCOMPARE(messages.size(), 4);
  QCOMPARE(messages[2].text, QStringLiteral("Lily smiled"));
  const auto history = kvchat::app::chat_messages_for_engine(*store.conversation(1), messages.mid(0, 3));
  QCOMPARE(messages[3].text.toStdString(), expected_reply(history, 20));
  QCOMPARE(QString::fromStdString(second.out), messages[3].text + "\n");
}

void CliChatTest::interactive_lines_from_stdin_reuse_the_cache() {
  const QString db = dir_.filePath("interactive.sqlite3");
  const CliResult result =
      run_cli({"chat", "--model", kvchat::test::stories_model_directory(), "--db", db, "--max-new-tokens", "16"},
              "Once upon a time\n\nThe dog ran\n");
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  ConversationStore store(db, StoreOpenMode::ReadOnly);
  const auto messages = store.messages(1);
  QCOMPARE(messages.size(), 4);  // the blank line is skipped
  QCOMPARE(QString::fromStdString(result.out), messages[1].text + "\n" + messages[3].text + "\n");
  // Per-turn stats on stderr: the second turn reads only its new tokens.
  const QRegularExpression stats_line(
      R"(\[(\d+) prompt tokens: (\d+) reused \((\d+) restored from disk in [\d.]+ ms\), (\d+) prefilled)");
  auto matches = stats_line.globalMatch(QString::fromStdString(result.err));
  QList<QRegularExpressionMatch> turns;
  while (matches.hasNext()) turns << matches.next();
  QCOMPARE(turns.size(), 2);
  QCOMPARE(turns[0].captured(2).toInt(), 0);
  const auto first_stats = kvchat::app::stats_from_json(messages[1].stats);
  QCOMPARE(static_cast<qint64>(turns[1].captured(2).toInt()), first_stats.cache_tokens);
}

void CliChatTest::usage_errors_are_clear() {
  const QString db = dir_.filePath("errors.sqlite3");
  CliResult result = run_cli({"chat", "--model", kvchat::test::stories_model_directory(), "--db", db, "--conversation",
                              "999", "--message", "hi"});
  QCOMPARE(result.exit_code, 2);
  QVERIFY2(result.err.find("no conversation with id 999") != std::string::npos, result.err.c_str());
  result = run_cli({"chat", "--model", kvchat::test::stories_model_directory(), "--db", db, "--kv-cache", "sometimes",
                    "--message", "hi"});
  QCOMPARE(result.exit_code, 2);
  QVERIFY2(result.err.find("sometimes") != std::string::npos, result.err.c_str());
  result = run_cli({"chat", "--db", db, "--message", "hi"});
  QCOMPARE(result.exit_code, 2);
  QVERIFY2(result.err.find("model") != std::string::npos, result.err.c_str());
  result = run_cli({"chat", "--model", dir_.filePath("no-such-model"), "--db", db, "--message", "hi"});
  QCOMPARE(result.exit_code, 1);
  QVERIFY2(result.err.find("no-such-model") != std::string::npos, result.err.c_str());
}

// An empty --message is refused before a conversation is created; a NUL byte read from stdin keeps the
// rest of the line (marked by U+FFFD) instead of cutting the message there.
void CliChatTest::empty_messages_and_nul_bytes() {
  const QString db = dir_.filePath("edge.sqlite3");
  for (const QString& empty : {QString(), QStringLiteral("  ")}) {
    const CliResult result =
        run_cli({"chat", "--model", kvchat::test::stories_model_directory(), "--db", db, "--message", empty});
    QCOMPARE(result.exit_code, 2);
    QVERIFY2(result.err.find("--message is empty") != std::string::npos, result.err.c_str());
  }
  QVERIFY(!QFile::exists(db) || ConversationStore(db, StoreOpenMode::ReadOnly).conversations().isEmpty());

  const CliResult result =
      run_cli({"chat", "--model", kvchat::test::stories_model_directory(), "--db", db, "--max-new-tokens", "4"},
              std::string("Once upon\0 a time\n", 18));
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  ConversationStore store(db, StoreOpenMode::ReadOnly);
  const auto conversations = store.conversations();
  QCOMPARE(conversations.size(), 1);
  QCOMPARE(store.messages(conversations[0].id)[0].text, QStringLiteral("Once upon\uFFFD a time"));
}

// Two runs, two processes: the second continues the conversation from the first's KV snapshot (every id
// the first run cached is restored, none prefilled again) and replies exactly as one process holding both
// turns in memory does (snapshots off there).
void CliChatTest::a_later_run_restores_the_conversation_from_its_snapshot() {
  const QString db = dir_.filePath("restart.sqlite3"), snapshots = dir_.filePath("restart-snapshots");
  const QStringList common{"chat",        "--model", kvchat::test::stories_model_directory(), "--max-new-tokens", "24",
                           "--cache-dir", snapshots};
  const CliResult first = run_cli(common + QStringList{"--db", db, "--message", "Tom had a red ball"});
  QVERIFY2(first.exit_code == 0, first.err.c_str());
  const CliResult second = run_cli(common + QStringList{"--db", db, "--conversation", "1", "--message", "He threw it"});
  QVERIFY2(second.exit_code == 0, second.err.c_str());
  ConversationStore store(db, StoreOpenMode::ReadOnly);
  const auto messages = store.messages(1);
  QCOMPARE(messages.size(), 4);
  const auto first_stats = kvchat::app::stats_from_json(messages[1].stats);
  const auto second_stats = kvchat::app::stats_from_json(messages[3].stats);
  QCOMPARE(first_stats.restored_tokens, 0);
  QCOMPARE(static_cast<qint64>(second_stats.restored_tokens), first_stats.cache_tokens);
  QCOMPARE(second_stats.reused_tokens, second_stats.restored_tokens);
  QVERIFY2(second.err.find("(" + std::to_string(second_stats.restored_tokens) + " restored from disk in ") !=
               std::string::npos,
           second.err.c_str());

  const QString reference_db = dir_.filePath("restart-reference.sqlite3");
  const CliResult reference =
      run_cli(common + QStringList{"--db", reference_db, "--kv-snapshots", "off"}, "Tom had a red ball\nHe threw it\n");
  QVERIFY2(reference.exit_code == 0, reference.err.c_str());
  const auto in_memory = ConversationStore(reference_db, StoreOpenMode::ReadOnly).messages(1);
  QCOMPARE(in_memory.size(), 4);
  QCOMPARE(messages[1].text, in_memory[1].text);
  QCOMPARE(messages[3].text, in_memory[3].text);
  QCOMPARE(kvchat::app::stats_from_json(in_memory[3].stats).reused_tokens, second_stats.reused_tokens);
}

// The prompt of a turn is a function of the conversation alone: four turns in one process (the cache kept
// in memory), four processes without snapshots (each turn re-reads the chat from the database), and four
// processes whose snapshot folder is deleted halfway give the same replies, id for id. The model is a
// chat model with random weights, whose replies re-encode to other ids than the ones it sampled (checked
// below), so a prompt rebuilt from the text alone would differ.
void CliChatTest::replies_do_not_depend_on_the_cache_or_a_restart() {
  const QString model =
      QString::fromStdString(kvchat::test::make_tiny_llama3_chat_model(dir_.filePath("chat-model").toStdString()));
  const QStringList lines = {"Tell me a story", "And then?", "Why did she leave?", "How does it end?"};
  const QStringList common{"chat", "--model", model, "--max-new-tokens", "12"};

  const QString in_memory_db = dir_.filePath("canonical-memory.sqlite3");
  const CliResult in_memory = run_cli(common + QStringList{"--db", in_memory_db, "--kv-snapshots", "off"},
                                      (lines.join('\n') + '\n').toStdString());
  QVERIFY2(in_memory.exit_code == 0, in_memory.err.c_str());

  const QString restarted_db = dir_.filePath("canonical-restarted.sqlite3");
  const QString snapshot_db = dir_.filePath("canonical-snapshots.sqlite3");
  QTemporaryDir snapshots;
  for (int turn = 0; turn < lines.size(); ++turn) {
    const QStringList conversation = turn == 0 ? QStringList{} : QStringList{"--conversation", "1"};
    const CliResult restarted = run_cli(
        common + conversation + QStringList{"--db", restarted_db, "--kv-snapshots", "off", "--message", lines[turn]});
    QVERIFY2(restarted.exit_code == 0, restarted.err.c_str());
    if (turn == 2) QVERIFY(QDir(snapshots.path()).removeRecursively());  // lost (or evicted) snapshots
    const CliResult with_snapshots =
        run_cli(common + conversation +
                QStringList{"--db", snapshot_db, "--cache-dir", snapshots.path(), "--message", lines[turn]});
    QVERIFY2(with_snapshots.exit_code == 0, with_snapshots.err.c_str());
  }

  const auto expected = ConversationStore(in_memory_db, StoreOpenMode::ReadOnly).messages(1);
  QCOMPARE(expected.size(), 2 * lines.size());
  bool re_encoding_differs = false;
  for (const QString& db : {restarted_db, snapshot_db}) {
    const auto messages = ConversationStore(db, StoreOpenMode::ReadOnly).messages(1);
    QCOMPARE(messages.size(), expected.size());
    for (int i = 1; i < messages.size(); i += 2) {
      QVERIFY(!expected[i].token_ids.empty());
      QCOMPARE(messages[i].token_ids, expected[i].token_ids);
      QCOMPARE(messages[i].text, expected[i].text);
      const auto stats = kvchat::app::stats_from_json(messages[i].stats);
      QCOMPARE(stats.prompt_tokens, kvchat::app::stats_from_json(expected[i].stats).prompt_tokens);
    }
  }
  const kvchat::LoadedModel chat_model = kvchat::load_model_directory(model.toStdString());
  for (int i = 1; i < expected.size(); i += 2)
    re_encoding_differs |=
        chat_model.tokenizer->encode(expected[i].text.toStdString(), false, false) != expected[i].token_ids;
  QVERIFY2(re_encoding_differs,
           "the replies re-encode to their own ids: this test would not see a prompt built from text");
}

KVCHAT_TEST_GUILESS_MAIN(CliChatTest)

}  // namespace app_test_cli_chat

#include "test_cli_chat.moc"
