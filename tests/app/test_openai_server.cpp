// `kvchat-cli serve` over HTTP, as a client sees it: OpenAI's error shapes and statuses, a streamed reply
// equal to the whole one and to `kvchat-cli generate` on the same prompt, KV reuse across the turns of a
// conversation, a client leaving mid-stream, concurrent clients, and the official `openai` npm client.
// On stories260K (no chat template: the messages are joined as plain text), greedy.
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <filesystem>
#include <thread>

#include "app/server/openai_protocol.h"
#include "app/server/openai_sessions.h"
#include "common/cli_runner.h"
#include "common/model_folder_copy.h"
#include "common/openai_npm_package.h"
#include "common/server_process.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_openai_server {

using kvchat::test::HttpReply;
using kvchat::test::ServerProcess;
using nlohmann::json;

namespace {

const char* kApiKey = "test-key-123";
const httplib::Headers kAuth = {{"Authorization", std::string("Bearer ") + kApiKey}};

QString model_path() { return QString::fromStdString(kvchat::test::shared_path("models/stories260K")); }

json chat_request(const std::vector<json>& messages, int max_tokens, bool stream = false) {
  json body = {{"model", "stories260K"}, {"messages", messages}, {"temperature", 0}, {"max_tokens", max_tokens}};
  if (stream) body["stream"] = true;
  return body;
}
json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }
json assistant(const std::string& text) { return {{"role", "assistant"}, {"content", text}}; }

struct Streamed {
  int status = 0;
  std::string text;
  std::string finish_reason;
  bool done = false;  // saw data: [DONE]
  json usage;
  int events = 0;
};

Streamed stream_chat(httplib::Client& client, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Streamed streamed;
  streamed.status =
      kvchat::test::post_stream(client, "/v1/chat/completions", body.dump(), kAuth, [&](const std::string& data) {
        ++streamed.events;
        if (data == "[DONE]") {
          streamed.done = true;
          return true;
        }
        const json chunk = json::parse(data);
        if (chunk.contains("usage") && !chunk["usage"].is_null()) streamed.usage = chunk["usage"];
        if (chunk["choices"].empty()) return true;
        const json& choice = chunk["choices"][0];
        if (choice["delta"].contains("content")) streamed.text += choice["delta"]["content"].get<std::string>();
        if (!choice["finish_reason"].is_null()) streamed.finish_reason = choice["finish_reason"];
        return true;
      });
  return streamed;
}

std::string whole_text(const HttpReply& reply) { return reply.json()["choices"][0]["message"]["content"]; }

}  // namespace

class TestOpenAiServer : public QObject {
  Q_OBJECT

 private:
  ServerProcess server_;

  void expect_error(const HttpReply& reply, int status, const std::string& code, const std::string& param = "") {
    QCOMPARE(reply.status, status);
    const json body = reply.json();
    QVERIFY2(body.is_object() && body.contains("error"), reply.body.c_str());
    const json& error = body["error"];
    QVERIFY(error["message"].is_string() && !error["message"].get<std::string>().empty());
    QVERIFY(error["type"].is_string());
    QVERIFY(error.contains("param") && error.contains("code"));
    QCOMPARE(error["code"].is_null() ? std::string() : error["code"].get<std::string>(), code);
    if (!param.empty()) QCOMPARE(error["param"].get<std::string>(), param);
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(server_.start(
        {"--model", model_path(), "--api-key", kApiKey, "--parallel", "4", "--max-body-mib", "1", "--threads", "1"}));
  }

  // No server needed: a stop text split across chunks is held back until it is told apart.
  void stop_text_filter_holds_back_partial_matches() {
    kvchat::app::openai::StopTextFilter filter({"END", "xyz"});
    QCOMPARE(filter.push("abc E"), std::string("abc "));
    QCOMPARE(filter.push("N"), std::string());
    QCOMPARE(filter.push("x"), std::string("EN"));  // "ENx" cannot become END, but "x" may start "xyz"
    QVERIFY(!filter.matched());
    QCOMPARE(filter.push("yz tail"), std::string());
    QVERIFY(filter.matched());
    QCOMPARE(filter.finish(), std::string());
    kvchat::app::openai::StopTextFilter open_end({"END"});
    QCOMPARE(open_end.push("the EN"), std::string("the "));
    QCOMPARE(open_end.finish(), std::string("EN"));
  }

