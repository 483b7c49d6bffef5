// Which session a server request runs on changes nothing but speed: a conversation's reply is the same
// on a fresh server, on one holding its session and on one whose session was evicted; a prefix shared
// with another conversation (a long system prompt, an edited last message) is reused exactly as far as
// the prompts' ids agree, also from a session still prefilling it; and a client that leaves during a long
// prefill frees its slot there. On an OpenAiServer inside the test process (its sessions reachable, the
// queue's state exact), and on ServerSessions alone. stories260K (no chat template), greedy.
#include <QtTest>
#include "common/test_suite.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

#include "app/chat/chat_turn_runner.h"
#include "app/server/openai_protocol.h"
#include "app/server/openai_sessions.h"
#include "common/in_process_server.h"
#include "common/server_process.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_openai_server_sessions {

using kvchat::TokenId;
using kvchat::app::openai::CompletionResult;
using kvchat::app::openai::SamplingRequest;
using kvchat::app::openai::ServerOptions;
using kvchat::app::openai::ServerSessions;
using kvchat::test::HttpReply;
using kvchat::test::InProcessServer;
using nlohmann::json;

namespace {

json system_message(const std::string& text) { return {{"role", "system"}, {"content", text}}; }
json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }
json assistant(const std::string& text) { return {{"role", "assistant"}, {"content", text}}; }
json chat_request(const std::vector<json>& messages, int max_tokens) {
  return {{"model", "stories260K"}, {"messages", messages}, {"temperature", 0}, {"max_tokens", max_tokens}};
}
HttpReply post_chat(InProcessServer& server, const std::vector<json>& messages, int max_tokens = 16) {
  httplib::Client client = server.client();
  return kvchat::test::post_json(client, "/v1/chat/completions", chat_request(messages, max_tokens).dump());
}
std::string reply_text(const HttpReply& reply) { return reply.json()["choices"][0]["message"]["content"]; }
int prompt_tokens(const HttpReply& reply) { return reply.json()["usage"]["prompt_tokens"]; }
int cached_tokens(const HttpReply& reply) { return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]; }
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

std::vector<kvchat::ChatMessage> chat_messages(const std::vector<json>& messages) {
  std::vector<kvchat::ChatMessage> out;
  for (const json& message : messages) out.push_back({message["role"], message["content"]});
  return out;
}

std::size_t common_prefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// Several hundred tokens that conversations share before they part.
std::string long_system_prompt() {
  return "You tell short stories for small children. Every story has a child, an animal and a small problem that "
         "is solved by the end. The child is kind and curious, the animal is funny, and nobody is ever hurt. Use "
         "short words and short sentences. Stories happen in a garden, a park, a farm, a forest or by the sea. "
         "Somebody always says thank you, and the story ends with everyone happy and going home for dinner. Never "
         "use scary words. Do not write more than a few sentences. The weather is sunny unless the story needs "
         "rain. Toys, balls, kites, boats and cakes are good things to have in a story. Friends help each other. ";
}

