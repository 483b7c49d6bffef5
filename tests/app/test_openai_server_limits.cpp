// The server's limits over real HTTP, on an OpenAiServer inside the test process (so a test can hold a
// generation slot itself and the queue's state is exact, not a race): 429 for a full queue, 503 for a
// queued request when the server shuts down, a whole (non-streamed) reply whose client leaves stops
// its generation, and the sessions' KV caches kept under the memory budget. stories260K, greedy.
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include "app/openai_protocol.h"
#include "app/openai_sessions.h"
#include "common/in_process_server.h"
#include "common/server_process.h"
#include "engine/kv_snapshot.h"
#include "engine/llama_model.h"
#include "engine/snapshot_store.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_openai_server_limits {

using kvchat::app::openai::ServerOptions;
using kvchat::test::HttpReply;
using kvchat::test::InProcessServer;
using nlohmann::json;

namespace {

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }
json assistant(const std::string& text) { return {{"role", "assistant"}, {"content", text}}; }
json chat_request(const std::vector<json>& messages, int max_tokens) {
  return {{"model", "stories260K"}, {"messages", messages}, {"temperature", 0}, {"max_tokens", max_tokens}};
}
HttpReply post_chat(InProcessServer& server, const json& body) {
  httplib::Client client = server.client();
  return kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
}
json health(InProcessServer& server) {
  httplib::Client client = server.client();
  auto reply = client.Get("/health");
  return reply ? json::parse(reply->body) : json();
}

ServerOptions options(int parallel, int max_queue, std::int64_t budget_bytes = 0) {
  ServerOptions options;
  options.parallel = parallel;
  options.max_queue = max_queue;
  options.model_id = "stories260K";
  options.memory_budget_bytes = budget_bytes;
  return options;
}

void expect_error(const HttpReply& reply, int status, const std::string& type, const std::string& code) {
  QCOMPARE(reply.status, status);
  const json body = reply.json();
  QVERIFY2(body.is_object() && body.contains("error"), reply.body.c_str());
  QVERIFY(body["error"]["message"].is_string() && !body["error"]["message"].get<std::string>().empty());
  QCOMPARE(body["error"]["type"].get<std::string>(), type);
  QVERIFY(body["error"].contains("param"));
  QCOMPARE(body["error"]["code"].get<std::string>(), code);
}

