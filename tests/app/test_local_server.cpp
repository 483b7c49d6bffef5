// The desktop app's "Serve the loaded model on localhost:PORT" through ChatController, as the settings
// dialog applies it: turned on, it answers HTTP with the greedy text of `kvchat-cli generate` while the
// app's own chat runs beside it; turned off, its port is closed; a port in use is a clear error, and so
// are threads the machine cannot start; a model switch restarts it on the new model. Its API key is kept
// in an owner-only file of its own, never in the settings file. stories260K, greedy.
#include <QSignalSpy>
#include <QtTest>
#include "common/test_suite.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <QFile>
#include <QTemporaryDir>

#include <thread>

#include "app/server/local_server.h"
#include "common/address_space_headroom.h"
#include "common/chat_fixture.h"
#include "common/cli_runner.h"
#include "common/server_process.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_local_server {

using kvchat::app::LocalServer;
using kvchat::app::LocalServerSettings;
using kvchat::test::HttpReply;
using nlohmann::json;

namespace {

constexpr int kMaxTokens = 40;

LocalServerSettings serve_on(int port, const QString& api_key = {}) {
  LocalServerSettings settings;
  settings.enabled = true;
  settings.port = port;
  settings.api_key = api_key;
  return settings;
}

HttpReply post_chat(int port, const std::string& model, const std::string& text) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(300, 0);
  const json body = {{"model", model},
                     {"temperature", 0},
                     {"max_tokens", kMaxTokens},
                     {"messages", {{{"role", "user"}, {"content", text}}}}};
  return kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
}

bool port_answers(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5, 0);
  return static_cast<bool>(client.Get("/health"));
}

}  // namespace

class TestLocalServer : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void serves_beside_the_chat_and_closes_its_port() {
    kvchat::test::ChatFixture fixture;
    QVERIFY(fixture.open(kvchat::test::greedy_chat_settings(kMaxTokens)));
    kvchat::app::ChatController* controller = fixture.controller();
    LocalServer& server = controller->localServerHost().server();
    QVERIFY(!server.isServing());  // off by default
    QSignalSpy serving(&server, &LocalServer::servingChanged);
    controller->localServerHost().applySettings(serve_on(0));
    QVERIFY(server.isServing());
    QCOMPARE(serving.count(), 1);
    QCOMPARE(serving[0][1].toString(), QString("http://127.0.0.1:%1").arg(server.port()));

    // An HTTP client and the app's own chat at once.
    HttpReply reply;
    std::thread client([&] { reply = post_chat(server.port(), "stories260K", "Once upon a time"); });
    QVERIFY(controller->send("Once upon a time"));
    QVERIFY(fixture.waitIdle());
    client.join();
    QCOMPARE(reply.status, 200);
    const std::string served = reply.json()["choices"][0]["message"]["content"];
    const auto generated =
        kvchat::test::run_cli({"generate", "--model", kvchat::test::stories_model_directory(), "--prompt",
                               "Once upon a time", "--max-new-tokens", QString::number(kMaxTokens), "--json"});
    QCOMPARE(generated.exit_code, 0);
    QCOMPARE(served, json::parse(generated.out)["generated_text"].get<std::string>());
    QCOMPARE(controller->currentMessages().last().text.toStdString(), served);

