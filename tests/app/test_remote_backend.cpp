// The remote backend: a ChatController whose turns go to a `kvchat-cli serve` started here in another
// process (stories260K, greedy). The streamed reply equals the server's non-streamed answer to the same
// messages; the server's usage and cached_tokens land in the stored stats; the reply's row records the
// server and model; a wrong key gives the 401 message; a server killed mid-reply leaves the partial text
// stored and marked, and the next turn against a restarted server works; a broken pipe does not end the
// process. Also the store's migration of a version-1 database (messages.backend) and the API key kept
// out of the settings file and the database.
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <limits>
#include <mutex>
#include <thread>

#include "app/chat/reply_format.h"
#include "app/remote/remote_client.h"
#include "app/remote/remote_stream.h"
#include "app/remote/remote_worker.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "common/chat_fixture.h"
#include "common/cutting_proxy.h"
#include "common/raw_sqlite.h"
#include "common/scripted_server.h"
#include "common/server_process.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_remote_backend {

using kvchat::app::BackendKind;
using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::app::MessageRecord;
using kvchat::test::ChatFixture;
using kvchat::test::ServerProcess;
using nlohmann::json;

namespace {

const char* kApiKey = "remote-test-key";

QStringList serve_arguments() {
  return {"--model", kvchat::test::stories_model_directory(), "--api-key", kApiKey, "--threads", "1"};
}

QString base_url(const ServerProcess& server) { return QStringLiteral("http://127.0.0.1:%1/v1").arg(server.port()); }

ChatSettings remote_settings(const ServerProcess& server, int max_new_tokens = 40) {
  ChatSettings settings = kvchat::test::greedy_chat_settings(max_new_tokens);
  settings.backend = BackendKind::Remote;
  settings.remote_base_url = base_url(server);
  settings.remote_api_key = kApiKey;
  return settings;
}

MessageRecord last_message(ChatController* controller) { return controller->currentMessages().last(); }

// The window's settings for a scripted server (its model named, so that only the chat request is made).
ChatSettings scripted_settings(const kvchat::test::ScriptedServer& server) {
  ChatSettings settings = kvchat::test::greedy_chat_settings(4);
  settings.backend = BackendKind::Remote;
  settings.remote_base_url = server.base_url();
  settings.remote_model = QStringLiteral("m");
  return settings;
}

QByteArray file_bytes(const QString& path) {
  QFile file(path);
  return file.open(QIODevice::ReadOnly) ? file.readAll() : QByteArray();
}

// A chat with tool use and a JSON reply format, as a server is asked for it: the assistant's calls as an array
// (content null when it wrote none), the tool result with the call it answers, and response_format with the
// schema's properties in the chat's order.
void check_tool_use_and_reply_format_request() {
  kvchat::ChatMessage call{"assistant", ""};
  call.tool_calls = R"([{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}])";
  kvchat::ChatMessage result{"tool", "42"};
  result.tool_call_id = "call_1";
  result.name = "f";
  kvchat::app::ReplyFormat format;
  format.kind = kvchat::app::ReplyFormat::Kind::JsonSchema;
  format.schema = QStringLiteral(R"({"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {}}})");
  const std::string body = kvchat::app::chat_request_body("m", {{"user", "Hi"}, call, result},
                                                          kvchat::GenerationConfig{}, true, format.response_format());
  const json parsed = json::parse(body);
  QCOMPARE(parsed["messages"][1].dump(),
           std::string(R"({"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"f"},)"
                       R"("id":"call_1","type":"function"}]})"));
  QCOMPARE(parsed["messages"][2].dump(),
           std::string(R"({"content":"42","name":"f","role":"tool","tool_call_id":"call_1"})"));
  QVERIFY2(body.find(R"("response_format":{"type":"json_schema","json_schema":{"name":"reply","strict":true,)"
                     R"("schema":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{}}}}})") !=
               std::string::npos,
           body.c_str());
  kvchat::app::ReplyFormat any_object;
  any_object.kind = kvchat::app::ReplyFormat::Kind::JsonObject;
  QCOMPARE(json::parse(kvchat::app::chat_request_body("m", {{"user", "Hi"}}, kvchat::GenerationConfig{}, true,
                                                      any_object.response_format()))["response_format"]
               .dump(),
           std::string(R"({"type":"json_object"})"));
  QVERIFY(!json::parse(kvchat::app::chat_request_body("m", {{"user", "Hi"}}, kvchat::GenerationConfig{}))
               .contains("response_format"));
}

}  // namespace