  void health_and_models() {
    httplib::Client client = server_.client();
    auto health = client.Get("/health");  // no key needed
    QVERIFY(health);
    QCOMPARE(health->status, 200);
    auto models = client.Get("/v1/models", kAuth);
    QVERIFY(models);
    QCOMPARE(models->status, 200);
    const json list = json::parse(models->body);
    QCOMPARE(list["data"].size(), std::size_t(1));
    QCOMPARE(list["data"][0]["id"].get<std::string>(), std::string("stories260K"));
    QCOMPARE(list["data"][0]["context_length"].get<int>(), 512);
    QCOMPARE(list["data"][0]["architecture"].get<std::string>(), std::string("llama"));
  }

  // The SDKs' models.retrieve(id).
  void a_model_is_retrieved_by_id() {
    httplib::Client client = server_.client();
    for (const char* path : {"/v1/models/stories260K", "/models/stories260K"}) {
      auto reply = client.Get(path, kAuth);
      QVERIFY(reply);
      QCOMPARE(reply->status, 200);
      const json model = json::parse(reply->body);
      QCOMPARE(model["id"].get<std::string>(), std::string("stories260K"));
      QCOMPARE(model["object"].get<std::string>(), std::string("model"));
    }
    auto other = client.Get("/v1/models/gpt-4o", kAuth);
    QVERIFY(other);
    expect_error(HttpReply{other->status, other->body}, 404, "model_not_found", "model");
    auto unauthorised = client.Get("/v1/models/stories260K");
    QVERIFY(unauthorised);
    QCOMPARE(unauthorised->status, 401);
  }

  // Every field of OpenAI's chat-completions request object, sent once asking for something: read (the
  // request succeeds) or refused with a 400 naming it; never dropped unread. At a value that asks for
  // nothing (as SDKs send defaults) each is accepted.
  void every_request_field_is_read_or_refused() {
    httplib::Client client = server_.client();
    const std::vector<std::pair<const char*, json>> read = {
        {"model", "stories260K"},
        {"max_tokens", 3},
        {"max_completion_tokens", 3},
        {"temperature", 0},
        {"top_p", 0.5},
        {"seed", 7},
        {"stop", "zzz"},
        {"n", 1},
        {"stream", false},
        {"stream_options", {{"include_usage", true}}},
        {"user", "user-1"},
        {"metadata", {{"purpose", "test"}}},
        {"safety_identifier", "id-1"},
        {"prompt_cache_key", "key-1"},
        {"service_tier", "auto"},
        {"top_k", 5},
        {"min_p", 0.1},
        {"repetition_penalty", 1.3},
        {"repeat_penalty", 1.3},
        {"repeat_last_n", 32},
        {"logprobs", true},
        {"response_format", {{"type", "json_object"}}},  // constrained decoding (app_test_openai_tools)
    };
    for (const auto& [name, value] : read) {
      json request = chat_request({user("Once")}, 3);
      request[name] = value;
      const HttpReply reply = kvchat::test::post_json(client, "/v1/chat/completions", request.dump(), kAuth);
      QVERIFY2(reply.status == 200, (std::string(name) + ": " + reply.body).c_str());
    }
    const std::vector<std::pair<const char*, json>> refused = {
        {"frequency_penalty", 0.5},
        {"presence_penalty", 0.5},
        {"logit_bias", {{"42", 5}}},
        {"top_logprobs", 2},                                                              // without logprobs: true
        {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},  // no template renders them
        {"tool_choice", "required"},                                                      // with no tools
        {"functions", json::array({{{"name", "f"}}})},
        {"function_call", {{"name", "f"}}},
        {"response_format", "json"},  // not an object
        {"modalities", json::array({"text", "audio"})},
        {"audio", {{"voice", "alloy"}, {"format", "wav"}}},
        {"prediction", {{"type", "content"}, {"content", "x"}}},
        {"reasoning_effort", "high"},
        {"verbosity", "low"},
        {"web_search_options", {{"search_context_size", "low"}}},
        {"store", true},
        {"service_tier", "flex"},
        {"n", 2},
        {"temperature", 3},
        {"an_unknown_field", 1},
    };
    for (const auto& [name, value] : refused) {
      json request = chat_request({user("Once")}, 3);
      request[name] = value;
      const HttpReply reply = kvchat::test::post_json(client, "/v1/chat/completions", request.dump(), kAuth);
      QVERIFY2(reply.status == 400, (std::string(name) + ": " + reply.body).c_str());
      QCOMPARE(reply.json()["error"]["param"].get<std::string>(), std::string(name));
    }
    // What SDKs send as defaults asks for nothing: accepted.
    json defaults = chat_request({user("Once")}, 3);
    for (const auto& [name, value] : {std::pair<const char*, json>{"frequency_penalty", 0},
                                      {"presence_penalty", 0},
                                      {"logit_bias", json::object()},
                                      {"logprobs", false},
                                      {"tools", json::array()},
                                      {"tool_choice", "auto"},
                                      {"parallel_tool_calls", true},
                                      {"response_format", {{"type", "text"}}},
                                      {"store", false},
                                      {"audio", nullptr}})
      defaults[name] = value;
    QCOMPARE(kvchat::test::post_json(client, "/v1/chat/completions", defaults.dump(), kAuth).status, 200);
    // A message's fields: what an assistant message carries back (refusal: null) is fine; a name is refused.
    json message_fields = chat_request(
        {user("Once"), {{"role", "assistant"}, {"content", "Hi"}, {"refusal", nullptr}}, user("Go on")}, 3);
    QCOMPARE(kvchat::test::post_json(client, "/v1/chat/completions", message_fields.dump(), kAuth).status, 200);
    message_fields["messages"][0]["name"] = "Ann";
    const HttpReply named = kvchat::test::post_json(client, "/v1/chat/completions", message_fields.dump(), kAuth);
    expect_error(named, 400, "unsupported_field", "messages[0].name");
    // /v1/completions' own fields.
    for (const auto& [name, value] : {std::pair<const char*, json>{"echo", true},
                                      {"best_of", 2},
                                      {"suffix", "end"},
                                      {"logprobs", 21},
                                      {"messages", json::array()}}) {
      json request = {{"model", "stories260K"}, {"prompt", "Once"}, {"max_tokens", 3}, {name, value}};
      const HttpReply reply = kvchat::test::post_json(client, "/v1/completions", request.dump(), kAuth);
      QVERIFY2(reply.status == 400, (std::string(name) + ": " + reply.body).c_str());
      QCOMPARE(reply.json()["error"]["param"].get<std::string>(), std::string(name));
    }
  }

