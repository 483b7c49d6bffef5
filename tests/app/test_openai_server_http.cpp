// The server's HTTP surface as clients other than the OpenAI SDKs meet it, on an OpenAiServer inside the
// test process: browser pages (CORS preflights and origins), the paths without /v1 that a bare base URL
// and llama.cpp's clients use, the Authorization scheme in any case, a request without `model`, 405 for
// a path's other method, 411 without a length, Retry-After on 429, and a reply cut by the server's
// shutdown ending in an error rather than looking whole. stories260K, greedy.
#include <QtTest>
#include "common/test_suite.h"

#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "app/compute_lock.h"
#include "app/server/openai_protocol.h"
#include "app/server/openai_sessions.h"
#include "common/in_process_server.h"
#include "common/raw_http.h"
#include "common/server_process.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_openai_server_http {

using kvchat::app::openai::ServerOptions;
using kvchat::test::HttpReply;
using kvchat::test::InProcessServer;
using kvchat::test::RawHttpConnection;
using kvchat::test::RawResponse;
using nlohmann::json;

namespace {

const char* kKey = "key-for-http-tests";

ServerOptions options(const std::string& cors_origin = "", int parallel = 1, int max_queue = 4) {
  ServerOptions options;
  options.model_id = "stories260K";
  options.api_key = kKey;
  options.cors_origin = cors_origin;
  options.parallel = parallel;
  options.max_queue = max_queue;
  return options;
}

json chat_request(const std::string& text, int max_tokens) {
  return {{"model", "stories260K"},
          {"messages", {{{"role", "user"}, {"content", text}}}},
          {"temperature", 0},
          {"max_tokens", max_tokens}};
}

// One raw request on a connection of its own; `headers` are whole lines ("Name: value\r\n").
RawResponse raw_request(int port, const std::string& method, const std::string& path, const std::string& headers,
                        const std::string& body = {}, bool with_length = true) {
  RawHttpConnection connection(port);
  std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers;
  if (with_length) request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  request += "\r\n" + body;
  if (!connection.send(request)) return {};
  return connection.read_response();
}

std::string bearer(const std::string& scheme = "Bearer") { return "Authorization: " + scheme + " " + kKey + "\r\n"; }

}  // namespace

class TestOpenAiServerHttp : public QObject {
  Q_OBJECT

 private:
  kvchat::LoadedModel model_;

 private Q_SLOTS:
  void initTestCase() {
    model_ = kvchat::load_model(kvchat::test::shared_path("models/stories260K"), kvchat::LoadOptions{{}, 1});
  }

  // A page on this machine (the default) may call the API: its preflight is answered without the key,
  // naming the headers it asked for, and its requests carry Access-Control-Allow-Origin. Another
  // page is refused, preflight and request, and gets no CORS header.
  void browser_pages_of_this_machine() {
    InProcessServer server(model_, options());
    const std::string page = "http://localhost:5173";
    const RawResponse preflight =
        raw_request(server.port(), "OPTIONS", "/v1/chat/completions",
                    "Origin: " + page +
                        "\r\nAccess-Control-Request-Method: POST\r\n"
                        "Access-Control-Request-Headers: authorization, content-type, x-stainless-os\r\n");
    QCOMPARE(preflight.status, 204);
    QCOMPARE(preflight.header("access-control-allow-origin"), page);
    QCOMPARE(preflight.header("access-control-allow-methods"), std::string("POST, OPTIONS"));
    QCOMPARE(preflight.header("access-control-allow-headers"),
             std::string("Authorization, Content-Type, x-stainless-os"));

    const RawResponse call = raw_request(server.port(), "POST", "/v1/chat/completions",
                                         "Origin: " + page + "\r\n" + bearer() + "Content-Type: application/json\r\n",
                                         chat_request("Once", 4).dump());
    QCOMPARE(call.status, 200);
    QCOMPARE(call.header("access-control-allow-origin"), page);
    QCOMPARE(call.header("vary"), std::string("Origin"));
    for (const char* local : {"http://127.0.0.1:8000", "https://[::1]", "http://localhost"})
      QCOMPARE(raw_request(server.port(), "GET", "/v1/models", std::string("Origin: ") + local + "\r\n" + bearer())
                   .header("access-control-allow-origin"),
               std::string(local));

    for (const char* stranger : {"https://evil.example", "http://localhost.evil.example", "null"}) {
      const RawResponse refused =
          raw_request(server.port(), "OPTIONS", "/v1/chat/completions",
                      std::string("Origin: ") + stranger + "\r\nAccess-Control-Request-Method: POST\r\n");
      QCOMPARE(refused.status, 403);
      QCOMPARE(refused.error_code(), std::string("origin_not_allowed"));
      QVERIFY(refused.header("access-control-allow-origin").empty());
      const RawResponse request =
          raw_request(server.port(), "POST", "/v1/chat/completions",
                      std::string("Origin: ") + stranger + "\r\n" + bearer(), chat_request("Once", 4).dump());
      QCOMPARE(request.status, 403);
      QCOMPARE(request.error_code(), std::string("origin_not_allowed"));
    }
    // Clients that are not browsers send no Origin and are served as before.
    QCOMPARE(raw_request(server.port(), "GET", "/v1/models", bearer()).status, 200);
  }

