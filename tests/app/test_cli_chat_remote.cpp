// kvchat-cli chat --backend URL against a `kvchat-cli serve` started here: the reply streamed to stdout
// equals the server's own non-streamed answer, the stored reply records server, model and the server's
// figures, a second turn continues the stored conversation, and a refused key, a server that is down and
// local-only options give clear errors with nothing stored.
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <nlohmann/json.hpp>

#include "app/chat_history.h"
#include "app/conversation_store.h"
#include "common/cli_runner.h"
#include "common/cutting_proxy.h"
#include "common/server_process.h"
#include "common/test_paths.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_chat_remote {

using kvchat::app::ConversationStore;
using kvchat::app::StoreOpenMode;
using kvchat::test::CliResult;
using kvchat::test::run_cli;
using nlohmann::json;

namespace {
const char* kApiKey = "cli-remote-key";
}

class CliChatRemoteTest : public QObject {
  Q_OBJECT

 private:
  kvchat::test::ServerProcess server_;
  QTemporaryDir dir_;
  QString base_url() const { return QStringLiteral("http://127.0.0.1:%1/v1").arg(server_.port()); }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    QVERIFY2(server_.start({"--model", QString::fromStdString(kvchat::test::shared_path("models/stories260K")),
                            "--api-key", kApiKey, "--threads", "1"}),
             server_.log().c_str());
  }

  void one_turn_then_a_second_in_the_same_conversation() {
    const QString db = dir_.filePath("chat.sqlite3");
    const CliResult first = run_cli({"chat", "--backend", base_url(), "--api-key", kApiKey, "--db", db, "--message",
                                     "Once upon a time", "--max-new-tokens", "30"});
    QVERIFY2(first.exit_code == 0, first.err.c_str());
    httplib::Client client = server_.client();
    const json request = {{"model", "stories260K"},
                          {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                          {"temperature", 0},
                          {"max_tokens", 30}};
    const kvchat::test::HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", request.dump(),
                                                                  {{"Authorization", std::string("Bearer ") + kApiKey}});
    QCOMPARE(whole.status, 200);
    const std::string expected = whole.json()["choices"][0]["message"]["content"];
    QCOMPARE(first.out, expected + "\n");
    QVERIFY2(first.err.find("backend: " + base_url().toStdString() + ", model: stories260K") != std::string::npos,
             first.err.c_str());

    ConversationStore store(db, StoreOpenMode::ReadOnly);
    const auto conversations = store.conversations();
    QCOMPARE(conversations.size(), 1);
    const auto messages = store.messages(conversations.first().id);
    QCOMPARE(messages.size(), 2);
    QCOMPARE(messages[1].text.toStdString(), expected);
    QCOMPARE(messages[1].backend, base_url());
    QCOMPARE(messages[1].model, QStringLiteral("stories260K"));
    QCOMPARE(messages[1].stats.value("backend").toString(), QStringLiteral("remote"));
    QCOMPARE(messages[1].stats.value("prompt_tokens").toInt(), whole.json()["usage"]["prompt_tokens"].get<int>());

    // The key from the environment; the conversation continued: the server had its prefix cached.
    qputenv("KVCHAT_API_KEY", kApiKey);
    const CliResult second = run_cli({"chat", "--backend", base_url(), "--db", db, "--conversation",
                                      QString::number(conversations.first().id), "--message", "The end",
                                      "--max-new-tokens", "10"});
    qunsetenv("KVCHAT_API_KEY");
    QVERIFY2(second.exit_code == 0, second.err.c_str());
    QVERIFY2(second.err.find(" cached on the server") != std::string::npos, second.err.c_str());
    QCOMPARE(store.messages(conversations.first().id).size(), 4);
  }

  void refused_key_and_unreachable_server_store_nothing() {
    const QString db = dir_.filePath("errors.sqlite3");
    const CliResult refused = run_cli({"chat", "--backend", base_url(), "--api-key", "wrong", "--db", db, "--message", "Hi"});
    QCOMPARE(refused.exit_code, 1);
    QVERIFY2(refused.err.find("refused the API key (401): incorrect API key provided") != std::string::npos,
             refused.err.c_str());
    const CliResult down = run_cli({"chat", "--backend", "http://127.0.0.1:1/v1", "--db", db, "--message", "Hi"});
    QCOMPARE(down.exit_code, 1);
    QVERIFY2(down.err.find("cannot reach http://127.0.0.1:1/v1: connection refused") != std::string::npos,
             down.err.c_str());
    QCOMPARE(ConversationStore(db, StoreOpenMode::ReadOnly).conversations().size(), 0);

    // A model the server does not have: its 404 message, and the turn stored as a failed one.
    const CliResult unknown = run_cli({"chat", "--backend", base_url(), "--api-key", kApiKey, "--remote-model",
                                       "no-such-model", "--db", db, "--message", "Hi"});
    QCOMPARE(unknown.exit_code, 1);
    QVERIFY2(unknown.err.find("answered 404 for model 'no-such-model': the model 'no-such-model' does not exist") !=
                 std::string::npos,
             unknown.err.c_str());
    ConversationStore store(db, StoreOpenMode::ReadOnly);
    const auto messages = store.messages(store.conversations().first().id);
    QCOMPARE(messages.size(), 2);
    QVERIFY(kvchat::app::is_failed_reply(messages[1]));
  }

  void a_server_killed_mid_reply_leaves_the_partial_text() {
    kvchat::test::ServerProcess doomed;
    QVERIFY2(doomed.start({"--model", QString::fromStdString(kvchat::test::shared_path("models/stories260K")),
                           "--threads", "1"}),
             doomed.log().c_str());
    const qint64 doomed_pid = doomed.pid();
    kvchat::test::CuttingProxy relay;
    QVERIFY(relay.start(doomed.port(), [doomed_pid] { ::kill(static_cast<pid_t>(doomed_pid), SIGKILL); }));
    const QString db = dir_.filePath("killed.sqlite3");
    const CliResult cut = run_cli({"chat", "--backend", QStringLiteral("http://127.0.0.1:%1/v1").arg(relay.port()),
                                   "--remote-model", "stories260K", "--db", db, "--message", "Once upon a time",
                                   "--max-new-tokens", "100000"});
    QCOMPARE(cut.exit_code, 1);
    QVERIFY(relay.cut());
    QVERIFY2(cut.err.find("broke off mid-reply") != std::string::npos, cut.err.c_str());
    QVERIFY(cut.out.size() > 1);
    ConversationStore store(db, StoreOpenMode::ReadOnly);
    const auto messages = store.messages(store.conversations().first().id);
    QCOMPARE(messages.size(), 2);
    QCOMPARE(messages[1].text.toStdString() + "\n", cut.out);  // what was printed is what was kept
    QCOMPARE(messages[1].stats.value("interrupted").toBool(), true);
    QVERIFY(kvchat::app::is_failed_reply(messages[1]));
  }

  void usage_errors() {
    const CliResult bad_url = run_cli({"chat", "--backend", "localhost:8000", "--message", "Hi"});
    QCOMPARE(bad_url.exit_code, 2);
    QVERIFY2(bad_url.err.find("--backend: the server address 'localhost:8000' is not a base URL") != std::string::npos,
             bad_url.err.c_str());
    const CliResult mixed = run_cli({"chat", "--backend", base_url(), "--kv-cache", "off", "--message", "Hi"});
    QVERIFY2(mixed.err.find("--kv-cache is the local engine's: it cannot be used with --backend") != std::string::npos,
             mixed.err.c_str());
    const CliResult key_alone = run_cli({"chat", "--model", "x", "--api-key", "k", "--message", "Hi"});
    QVERIFY2(key_alone.err.find("--api-key needs --backend URL") != std::string::npos, key_alone.err.c_str());
  }
};

KVCHAT_TEST_GUILESS_MAIN(CliChatRemoteTest)

}  // namespace app_test_cli_chat_remote

#include "test_cli_chat_remote.moc"
