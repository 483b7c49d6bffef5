// Crash safety: a writer process streams a reply into the store and is killed with SIGKILL mid-stream.
// The file must stay intact, the chat must be there, and the partial reply must hold at least what the
// writer had reported as committed.
//
// The same program is both sides: with KVCHAT_STORE_WRITER_DB set, the suite runs the writer instead of the tests.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <QCoreApplication>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

#include "app/store/conversation_store.h"
#include "common/test_suite.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_store_crash_safety {

using kvchat::app::ConversationStore;
using kvchat::app::MessageRecord;

namespace {

const char* const kWriterDbVariable = "KVCHAT_STORE_WRITER_DB";
const QString kTitle = QStringLiteral("Streaming until killed");
const QString kUserText = QStringLiteral("Tell me a long story about a dragon.");

// The reply the writer streams: deterministic, so that the parent can rebuild any prefix of it.
// Mixed scripts keep the UTF-8 path honest.
QString reply_chunk(int index) {
  static const QString words[] = {QStringLiteral("dragon "), QStringLiteral("flew "),   QStringLiteral("über "),
                                  QStringLiteral("the "),    QStringLiteral("hills, "), QStringLiteral("竜 "),
                                  QStringLiteral("and "),    QStringLiteral("slept.\n")};
  return words[index % 8] + QString::number(index) + QLatin1Char(' ');
}

QString full_reply(int chunks) {
  QString text;
  for (int i = 0; i < chunks; ++i) text += reply_chunk(i);
  return text;
}

constexpr int kMaxChunks = 100000;

// The child: one conversation, one user message, then an assistant reply that grows every ~20 ms.
// Each line "committed <length>" is printed only after update_message_text returned, i.e. after the commit.
int run_writer(int argc, char** argv) {
  QCoreApplication app(argc, argv);
  // stdout is the protocol channel: logs go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("writer"));
  ConversationStore store(qEnvironmentVariable(kWriterDbVariable));
  const qint64 conversation = store.create_conversation(kTitle);
  MessageRecord user;
  user.conversation_id = conversation;
  user.role = kvchat::app::MessageRole::User;
  user.text = kUserText;
  store.add_message(user);
  MessageRecord reply;
  reply.conversation_id = conversation;
  reply.role = kvchat::app::MessageRole::Assistant;
  reply.model = QStringLiteral("stories260K");
  reply.complete = false;
  const qint64 reply_id = store.add_message(reply);
  std::printf("conversation %lld\n", static_cast<long long>(conversation));
  std::fflush(stdout);

  QString text;
  for (int i = 0; i < kMaxChunks; ++i) {
    text += reply_chunk(i);
    store.update_message_text(reply_id, text);
    std::printf("committed %lld\n", static_cast<long long>(text.size()));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

}  // namespace

class StoreCrashSafetyTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void killed_writer_loses_nothing_committed_data();
  void killed_writer_loses_nothing_committed();

 private:
  void kill_writer_after(int commits_before_kill);
};

void StoreCrashSafetyTest::kill_writer_after(int commits_before_kill) {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const QString path = dir.filePath(QStringLiteral("crash.sqlite3"));

  QProcess writer;
  QProcessEnvironment environment = QProcessEnvironment::systemEnvironment();
  environment.insert(QString::fromLatin1(kWriterDbVariable), path);
  writer.setProcessEnvironment(environment);
  writer.setProcessChannelMode(QProcess::ForwardedErrorChannel);
  writer.start(QCoreApplication::applicationFilePath(), {kvchat::test::current_suite_name()});
  QVERIFY2(writer.waitForStarted(30000), qPrintable(writer.errorString()));

  qint64 conversation_id = 0;
  qint64 last_committed = -1;
  int commits = 0;
  QByteArray pending;
  auto consume_lines = [&] {
    pending += writer.readAllStandardOutput();
    int newline;
    while ((newline = pending.indexOf('\n')) >= 0) {
      const QByteArray line = pending.left(newline).trimmed();
      pending.remove(0, newline + 1);
      if (line.startsWith("conversation ")) conversation_id = line.mid(13).toLongLong();
      if (line.startsWith("committed ")) {
        last_committed = line.mid(10).toLongLong();
        ++commits;
      }
    }
  };
  while (commits < commits_before_kill) {
    if (!writer.waitForReadyRead(60000)) break;
    consume_lines();
  }
  QVERIFY2(commits >= commits_before_kill,
           qPrintable(QStringLiteral("writer reported only %1 commits (state %2)").arg(commits).arg(writer.state())));
  writer.kill();  // SIGKILL: no destructors, no close, possibly in the middle of a transaction
  QVERIFY(writer.waitForFinished(30000));
  QCOMPARE(writer.exitStatus(), QProcess::CrashExit);
  // Lines already in the pipe were printed after their commits: they count too.
  consume_lines();
  QVERIFY(conversation_id > 0);
  QVERIFY(last_committed > 0);

  ConversationStore store(path);
  QCOMPARE(store.integrity_check(), QStringLiteral("ok"));
  const auto conversation = store.conversation(conversation_id);
  QVERIFY(conversation.has_value());
  QCOMPARE(conversation->title, kTitle);
  const QList<MessageRecord> messages = store.messages(conversation_id);
  QCOMPARE(messages.size(), 2);
  QCOMPARE(messages[0].role, kvchat::app::MessageRole::User);
  QCOMPARE(messages[0].text, kUserText);
  QCOMPARE(messages[0].complete, true);
  QCOMPARE(messages[1].role, kvchat::app::MessageRole::Assistant);
  QCOMPARE(messages[1].complete, false);
  QCOMPARE(messages[1].model, QStringLiteral("stories260K"));

  const QString partial = messages[1].text;
  QVERIFY2(partial.size() >= last_committed,
           qPrintable(QStringLiteral("partial reply has %1 characters, %2 were reported committed")
                          .arg(partial.size())
                          .arg(last_committed)));
  // Exactly some committed state of the stream: a prefix of the reply ending on a chunk boundary.
  int chunks = 0;
  QString expected;
  while (expected.size() < partial.size()) expected += reply_chunk(chunks++);
  QCOMPARE(partial, expected);
  QCOMPARE(partial, full_reply(chunks));
  qInfo("killed after %d reported commits: %lld characters reported, %lld stored", commits,
        static_cast<long long>(last_committed), static_cast<long long>(partial.size()));

  // The survivor is writable: the app can carry on with the same file.
  store.finish_message(messages[1].id, partial + QStringLiteral("[interrupted]"), QJsonObject());
  QCOMPARE(store.messages(conversation_id)[1].complete, true);
}

void StoreCrashSafetyTest::killed_writer_loses_nothing_committed_data() {
  QTest::addColumn<int>("commits_before_kill");
  QTest::newRow("early") << 3;
  QTest::newRow("later") << 25;
}

void StoreCrashSafetyTest::killed_writer_loses_nothing_committed() {
  QFETCH(int, commits_before_kill);
  kill_writer_after(commits_before_kill);
}

namespace {

int store_crash_safety_main(int argc, char** argv) {
  if (qEnvironmentVariableIsSet(kWriterDbVariable)) return run_writer(argc, argv);
  QCoreApplication app(argc, argv);
  StoreCrashSafetyTest test;
  return QTest::qExec(&test, argc, argv);
}

}  // namespace

KVCHAT_TEST_CUSTOM_MAIN(store_crash_safety_main)

}  // namespace app_test_store_crash_safety

#include "test_store_crash_safety.moc"