  // --cors-origin: the pages named (and then only those), or any page with *.
  void browser_pages_named_by_the_option() {
    {
      InProcessServer server(model_, options("https://chat.example.org, https://other.example.org:8443/"));
      for (const char* allowed : {"https://chat.example.org", "https://other.example.org:8443"}) {
        const RawResponse preflight =
            raw_request(server.port(), "OPTIONS", "/chat/completions",
                        std::string("Origin: ") + allowed + "\r\nAccess-Control-Request-Method: POST\r\n");
        QCOMPARE(preflight.status, 204);
        QCOMPARE(preflight.header("access-control-allow-origin"), std::string(allowed));
      }
      QCOMPARE(raw_request(server.port(), "OPTIONS", "/v1/models", "Origin: http://localhost:3000\r\n").status, 403);
    }
    InProcessServer any(model_, options("*"));
    const RawResponse preflight =
        raw_request(any.port(), "OPTIONS", "/v1/completions",
                    "Origin: https://anywhere.example\r\nAccess-Control-Request-Method: POST\r\n");
    QCOMPARE(preflight.status, 204);
    QCOMPARE(preflight.header("access-control-allow-origin"), std::string("*"));
    QCOMPARE(raw_request(any.port(), "OPTIONS", "/v1/nothing", "Origin: https://anywhere.example\r\n").status, 404);
  }