  // top_k, min_p and the repetition penalty as llama-server and vLLM take them, applied as
  // `kvchat-cli generate` applies its own options.
  void sampling_extensions_are_applied() {
    httplib::Client client = server_.client();
    json request = {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"temperature", 0},
                    {"max_tokens", 40},       {"repeat_penalty", 1.5},        {"repeat_last_n", 64}};
    const HttpReply penalised = kvchat::test::post_json(client, "/v1/completions", request.dump(), kAuth);
    QCOMPARE(penalised.status, 200);
    const auto generated = kvchat::test::run_cli({"generate", "--model", model_path(), "--prompt", "Once upon a time",
                                                  "--max-new-tokens", "40", "--repeat-penalty", "1.5", "--json"});
    QCOMPARE(generated.exit_code, 0);
    const std::string expected = json::parse(generated.out)["generated_text"];
    QCOMPARE(penalised.json()["choices"][0]["text"].get<std::string>(), expected);
    request.erase("repeat_penalty");
    const HttpReply plain = kvchat::test::post_json(client, "/v1/completions", request.dump(), kAuth);
    QVERIFY(plain.json()["choices"][0]["text"].get<std::string>() != expected);  // the penalty did something
    // top_k 1 at a high temperature is greedy.
    request["temperature"] = 1.5;
    request["top_k"] = 1;
    request["seed"] = 3;
    QCOMPARE(kvchat::test::post_json(client, "/v1/completions", request.dump(), kAuth).json()["choices"][0]["text"],
             plain.json()["choices"][0]["text"]);
  }

  // A prompt as one string in an array, as token ids, or as one array of ids: the same reply.
  void a_prompt_may_be_an_array_or_token_ids() {
    httplib::Client client = server_.client();
    const auto generated = kvchat::test::run_cli(
        {"generate", "--model", model_path(), "--prompt", "Once upon a time", "--max-new-tokens", "20", "--json"});
    QCOMPARE(generated.exit_code, 0);
    const json expected = json::parse(generated.out);
    const json ids = expected["prompt_ids"];
    for (const json& prompt : {json::array({"Once upon a time"}), ids, json::array({ids})}) {
      const json request = {{"model", "stories260K"}, {"prompt", prompt}, {"temperature", 0}, {"max_tokens", 20}};
      const HttpReply reply = kvchat::test::post_json(client, "/v1/completions", request.dump(), kAuth);
      QVERIFY2(reply.status == 200, reply.body.c_str());
      QCOMPARE(reply.json()["choices"][0]["text"].get<std::string>(), expected["generated_text"].get<std::string>());
      QCOMPARE(reply.json()["usage"]["prompt_tokens"].get<std::size_t>(), ids.size());
    }
    for (const json& prompt : {json::array({"one", "two"}), json::array({1, 99999}), json::array(), json(5)}) {
      const json request = {{"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", 2}};
      expect_error(kvchat::test::post_json(client, "/v1/completions", request.dump(), kAuth), 400, "invalid_value",
                   "prompt");
    }
  }

  // logprobs: each token's log-softmax of the logits it was sampled from (an uncached forward of the
  // sequence so far, in this process), the top alternatives in order; the tokens' texts make up the reply,
  // streamed or whole, and a stop text's tokens are left out.
  void logprobs_are_those_of_the_logits() {
    httplib::Client client = server_.client();
    const auto generated = kvchat::test::run_cli(
        {"generate", "--model", model_path(), "--prompt", "Once upon a time", "--max-new-tokens", "24", "--json"});
    QCOMPARE(generated.exit_code, 0);
    const json expected = json::parse(generated.out);
    const std::vector<kvchat::TokenId> prompt_ids = expected["prompt_ids"];
    const std::vector<kvchat::TokenId> generated_ids = expected["generated_ids"];
    const json request = {
        {"model", "stories260K"}, {"prompt", prompt_ids}, {"temperature", 0}, {"max_tokens", 24}, {"logprobs", 3}};
    const HttpReply reply = kvchat::test::post_json(client, "/v1/completions", request.dump(), kAuth);
    QVERIFY2(reply.status == 200, reply.body.c_str());
    const json choice = reply.json()["choices"][0];
    const json& logprobs = choice["logprobs"];
    const std::string text = choice["text"];
    QCOMPARE(text, expected["generated_text"].get<std::string>());
    std::string joined;
    for (const json& token : logprobs["tokens"]) joined += token.get<std::string>();
    QCOMPARE(joined, text);
    const std::size_t count = logprobs["token_logprobs"].size();
    QVERIFY(count > 0 && count <= generated_ids.size());

    const kvchat::LoadedModel model = kvchat::load_model(kvchat::test::shared_path("models/stories260K"));
    std::vector<kvchat::TokenId> sequence = prompt_ids;
    for (std::size_t i = 0; i < count; ++i) {
      const at::Tensor expected_logprobs =
          at::log_softmax(model.model->forward(sequence, 0, nullptr).to(at::kDouble), 0);
      const double chosen = expected_logprobs[generated_ids[i]].item<double>();
      QVERIFY2(
          std::abs(logprobs["token_logprobs"][i].get<double>() - chosen) < 1e-4,
          qPrintable(
              QString("token %1: %2 against %3").arg(i).arg(logprobs["token_logprobs"][i].get<double>()).arg(chosen)));
      QCOMPARE(logprobs["text_offset"][i].get<std::size_t>(),
               std::size_t(joined.find(logprobs["tokens"][i].get<std::string>(),
                                       logprobs["text_offset"][i].get<std::size_t>())));
      // The best alternative is the greedy choice; its logprob is the largest of the row.
      const json& top = logprobs["top_logprobs"][i];
      QVERIFY(!top.empty() && top.size() <= 3);
      double best = -1e9;
      for (auto it = top.begin(); it != top.end(); ++it) best = std::max(best, it->get<double>());
      QVERIFY(std::abs(best - expected_logprobs.max().item<double>()) < 1e-4);
      sequence.push_back(generated_ids[i]);
    }

    // Chat: the same figures in OpenAI's chat shape, and a stream carries the same entries.
    json chat = chat_request({user("Once upon a time")}, 24);
    chat["logprobs"] = true;
    chat["top_logprobs"] = 2;
    const HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", chat.dump(), kAuth);
    QCOMPARE(whole.status, 200);
    const json content = whole.json()["choices"][0]["logprobs"]["content"];
    std::string chat_joined;
    for (const json& entry : content) {
      chat_joined += entry["token"].get<std::string>();
      QCOMPARE(entry["top_logprobs"].size(), std::size_t(2));
      QCOMPARE(entry["top_logprobs"][0]["logprob"].get<double>(), entry["logprob"].get<double>());  // greedy
      QCOMPARE(entry["bytes"].size(), entry["token"].get<std::string>().size());
    }
    QCOMPARE(chat_joined, whole_text(whole));
    json streamed_entries = json::array();
    chat["stream"] = true;
    const int status =
        kvchat::test::post_stream(client, "/v1/chat/completions", chat.dump(), kAuth, [&](const std::string& data) {
          if (data == "[DONE]") return true;
          const json chunk = json::parse(data);
          if (!chunk["choices"].empty() && chunk["choices"][0]["logprobs"].is_object())
            for (const json& entry : chunk["choices"][0]["logprobs"]["content"]) streamed_entries.push_back(entry);
          return true;
        });
    QCOMPARE(status, 200);
    QCOMPARE(streamed_entries, content);

    // A stop text: the entries cover the text before it, no more.
    const std::string full = whole_text(whole);
    const std::size_t space = full.find(' ', 5);
    QVERIFY(space != std::string::npos);
    chat.erase("stream");
    chat["stop"] = full.substr(space, 3);
    const HttpReply cut = kvchat::test::post_json(client, "/v1/chat/completions", chat.dump(), kAuth);
    std::string cut_joined;
    const json cut_body = cut.json();
    for (const json& entry : cut_body["choices"][0]["logprobs"]["content"])
      cut_joined += entry["token"].get<std::string>();
    QCOMPARE(whole_text(cut), full.substr(0, space));
    QVERIFY2(cut_joined.size() >= whole_text(cut).size() &&
                 cut_joined.compare(0, whole_text(cut).size(), whole_text(cut)) == 0,
             cut_joined.c_str());
    QVERIFY(cut_joined.size() < full.size());
  }

  void errors_have_openai_shape() {
    httplib::Client client = server_.client();
    const std::string valid = chat_request({user("Once")}, 4).dump();
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", valid), 401, "invalid_api_key");
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", valid, {{"Authorization", "Bearer wrong"}}),
                 401, "invalid_api_key");
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", "{\"model\": ", kAuth), 400, "invalid_json");
    json wrong = chat_request({user("Once")}, 4);
    wrong["messages"] = "Once";
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", wrong.dump(), kAuth), 400, "invalid_value",
                 "messages");
    wrong = chat_request({user("Once")}, 4);
    wrong["temperature"] = "hot";
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", wrong.dump(), kAuth), 400, "invalid_value",
                 "temperature");
    wrong = chat_request({user("Once")}, 4);
    wrong["n"] = 2;
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", wrong.dump(), kAuth), 400, "invalid_value",
                 "n");
    wrong = chat_request({user("Once")}, 4);
    wrong["stop"] = 5;
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", wrong.dump(), kAuth), 400, "invalid_value",
                 "stop");
    wrong = chat_request({user("Once")}, 4);
    wrong["model"] = "gpt-4o";
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", wrong.dump(), kAuth), 404, "model_not_found",
                 "model");

    // 512 positions: ~1000 words cannot fit; the message says how many tokens against which limit.
    std::string long_text;
    for (int i = 0; i < 1000; ++i) long_text += " the cat";
    const HttpReply too_long =
        kvchat::test::post_json(client, "/v1/chat/completions", chat_request({user(long_text)}, 4).dump(), kAuth);
    expect_error(too_long, 400, "context_length_exceeded", "messages");
    const std::string message = too_long.json()["error"]["message"];
    QVERIFY2(
        message.find("tokens long") != std::string::npos && message.find("context limit is 512") != std::string::npos,
        message.c_str());

    json huge = chat_request({user(std::string(std::size_t(2) << 20, 'a'))}, 4);  // over --max-body-mib 1
    expect_error(kvchat::test::post_json(client, "/v1/chat/completions", huge.dump(), kAuth), 413, "request_too_large");
    expect_error(kvchat::test::post_json(client, "/v1/nothing", valid, kAuth), 404, "unknown_url");
    QVERIFY(server_.running());
  }

  void stream_equals_whole_and_generate() {
    httplib::Client client = server_.client();
    const json request = chat_request({user("Once upon a time")}, 40);
    const HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", request.dump(), kAuth);
    QCOMPARE(whole.status, 200);
    const json body = whole.json();
    QCOMPARE(body["object"].get<std::string>(), std::string("chat.completion"));
    const std::string text = whole_text(whole);
    QVERIFY(!text.empty());
    QCOMPARE(body["usage"]["total_tokens"].get<int>(),
             body["usage"]["prompt_tokens"].get<int>() + body["usage"]["completion_tokens"].get<int>());
    QVERIFY(body["timings"].contains("decode_tokens_per_second") && body["timings"].contains("restored_tokens"));

    const Streamed streamed = stream_chat(client, request);
    QCOMPARE(streamed.status, 200);
    QVERIFY(streamed.done);
    QCOMPARE(streamed.text, text);
    QCOMPARE(streamed.finish_reason, body["choices"][0]["finish_reason"].get<std::string>());
    QCOMPARE(streamed.usage["completion_tokens"].get<int>(), body["usage"]["completion_tokens"].get<int>());

    // No chat template: the rendered prompt is the message itself, encoded as `generate --prompt` does.
    const auto generated = kvchat::test::run_cli(
        {"generate", "--model", model_path(), "--prompt", "Once upon a time", "--max-new-tokens", "40", "--json"});
    QCOMPARE(generated.exit_code, 0);
    QCOMPARE(json::parse(generated.out)["generated_text"].get<std::string>(), text);
  }

  void stop_text_cuts_the_reply() {
    httplib::Client client = server_.client();
    const std::string full = whole_text(kvchat::test::post_json(
        client, "/v1/chat/completions", chat_request({user("Once upon a time")}, 40).dump(), kAuth));
    const std::size_t space = full.find(' ', 5);
    QVERIFY(space != std::string::npos);
    const std::string stop = full.substr(space, 3);
    json request = chat_request({user("Once upon a time")}, 40);
    request["stop"] = json::array({stop, "zzzz"});
    const HttpReply cut = kvchat::test::post_json(client, "/v1/chat/completions", request.dump(), kAuth);
    QCOMPARE(whole_text(cut), full.substr(0, full.find(stop)));
    QCOMPARE(cut.json()["choices"][0]["finish_reason"].get<std::string>(), std::string("stop"));
    QCOMPARE(stream_chat(client, request).text, full.substr(0, full.find(stop)));
  }

  void later_turns_reuse_the_cache() {
    httplib::Client client = server_.client();
    std::vector<json> messages = {user("A little bird")};
    std::vector<int> cached, prompt;
    for (const char* next : {" The bird sang", " Then it flew"}) {
      const HttpReply reply =
          kvchat::test::post_json(client, "/v1/chat/completions", chat_request(messages, 16).dump(), kAuth);
      QCOMPARE(reply.status, 200);
      cached.push_back(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]);
      prompt.push_back(reply.json()["usage"]["prompt_tokens"]);
      messages.push_back(assistant(whole_text(reply)));
      messages.push_back(user(next));
    }
    const HttpReply third =
        kvchat::test::post_json(client, "/v1/chat/completions", chat_request(messages, 16).dump(), kAuth);
    QCOMPARE(third.status, 200);
    cached.push_back(third.json()["usage"]["prompt_tokens_details"]["cached_tokens"]);
    // Turn 2 reuses at least turn 1's prompt, turn 3 at least turn 2's.
    QVERIFY2(cached[1] >= prompt[0] && cached[2] >= prompt[1] && cached[2] > cached[1],
             QString("cached %1 %2 %3, prompts %4 %5")
                 .arg(cached[0])
                 .arg(cached[1])
                 .arg(cached[2])
                 .arg(prompt[0])
                 .arg(prompt[1])
                 .toUtf8());
  }

  void disconnect_stops_generation() {
    httplib::Client client = server_.client();
    json request = chat_request({user("One day")}, 400);
    const HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", request.dump(), kAuth);
    const int full_tokens = whole.json()["usage"]["completion_tokens"];
    QVERIFY2(full_tokens >= 40, "the reply must be long enough to leave in the middle");

    const std::size_t log_from = server_.log().size();
    request["stream"] = true;
    int content_events = 0;
    kvchat::test::post_stream(client, "/v1/chat/completions", request.dump(), kAuth,
                              [&](const std::string&) { return ++content_events < 3; });
    QVERIFY(server_.wait_for_log("client disconnected after ", 60000, log_from));
    const std::string log = server_.log().substr(log_from);
    const std::size_t at = log.find("client disconnected after ") + std::string("client disconnected after ").size();
    const int stopped_at = std::stoi(log.substr(at));
    QVERIFY2(stopped_at < full_tokens, log.c_str());
    // The server goes on serving.
    httplib::Client next = server_.client();
    QCOMPARE(
        kvchat::test::post_json(next, "/v1/chat/completions", chat_request({user("Once")}, 4).dump(), kAuth).status,
        200);
  }

  void concurrent_clients_get_their_own_text() {
    const std::vector<std::string> prompts = {"The sun", "A big dog", "Lily went", "Tom had a"};
    std::vector<std::string> alone;
    for (const std::string& prompt : prompts) {
      httplib::Client client = server_.client();
      alone.push_back(whole_text(
          kvchat::test::post_json(client, "/v1/chat/completions", chat_request({user(prompt)}, 48).dump(), kAuth)));
    }
    std::vector<std::string> together(prompts.size());
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < prompts.size(); ++i)
      threads.emplace_back([&, i] {
        httplib::Client client = server_.client();
        if (i % 2 == 0) {
          together[i] = stream_chat(client, chat_request({user(prompts[i])}, 48)).text;
        } else {
          const HttpReply reply = kvchat::test::post_json(client, "/v1/chat/completions",
                                                          chat_request({user(prompts[i])}, 48).dump(), kAuth);
          together[i] = reply.status == 200 ? whole_text(reply) : "status " + std::to_string(reply.status);
        }
      });
    for (std::thread& thread : threads) thread.join();
    for (std::size_t i = 0; i < prompts.size(); ++i) QCOMPARE(together[i], alone[i]);
  }

  void raw_completion() {
    httplib::Client client = server_.client();
    const json request = {
        {"model", "stories260K"}, {"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 40}};
    const HttpReply reply = kvchat::test::post_json(client, "/v1/completions", request.dump(), kAuth);
    QCOMPARE(reply.status, 200);
    const auto generated = kvchat::test::run_cli(
        {"generate", "--model", model_path(), "--prompt", "Once upon a time", "--max-new-tokens", "40", "--json"});
    QCOMPARE(reply.json()["choices"][0]["text"].get<std::string>(),
             json::parse(generated.out)["generated_text"].get<std::string>());
  }

  // A chat template (Llama 2's shape, with <s> and </s> as special tokens in the rendered text): the
  // reply equals the terminal chat's (the same turn code), streamed or whole, and later turns reuse the
  // cache of earlier ones, so each prefills little more than its new turn.
  void chat_template_conversation() {
    QTemporaryDir dir;
    const std::string model =
        kvchat::test::copy_reference_model("stories260K", dir.filePath("templated").toStdString());
    json config = json::parse(kvchat::test::read_file_bytes(model + "/tokenizer_config.json"));
    config["chat_template"] =
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
        "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
        "{% else %}{{ raise_exception('only user and assistant roles') }}{% endif %}{% endfor %}";
    kvchat::test::write_file_bytes(model + "/tokenizer_config.json", config.dump());
    ServerProcess server;
    QVERIFY(server.start({"--model", QString::fromStdString(model), "--model-id", "templated", "--threads", "1"}));
    httplib::Client client = server.client();
    // What the template refuses is the request's fault.
    json refused = chat_request({json{{"role", "system"}, {"content", "Be brief."}}, user("Hi")}, 4);
    refused["model"] = "templated";
    const HttpReply template_error = kvchat::test::post_json(client, "/v1/chat/completions", refused.dump());
    expect_error(template_error, 400, "template_error", "messages");
    QVERIFY2(template_error.body.find("only user and assistant roles") != std::string::npos,
             template_error.body.c_str());

    std::vector<json> messages;
    std::vector<int> cached, prompt;
    for (const char* turn : {"Once upon a time", "The cat said", "Then the dog"}) {
      messages.push_back(user(turn));
      json request = chat_request(messages, 16);
      request["model"] = "templated";
      const HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", request.dump());
      QCOMPARE(whole.status, 200);
      const Streamed streamed = stream_chat(client, request);
      QCOMPARE(streamed.text, whole_text(whole));
      cached.push_back(whole.json()["usage"]["prompt_tokens_details"]["cached_tokens"]);
      prompt.push_back(whole.json()["usage"]["prompt_tokens"]);
      messages.push_back(assistant(whole_text(whole)));
    }
    QVERIFY2(cached[1] >= prompt[0] && cached[2] >= prompt[1], QString("cached %1 %2 %3, prompts %4 %5")
                                                                   .arg(cached[0])
                                                                   .arg(cached[1])
                                                                   .arg(cached[2])
                                                                   .arg(prompt[0])
                                                                   .arg(prompt[1])
                                                                   .toUtf8());

    const auto chat =
        kvchat::test::run_cli({"chat", "--model", QString::fromStdString(model), "--db", dir.filePath("chats.sqlite3"),
                               "--message", "Once upon a time", "--max-new-tokens", "16", "--kv-snapshots", "off"});
    QCOMPARE(chat.exit_code, 0);
    QCOMPARE(chat.out, messages[1]["content"].get<std::string>() + "\n");
  }

  // --cache-dir: a session's KV cache outlives the server; the next run restores it for a request that
  // continues the conversation, and replies as a server that never stopped does.
  void snapshots_survive_a_restart() {
    QTemporaryDir cache;
    std::vector<json> messages = {user("A little bird")};
    int first_prompt = 0;
    {
      ServerProcess first;
      QVERIFY(first.start({"--model", model_path(), "--cache-dir", cache.path(), "--threads", "1"}));
      httplib::Client client = first.client();
      const HttpReply reply =
          kvchat::test::post_json(client, "/v1/chat/completions", chat_request(messages, 24).dump());
      QCOMPARE(reply.status, 200);
      first_prompt = reply.json()["usage"]["prompt_tokens"];
      messages.push_back(assistant(whole_text(reply)));
      messages.push_back(user(" The bird sang"));
      QVERIFY(first.stop());
    }
    ServerProcess second;
    QVERIFY(second.start({"--model", model_path(), "--cache-dir", cache.path(), "--threads", "1"}));
    httplib::Client client = second.client();
    const HttpReply restored =
        kvchat::test::post_json(client, "/v1/chat/completions", chat_request(messages, 24).dump());
    QCOMPARE(restored.status, 200);
    const json body = restored.json();
    QVERIFY2(body["timings"]["restored_tokens"].get<int>() > first_prompt &&
                 body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() > first_prompt,
             restored.body.c_str());
    httplib::Client plain = server_.client();
    QCOMPARE(whole_text(restored), whole_text(kvchat::test::post_json(plain, "/v1/chat/completions",
                                                                      chat_request(messages, 24).dump(), kAuth)));
  }

  // Admission without HTTP: one slot and no queue, so a second request is refused while the first runs.
  void full_queue_is_refused() {
    const kvchat::LoadedModel model = kvchat::load_model(kvchat::test::shared_path("models/stories260K"));
    kvchat::app::openai::ServerSessions sessions(model, nullptr, /*parallel=*/1, /*max_queue=*/0);
    auto first = sessions.acquire_for_prompt({1, 2, 3});
    try {
      sessions.acquire_for_prompt({1, 2, 3});
      QFAIL("a second request was admitted");
    } catch (const kvchat::app::openai::ApiError& error) {
      QCOMPARE(error.status, 429);
      QCOMPARE(error.code, std::string("queue_full"));
    }
    first.reset();
    QVERIFY(sessions.acquire_for_prompt({1, 2, 3}) != nullptr);
  }

  // The official client library: npm fetches it into the build folder; without the registry, skipped.
  void official_openai_npm_client() {
    const QString package_dir = kvchat::test::openai_npm_package_dir();
    if (const QString unavailable = kvchat::test::install_openai_npm_package(); !unavailable.isEmpty())
      QSKIP(qPrintable(unavailable));
    QProcess node;
    const QString script =
        QString::fromStdString(std::string(std::getenv("KVCHAT_SOURCE_DIR") ? std::getenv("KVCHAT_SOURCE_DIR") : ".")) +
        "/tests/app/openai_client.mjs";
    node.start("node",
               {script, package_dir, QString("http://127.0.0.1:%1/v1").arg(server_.port()), kApiKey, "stories260K"});
    if (!node.waitForStarted(30000)) QSKIP("node is not installed");
    QVERIFY(node.waitForFinished(300000));
    const std::string out = node.readAllStandardOutput().toStdString();
    QVERIFY2(node.exitCode() == 0, node.readAllStandardError().constData());
    const json result = json::parse(out);
    QCOMPARE(result["whole"]["texts"], result["streamed"]["texts"]);
    for (const char* mode : {"whole", "streamed"}) {
      const json& cached = result[mode]["cached"];
      QVERIFY2(cached[1].get<int>() > 0 && cached[2].get<int>() > cached[1].get<int>(), out.c_str());
    }
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestOpenAiServer)

}  // namespace app_test_openai_server

#include "test_openai_server.moc"
