// The growing reply's crash-safety bound: text handed to the committer is in the database within
// kReplyCommitBound, whether tokens stream fast or one token is slow; and a fast stream is not one
// commit per token.
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "app/chat/reply_committer.h"
#include "app/store/conversation_store.h"
#include "common/raw_sqlite.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_reply_committer {

using kvchat::app::ConversationStore;
using kvchat::app::MessageRecord;
using kvchat::app::ReplyCommitter;
using kvchat::test::raw_query;
using Clock = std::chrono::steady_clock;

class ReplyCommitterTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void shown_text_is_committed_within_the_bound() {
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("chats.sqlite3"));
    ConversationStore store(path);
    const qint64 conversation = store.create_conversation(QStringLiteral("c"));
    MessageRecord reply;
    reply.conversation_id = conversation;
    reply.role = kvchat::app::MessageRole::Assistant;
    reply.complete = false;
    const qint64 reply_id = store.add_message(reply);
    const QString select = QStringLiteral("SELECT length(text) FROM messages WHERE id = %1").arg(reply_id);

    ReplyCommitter committer(path, reply_id);
    // (time handed over, length) of every update; the database is polled meanwhile.
    std::vector<std::pair<Clock::time_point, int>> handed;
    std::string text;
    int checks = 0;
    auto check_bound = [&] {
      const Clock::time_point polled = Clock::now();
      const int committed = raw_query(path, select).toInt();
      for (const auto& [at, length] : handed)
        if (at + kvchat::app::kReplyCommitBound <= polled)
          QVERIFY2(committed >= length,
                   qPrintable(QStringLiteral("%1 bytes handed over %2 ms ago, %3 committed")
                                  .arg(length)
                                  .arg(std::chrono::duration_cast<std::chrono::milliseconds>(polled - at).count())
                                  .arg(committed)));
      ++checks;
    };
    // A fast stream: a token every 2 ms for 1.5 s.
    const Clock::time_point start = Clock::now();
    Clock::time_point next_check = start;
    while (Clock::now() - start < std::chrono::milliseconds(1500)) {
      text += "tok ";
      committer.update(text);
      handed.emplace_back(Clock::now(), static_cast<int>(text.size()));
      if (Clock::now() >= next_check) {
        check_bound();
        next_check = Clock::now() + std::chrono::milliseconds(50);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // Then one slow token: the text before it must not wait for it.
    text += "slow";
    committer.update(text);
    handed.emplace_back(Clock::now(), static_cast<int>(text.size()));
    const Clock::time_point slow_start = Clock::now();
    while (Clock::now() - slow_start < std::chrono::milliseconds(1200)) {
      check_bound();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    QCOMPARE(raw_query(path, QStringLiteral("SELECT text FROM messages WHERE id = %1").arg(reply_id)),
             QString::fromStdString(text));
    QVERIFY(checks > 20);
    // About four commits a second, not one per token (~600 tokens were handed over).
    const int commits = committer.commits();
    QVERIFY2(commits >= 4 && commits <= 20, qPrintable(QString::number(commits)));
    committer.stop();
    QCOMPARE(store.message(reply_id)->complete, false);
  }
};

KVCHAT_TEST_GUILESS_MAIN(ReplyCommitterTest)

}  // namespace app_test_reply_committer

#include "test_reply_committer.moc"