// Waits (without a time limit of its own: ctest's timeout is the limit) until `done` holds.
template <typename Predicate>
void wait_until(Predicate done) {
  while (!done()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

class TestOpenAiServerSessions : public QObject {
  Q_OBJECT

 private:
  kvchat::LoadedModel model_;
  std::ostringstream log_;

  std::string log_text() {
    spdlog::default_logger()->flush();
    return log_.str();
  }
  // The ids a server that never saw the conversation gives it.
  std::vector<TokenId> encode(const std::vector<json>& messages) const {
    return kvchat::app::ChatTurnRunner(model_).encode_messages(chat_messages(messages));
  }
  std::string fresh_reply(const std::vector<json>& messages) {
    InProcessServer fresh(model_, options(1, 4));
    const HttpReply reply = post_chat(fresh, messages);
    return reply.status == 200 ? reply_text(reply) : "status " + std::to_string(reply.status);
  }

 private Q_SLOTS:
  void initTestCase() {
    model_ = kvchat::load_model(kvchat::test::shared_path("models/stories260K"), kvchat::LoadOptions{{}, 1});
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    spdlog::default_logger()->sinks().push_back(sink);
    spdlog::set_level(spdlog::level::info);
  }

  // The same three-turn conversation on a server that served its first two turns (its session resident),
  // on one that served them under a budget that evicts every idle cache, and on a fresh server: the same
  // prompt, token for token, and the same reply. The ids of earlier replies as the model sampled them
  // are not the encoding of their text, so a server continuing them would prompt differently.
  void reply_does_not_depend_on_resident_sessions() {
    InProcessServer resident(model_, options(1, 4));
    InProcessServer evicting(model_, options(1, 4, /*budget_bytes=*/1));
    std::vector<json> messages = {user("Once upon a time, there was a little girl named Lily")};
    for (const char* next : {" She said", " Then the dog"}) {
      const HttpReply kept = post_chat(resident, messages, 48);
      const HttpReply evicted = post_chat(evicting, messages, 48);
      QCOMPARE(kept.status, 200);
      QCOMPARE(reply_text(evicted), reply_text(kept));
      messages.push_back(assistant(reply_text(kept)));
      messages.push_back(user(next));
    }
    QVERIFY2(health(evicting)["kv_cache_evictions"].get<int>() >= 2, health(evicting).dump().c_str());

    const std::vector<TokenId> canonical = encode(messages);
    const HttpReply kept = post_chat(resident, messages, 48);
    const HttpReply evicted = post_chat(evicting, messages, 48);
    InProcessServer fresh_server(model_, options(1, 4));
    const HttpReply fresh = post_chat(fresh_server, messages, 48);
    for (const HttpReply* reply : {&kept, &evicted, &fresh}) {
      QCOMPARE(reply->status, 200);
      QCOMPARE(prompt_tokens(*reply), int(canonical.size()));
      QCOMPARE(reply_text(*reply), reply_text(fresh));
    }
    QCOMPARE(cached_tokens(fresh), 0);
    QVERIFY2(cached_tokens(kept) > int(encode({messages[0]}).size()), kept.body.c_str());
  }

  // Eight clients at once on a server with --parallel 8 (replies of different lengths, two conversations sharing a
  // long system prompt, started a few milliseconds apart so that they join and leave the batch at different steps):
  // their decode steps are batched, and every reply is the one a server running one request at a time gives.
  void concurrent_requests_decode_together_as_alone() {
    std::vector<std::vector<json>> conversations;
    std::vector<int> lengths;
    const char* openings[] = {"Tom had a red ball.",
                              "Lily saw a big tree.",
                              "The cat was sleepy.",
                              "A bird sang a song.",
                              "Ben and his dog went to the park.",
                              "The sun was hot.",
                              "Sue found a shiny stone.",
                              "The boat was blue."};
    for (int j = 0; j < 8; ++j) {
      std::vector<json> messages;
      if (j == 1 || j == 4) messages.push_back(system_message(long_system_prompt()));
      messages.push_back(user(openings[j]));
      conversations.push_back(messages);
      lengths.push_back(16 + 8 * j);
    }
    std::vector<std::string> alone;
    {
      InProcessServer one_at_a_time(model_, options(1, 8));
      for (int j = 0; j < 8; ++j) {
        const HttpReply reply = post_chat(one_at_a_time, conversations[j], lengths[j]);
        QCOMPARE(reply.status, 200);
        alone.push_back(reply_text(reply));
      }
    }
    InProcessServer server(model_, options(8, 8));
    std::vector<HttpReply> replies(8);
    std::vector<std::thread> clients;
    for (int j = 0; j < 8; ++j) {
      clients.emplace_back([&, j] {
        std::this_thread::sleep_for(std::chrono::milliseconds(3 * j));
        replies[j] = post_chat(server, conversations[j], lengths[j]);
      });
    }
    for (std::thread& client : clients) client.join();
    for (int j = 0; j < 8; ++j) {
      QCOMPARE(replies[j].status, 200);
      QCOMPARE(reply_text(replies[j]), alone[j]);
    }
    const json status = health(server);
    QVERIFY2(status["batched_decode_rows"].get<int>() > 0, status.dump().c_str());
    QVERIFY2(status["largest_decode_batch"].get<int>() >= 2, status.dump().c_str());
    QVERIFY2(status["batched_decode_steps"].get<int>() < status["batched_decode_rows"].get<int>(),
             status.dump().c_str());
  }

  // Two conversations sharing a long system prompt: the second reuses exactly the prefix the two prompts'
  // ids share, copied into a session of its own, so the first keeps its whole cache and its next turn
  // continues it. An edited last message reuses everything before the edit. Every reply is a fresh
  // server's.
  void shared_prefix_is_reused_across_conversations() {
    const std::vector<json> first = {system_message(long_system_prompt()), user("Tom had a red ball.")};
    const std::vector<json> second = {system_message(long_system_prompt()), user("Lily saw a big tree.")};
    const std::size_t shared = common_prefix(encode(first), encode(second));
    QVERIFY2(shared >= 100 && shared < encode(first).size() && shared < encode(second).size(),
             qPrintable(QString("%1 shared tokens").arg(shared)));

    InProcessServer server(model_, options(1, 4));
    const HttpReply first_reply = post_chat(server, first);
    QCOMPARE(first_reply.status, 200);
    QCOMPARE(cached_tokens(first_reply), 0);
    const HttpReply second_reply = post_chat(server, second);
    QCOMPARE(second_reply.status, 200);
    QCOMPARE(cached_tokens(second_reply), int(shared));
    QCOMPARE(health(server)["prefix_copies"].get<int>(), 1);  // the first conversation's cache kept whole
    QCOMPARE(health(server)["waiting_for_prefix"].get<int>(), 0);
    QCOMPARE(reply_text(second_reply), fresh_reply(second));
    QCOMPARE(reply_text(first_reply), fresh_reply(first));

    std::vector<json> first_next = first;
    first_next.push_back(assistant(reply_text(first_reply)));
    first_next.push_back(user("He was happy."));
    const HttpReply continued = post_chat(server, first_next);
    QCOMPARE(continued.status, 200);
    QVERIFY2(cached_tokens(continued) > int(shared), continued.body.c_str());
    QCOMPARE(reply_text(continued), fresh_reply(first_next));

    std::vector<json> edited = first_next;
    edited.back() = user("He was sad.");
    const std::size_t before_edit = common_prefix(encode(first_next), encode(edited));
    QVERIFY(before_edit > shared && before_edit < encode(edited).size());
    const HttpReply edited_reply = post_chat(server, edited);
    QCOMPARE(edited_reply.status, 200);
    QCOMPARE(cached_tokens(edited_reply), int(before_edit));
    QCOMPARE(reply_text(edited_reply), fresh_reply(edited));
  }

  // One slot, held by the test; a request with a long prompt waits for it, and its client leaves while it
  // waits. When the slot comes free the request stops before its first prefill chunk: nothing is
  // prefilled or generated, the slot is free again, and the next request is served.
  void client_leaving_before_the_prefill_frees_the_slot() {
    InProcessServer server(model_, options(1, 1));
    const std::vector<json> messages = {system_message(long_system_prompt()), user("Tom had a red ball.")};
    const std::size_t prompt_size = encode(messages).size();
    const std::size_t log_from = log_text().size();
    auto held = server.server().sessions().acquire_for_prompt({1, 2, 3});

    const int socket = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(server.port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    QCOMPARE(::connect(socket, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    const std::string body = chat_request(messages, 400).dump();
    const std::string http =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    QCOMPARE(::send(socket, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
    wait_until([&] { return server.server().sessions().status().waiting == 1; });
    ::close(socket);
    held.reset();
    // It has the slot once it stops waiting, and gives it back when it is done.
    wait_until([&] {
      const ServerSessions::Status status = server.server().sessions().status();
      return status.waiting == 0 && status.running == 0;
    });

    const std::string log = log_text().substr(log_from);
    const std::string expected = "client disconnected during the prefill (0 of " + std::to_string(prompt_size) +
                                 " prompt tokens cached): prefill stopped";
    QVERIFY2(log.find(expected) != std::string::npos, log.c_str());
    QVERIFY2(log.find("client disconnected after ") == std::string::npos, log.c_str());
    QCOMPARE(health(server)["kv_cache_bytes"].get<std::int64_t>(), std::int64_t(0));
    QCOMPARE(post_chat(server, {user("Once")}, 4).status, 200);
  }

  // A client asked before each prefill chunk that is gone at the third ask: two chunks prefilled, nothing
  // generated, the slot free (with no queue, a request still running would have the next one refused).
  void client_leaving_stops_the_prefill_between_chunks() {
    ServerSessions sessions(model_, nullptr, /*parallel=*/1, /*max_queue=*/0);
    sessions.set_prefill_chunk_tokens(16);
    const std::vector<TokenId> ids =
        sessions.encode_chat(chat_messages({system_message(long_system_prompt()), user("Tom had a red ball.")}));
    QVERIFY(ids.size() > 100);
    SamplingRequest sampling;
    sampling.temperature = 0;
    sampling.max_tokens = 16;
    auto lease = sessions.acquire_for_prompt(ids);
    int asked = 0;
    bool stopped_by_client = false;
    const CompletionResult result = sessions.run(
        *lease, ids, sampling, [&](const std::string&) { return ++asked < 3; }, &stopped_by_client);
    QVERIFY(stopped_by_client);
    QCOMPARE(asked, 3);
    QCOMPARE(result.stats.prefilled_tokens, 32);
    QCOMPARE(result.stats.generated_tokens, 0);
    QCOMPARE(result.text, std::string());
    lease.reset();
    QCOMPARE(sessions.status().running, 0);
    QVERIFY(sessions.acquire_for_prompt(ids) != nullptr);
  }

  // The session sharing the longest prefix is still prefilling it (its client is slow to be asked): the
  // second request waits for that prefix rather than prefilling it again, gets a copy as soon as the
  // first's prefill holds it, and both replies are those of sessions of their own.
  void running_prefill_shares_its_prefix() {
    const std::vector<kvchat::ChatMessage> first =
        chat_messages({system_message(long_system_prompt()), user("Tom had a red ball.")});
    const std::vector<kvchat::ChatMessage> second =
        chat_messages({system_message(long_system_prompt()), user("Lily saw a big tree.")});
    SamplingRequest sampling;
    sampling.temperature = 0;
    sampling.max_tokens = 16;
    auto alone = [&](const std::vector<kvchat::ChatMessage>& messages) {
      ServerSessions sessions(model_, nullptr, 1, 0);
      sessions.set_prefill_chunk_tokens(16);
      const std::vector<TokenId> ids = sessions.encode_chat(messages);
      auto lease = sessions.acquire_for_prompt(ids);
      return sessions.run(*lease, ids, sampling, {}, nullptr).text;
    };
    const std::string first_alone = alone(first), second_alone = alone(second);

    ServerSessions sessions(model_, nullptr, /*parallel=*/2, /*max_queue=*/0);
    sessions.set_prefill_chunk_tokens(16);
    const std::vector<TokenId> first_ids = sessions.encode_chat(first), second_ids = sessions.encode_chat(second);
    const std::size_t shared = common_prefix(first_ids, second_ids);
    QVERIFY(shared >= 100 && shared < second_ids.size());

    std::mutex mutex;
    std::condition_variable resumed;
    bool go = false;
    auto first_lease = sessions.acquire_for_prompt(first_ids);
    CompletionResult first_result;
    std::thread first_thread([&] {
      // Asked before its first chunk, the client answers only once the second request waits.
      first_result = sessions.run(
          *first_lease, first_ids, sampling,
          [&](const std::string&) {
            std::unique_lock<std::mutex> lock(mutex);
            resumed.wait(lock, [&] { return go; });
            return true;
          },
          nullptr);
      first_lease.reset();
    });
    std::unique_ptr<ServerSessions::Lease> second_lease;
    std::thread second_thread([&] { second_lease = sessions.acquire_for_prompt(second_ids); });
    wait_until([&] { return sessions.status().waiting_for_prefix == 1; });
    QCOMPARE(sessions.status().prefix_copies, std::int64_t(0));
    {
      std::lock_guard<std::mutex> lock(mutex);
      go = true;
    }
    resumed.notify_all();
    second_thread.join();
    QCOMPARE(sessions.status().prefix_copies, std::int64_t(1));
    const CompletionResult second_result = sessions.run(*second_lease, second_ids, sampling, {}, nullptr);
    second_lease.reset();
    first_thread.join();
    QCOMPARE(second_result.stats.reused_tokens, int(shared));
    QCOMPARE(second_result.stats.prefilled_tokens, int(second_ids.size() - shared));
    QCOMPARE(second_result.text, second_alone);
    QCOMPARE(first_result.text, first_alone);
    QCOMPARE(first_result.stats.prefilled_tokens, int(first_ids.size()));
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestOpenAiServerSessions)

}  // namespace app_test_openai_server_sessions

#include "test_openai_server_sessions.moc"
