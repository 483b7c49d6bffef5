// The server's limits over real HTTP, on an OpenAiServer inside the test process (so a test can hold a
// generation slot itself and the queue's state is exact, not a race): 429 for a full queue, 503 for a
// queued request when the server shuts down, a whole (non-streamed) reply whose client leaves stops
// its generation, and the sessions' KV caches kept under the memory budget. What one client may hold:
// a chunked body is held to the body limit, headers and bodies to their times, a length that is no
// length is answered at once, and half-sent connections cannot hold up the others; the options that
// size the server are bounded. stories260K, greedy.
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "app/server/openai_protocol.h"
#include "app/server/openai_sessions.h"
#include "common/in_process_server.h"
#include "common/raw_http.h"
#include "common/server_process.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/cache/snapshot_store.h"
#include "engine/model/llama_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_openai_server_limits {

using kvchat::app::openai::ServerOptions;
using kvchat::app::openai::ServerSessions;
using kvchat::test::HttpReply;
using kvchat::test::InProcessServer;
using kvchat::test::RawHttpConnection;
using kvchat::test::RawResponse;
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
    const std::string http =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
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

  // Sixteen clients at once with long prompts on a server whose budget holds about three requests' reservations
  // (--parallel 8, a cache folder): every request is served, each reply the one a server without a budget gives, and
  // the budget holds throughout: what it counted at most (idle caches, reservations, caches being copied from) stays
  // within it, requests wait for room rather than fail, and idle caches are evicted to snapshots to make it.
  void memory_budget_holds_under_sixteen_clients() {
    const std::string story =
        "The child and the animal walk to the park in the sun. They find a ball and a kite by the big tree. The "
        "wind is soft and the kite flies high. A little dog runs after the ball and barks. Everyone laughs and "
        "says thank you. Then they sit by the pond and share a cake. The ducks come to see them. ";
    std::vector<std::vector<json>> conversations;
    for (int j = 0; j < 16; ++j) {
      // Half of them open alike (a prefix a session may copy from another), half differently from the start.
      const std::string opening = j % 2 == 0 ? "Story time. " : "Story " + std::to_string(j) + ". ";
      conversations.push_back({user(opening + story + story.substr(static_cast<std::size_t>(j) * 7) + "Tom said")});
    }
    const int reply_tokens = 24;
    std::vector<std::string> alone;
    {
      InProcessServer unlimited(model_, options(1, 16));
      for (const auto& messages : conversations) {
        const HttpReply reply = post_chat(unlimited, chat_request(messages, reply_tokens));
        QCOMPARE(reply.status, 200);
        alone.push_back(reply.json()["choices"][0]["message"]["content"]);
      }
    }
    QTemporaryDir folder;
    auto snapshots =
        std::make_shared<kvchat::SnapshotStore>(folder.path().toStdString(), std::int64_t(64) << 20,
                                                kvchat::fingerprint_model(*model_.model), model_.model->cache_shape());
    // Three of the largest reservations: the prompts run 200 to 300 tokens, so three or four fit at once.
    std::int64_t largest = 0;
    {
      InProcessServer probe(model_, options(1, 1));
      auto& sessions = probe.server().sessions();
      for (const auto& messages : conversations) {
        std::vector<kvchat::ChatMessage> chat;
        for (const json& message : messages) chat.push_back({message["role"], message["content"]});
        const std::size_t prompt = sessions.encode_chat(chat).size();
        QVERIFY2(prompt >= 150, qPrintable(QString("a prompt of %1 tokens").arg(prompt)));
        largest = std::max(largest, sessions.reservation_bytes(prompt, reply_tokens));
      }
    }
    const std::int64_t budget = 3 * largest;
    InProcessServer server(model_, options(8, 16, budget), snapshots);
    std::atomic<bool> done{false};
    std::int64_t most_reserved = 0;
    std::thread watcher([&] {
      while (!done.load()) {
        const json status = health(server);
        if (status.is_object())
          most_reserved = std::max(most_reserved, status["kv_cache_reserved_bytes"].get<std::int64_t>());
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    std::vector<HttpReply> replies(16);
    std::vector<std::thread> clients;
    for (int j = 0; j < 16; ++j)
      clients.emplace_back([&, j] { replies[j] = post_chat(server, chat_request(conversations[j], reply_tokens)); });
    for (std::thread& client : clients) client.join();
    done.store(true);
    watcher.join();
    for (int j = 0; j < 16; ++j) {
      QVERIFY2(replies[j].status == 200, replies[j].body.c_str());
      QCOMPARE(replies[j].json()["choices"][0]["message"]["content"].get<std::string>(), alone[j]);
    }
    const json status = health(server);
    QVERIFY2(status["kv_cache_peak_bytes"].get<std::int64_t>() <= budget, status.dump().c_str());
    QVERIFY2(status["kv_cache_peak_bytes"].get<std::int64_t>() >= 2 * largest / 3, status.dump().c_str());
    QVERIFY2(most_reserved <= budget && most_reserved >= largest / 2, qPrintable(QString::number(most_reserved)));
    // Counted by the server, not sampled here: a wait can begin and end between two looks.
    QVERIFY2(status["memory_waits"].get<std::int64_t>() >= 1, status.dump().c_str());
    QCOMPARE(status["waiting_for_memory"].get<int>(), 0);
    QVERIFY2(status["kv_cache_evictions"].get<int>() >= 1, status.dump().c_str());
    QCOMPARE(status["kv_cache_reserved_bytes"].get<std::int64_t>(), std::int64_t(0));
    QVERIFY2(status["kv_cache_bytes"].get<std::int64_t>() <= budget, status.dump().c_str());
    snapshots->flush();
    QVERIFY2(snapshots->folder_bytes() > 0, "no cache was written to the cache folder");
  }

  // Replies longer than a reservation's first kReplyReservationTokens: each extends its reservation as it grows, under
  // a budget that holds two requests' first reservations, and every reply is still the one a server without a budget
  // gives. Where one went past the budget (every other running request waiting to extend as well), it is counted.
  void replies_past_their_reservation_extend_it() {
    const int reply_tokens = 300;
    const std::vector<std::vector<json>> conversations = {{user("Tom had a red ball.")},
                                                          {user("Lily saw a big tree.")},
                                                          {user("The cat was sleepy.")},
                                                          {user("Ben and his dog went to the park.")}};
    std::vector<std::string> alone;
    int longest = 0;
    {
      InProcessServer unlimited(model_, options(1, 4));
      for (const auto& messages : conversations) {
        const HttpReply reply = post_chat(unlimited, chat_request(messages, reply_tokens));
        QCOMPARE(reply.status, 200);
        alone.push_back(reply.json()["choices"][0]["message"]["content"]);
        longest = std::max(longest, reply.json()["usage"]["completion_tokens"].get<int>());
      }
    }
    QVERIFY2(longest > ServerSessions::kReplyReservationTokens + 16,
             qPrintable(QString("the longest reply has %1 tokens").arg(longest)));
    InProcessServer probe(model_, options(1, 1));
    const std::int64_t first_reservation = probe.server().sessions().reservation_bytes(16, reply_tokens);
    InProcessServer budgeted(model_, options(4, 4, 2 * first_reservation + first_reservation / 2));
    std::vector<HttpReply> replies(conversations.size());
    std::vector<std::thread> clients;
    for (std::size_t j = 0; j < conversations.size(); ++j)
      clients.emplace_back([&, j] { replies[j] = post_chat(budgeted, chat_request(conversations[j], reply_tokens)); });
    for (std::thread& client : clients) client.join();
    for (std::size_t j = 0; j < conversations.size(); ++j) {
      QVERIFY2(replies[j].status == 200, replies[j].body.c_str());
      QCOMPARE(replies[j].json()["choices"][0]["message"]["content"].get<std::string>(), alone[j]);
    }
    const json status = health(budgeted);
    QVERIFY2(status["kv_reservation_extensions"].get<int>() >= 1, status.dump().c_str());
    QCOMPARE(status["kv_cache_reserved_bytes"].get<std::int64_t>(), std::int64_t(0));
    if (status["kv_budget_overshoots"].get<int>() == 0)
      QVERIFY2(status["kv_cache_peak_bytes"].get<std::int64_t>() <= status["kv_cache_budget_bytes"].get<std::int64_t>(),
               status.dump().c_str());
  }

  // A chunked body is held to the body limit as one with a length is: refused 413 while the client is
  // still sending it, not read to its end. A chunked body within the limit is served.
  void chunked_body_over_the_limit_is_413() {
    ServerOptions limited = options(1, 0);
    limited.max_body_bytes = std::size_t(1) << 20;
    InProcessServer server(model_, limited);
    const std::string head =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n";
    RawHttpConnection endless(server.port());
    QVERIFY(endless.send(head + "\r\n"));
    const std::string chunk = "10000\r\n" + std::string(0x10000, 'a') + "\r\n";
    QVERIFY2(endless.send_until_answered(chunk, std::size_t(30) << 20, std::chrono::milliseconds(0)),
             "30 MB of chunks were sent without an answer");
    const RawResponse refused = endless.read_response();
    QCOMPARE(refused.status, 413);
    QCOMPARE(refused.error_code(), std::string("request_too_large"));

    const std::string body = chat_request({user("Once")}, 4).dump();
    char size[32];
    std::snprintf(size, sizeof size, "%zx", body.size());
    RawHttpConnection within(server.port());
    QVERIFY(within.send(head + "Connection: close\r\n\r\n" + size + "\r\n" + body + "\r\n0\r\n\r\n"));
    const RawResponse served = within.read_response();
    QCOMPARE(served.status, 200);
    QVERIFY(served.json()["choices"][0]["message"]["content"].is_string());
  }

  // Headers sent a byte at a time get 408 once the header time is up, the request line as the headers;
  // so does a body that stops coming. The connection is closed.
  void slow_headers_and_bodies_are_408() {
    ServerOptions slow = options(1, 0);
    slow.header_timeout_ms = 500;
    slow.body_timeout_ms = 500;
    InProcessServer server(model_, slow);
    const struct {
      std::string start;
      std::string message;
    } cases[] = {
        {"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", "the request's headers did not arrive within 500 ms"},
        {"GET /heal", "the request's headers did not arrive within 500 ms"},
        {"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n{",
         "the request's body did not arrive within 500 ms"},
    };
    for (const auto& c : cases) {
      RawHttpConnection connection(server.port());
      QVERIFY(connection.send(c.start));
      // A byte every 20 ms, for at most a minute: each arrives long before a read would time out.
      QVERIFY2(connection.send_until_answered(" ", 3000, std::chrono::milliseconds(20)), c.start.c_str());
      const RawResponse refused = connection.read_response();
      QCOMPARE(refused.status, 408);
      QCOMPARE(refused.error_code(), std::string("request_timeout"));
      QCOMPARE(refused.json()["error"]["message"].get<std::string>(), c.message);
      QCOMPARE(refused.header("connection"), std::string("close"));
    }
    QCOMPARE(health(server)["status"].get<std::string>(), std::string("ok"));
  }

  // A Content-Length that is not a number of bytes, or one no body could have, is answered at once, while
  // the client is still sending: never read as a length to wait for.
  void impossible_lengths_are_answered_at_once() {
    InProcessServer server(model_, options(1, 0));
    const struct {
      const char* length;
      int status;
      const char* code;
    } cases[] = {{"-1", 400, "invalid_framing"},
                 {"18446744073709551616", 413, "request_too_large"},
                 {"18446744073709551615", 413, "request_too_large"},
                 {"99999999999999999999999999", 413, "request_too_large"},
                 {"1e3", 400, "invalid_framing"},
                 {"0x10", 400, "invalid_framing"}};
    for (const auto& c : cases) {
      RawHttpConnection connection(server.port());
      QVERIFY(
          connection.send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: " +
                          std::string(c.length) + "\r\n\r\n"));
      QVERIFY2(connection.send_until_answered("a", 3000, std::chrono::milliseconds(20)), c.length);
      const RawResponse refused = connection.read_response();
      QCOMPARE(refused.status, c.status);
      QCOMPARE(refused.error_code(), std::string(c.code));
    }
    RawHttpConnection both(server.port());
    QVERIFY(
        both.send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
                  "Transfer-Encoding: chunked\r\n\r\n"));
    const RawResponse smuggled = both.read_response();
    QCOMPARE(smuggled.status, 400);
    QCOMPARE(smuggled.error_code(), std::string("invalid_framing"));
  }

  // More half-sent requests than the server takes connections, each kept alive by a byte now and then:
  // /health is still answered while they go on, because a new connection replaces the one that has waited
  // longest for its headers.
  void half_sent_requests_do_not_hold_up_others() {
    InProcessServer server(model_, options(1, 0));
    const int allowed = 1 + 0 + ServerOptions::kSpareConnections;
    std::vector<std::unique_ptr<RawHttpConnection>> half_sent;
    for (int i = 0; i < allowed + 8; ++i) {
      half_sent.push_back(std::make_unique<RawHttpConnection>(server.port()));
      QVERIFY(half_sent.back()->send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
    }
    std::atomic<bool> answered{false};
    std::atomic<bool> gave_up{false};
    std::thread trickle([&] {
      for (int round = 0; round < 1200 && !answered.load(); ++round) {  // a byte each 50 ms, for at most a minute
        for (auto& connection : half_sent) connection->send("a");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      gave_up.store(!answered.load());
    });
    RawHttpConnection probe(server.port());
    QVERIFY(probe.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"));
    const RawResponse reply = probe.read_response();
    answered.store(true);
    trickle.join();
    QCOMPARE(reply.status, 200);
    QVERIFY2(!gave_up.load(), "/health was answered only after the half-sent requests stopped");
    const auto closed =
        std::count_if(half_sent.begin(), half_sent.end(), [](const auto& c) { return c->closed_by_server(); });
    QVERIFY2(closed >= 1, "no half-sent request was closed");
  }

  // Clients that connect at once are all queued by the kernel until the server accepts them: the listen backlog is
  // the system's, not the HTTP library's 5. With a backlog of 5, the sixth connection onwards waited out SYN
  // retransmits and could be lost (the sixteen clients above, now and then). The server here is bound and not yet
  // accepting, so every connection made is one the backlog holds.
  void connections_at_once_are_all_queued() {
    kvchat::app::openai::OpenAiServer server(model_, nullptr, options(1, 0));
    server.bind();
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(server.bound_port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    constexpr int kClients = 64;
    std::vector<int> sockets;
    for (int i = 0; i < kClients; ++i) {
      const int socket = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      QVERIFY(socket >= 0);
      sockets.push_back(socket);
      const int result = ::connect(socket, reinterpret_cast<const sockaddr*>(&address), sizeof address);
      QVERIFY2(result == 0 || errno == EINPROGRESS, std::strerror(errno));
    }
    // A handshake on the loopback takes microseconds; a connection the backlog dropped waits a second for its
    // first retransmit, and is dropped again while nothing accepts.
    int connected = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
    std::vector<bool> done(kClients, false);
    while (connected < kClients && std::chrono::steady_clock::now() < deadline) {
      for (int i = 0; i < kClients; ++i) {
        if (done[i]) continue;
        pollfd descriptor{sockets[i], POLLOUT, 0};
        if (::poll(&descriptor, 1, 0) == 1) {
          int error = 0;
          socklen_t length = sizeof error;
          ::getsockopt(sockets[i], SOL_SOCKET, SO_ERROR, &error, &length);
          QVERIFY2(error == 0, std::strerror(error));
          done[i] = true;
          ++connected;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (int socket : sockets) ::close(socket);
    QCOMPARE(connected, kClients);
  }

  // The options that size the server (its threads, its queue, its body) have upper bounds: past them the
  // server is not made, rather than made unable to answer.
  void sizes_are_bounded() {
    for (const auto& [parallel, queue] : std::vector<std::pair<int, int>>{{100000, 0}, {0, 0}, {1, 100000}, {1, -1}}) {
      ServerOptions sized = options(parallel, queue);
      QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kvchat::app::openai::OpenAiServer(model_, nullptr, sized));
    }
    ServerOptions huge_body = options(1, 0);
    huge_body.max_body_bytes = std::size_t(1) << 40;
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kvchat::app::openai::OpenAiServer(model_, nullptr, huge_body));
    ServerOptions largest = options(ServerOptions::kMaxParallel, ServerOptions::kMaxQueue);
    kvchat::app::openai::OpenAiServer server(model_, nullptr, largest);  // the bounds themselves are fine
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestOpenAiServerLimits)

}  // namespace app_test_openai_server_limits

#include "test_openai_server_limits.moc"