    const int port = server.port();
    LocalServerSettings off = serve_on(port);
    off.enabled = false;
    controller->localServerHost().applySettings(off);
    QVERIFY(!server.isServing());
    QCOMPARE(serving.count(), 2);
    QCOMPARE(serving[1][0].toBool(), false);
    QVERIFY(!port_answers(port));
  }

  void port_in_use_is_a_clear_error() {
    const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    QCOMPARE(::bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    QCOMPARE(::listen(taken, 1), 0);
    socklen_t length = sizeof address;
    QCOMPARE(::getsockname(taken, reinterpret_cast<sockaddr*>(&address), &length), 0);
    const int port = ntohs(address.sin_port);

    kvchat::test::ChatFixture fixture;
    QVERIFY(fixture.open(kvchat::test::greedy_chat_settings(kMaxTokens)));
    LocalServer& server = fixture.controller()->localServerHost().server();
    QSignalSpy failed(&server, &LocalServer::failed);
    fixture.controller()->localServerHost().applySettings(serve_on(port));
    ::close(taken);
    QVERIFY(!server.isServing());
    QCOMPARE(failed.count(), 1);
    const QString message = failed[0][0].toString();
    QVERIFY2(message.contains(QString("localhost:%1").arg(port)) && message.contains("cannot bind"),
             qPrintable(message));
  }

  void model_switch_restarts_on_the_new_model() {
    kvchat::test::ChatFixture fixture;
    QVERIFY(fixture.open(kvchat::test::greedy_chat_settings(kMaxTokens)));
    kvchat::app::ChatController* controller = fixture.controller();
    controller->localServerHost().applySettings(serve_on(0, "key-1"));
    LocalServer& server = controller->localServerHost().server();
    QVERIFY(server.isServing());
    QSignalSpy serving(&server, &LocalServer::servingChanged);
    QSignalSpy loaded(&controller->backendHost(), &kvchat::app::BackendHost::modelLoaded);
    const QString gguf = QString::fromStdString(kvchat::test::shared_path("fixtures/gguf/stories260K-Q8_0.gguf"));
    controller->loadModel(gguf);
    QCOMPARE(serving.count(), 1);  // stopped while the model loads
    QCOMPARE(serving[0][0].toBool(), false);
    QVERIFY(loaded.wait(60000));
    QCOMPARE(serving.count(), 2);
    QVERIFY(server.isServing());
    httplib::Client client("127.0.0.1", server.port());
    auto models = client.Get("/v1/models", {{"Authorization", "Bearer key-1"}});
    QVERIFY(models);
    QCOMPARE(models->status, 200);
    QCOMPARE(json::parse(models->body)["data"][0]["id"].get<std::string>(), std::string("stories260K-Q8_0.gguf"));
  }

  // The server's threads cannot all start (little address space left, as under a memory limit with
  // many compute threads): the app goes on, and says why it is not serving.
  void threads_that_cannot_start_are_a_clear_error() {
    kvchat::test::ChatFixture fixture;
    QVERIFY(fixture.open(kvchat::test::greedy_chat_settings(kMaxTokens)));
    LocalServer& server = fixture.controller()->localServerHost().server();
    QSignalSpy failed(&server, &LocalServer::failed);
    {
      kvchat::test::AddressSpaceHeadroom headroom(std::size_t(64) << 20);
      if (!headroom.active()) QSKIP("the address space cannot be capped here (sanitized build)");
      fixture.controller()->localServerHost().applySettings(serve_on(0));
    }
    QVERIFY(!server.isServing());
    QCOMPARE(failed.count(), 1);
    const QString message = failed[0][0].toString();
    QVERIFY2(message.startsWith("Cannot serve the model on localhost:0: cannot start the server's ") &&
                 message.contains(" threads ("),
             qPrintable(message));
    // With room again, the same settings serve.
    fixture.controller()->localServerHost().applySettings(serve_on(0));
    QVERIFY(server.isServing());
    QVERIFY(port_answers(server.port()));
  }

  // The key is written to kvchat-server-api-key beside the settings file, owner-only, and never to the
  // settings file; a key an older version left in the settings file is moved out when it is read.
  void api_key_is_kept_out_of_the_settings_file() {
    QTemporaryDir dir;
    const QString ini_path = dir.filePath("kvchat.ini");
    const QString key_path = dir.filePath("kvchat-server-api-key");
    auto file_text = [](const QString& path) {
      QFile file(path);
      return file.open(QIODevice::ReadOnly) ? QString::fromUtf8(file.readAll()) : QString();
    };
    auto mode = [](const QString& path) {
      struct stat status {};
      return ::stat(QFile::encodeName(path).constData(), &status) == 0 ? (status.st_mode & 0777) : 0u;
    };
    {
      QSettings ini(ini_path, QSettings::IniFormat);
      QCOMPARE(LocalServerSettings::api_key_path(ini), key_path);
      serve_on(9090, "sk-local-123").save(ini);
    }
    QVERIFY2(!file_text(ini_path).contains("sk-local-123"), qPrintable(file_text(ini_path)));
    QCOMPARE(file_text(key_path), QString("sk-local-123"));
    QCOMPARE(mode(key_path), 0600u);
    {
      QSettings ini(ini_path, QSettings::IniFormat);
      QCOMPARE(LocalServerSettings::load(ini).api_key, QString("sk-local-123"));
    }

    // As older versions wrote it: the key in the settings file, no key file.
    QVERIFY(QFile::remove(key_path));
    {
      QFile ini(ini_path);
      QVERIFY(ini.open(QIODevice::WriteOnly | QIODevice::Truncate));
      ini.write("[local_server]\nenabled=true\nport=9090\napi_key=sk-older-456\n");
    }
    {
      QSettings ini(ini_path, QSettings::IniFormat);
      const LocalServerSettings loaded = LocalServerSettings::load(ini);
      QCOMPARE(loaded.api_key, QString("sk-older-456"));
      QCOMPARE(loaded.port, 9090);
    }
    QVERIFY2(!file_text(ini_path).contains("sk-older-456"), qPrintable(file_text(ini_path)));
    QCOMPARE(file_text(key_path), QString("sk-older-456"));
    QCOMPARE(mode(key_path), 0600u);

    // No key: no key file.
    {
      QSettings ini(ini_path, QSettings::IniFormat);
      serve_on(9090).save(ini);
    }
    QVERIFY(!QFile::exists(key_path));
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestLocalServer)

}  // namespace app_test_local_server

#include "test_local_server.moc"
