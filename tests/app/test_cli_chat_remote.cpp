// kvchat-cli chat --backend URL against a `kvchat-cli serve` started here: the reply streamed to stdout
// equals the server's own non-streamed answer, the stored reply records server, model and the server's
// figures, a second turn continues the stored conversation, and a refused key, a server that is down and
// local-only options give clear errors with nothing stored.
#include <QFile>
#include <QProcess>
#include <QTemporaryDir>
#include <QThread>
#include <QtTest>
#include "common/test_suite.h"

#include <nlohmann/json.hpp>

#include <csignal>

#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "common/cli_runner.h"
#include "common/cutting_proxy.h"
#include "common/scripted_server.h"
#include "common/server_process.h"
#include "common/terminal_cli_runner.h"
#include "common/test_paths.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_chat_remote {

using kvchat::app::ConversationStore;
using kvchat::app::StoreOpenMode;
using kvchat::test::CliResult;
using kvchat::test::content_event;
using kvchat::test::run_cli;
using kvchat::test::ScriptedConnection;
using kvchat::test::ScriptedServer;
using nlohmann::json;

namespace {
const char* kApiKey = "cli-remote-key";

const std::string kFinish =
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

// kvchat-cli chat against a scripted server, one turn: the arguments after --db, --message.
QStringList scripted_chat(const ScriptedServer& server, const QString& db, const QStringList& more = {}) {
  return QStringList{"chat", "--backend", server.base_url(), "--remote-model", "m", "--db", db, "--message", "Hi"} +
         more;
}

// The reply of the first conversation's first turn.
kvchat::app::MessageRecord stored_reply(const QString& db) {
  ConversationStore store(db, StoreOpenMode::ReadOnly);
  const auto messages = store.messages(store.conversations().first().id);
  return messages.size() == 2 ? messages[1] : kvchat::app::MessageRecord{};
}

QByteArray file_bytes(const QString& path) {
  QFile file(path);
  return file.open(QIODevice::ReadOnly) ? file.readAll() : QByteArray();
}
}  // namespace

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
    const kvchat::test::HttpReply whole = kvchat::test::post_json(
        client, "/v1/chat/completions", request.dump(), {{"Authorization", std::string("Bearer ") + kApiKey}});
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
    const CliResult second =
        run_cli({"chat", "--backend", base_url(), "--db", db, "--conversation",
                 QString::number(conversations.first().id), "--message", "The end", "--max-new-tokens", "10"});
    qunsetenv("KVCHAT_API_KEY");
    QVERIFY2(second.exit_code == 0, second.err.c_str());
    QVERIFY2(second.err.find(" cached on the server") != std::string::npos, second.err.c_str());
    QCOMPARE(store.messages(conversations.first().id).size(), 4);
  }

  void refused_key_and_unreachable_server_store_nothing() {
    const QString db = dir_.filePath("errors.sqlite3");
    const CliResult refused =
        run_cli({"chat", "--backend", base_url(), "--api-key", "wrong", "--db", db, "--message", "Hi"});
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
    const CliResult cut =
        run_cli({"chat", "--backend", QStringLiteral("http://127.0.0.1:%1/v1").arg(relay.port()), "--remote-model",
                 "stories260K", "--db", db, "--message", "Once upon a time", "--max-new-tokens", "100000"});
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

  // An endless stream is read up to the text max_tokens can make (64 KiB + 256 bytes a token), then the turn
  // ends as failed with the text within the bound kept.
  void endless_reply_is_bounded() {
    ScriptedServer server;
    const std::string piece(1000, 'x');
    QVERIFY(server.start([&](ScriptedConnection& connection) {
      if (!connection.send_head("200 OK")) return;
      while (connection.send(content_event(piece))) {
      }
    }));
    const QString db = dir_.filePath("endless.sqlite3");
    const CliResult result = run_cli(scripted_chat(server, db, {"--max-new-tokens", "4"}), {}, 60000);
    QCOMPARE(result.exit_code, 1);
    QVERIFY2(result.err.find("kvchat-cli chat: the reply from " + server.base_url().toStdString() +
                             " was ended: the reply passed 65 KiB of text, more than the requested tokens can make: "
                             "the server did not stop. The text so far is kept; Regenerate to ask again\n") !=
                 std::string::npos,
             result.err.c_str());
    QCOMPARE(result.out, std::string(66000, 'x') + "\n");
    const kvchat::app::MessageRecord reply = stored_reply(db);
    QCOMPARE(reply.text.toStdString(), std::string(66000, 'x'));
    QVERIFY(kvchat::app::is_failed_reply(reply));
    QCOMPARE(reply.stats.value("interrupted").toBool(), true);
  }

  // Events without text, a line that never ends and a gzip bomb: each bounded, each a clear failure.
  void floods_are_bounded() {
    enum class Flood { KeepAlives, EndlessLine, GzipBomb };
    for (const Flood flood : {Flood::KeepAlives, Flood::EndlessLine, Flood::GzipBomb}) {
      ScriptedServer server;
      QVERIFY(server.start([flood](ScriptedConnection& connection) {
        const std::string keep_alives = std::string(": keep-alive\n").append(std::string(4096, '\n'));
        if (flood == Flood::GzipBomb) return kvchat::test::send_gzip_bomb(connection, keep_alives);
        if (!connection.send_head("200 OK")) return;
        if (flood == Flood::EndlessLine) {
          connection.send("data: {\"choices\":[{\"delta\":{\"content\":\"");
          while (connection.send(std::string(65536, 'x'))) {
          }
        }
        while (connection.send(keep_alives)) {
        }
      }));
      const QString db = dir_.filePath(QStringLiteral("flood-%1.sqlite3").arg(static_cast<int>(flood)));
      const CliResult result = run_cli(scripted_chat(server, db, {"--max-new-tokens", "4"}), {}, 60000);
      QCOMPARE(result.exit_code, 1);
      const std::string expected =
          flood == Flood::EndlessLine
              ? "the server sent more than 1 MiB without a line break, more than a line of the event stream may have"
              : "the server sent more than 4112 KiB for one reply of at most 65 KiB of text";
      QVERIFY2(result.err.find("kvchat-cli chat: the server at " + server.base_url().toStdString() +
                               " sent no text: " + expected + "\n") != std::string::npos,
               result.err.c_str());
      QVERIFY(kvchat::app::is_failed_reply(stored_reply(db)));
    }
  }

  // One event nested 100,000 deep (the parser's depth ends stack overflows wherever it is printed), in the
  // stream and in the /models answer: a clear failure, the text before it kept.
  void deeply_nested_json_fails_the_turn() {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    ScriptedServer server;
    QVERIFY(server.start([&](ScriptedConnection& connection) {
      if (connection.is_models_request()) {
        connection.send_head("200 OK", "Content-Type: application/json\r\n");
        connection.send(R"({"object":"list","detail":)" + deep + "}");
        return;
      }
      if (!connection.send_head("200 OK")) return;
      connection.send(content_event("Hello") + R"(data: {"error":{"code":1},"detail":)" + deep + "}\n\n" + kFinish);
    }));
    const QString db = dir_.filePath("deep.sqlite3");
    const CliResult streamed = run_cli(scripted_chat(server, db), {}, 60000);
    QCOMPARE(streamed.exit_code, 1);
    QVERIFY2(streamed.err.find("the reply from " + server.base_url().toStdString() +
                               " was ended: the server sent an event of JSON nested more than 64 levels deep. The "
                               "text so far is kept") != std::string::npos,
             streamed.err.c_str());
    QCOMPARE(streamed.out, std::string("Hello\n"));
    QCOMPARE(stored_reply(db).text, QStringLiteral("Hello"));
    QVERIFY(kvchat::app::is_failed_reply(stored_reply(db)));

    const CliResult models = run_cli(
        {"chat", "--backend", server.base_url(), "--db", dir_.filePath("deep-models.sqlite3"), "--message", "Hi"}, {},
        60000);
    QCOMPARE(models.exit_code, 1);
    QVERIFY2(models.err.find("the server at " + server.base_url().toStdString() +
                             " answered /models with JSON nested more than 64 levels deep\n") != std::string::npos,
             models.err.c_str());
  }

  // A server that answers nothing (before its headers, or after some text): the idle timeout ends the turn.
  // One that never stops trickling: the reply timeout does. Each keeps what arrived.
  void timeouts_end_a_turn_and_keep_its_text() {
    ScriptedServer silent;
    QVERIFY(silent.start([](ScriptedConnection& connection) { connection.wait_for_client_to_go(); }));
    const QString db = dir_.filePath("timeouts.sqlite3");
    const CliResult unanswered = run_cli(scripted_chat(silent, db, {"--idle-timeout", "1"}), {}, 60000);
    QCOMPARE(unanswered.exit_code, 1);
    QVERIFY2(unanswered.err.find("kvchat-cli chat: the server at " + silent.base_url().toStdString() +
                                 " did not answer: it sent nothing for 1 s (the idle timeout: Settings > Backend, "
                                 "--idle-timeout)\n") != std::string::npos,
             unanswered.err.c_str());

    ScriptedServer stalls;
    QVERIFY(stalls.start([](ScriptedConnection& connection) {
      if (connection.send_head("200 OK") && connection.send(content_event("Once upon")))
        connection.wait_for_client_to_go();
    }));
    const QString stalled_db = dir_.filePath("stalled.sqlite3");
    const CliResult stalled = run_cli(scripted_chat(stalls, stalled_db, {"--idle-timeout", "1"}), {}, 60000);
    QCOMPARE(stalled.exit_code, 1);
    QVERIFY2(stalled.err.find("was ended: it sent nothing for 1 s (the idle timeout") != std::string::npos,
             stalled.err.c_str());
    QCOMPARE(stored_reply(stalled_db).text, QStringLiteral("Once upon"));
    QVERIFY(kvchat::app::is_failed_reply(stored_reply(stalled_db)));

    ScriptedServer trickles;
    QVERIFY(trickles.start([](ScriptedConnection& connection) {
      if (!connection.send_head("200 OK")) return;
      while (connection.send(content_event("x"))) QThread::msleep(20);
    }));
    const QString trickled_db = dir_.filePath("trickled.sqlite3");
    const CliResult trickled = run_cli(scripted_chat(trickles, trickled_db, {"--reply-timeout", "1"}), {}, 60000);
    QCOMPARE(trickled.exit_code, 1);
    QVERIFY2(trickled.err.find("was ended: the reply took longer than 1 s (the reply timeout: Settings > Backend, "
                               "--reply-timeout)") != std::string::npos,
             trickled.err.c_str());
    const QString kept = stored_reply(trickled_db).text;
    QVERIFY(!kept.isEmpty());
    QCOMPARE(kept, QString(kept.size(), QLatin1Char('x')));
    QCOMPARE(trickled.out, kept.toStdString() + "\n");

    const CliResult bad = run_cli({"chat", "--backend", silent.base_url(), "--idle-timeout", "0", "--message", "Hi"});
    QCOMPARE(bad.exit_code, 2);
    QVERIFY2(bad.err.find("--idle-timeout must be from 1 to 604800 seconds") != std::string::npos, bad.err.c_str());
  }

  // Ctrl-C during a remote turn is Stop: the connection closes, the text so far is stored as a stopped reply.
  void interrupt_stops_the_turn() {
    ScriptedServer server;
    QVERIFY(server.start([](ScriptedConnection& connection) {
      if (connection.send_head("200 OK") && connection.send(content_event("Once"))) connection.wait_for_client_to_go();
    }));
    const QString db = dir_.filePath("interrupted.sqlite3");
    QProcess process;
    process.start(QString::fromStdString(kvchat::test::build_dir()) + "/kvchat-cli", scripted_chat(server, db));
    QByteArray out;
    QVERIFY(QTest::qWaitFor(
        [&] {
          process.waitForReadyRead(50);
          out += process.readAllStandardOutput();
          return out.contains("Once");
        },
        60000));
    ::kill(static_cast<pid_t>(process.processId()), SIGINT);
    QVERIFY(process.waitForFinished(30000));
    out += process.readAllStandardOutput();
    const QByteArray err = process.readAllStandardError();
    QCOMPARE(process.exitStatus(), QProcess::NormalExit);
    QVERIFY2(process.exitCode() == 0, err.constData());
    QCOMPARE(out, QByteArray("Once\n"));
    QVERIFY2(err.contains("stop: stopped]"), err.constData());
    const kvchat::app::MessageRecord reply = stored_reply(db);
    QCOMPARE(reply.text, QStringLiteral("Once"));
    QVERIFY(reply.complete);
    QVERIFY(!kvchat::app::is_failed_reply(reply));
    QCOMPARE(reply.stats.value("stop_reason").toString(), QStringLiteral("stopped"));
  }

  // Counts that are no counts (1e300 would become INT_MIN; a string, a negative number) are refused, named,
  // and the client's own figures kept.
  void impossible_usage_is_refused() {
    ScriptedServer server;
    QVERIFY(server.start([](ScriptedConnection& connection) {
      if (!connection.send_head("200 OK")) return;
      connection.send(content_event("Hi") + content_event(" there") +
                      R"(data: {"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1e300,)"
                      R"("completion_tokens":"12"}})"
                      "\n\ndata: [DONE]\n\n");
    }));
    const QString db = dir_.filePath("usage.sqlite3");
    const CliResult result = run_cli(scripted_chat(server, db), {}, 60000);
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    QVERIFY2(result.err.find("kvchat-cli chat: warning: the server's figures are not used: usage.prompt_tokens is "
                             "1e+300, not a token count\n") != std::string::npos,
             result.err.c_str());
    const kvchat::app::MessageRecord reply = stored_reply(db);
    QCOMPARE(reply.text, QStringLiteral("Hi there"));
    QCOMPARE(reply.stats.value("prompt_tokens").toInt(), 0);
    QCOMPARE(reply.stats.value("generated_tokens").toInt(), 2);  // the chunks counted here
    QCOMPARE(reply.stats.value("rejected_figures").toString(),
             QStringLiteral("usage.prompt_tokens is 1e+300, not a token count"));
  }

  // A 401 that echoes the key, and a key in the base URL: never on stderr, never in the database.
  void api_key_is_never_shown_or_stored() {
    const std::string secret = "sk-cli-secret-0123456789";
    ScriptedServer server;
    QVERIFY(server.start([&](ScriptedConnection& connection) {
      connection.send_head("401 Unauthorized", "Content-Type: application/json\r\n");
      connection.send(R"({"error":{"message":"incorrect API key provided: )" + secret + R"("}})");
    }));
    const QString db = dir_.filePath("key.sqlite3");
    const CliResult refused =
        run_cli(scripted_chat(server, db, {"--api-key", QString::fromStdString(secret)}), {}, 60000);
    QCOMPARE(refused.exit_code, 1);
    QVERIFY2(refused.err.find("refused the API key (401): incorrect API key provided: [API key]. Set the right key") !=
                 std::string::npos,
             refused.err.c_str());
    QVERIFY2(server.last_request().find("Authorization: Bearer " + secret) != std::string::npos,
             server.last_request().c_str());
    QVERIFY(refused.err.find(secret) == std::string::npos);
    QVERIFY(!file_bytes(db).contains(QByteArray::fromStdString(secret)));
    QVERIFY(!file_bytes(db + "-wal").contains(QByteArray::fromStdString(secret)));
    QVERIFY(kvchat::app::is_failed_reply(stored_reply(db)));

    const QString with_credentials =
        QStringLiteral("http://user:%1@127.0.0.1:%2/v1").arg(QString::fromStdString(secret)).arg(server.port());
    const QString url_db = dir_.filePath("url-key.sqlite3");
    const CliResult url = run_cli({"chat", "--backend", with_credentials, "--db", url_db, "--message", "Hi"});
    QCOMPARE(url.exit_code, 2);
    const QString refused_url = QStringLiteral(
                                    "--backend: the server address 'http://***@127.0.0.1:%1/v1' has credentials in it "
                                    "(user:password@)")
                                    .arg(server.port());
    QVERIFY2(url.err.find(refused_url.toStdString()) != std::string::npos, url.err.c_str());
    QVERIFY(url.err.find(secret) == std::string::npos);
    QVERIFY(!QFile::exists(url_db));
  }

  // On a terminal a reply's escape sequences (a clipboard write, a cleared screen) are shown, not obeyed;
  // the database and a pipe get the text as it came.
  void reply_escapes_reach_a_terminal_as_text() {
    ScriptedServer server;
    QVERIFY(server.start([](ScriptedConnection& connection) {
      if (!connection.send_head("200 OK")) return;
      connection.send(content_event(R"(copy \u001b]52;c;aGk=\u0007 then \u009b2J)") + content_event("caf\xC3\xA9 ok") +
                      kFinish);
    }));
    const QString db = dir_.filePath("terminal.sqlite3");
    const CliResult shown = kvchat::test::run_cli_on_terminal(scripted_chat(server, db));
    QVERIFY2(shown.exit_code == 0, shown.err.c_str());
    QCOMPARE(shown.out, std::string("copy \\x1b]52;c;aGk=\\x07 then \\x9b2Jcaf\xC3\xA9 ok\n"));
    QCOMPARE(stored_reply(db).text, QStringLiteral("copy \x1b]52;c;aGk=\x07 then \u009b2Jcaf\u00e9 ok"));
    const CliResult piped = run_cli(scripted_chat(server, dir_.filePath("piped.sqlite3")), {}, 60000);
    QCOMPARE(piped.out, std::string("copy \x1b]52;c;aGk=\x07 then \xC2\x9B"
                                    "2Jcaf\xC3\xA9 ok\n"));
  }

  // Bytes that are not UTF-8 inside an event: its text is kept with U+FFFD in their place, and the reply marked.
  void invalid_utf8_is_kept_and_marked() {
    ScriptedServer server;
    QVERIFY(server.start([](ScriptedConnection& connection) {
      if (!connection.send_head("200 OK")) return;
      connection.send(content_event("Once ") + content_event("caf\xC3 \xFF ok") + kFinish);
    }));
    const QString db = dir_.filePath("utf8.sqlite3");
    const CliResult result = run_cli(scripted_chat(server, db), {}, 60000);
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    QVERIFY2(result.err.find("kvchat-cli chat: warning: the server sent bytes that are not UTF-8; they are shown and "
                             "stored as U+FFFD\n") != std::string::npos,
             result.err.c_str());
    const kvchat::app::MessageRecord reply = stored_reply(db);
    QCOMPARE(reply.text, QStringLiteral("Once caf\uFFFD \uFFFD ok"));
    QCOMPARE(reply.stats.value("invalid_utf8").toBool(), true);
  }
};

KVCHAT_TEST_GUILESS_MAIN(CliChatRemoteTest)

}  // namespace app_test_cli_chat_remote

#include "test_cli_chat_remote.moc"