// Waits (without a time limit of its own: ctest's timeout is the limit) until `done` holds.
template <typename Predicate>
void wait_until(Predicate done) {
  while (!done()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

class TestOpenAiServerLimits : public QObject {
  Q_OBJECT

 private:
  kvchat::LoadedModel model_;
  std::ostringstream log_;

  std::string log_text() {
    spdlog::default_logger()->flush();
    return log_.str();
  }

 private Q_SLOTS:
  void initTestCase() {
    model_ = kvchat::load_model(kvchat::test::shared_path("models/stories260K"), kvchat::LoadOptions{{}, 1});
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    spdlog::default_logger()->sinks().push_back(sink);
    spdlog::set_level(spdlog::level::info);
  }

  // One slot, no queue, the slot held by the test: the request is refused at once, in OpenAI's shape.
  void full_queue_is_429_over_http() {
    InProcessServer server(model_, options(1, 0));
    {
      auto held = server.server().sessions().acquire_for_prompt({1, 2, 3});
      expect_error(post_chat(server, chat_request({user("Once")}, 4)), 429, "rate_limit_error", "queue_full");
      QCOMPARE(health(server)["running"].get<int>(), 1);
    }
    QCOMPARE(post_chat(server, chat_request({user("Once")}, 4)).status, 200);
  }

  // A request waiting in the queue when the server stops is answered 503, not left hanging.
  void queued_request_is_503_on_shutdown() {
    InProcessServer server(model_, options(1, 1));
    auto held = server.server().sessions().acquire_for_prompt({1, 2, 3});
    HttpReply queued;
    std::thread client([&] { queued = post_chat(server, chat_request({user("Once")}, 4)); });
    wait_until([&] { return server.server().sessions().status().waiting == 1; });
    std::thread stopper([&] { server.stop(); });
    client.join();
    expect_error(queued, 503, "server_error", "server_shutting_down");
    held.reset();
    stopper.join();
  }

  // A whole reply writes nothing until it is done; the server polls the socket before every prefill chunk
  // and after every token, so a client that closes its connection stops the generation there.
  void whole_reply_stops_when_its_client_leaves() {
    InProcessServer server(model_, options(1, 0));
    const json request = chat_request({user("One day")}, 400);
    const HttpReply whole = post_chat(server, request);
    const int full_tokens = whole.json()["usage"]["completion_tokens"];
    QVERIFY2(full_tokens >= 40, "the reply must be long enough to leave in the middle");

    const std::size_t log_from = log_text().size();
    const int socket = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(server.port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    QCOMPARE(::connect(socket, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    const std::string body = request.dump();
    const std::string http = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    QCOMPARE(::send(socket, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
    ::close(socket);

    // The server asks before each prefill chunk too: a client gone that early stops it with nothing generated.
    wait_until([&] { return log_text().find("client disconnected ", log_from) != std::string::npos; });
    const std::string log = log_text().substr(log_from);
    const std::string marker = "client disconnected after ";
    const int stopped_at =
        log.find(marker) == std::string::npos ? 0 : std::stoi(log.substr(log.find(marker) + marker.size()));
    qInfo("whole reply: client left, generation stopped after %d of %d tokens", stopped_at, full_tokens);
    QVERIFY2(stopped_at < full_tokens, log.c_str());
    QCOMPARE(post_chat(server, chat_request({user("Once")}, 4)).status, 200);  // still serving
  }

  // A budget of one conversation's cache: a second conversation evicts the first (LRU), /health says so,
  // and the first one's next turn is rebuilt (prefilled, or restored from its snapshot with a cache
  // folder) into the same reply as on a server without a budget.
  void memory_budget_evicts_idle_caches() {
    std::vector<json> first = {user("A little bird")};
    std::int64_t one_cache = 0;
    std::string unlimited_reply;
    {
      InProcessServer unlimited(model_, options(1, 4));
      const HttpReply reply = post_chat(unlimited, chat_request(first, 24));
      QCOMPARE(reply.status, 200);
      one_cache = health(unlimited)["kv_cache_bytes"].get<std::int64_t>();
      QVERIFY(one_cache > 0);
      first.push_back(assistant(reply.json()["choices"][0]["message"]["content"]));
      first.push_back(user(" The bird sang"));
      unlimited_reply = post_chat(unlimited, chat_request(first, 24)).json()["choices"][0]["message"]["content"];
    }
    for (bool with_snapshots : {false, true}) {
      QTemporaryDir folder;
      std::shared_ptr<kvchat::SnapshotStore> snapshots;
      if (with_snapshots)
        snapshots = std::make_shared<kvchat::SnapshotStore>(folder.path().toStdString(), std::int64_t(64) << 20,
                                                            kvchat::fingerprint_model(*model_.model),
                                                            model_.model->cache_shape());
      InProcessServer server(model_, options(1, 4, one_cache), snapshots);
      const std::vector<json> opening(first.begin(), first.begin() + 1);
      QCOMPARE(post_chat(server, chat_request(opening, 24)).status, 200);
      QCOMPARE(post_chat(server, chat_request({user("Tom had a red ball")}, 24)).status, 200);
      const json status = health(server);
      QCOMPARE(status["kv_cache_budget_bytes"].get<std::int64_t>(), one_cache);
      QVERIFY2(status["kv_cache_evictions"].get<int>() >= 1, status.dump().c_str());
      QVERIFY2(status["kv_cache_bytes"].get<std::int64_t>() <= one_cache, status.dump().c_str());
      if (snapshots) snapshots->flush();  // the evicted cache's snapshot is written on the store's thread
      const HttpReply continued = post_chat(server, chat_request(first, 24));
      QCOMPARE(continued.status, 200);
      QCOMPARE(continued.json()["choices"][0]["message"]["content"].get<std::string>(), unlimited_reply);
      const int restored = continued.json()["timings"]["restored_tokens"];
      QVERIFY2(with_snapshots ? restored > 0 : restored == 0, continued.body.c_str());
    }
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestOpenAiServerLimits)

}  // namespace app_test_openai_server_limits

#include "test_openai_server_limits.moc"