class TestRemoteBackend : public QObject {
  Q_OBJECT

 private:
  ServerProcess server_;
  std::string model_id_;

  // The server's own non-streamed answer to `messages`, and its usage.
  json whole_answer(const std::vector<json>& messages, int max_tokens) {
    httplib::Client client = server_.client();
    const json body = {{"model", model_id_}, {"messages", messages}, {"temperature", 0}, {"max_tokens", max_tokens}};
    const kvchat::test::HttpReply reply = kvchat::test::post_json(
        client, "/v1/chat/completions", body.dump(), {{"Authorization", std::string("Bearer ") + kApiKey}});
    if (reply.status != 200) qWarning("non-streamed answer: %d %s", reply.status, reply.body.c_str());
    return reply.json();
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY2(server_.start(serve_arguments()), server_.log().c_str());
    const std::vector<std::string> models =
        kvchat::app::list_remote_models({base_url(server_).toStdString(), kApiKey, ""});
    QVERIFY(!models.empty());
    model_id_ = models.front();
  }

  void remote_turns_stream_store_stats_and_origin() {
    ChatFixture fixture;
    QVERIFY(fixture.open(remote_settings(server_)));
    ChatController* controller = fixture.controller();
    QVERIFY(controller->usesRemoteBackend());
    QVERIFY(controller->cacheGauge().on_server);
    QString streamed;
    connect(controller, &ChatController::replyTextAppended, this,
            [&](qint64, qint64, const QString& chunk) { streamed += chunk; });

    QVERIFY(controller->send(QStringLiteral("Once upon a time")));
    QVERIFY(fixture.waitIdle());
    const MessageRecord first = last_message(controller);
    const json expected = whole_answer({{{"role", "user"}, {"content", "Once upon a time"}}}, 40);
    QVERIFY(!first.text.isEmpty());
    QCOMPARE(first.text.toStdString(), expected["choices"][0]["message"]["content"].get<std::string>());
    QCOMPARE(streamed, first.text);
    {
      // The same greedy turn on this computer's engine gives the same text.
      ChatFixture local;
      QVERIFY(local.open(kvchat::test::greedy_chat_settings(40)));
      QVERIFY(local.controller()->send(QStringLiteral("Once upon a time")));
      QVERIFY(local.waitIdle());
      QCOMPARE(last_message(local.controller()).text, first.text);
      QCOMPARE(last_message(local.controller()).backend, QStringLiteral("local"));
    }
    QCOMPARE(first.backend, base_url(server_));
    QCOMPARE(first.model.toStdString(), model_id_);
    QVERIFY2(!kvchat::app::is_failed_reply(first), qPrintable(kvchat::app::reply_error(first)));
    QCOMPARE(first.stats.value("backend").toString(), QStringLiteral("remote"));
    QCOMPARE(first.stats.value("prompt_tokens").toInt(), expected["usage"]["prompt_tokens"].get<int>());
    QCOMPARE(first.stats.value("generated_tokens").toInt(), expected["usage"]["completion_tokens"].get<int>());
    QVERIFY(first.stats.contains("cached_tokens"));
    QCOMPARE(first.stats.value("figures").toString(), QStringLiteral("server"));  // kvchat serve sends timings

    // The second turn's history starts with the first's: the server reports the prefix it had cached.
    QVERIFY(controller->send(QStringLiteral("The end")));
    QVERIFY(fixture.waitIdle());
    const MessageRecord second = last_message(controller);
    QVERIFY2(!kvchat::app::is_failed_reply(second), qPrintable(kvchat::app::reply_error(second)));
    QVERIFY2(second.stats.value("cached_tokens").toInt() > 0, QJsonDocument(second.stats).toJson().constData());
    QCOMPARE(controller->cacheGauge().reused_tokens, second.stats.value("cached_tokens").toInt());

    // Exports say which server answered, and that its cache is its own.
    QTemporaryDir out;
    controller->exportConversation(controller->currentConversationId(), out.filePath("chat.md"),
                                   kvchat::app::ExportFormat::Markdown);
    QFile exported(out.filePath("chat.md"));
    QVERIFY(exported.open(QIODevice::ReadOnly));
    const QString markdown = QString::fromUtf8(exported.readAll());
    QVERIFY2(markdown.contains(QStringLiteral("%1 on %2 · ").arg(QString::fromStdString(model_id_), base_url(server_))),
             qPrintable(markdown));
    QVERIFY2(
        markdown.contains(
            QStringLiteral("cache on the server, %1 tokens cached").arg(second.stats.value("cached_tokens").toInt())),
        qPrintable(markdown));
  }