  // The paths without /v1 answer as the ones with it; `model` may be left out; the Authorization scheme
  // is case-insensitive.
  void bare_paths_optional_model_and_any_scheme_case() {
    InProcessServer server(model_, options());
    const std::string auth = bearer("bearer") + "Content-Type: application/json\r\n";
    const RawResponse with_v1 =
        raw_request(server.port(), "POST", "/v1/chat/completions", bearer() + "Content-Type: application/json\r\n",
                    chat_request("Once upon a time", 12).dump());
    QCOMPARE(with_v1.status, 200);
    const std::string expected = with_v1.json()["choices"][0]["message"]["content"];

    json no_model = chat_request("Once upon a time", 12);
    no_model.erase("model");
    const RawResponse bare = raw_request(server.port(), "POST", "/chat/completions", auth, no_model.dump());
    QCOMPARE(bare.status, 200);
    QCOMPARE(bare.json()["choices"][0]["message"]["content"].get<std::string>(), expected);
    QCOMPARE(bare.json()["model"].get<std::string>(), std::string("stories260K"));

    const json prompt = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 4}};
    const RawResponse completion = raw_request(server.port(), "POST", "/completions", bearer("BEARER"), prompt.dump());
    QCOMPARE(completion.status, 200);
    QCOMPARE(completion.json()["object"].get<std::string>(), std::string("text_completion"));
    const RawResponse models =
        raw_request(server.port(), "GET", "/models", "Authorization: bEaReR  " + std::string(kKey) + "\r\n");
    QCOMPARE(models.status, 200);
    QCOMPARE(models.json()["data"][0]["id"].get<std::string>(), std::string("stories260K"));

    QCOMPARE(raw_request(server.port(), "GET", "/models", "Authorization: Basic " + std::string(kKey) + "\r\n").status,
             401);
    QCOMPARE(
        raw_request(server.port(), "GET", "/models", "Authorization: Bearer " + std::string(kKey) + "x\r\n").status,
        401);
  }

  // A path's other method is 405 naming the one it takes; a POST without a length says so; a max_tokens
  // over the limit says what the limit is.
  void methods_lengths_and_limits_are_named() {
    InProcessServer server(model_, options());
    const RawResponse get_post_route = raw_request(server.port(), "GET", "/v1/chat/completions", bearer());
    QCOMPARE(get_post_route.status, 405);
    QCOMPARE(get_post_route.error_code(), std::string("method_not_allowed"));
    QCOMPARE(get_post_route.header("allow"), std::string("POST, OPTIONS"));
    const RawResponse post_get_route = raw_request(server.port(), "POST", "/models", bearer(), "{}");
    QCOMPARE(post_get_route.status, 405);
    QCOMPARE(post_get_route.header("allow"), std::string("GET, OPTIONS"));
    QCOMPARE(raw_request(server.port(), "GET", "/v1/nothing", bearer()).status, 404);

    const RawResponse no_length = raw_request(server.port(), "POST", "/v1/chat/completions", bearer(), "", false);
    QCOMPARE(no_length.status, 411);
    QCOMPARE(no_length.error_code(), std::string("length_required"));
    QVERIFY2(no_length.body.find("needs a Content-Length header") != std::string::npos, no_length.body.c_str());

    json too_many = chat_request("Once", 4);
    too_many["max_tokens"] = 100000000;
    const RawResponse over = raw_request(server.port(), "POST", "/v1/chat/completions", bearer(), too_many.dump());
    QCOMPARE(over.status, 400);
    QCOMPARE(over.json()["error"]["message"].get<std::string>(),
             std::string("'max_tokens' must be at most 16777216, got 100000000"));
    too_many["max_tokens"] = 0;
    QCOMPARE(raw_request(server.port(), "POST", "/v1/chat/completions", bearer(), too_many.dump())
                 .json()["error"]["message"]
                 .get<std::string>(),
             std::string("'max_tokens' must be at least 1, got 0"));
  }

  // 429 says when to try again.
  void full_queue_says_when_to_retry() {
    InProcessServer server(model_, options("", 1, 0));
    auto held = server.server().sessions().acquire_for_prompt({1, 2, 3});
    const RawResponse busy =
        raw_request(server.port(), "POST", "/v1/chat/completions", bearer(), chat_request("Once", 4).dump());
    QCOMPARE(busy.status, 429);
    QCOMPARE(busy.header("retry-after"), std::string("1"));
  }

  // The server stops while a reply streams: the stream ends with an error event, without a finish
  // reason or [DONE], so the client knows the reply is cut. The generation is held at its start (the
  // compute lock a model load takes) until the stop is in, so it is cut whatever the machine's speed.
  void stream_cut_by_shutdown_ends_in_an_error() {
    InProcessServer server(model_, options());
    std::unique_lock<std::shared_mutex> hold(kvchat::app::compute_settings_mutex());
    json request = chat_request("One day", 400);
    request["stream"] = true;
    std::mutex mutex;
    std::condition_variable changed;
    bool first_event = false;
    std::vector<std::string> events;
    std::thread client([&] {
      httplib::Client http = server.client();
      kvchat::test::post_stream(http, "/v1/chat/completions", request.dump(),
                                {{"Authorization", std::string("Bearer ") + kKey}}, [&](const std::string& data) {
                                  std::lock_guard<std::mutex> lock(mutex);
                                  events.push_back(data);
                                  first_event = true;
                                  changed.notify_all();
                                  return true;
                                });
    });
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return first_event; });  // the role chunk: the request runs, held at the lock
    }
    server.server().stop();  // returns at once: the running request is not waited for
    hold.unlock();
    client.join();
    QVERIFY(!events.empty());
    for (const std::string& event : events) {
      QVERIFY2(event != "[DONE]", "a cut stream ended with [DONE]");
      const json chunk = json::parse(event);
      if (chunk.contains("choices") && !chunk["choices"].empty())
        QVERIFY2(chunk["choices"][0]["finish_reason"].is_null(), event.c_str());
    }
    const json last = json::parse(events.back());
    QVERIFY2(last.contains("error"), events.back().c_str());
    QCOMPARE(last["error"]["code"].get<std::string>(), std::string("server_shutting_down"));
    QVERIFY2(last["error"]["message"].get<std::string>().find("the reply was cut short after ") != std::string::npos,
             events.back().c_str());
  }

  // The same for a whole reply: 503, not a 200 with part of a reply.
  void whole_reply_cut_by_shutdown_is_503() {
    InProcessServer server(model_, options());
    std::unique_lock<std::shared_mutex> hold(kvchat::app::compute_settings_mutex());
    RawResponse reply;
    std::thread client([&] {
      reply = raw_request(server.port(), "POST", "/v1/chat/completions", bearer(), chat_request("One day", 400).dump());
    });
    while (server.server().sessions().status().running == 0) std::this_thread::yield();
    server.server().stop();
    hold.unlock();
    client.join();
    QCOMPARE(reply.status, 503);
    QCOMPARE(reply.error_code(), std::string("server_shutting_down"));
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestOpenAiServerHttp)

}  // namespace app_test_openai_server_http

#include "test_openai_server_http.moc"
