// What one turn leaves in the store, row by row, as the app, `kvchat-cli chat` and its remote backend write it
// (TurnRecorder): the user message, the reply saved empty and incomplete, its growth committed by the timer
// (many chunks, one commit a tick) or by the committer thread, then the finished reply with its stats and ids,
// a failed one with its error and the text that arrived, a failed continuation put back, and the context-cut
// marker.
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <chrono>
#include <thread>

#include "app/chat/turn_recorder.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_turn_recorder {

using kvchat::app::ConversationStore;
using kvchat::app::MessageRecord;
using kvchat::app::TurnRecorder;

namespace {

// Every row of the conversation: role, text, complete.
QStringList rows(const ConversationStore& store, qint64 conversation_id) {
  QStringList result;
  for (const MessageRecord& message : store.messages(conversation_id))
    result << QStringLiteral("%1|%2|%3")
                  .arg(kvchat::app::role_name(message.role), message.text, message.complete ? "complete" : "growing");
  return result;
}

MessageRecord local_reply() {
  MessageRecord reply;
  reply.model = QStringLiteral("stories260K");
  reply.backend = QStringLiteral("local");
  reply.settings = QJsonObject{{"temperature", 0.0}};
  return reply;
}

}  // namespace

class TurnRecorderTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void init() {
    dir_ = std::make_unique<QTemporaryDir>();
    store_ = std::make_unique<ConversationStore>(dir_->filePath(QStringLiteral("chats.sqlite3")));
    chat_ = store_->create_conversation(QStringLiteral("Story"));
  }
  void cleanup() {
    store_.reset();
    dir_.reset();
  }

  void a_finished_turn_is_the_user_message_and_the_reply_with_its_ids() {
    const qint64 user = TurnRecorder::add_user_message(*store_, chat_, QStringLiteral("Once upon a time"));
    TurnRecorder recorder(*store_, chat_, TurnRecorder::Cadence::EventLoopTimer);
    const qint64 reply = recorder.start_reply(local_reply());
    QCOMPARE(reply, user + 1);
    QCOMPARE(rows(*store_, chat_), (QStringList{"user|Once upon a time|complete", "assistant||growing"}));
    const MessageRecord saved = store_->message(reply).value();
    QCOMPARE(saved.model, QStringLiteral("stories260K"));
    QCOMPARE(saved.backend, QStringLiteral("local"));
    QCOMPARE(saved.settings, (QJsonObject{{"temperature", 0.0}}));

    recorder.append(std::string_view(", there"));
    recorder.append(QStringLiteral(" was"));
    QCOMPARE(recorder.text(), QStringLiteral(", there was"));
    recorder.finish(QJsonObject{{"generated_tokens", 2}, {"stop_reason", "max_tokens"}}, {11, 12}, 99);
    QCOMPARE(rows(*store_, chat_), (QStringList{"user|Once upon a time|complete", "assistant|, there was|complete"}));
    const MessageRecord finished = store_->message(reply).value();
    QCOMPARE(finished.stats, (QJsonObject{{"generated_tokens", 2}, {"stop_reason", "max_tokens"}}));
    QCOMPARE(finished.token_ids, (std::vector<kvchat::TokenId>{11, 12}));
    QCOMPARE(finished.token_vocabulary, quint64{99});
    QVERIFY(!kvchat::app::is_failed_reply(finished));
  }

  // The timer commits what grew since its last tick, once, however many chunks came: never one commit a chunk.
  void the_growing_reply_is_committed_once_a_tick() {
    TurnRecorder::add_user_message(*store_, chat_, QStringLiteral("Count"));
    TurnRecorder recorder(*store_, chat_, TurnRecorder::Cadence::EventLoopTimer);
    const qint64 reply = recorder.start_reply(local_reply());
    QString expected;
    for (int i = 0; i < 100; ++i) {
      const QString chunk = QStringLiteral(" %1").arg(i);
      recorder.append(chunk);
      expected += chunk;
    }
    // Nothing is written per chunk: the commit waits for the timer.
    QCOMPARE(recorder.commits(), 0);
    QCOMPARE(store_->message(reply)->text, QString());
    QVERIFY(QTest::qWaitFor([&] { return recorder.commits() > 0; }, 10000));
    QCOMPARE(recorder.commits(), 1);
    QCOMPARE(rows(*store_, chat_), (QStringList{"user|Count|complete", "assistant|" + expected + "|growing"}));
    // Unchanged text is not written again.
    recorder.commit();
    QCOMPARE(recorder.commits(), 1);
    recorder.append(QStringLiteral(" end"));
    recorder.commit();
    QCOMPARE(recorder.commits(), 2);
    QCOMPARE(store_->message(reply)->text, expected + " end");
    QCOMPARE(store_->message(reply)->complete, false);
  }

  // The CLI's cadence: its own thread commits while the caller's thread never runs an event loop.
  void the_committer_thread_commits_without_an_event_loop() {
    TurnRecorder::add_user_message(*store_, chat_, QStringLiteral("Hello"));
    TurnRecorder recorder(*store_, chat_, TurnRecorder::Cadence::CommitterThread);
    recorder.start_reply(local_reply());
    recorder.append(std::string_view("Hi there"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (recorder.commits() < 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    QCOMPARE(rows(*store_, chat_), (QStringList{"user|Hello|complete", "assistant|Hi there|growing"}));
    QCOMPARE(recorder.commits(), 1);
    recorder.finish(QStringLiteral("Hi there!"), QJsonObject{{"generated_tokens", 3}});
    QCOMPARE(rows(*store_, chat_), (QStringList{"user|Hello|complete", "assistant|Hi there!|complete"}));
  }

  void a_failed_turn_keeps_the_text_that_arrived_with_the_error() {
    TurnRecorder::add_user_message(*store_, chat_, QStringLiteral("Tell me"));
    TurnRecorder recorder(*store_, chat_, TurnRecorder::Cadence::EventLoopTimer);
    const qint64 reply = recorder.start_reply(local_reply());
    recorder.append(QStringLiteral("Once"));
    recorder.fail(QStringLiteral("the server went away"), QJsonObject{{"generated_tokens", 1}});
    QCOMPARE(rows(*store_, chat_), (QStringList{"user|Tell me|complete", "assistant|Once|complete"}));
    const MessageRecord failed = store_->message(reply).value();
    QCOMPARE(failed.stats, (QJsonObject{{"generated_tokens", 1}, {"error", "the server went away"}}));
    QVERIFY(kvchat::app::is_failed_reply(failed));
    QCOMPARE(kvchat::app::reply_error(failed), QStringLiteral("the server went away"));
    QVERIFY(failed.token_ids.empty());
  }

  // Continue that fails: the reply stands as it was, its ids kept when no text arrived.
  void a_failed_continuation_puts_the_reply_back() {
    TurnRecorder::add_user_message(*store_, chat_, QStringLiteral("Go on"));
    MessageRecord cut = local_reply();
    cut.conversation_id = chat_;
    cut.role = kvchat::app::MessageRole::Assistant;
    cut.text = QStringLiteral("Once upon");
    const qint64 reply = store_->add_message(cut);
    const QJsonObject before{{"stop_reason", "max_tokens"}, {"generated_tokens", 2}};
    store_->finish_message(reply, cut.text, before, {5, 6}, 7);
    {
      TurnRecorder recorder(*store_, chat_, TurnRecorder::Cadence::EventLoopTimer);
      recorder.continue_reply(store_->message(reply).value());
      QCOMPARE(recorder.reply_id(), reply);
      QCOMPARE(recorder.continued_stats(), before);
      recorder.fail(QStringLiteral("the engine stopped"));
      const MessageRecord kept = store_->message(reply).value();
      QCOMPARE(kept.text, QStringLiteral("Once upon"));
      QCOMPARE(kept.stats, before);
      QCOMPARE(kept.token_ids, (std::vector<kvchat::TokenId>{5, 6}));
      QVERIFY(!kvchat::app::is_failed_reply(kept));
    }
    {
      TurnRecorder recorder(*store_, chat_, TurnRecorder::Cadence::EventLoopTimer);
      recorder.continue_reply(store_->message(reply).value());
      recorder.append(QStringLiteral(" a time"));
      recorder.fail(QStringLiteral("the engine stopped"));
      const MessageRecord grown = store_->message(reply).value();
      QCOMPARE(grown.text, QStringLiteral("Once upon a time"));
      QCOMPARE(grown.stats, before);
      QVERIFY(grown.token_ids.empty());  // they no longer cover the text
    }
    QCOMPARE(rows(*store_, chat_), (QStringList{"user|Go on|complete", "assistant|Once upon a time|complete"}));
  }

  void a_context_cut_leaves_a_marker_before_the_first_message_kept() {
    const qint64 first = TurnRecorder::add_user_message(*store_, chat_, QStringLiteral("One"));
    MessageRecord answer;
    answer.conversation_id = chat_;
    answer.role = kvchat::app::MessageRole::Assistant;
    answer.text = QStringLiteral("Two");
    const qint64 second = store_->add_message(answer);
    const qint64 third = TurnRecorder::add_user_message(*store_, chat_, QStringLiteral("Three"));
    TurnRecorder recorder(*store_, chat_, TurnRecorder::Cadence::EventLoopTimer);
    recorder.set_prompt_message_ids({first, second, third});
    recorder.start_reply(local_reply());
    // Nothing cut, or everything: no marker.
    QVERIFY(!recorder.mark_context_cut(0, 64));
    QVERIFY(!recorder.mark_context_cut(3, 64));
    const auto marker = recorder.mark_context_cut(2, 64);
    QVERIFY(marker);
    recorder.append(QStringLiteral("Four"));
    recorder.finish(QJsonObject{{"generated_tokens", 1}});
    const QString words = QStringLiteral(
        "The 2 oldest messages no longer fit the context window (64 tokens); the model sees the chat from here on.");
    QCOMPARE(marker->text, words);
    QCOMPARE(rows(*store_, chat_), (QStringList{"user|One|complete", "assistant|Two|complete", "user|Three|complete",
                                                "assistant|Four|complete", "marker|" + words + "|complete"}));
    const MessageRecord saved = store_->message(marker->id).value();
    QCOMPARE(saved.settings.value(kvchat::app::kMarkerContextStartKey).toInteger(), third);
  }

 private:
  std::unique_ptr<QTemporaryDir> dir_;
  std::unique_ptr<ConversationStore> store_;
  qint64 chat_ = 0;
};

KVCHAT_TEST_GUILESS_MAIN(TurnRecorderTest)

}  // namespace app_test_turn_recorder

#include "test_turn_recorder.moc"