  void wrong_key_shows_the_401_message() {
    ChatFixture fixture;
    ChatSettings settings = remote_settings(server_);
    settings.remote_api_key = QStringLiteral("wrong-key");
    QVERIFY(fixture.open(settings));
    QSignalSpy failed(fixture.controller(), &ChatController::replyFailed);
    QVERIFY(fixture.controller()->send(QStringLiteral("Hello")));
    QVERIFY(fixture.waitIdle());
    QCOMPARE(failed.count(), 1);
    const QString message = failed.first().at(2).toString();
    QVERIFY2(
        message.startsWith(QStringLiteral("the server at %1 refused the API key (401): incorrect API key provided. ")
                               .arg(base_url(server_))),
        qPrintable(message));
    QCOMPARE(kvchat::app::reply_error(last_message(fixture.controller())), message);
  }

  void unreachable_server_is_a_clear_error() {
    ChatFixture fixture;
    ChatSettings settings = remote_settings(server_);
    settings.remote_base_url = QStringLiteral("http://127.0.0.1:1/v1");
    QVERIFY(fixture.open(settings));
    QSignalSpy failed(fixture.controller(), &ChatController::replyFailed);
    QVERIFY(fixture.controller()->send(QStringLiteral("Hello")));
    QVERIFY(fixture.waitIdle());
    QCOMPARE(failed.count(), 1);
    QCOMPARE(failed.first().at(2).toString(),
             QStringLiteral(
                 "cannot reach http://127.0.0.1:1/v1: connection refused (is the server running, on that port?)"));
  }

  void server_killed_mid_reply_keeps_the_partial_text() {
    ServerProcess doomed;
    QVERIFY2(doomed.start(serve_arguments()), doomed.log().c_str());
    // The client talks to the server through a relay that kills it (SIGKILL, from the relay's thread) as
    // soon as the first text has been passed on: the reply is cut at a known point.
    const qint64 doomed_pid = doomed.pid();
    kvchat::test::CuttingProxy relay;
    QVERIFY(relay.start(doomed.port(), [doomed_pid] { ::kill(static_cast<pid_t>(doomed_pid), SIGKILL); }));
    ChatFixture fixture;
    ChatSettings settings = remote_settings(doomed, 100000);  // the model's whole window
    settings.remote_base_url = QStringLiteral("http://127.0.0.1:%1/v1").arg(relay.port());
    settings.remote_model = QString::fromStdString(model_id_);
    QVERIFY(fixture.open(settings));
    ChatController* controller = fixture.controller();
    QSignalSpy failed(controller, &ChatController::replyFailed);
    QVERIFY(controller->send(QStringLiteral("Once upon a time")));
    QVERIFY(fixture.waitIdle());
    QVERIFY(relay.cut());
    QVERIFY(QTest::qWaitFor([&] { return !doomed.running(); }, 30000));
    QCOMPARE(failed.count(), 1);
    const MessageRecord partial = last_message(controller);
    QVERIFY(!partial.text.isEmpty());
    QVERIFY(partial.complete);
    QCOMPARE(partial.stats.value("interrupted").toBool(), true);
    QVERIFY2(kvchat::app::reply_error(partial).contains(QStringLiteral("broke off mid-reply")),
             qPrintable(kvchat::app::reply_error(partial)));
    // The same text the window showed is what the database holds after a reopen.
    fixture.close();

    ServerProcess restarted;
    QVERIFY2(restarted.start(serve_arguments()), restarted.log().c_str());
    QVERIFY(fixture.open(remote_settings(restarted)));
    controller = fixture.controller();
    QCOMPARE(last_message(controller).text, partial.text);
    QVERIFY(controller->regenerate());
    QVERIFY(fixture.waitIdle());
    const MessageRecord again = last_message(controller);
    QVERIFY2(!kvchat::app::is_failed_reply(again), qPrintable(kvchat::app::reply_error(again)));
    QVERIFY(!again.text.isEmpty());
    QCOMPARE(again.backend, base_url(restarted));
    QCOMPARE(controller->currentMessages().size(), 3);  // the user message, the interrupted reply, the new one
  }

  void stop_closes_the_connection() {
    ChatFixture fixture;
    ChatSettings settings = remote_settings(server_, 100000);
    // Stop is pressed (on the GUI thread, waited for) once the first text has been passed on and has reached
    // the controller (the client may read the relayed bytes only after a stop pressed at once, and then
    // rightly drops them); the rest of the stream follows only then, so the client sees its stop flag with
    // most of the reply still to come.
    ChatController* controller = nullptr;
    std::atomic<bool> text_arrived{false};
    kvchat::test::CuttingProxy relay;
    QVERIFY(relay.start(
        server_.port(),
        [&controller, &text_arrived] {
          for (int waited_ms = 0; !text_arrived && waited_ms < 20000; ++waited_ms)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          QMetaObject::invokeMethod(controller, &ChatController::stop, Qt::BlockingQueuedConnection);
        },
        /*keep_relaying=*/true));
    settings.remote_base_url = QStringLiteral("http://127.0.0.1:%1/v1").arg(relay.port());
    settings.remote_model = QString::fromStdString(model_id_);
    QVERIFY(fixture.open(settings));
    controller = fixture.controller();
    const QObject text_watch;  // ends the connection before text_arrived goes
    connect(controller, &ChatController::replyTextAppended, &text_watch, [&text_arrived] { text_arrived = true; });
    QVERIFY(controller->send(QStringLiteral("Once upon a time")));
    QVERIFY(fixture.waitIdle());
    QVERIFY(relay.cut());
    QVERIFY(text_arrived);
    const MessageRecord stopped = last_message(controller);
    QVERIFY2(!kvchat::app::is_failed_reply(stopped), qPrintable(kvchat::app::reply_error(stopped)));
    QCOMPARE(stopped.stats.value("stop_reason").toString(), QStringLiteral("stopped"));
    const std::string whole =
        whole_answer({{{"role", "user"}, {"content", "Once upon a time"}}}, 100000)["choices"][0]["message"]["content"];
    QVERIFY(!stopped.text.isEmpty());
    QVERIFY2(stopped.text.size() < QString::fromStdString(whole).size(), qPrintable(stopped.text));
    QVERIFY(QString::fromStdString(whole).startsWith(stopped.text));
  }

  void stop_before_the_first_token_closes_the_connection() {
    // A "server" that takes the connection and never answers, as one still reading a long prompt would.
    const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    QVERIFY(::bind(silent, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    QVERIFY(::listen(silent, 4) == 0);
    QVERIFY(::getsockname(silent, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    ChatFixture fixture;
    ChatSettings settings = remote_settings(server_);
    settings.remote_base_url = QStringLiteral("http://127.0.0.1:%1/v1").arg(ntohs(address.sin_port));
    settings.remote_model = QStringLiteral("any");
    QVERIFY(fixture.open(settings));
    QVERIFY(fixture.controller()->send(QStringLiteral("Hello")));
    fixture.controller()->stop();
    QVERIFY(fixture.waitIdle());
    ::close(silent);
    const MessageRecord reply = last_message(fixture.controller());
    QVERIFY2(!kvchat::app::is_failed_reply(reply), qPrintable(kvchat::app::reply_error(reply)));
    QCOMPARE(reply.stats.value("stop_reason").toString(), QStringLiteral("stopped"));
    QCOMPARE(reply.text, QString());
  }

  // A server that goes while a request is still being sent makes the client's next write raise
  // SIGPIPE, which ends a process by default (and QtTest reports it as a crash): this suite's remote
  // turns died so now and then when a stop closed the connection mid-request. Once a remote turn has
  // run, the signal is ignored and such a write is a failed request instead.
  void broken_pipe_does_not_end_the_app() {
    ChatFixture fixture;
    QVERIFY(fixture.open(remote_settings(server_, 4)));
    QVERIFY(fixture.controller()->send(QStringLiteral("Hello")));
    QVERIFY(fixture.waitIdle());
    QVERIFY2(!kvchat::app::is_failed_reply(last_message(fixture.controller())),
             qPrintable(kvchat::app::reply_error(last_message(fixture.controller()))));
    struct sigaction current {};
    QVERIFY(::sigaction(SIGPIPE, nullptr, &current) == 0);
    QVERIFY(current.sa_handler == SIG_IGN);
    QCOMPARE(::raise(SIGPIPE), 0);  // would end this process were the signal not ignored
  }

  void version_one_database_is_migrated() {
    QTemporaryDir dir;
    const QString path = dir.filePath("old.sqlite3");
    qint64 reply_id = 0;
    {
      kvchat::app::ConversationStore store(path);
      const qint64 conversation = store.create_conversation("Old chat");
      MessageRecord reply;
      reply.conversation_id = conversation;
      reply.role = kvchat::app::MessageRole::Assistant;
      reply.text = "kept";
      reply.model = "stories260K";
      reply_id = store.add_message(reply);
    }
    // What a version-1 file looks like: no backend column (nor the later token, pinned and branch columns), version 1.
    kvchat::test::raw_query(path, "ALTER TABLE messages DROP COLUMN backend");
    kvchat::test::raw_query(path, "ALTER TABLE messages DROP COLUMN token_ids");
    kvchat::test::raw_query(path, "ALTER TABLE messages DROP COLUMN token_vocabulary");
    kvchat::test::raw_query(path, "ALTER TABLE conversations DROP COLUMN pinned");
    kvchat::test::raw_query(path, "ALTER TABLE conversations DROP COLUMN generation_settings");
    kvchat::test::raw_query(path, "ALTER TABLE conversations DROP COLUMN reply_format");
    kvchat::test::raw_query(path, "ALTER TABLE messages DROP COLUMN branch");
    kvchat::test::raw_query(path, "ALTER TABLE messages DROP COLUMN forked_from");
    kvchat::test::raw_query(path, "DELETE FROM schema_version");
    kvchat::test::raw_query(path, "INSERT INTO schema_version (version) VALUES (1)");
    QCOMPARE(kvchat::test::raw_query(path, "SELECT count(*) FROM pragma_table_info('messages') WHERE name = 'backend'"),
             QStringLiteral("0"));
    {
      kvchat::app::ConversationStore reader(path, kvchat::app::StoreOpenMode::ReadOnly);
      QCOMPARE(reader.message(reply_id)->text, QStringLiteral("kept"));
      QCOMPARE(reader.message(reply_id)->backend, QString());
    }
    QCOMPARE(kvchat::test::raw_query(path, "SELECT max(version) FROM schema_version"), QStringLiteral("1"));
    {
      kvchat::app::ConversationStore store(path);
      QCOMPARE(kvchat::test::raw_query(path, "SELECT max(version) FROM schema_version"),
               QString::number(kvchat::app::ConversationStore::kSchemaVersion));
      QCOMPARE(store.message(reply_id)->text, QStringLiteral("kept"));
      QVERIFY(store.message(reply_id)->token_ids.empty());  // a reply from before its ids were kept
      QCOMPARE(store.message(reply_id)->model, QStringLiteral("stories260K"));
      store.set_message_origin(reply_id, "http://example:8000/v1", "big-model");
      QCOMPARE(store.message(reply_id)->backend, QStringLiteral("http://example:8000/v1"));
      QCOMPARE(store.message(reply_id)->model, QStringLiteral("big-model"));
    }
  }

  void api_key_stays_out_of_settings_and_database() {
    ChatFixture fixture;
    ChatSettings settings = remote_settings(server_);
    QVERIFY(fixture.open(settings));
    QVERIFY(fixture.controller()->send(QStringLiteral("Hi")));
    QVERIFY(fixture.waitIdle());
    fixture.close();
    const QString key_file = fixture.path("kvchat-api-key");
    QFile key(key_file);
    QVERIFY(key.open(QIODevice::ReadOnly));
    QCOMPARE(key.readAll(), QByteArray(kApiKey));
    QCOMPARE(key.permissions() &
                 (QFileDevice::ReadGroup | QFileDevice::ReadOther | QFileDevice::WriteGroup | QFileDevice::WriteOther),
             QFileDevice::Permissions());
    QFile ini(fixture.path("kvchat.ini"));
    QVERIFY(ini.open(QIODevice::ReadOnly));
    QVERIFY(!ini.readAll().contains(kApiKey));
    QFile database(fixture.databasePath());
    QVERIFY(database.open(QIODevice::ReadOnly));
    QVERIFY(!database.readAll().contains(kApiKey));
    QSettings reread(fixture.path("kvchat.ini"), QSettings::IniFormat);
    QCOMPARE(ChatSettings::load(reread).remote_api_key, QString::fromLatin1(kApiKey));
  }

  // One event nested 100,000 deep used to end the whole window (a stack overflow where it was printed): the
  // turn fails with the reason, its text so far kept in a finished row, and the window goes on.
  void deeply_nested_event_fails_the_turn_not_the_app() {
    kvchat::test::ScriptedServer server;
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    QVERIFY(server.start([&](kvchat::test::ScriptedConnection& connection) {
      if (connection.send_head("200 OK"))
        connection.send(kvchat::test::content_event("Hello") + R"(data: {"error":{"code":1},"detail":)" + deep +
                        "}\n\n");
    }));
    ChatFixture fixture;
    QVERIFY(fixture.open(scripted_settings(server)));
    ChatController* controller = fixture.controller();
    QSignalSpy failed(controller, &ChatController::replyFailed);
    QVERIFY(controller->send(QStringLiteral("Hi")));
    QVERIFY(fixture.waitIdle());
    QCOMPARE(failed.count(), 1);
    const QString message = failed.first().at(2).toString();
    QCOMPARE(message, QStringLiteral("the reply from %1 was ended: the server sent an event of JSON nested more "
                                     "than 64 levels deep. The text so far is kept; Regenerate to ask again")
                          .arg(server.base_url()));
    const MessageRecord reply = last_message(controller);
    QCOMPARE(reply.text, QStringLiteral("Hello"));
    QVERIFY(reply.complete);
    QCOMPARE(reply.stats.value("interrupted").toBool(), true);
    QCOMPARE(kvchat::app::reply_error(reply), message);
  }

  // The depth limit counts brackets of the JSON, not brackets inside its strings: 64 levels are read, 65 are
  // refused, and a string of brackets (escaped quotes included) is text.
  void server_json_depth_counts_only_the_structure() {
    using kvchat::app::parse_server_json;
    const auto nested = [](int depth, const std::string& inside) {
      std::string text;
      for (int i = 0; i < depth; ++i) text += i % 2 ? "[" : "{\"k\":";
      text += inside;
      for (int i = depth - 1; i >= 0; --i) text += i % 2 ? "]" : "}";
      return text;
    };
    std::string problem;
    QVERIFY(!parse_server_json(nested(64, "1"), &problem).is_discarded());
    QVERIFY(parse_server_json(nested(65, "1"), &problem).is_discarded());
    QCOMPARE(problem, std::string("JSON nested more than 64 levels deep"));
    const std::string brackets = "\"\\\"" + std::string(200, '[') + "\\\\\"";  // "\"[[[...\\"
    problem.clear();
    const nlohmann::json text = parse_server_json(nested(64, brackets), &problem);
    QVERIFY2(!text.is_discarded(), problem.c_str());
    QVERIFY(parse_server_json("[[1]", &problem).is_discarded());
    QCOMPARE(problem, std::string("not JSON"));
    QVERIFY(parse_server_json(std::string(70, '['), &problem).is_discarded());
    QCOMPARE(problem, std::string("JSON nested more than 64 levels deep"));
  }

  // Settings > Backend's idle timeout: a server that goes silent mid-reply ends the turn after it, the text
  // kept; the setting survives a save and a load.
  void idle_timeout_comes_from_the_settings() {
    kvchat::test::ScriptedServer server;
    QVERIFY(server.start([](kvchat::test::ScriptedConnection& connection) {
      if (connection.send_head("200 OK") && connection.send(kvchat::test::content_event("Once upon")))
        connection.wait_for_client_to_go();
    }));
    ChatFixture fixture;
    ChatSettings settings = scripted_settings(server);
    settings.remote_idle_timeout_s = 1;
    settings.remote_reply_timeout_s = 120;
    QVERIFY(fixture.open(settings));
    QSettings saved(fixture.path("kvchat.ini"), QSettings::IniFormat);
    QCOMPARE(ChatSettings::load(saved).remote_idle_timeout_s, 1);
    QCOMPARE(ChatSettings::load(saved).remote_reply_timeout_s, 120);
    QSignalSpy failed(fixture.controller(), &ChatController::replyFailed);
    QVERIFY(fixture.controller()->send(QStringLiteral("Hi")));
    QVERIFY(fixture.waitIdle());
    QCOMPARE(failed.count(), 1);
    QCOMPARE(failed.first().at(2).toString(),
             QStringLiteral("the reply from %1 was ended: it sent nothing for 1 s (the idle timeout: Settings > "
                            "Backend, --idle-timeout). The text so far is kept; Regenerate to ask again")
                 .arg(server.base_url()));
    QCOMPARE(last_message(fixture.controller()).text, QStringLiteral("Once upon"));
  }

  // A 401 that echoes the key, and credentials in the base URL: neither reaches the window's error nor the
  // chats' database.
  void api_key_echo_and_url_credentials_are_redacted() {
    const QString secret = QStringLiteral("sk-window-secret-0123456789");
    kvchat::test::ScriptedServer server;
    QVERIFY(server.start([&](kvchat::test::ScriptedConnection& connection) {
      connection.send_head("401 Unauthorized", "Content-Type: application/json\r\n");
      connection.send(R"({"error":{"message":"incorrect API key provided: )" + secret.toStdString() + R"("}})");
    }));
    ChatFixture fixture;
    ChatSettings settings = scripted_settings(server);
    settings.remote_api_key = secret;
    QVERIFY(fixture.open(settings));
    QSignalSpy failed(fixture.controller(), &ChatController::replyFailed);
    QVERIFY(fixture.controller()->send(QStringLiteral("Hi")));
    QVERIFY(fixture.waitIdle());
    QCOMPARE(failed.count(), 1);
    QCOMPARE(failed.first().at(2).toString(),
             QStringLiteral("the server at %1 refused the API key (401): incorrect API key provided: [API key]. "
                            "Set the right key in Settings > Backend, --api-key or KVCHAT_API_KEY")
                 .arg(server.base_url()));

    settings.remote_api_key.clear();
    settings.remote_base_url = QStringLiteral("http://user:%1@127.0.0.1:%2/v1").arg(secret).arg(server.port());
    fixture.close();
    QVERIFY(fixture.open(settings));
    QVERIFY(fixture.controller()->send(QStringLiteral("Hi again")));
    QVERIFY(fixture.waitIdle());
    const MessageRecord reply = last_message(fixture.controller());
    QCOMPARE(reply.backend, QStringLiteral("http://***@127.0.0.1:%1/v1").arg(server.port()));
    const QString refused =
        QStringLiteral("the server address 'http://***@127.0.0.1:%1/v1' has credentials in it").arg(server.port());
    QVERIFY2(kvchat::app::reply_error(reply).startsWith(refused), qPrintable(kvchat::app::reply_error(reply)));
    fixture.close();
    for (const QString& file : {fixture.databasePath(), fixture.databasePath() + "-wal"})
      QVERIFY2(!file_bytes(file).contains(secret.toUtf8()), qPrintable(file));
  }

  // A key file left readable by others (an older version, a copy, a umask) is made owner-only: when the
  // settings are saved, and when they are loaded.
  void key_file_is_made_owner_only() {
    QTemporaryDir dir;
    QSettings ini(dir.filePath("kvchat.ini"), QSettings::IniFormat);
    const QString key_path = ChatSettings::api_key_path(ini);
    const QFileDevice::Permissions others =
        QFileDevice::ReadGroup | QFileDevice::ReadOther | QFileDevice::WriteGroup | QFileDevice::WriteOther;
    auto write_readable_key = [&] {
      QFile key(key_path);
      QVERIFY(key.open(QIODevice::WriteOnly | QIODevice::Truncate));
      key.write("old-key");
      key.close();
      QVERIFY(key.setPermissions(QFileDevice::ReadOwner | QFileDevice::WriteOwner | QFileDevice::ReadGroup |
                                 QFileDevice::ReadOther));
      QVERIFY((QFile(key_path).permissions() & others) != QFileDevice::Permissions());
    };
    write_readable_key();
    QCOMPARE(ChatSettings::load(ini).remote_api_key, QStringLiteral("old-key"));
    QCOMPARE(QFile(key_path).permissions() & others, QFileDevice::Permissions());
    write_readable_key();
    ChatSettings settings;
    settings.remote_api_key = QStringLiteral("new-key");
    settings.save(ini);
    QCOMPARE(QFile(key_path).permissions() & others, QFileDevice::Permissions());
    QCOMPARE(ChatSettings::load(ini).remote_api_key, QStringLiteral("new-key"));
  }

  // The settings OpenAI's API lacks go out as vLLM and llama-server spell them; a server that refuses them
  // (OpenAI answers 400 naming the field) gets the turn again without them, and not again after that.
  void sampling_extensions_are_sent_and_dropped_for_a_server_that_refuses_them() {
    std::mutex mutex;
    std::vector<json> bodies;
    kvchat::test::ScriptedServer server;
    QVERIFY(server.start([&](kvchat::test::ScriptedConnection& connection) {
      const std::string& request = connection.request();
      const json body = json::parse(request.substr(request.find("\r\n\r\n") + 4), nullptr, false);
      {
        std::lock_guard<std::mutex> lock(mutex);
        bodies.push_back(body);
      }
      if (body.contains("top_k")) {
        connection.send_head("400 Bad Request", "Content-Type: application/json\r\n");
        connection.send(
            R"({"error":{"message":"Unrecognized request argument supplied: top_k","type":"invalid_request_error"}})");
        return;
      }
      if (connection.send_head("200 OK")) connection.send(kvchat::test::content_event("Hello") + "data: [DONE]\n\n");
    }));
    ChatFixture fixture;
    ChatSettings settings = scripted_settings(server);
    settings.temperature = 0.7;
    settings.top_k = 40;
    settings.top_p = 0.9;
    settings.min_p = 0.05;
    settings.repetition_penalty = 1.1;
    settings.seed = 1234;
    QVERIFY(fixture.open(settings));
    QVERIFY(fixture.controller()->send(QStringLiteral("Hi")));
    QVERIFY(fixture.waitIdle());
    const MessageRecord reply = last_message(fixture.controller());
    QVERIFY2(!kvchat::app::is_failed_reply(reply), qPrintable(kvchat::app::reply_error(reply)));
    QCOMPARE(reply.text, QStringLiteral("Hello"));
    QCOMPARE(reply.stats.value("unsent_settings").toString(), QStringLiteral("top-k, min-p, repetition penalty"));
    std::lock_guard<std::mutex> lock(mutex);
    QCOMPARE(bodies.size(), std::size_t{2});
    QCOMPARE(bodies[0]["top_k"].get<int>(), 40);
    QCOMPARE(bodies[0]["min_p"].get<float>(), 0.05f);
    QCOMPARE(bodies[0]["repetition_penalty"].get<float>(), 1.1f);
    QCOMPARE(bodies[0]["repeat_penalty"].get<float>(), 1.1f);
    QCOMPARE(bodies[0]["repeat_last_n"].get<int>(), kvchat::SamplingParams{}.repetition_window);
    QCOMPARE(bodies[0]["top_p"].get<float>(), 0.9f);
    QCOMPARE(bodies[0]["seed"].get<std::int64_t>(), 1234);
    for (const char* field : {"top_k", "min_p", "repetition_penalty", "repeat_penalty", "repeat_last_n"})
      QVERIFY2(!bodies[1].contains(field), field);
    QCOMPARE(bodies[1]["top_p"].get<float>(), 0.9f);
    QCOMPARE(bodies[1]["messages"], bodies[0]["messages"]);
  }

  // vLLM's schema takes a seed as a signed 64-bit number: a turn's drawn seed (setting 0) and a set one stay
  // within it.
  void seeds_stay_within_the_signed_64_bit_range() {
    ChatSettings settings;
    settings.seed = 0;
    // Half of all 64-bit draws are above 2^63 - 1: two hundred in range do not happen by chance.
    for (int i = 0; i < 200; ++i) {
      const std::uint64_t seed = settings.to_generation_config().sampling.seed;
      QVERIFY2(seed >= 1 && seed <= ChatSettings::kMaxSeed, qPrintable(QString::number(seed)));
    }
    settings.seed = std::numeric_limits<quint64>::max();
    QCOMPARE(settings.to_generation_config().sampling.seed, ChatSettings::kMaxSeed);
    {
      QTemporaryDir dir;
      QSettings ini(dir.filePath("kvchat.ini"), QSettings::IniFormat);
      ini.setValue("chat/seed", QStringLiteral("17958220492697838977"));
      QCOMPARE(ChatSettings::load(ini).seed, ChatSettings::kMaxSeed);
    }
    kvchat::GenerationConfig generation;
    generation.sampling.temperature = 0.5f;
    generation.sampling.seed = 17958220492697838977ULL;
    const json body = json::parse(kvchat::app::chat_request_body("m", {{"user", "Hi"}}, generation));
    QVERIFY(body["seed"].is_number_integer());
    QVERIFY(!body["seed"].is_number_unsigned() || body["seed"].get<std::uint64_t>() <= kvchat::app::kMaxRemoteSeed);
    QCOMPARE(body["seed"].get<std::int64_t>(),
             static_cast<std::int64_t>(17958220492697838977ULL & kvchat::app::kMaxRemoteSeed));
    QCOMPARE(body.dump().find("17958220492697838977"), std::string::npos);
  }

  void the_request_carries_tool_use_and_the_reply_format() { check_tool_use_and_reply_format_request(); }
};

KVCHAT_TEST_GUILESS_MAIN(TestRemoteBackend)

}  // namespace app_test_remote_backend

#include "test_remote_backend.moc"
