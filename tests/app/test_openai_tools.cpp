// Tool calls and structured output through `kvchat-cli serve`, over raw HTTP, on a model in the Llama 3 layout
// given NousResearch Hermes 2 Pro's tool-use chat template (its calls are <tool_call>{json}</tool_call>) beside
// Llama 3's.
// A random model never calls a tool by itself, so its calls are made by constrained decoding: tool_choice
// naming a function (or "required") forces a call whose arguments are valid for the tool's parameters.
// Checked: the call comes back in OpenAI's shape, whole and streamed (delta.tool_calls), with finish_reason
// "tool_calls"; the tool's result goes back in a second request; response_format json_schema and json_object
// replies parse and are valid against their schema; a schema the constraint cannot follow is a 400 naming
// where in it the problem is. Requests with tools are rendered by the model's "tool_use" template, the others by
// its default one (tests/common/tiny_tool_use_model.h).
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include "common/json_schema_testing.h"
#include "common/model_folder_copy.h"
#include "common/server_process.h"
#include "common/tiny_tool_use_model.h"
#include "engine/text/constraint/json_matcher.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_openai_tools {

using kvchat::test::HttpReply;
using kvchat::test::ServerProcess;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

const char* kModelId = "tiny-hermes-tools";

const char* const kWeatherTool = R"({"type": "function", "function": {
  "name": "get_weather", "description": "Get the current weather for a city",
  "parameters": {"type": "object", "properties": {
    "location": {"type": "string", "enum": ["Paris", "Z\u00fcrich", "S\u00e3o Paulo"]},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
   "required": ["location", "unit"], "additionalProperties": false}}})";
const char* const kTimeTool = R"({"type": "function", "function": {
  "name": "get_time", "description": "The time in a zone", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
  "required": ["zone"], "additionalProperties": false}}})";
const char* const kAnswerSchema = R"({"type": "object", "properties": {
  "title": {"type": "string", "maxLength": 10}, "score": {"type": "number", "minimum": 0, "maximum": 10},
  "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}, "required": ["title", "score"],
  "additionalProperties": false})";
const char* const kPatternSchema =
    R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}})";

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

json request(const std::vector<json>& messages) {
  return {{"model", kModelId}, {"messages", messages}, {"temperature", 0}, {"max_tokens", 400}};
}

// The parameters schema of the tool named `name` among `tools`.
ordered_json parameters_of(const std::vector<ordered_json>& tools, const std::string& name) {
  for (const ordered_json& tool : tools)
    if (tool["function"]["name"] == name) return tool["function"]["parameters"];
  return nullptr;
}

// A streamed chat answer assembled as the SDKs assemble it: content deltas joined, tool_calls deltas by index.
struct Streamed {
  std::string content;
  json tool_calls = json::array();
  std::string finish_reason;
  int status = 0;
};
Streamed stream(httplib::Client& client, json body) {
  body["stream"] = true;
  Streamed out;
  out.status = kvchat::test::post_stream(client, "/v1/chat/completions", body.dump(), {}, [&](const std::string& data) {
    if (data == "[DONE]") return true;
    const json chunk = json::parse(data);
    if (chunk.contains("error")) {
      out.content = chunk.dump();
      return true;
    }
    const json& choice = chunk["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) out.content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls"))
      for (const json& call : delta["tool_calls"]) {
        const std::size_t index = call["index"];
        while (out.tool_calls.size() <= index)
          out.tool_calls.push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
        json& slot = out.tool_calls[index];
        if (call.contains("id")) slot["id"] = call["id"];
        if (call.contains("function")) {
          if (call["function"].contains("name"))
            slot["function"]["name"] =
                slot["function"]["name"].get<std::string>() + call["function"]["name"].get<std::string>();
          if (call["function"].contains("arguments"))
            slot["function"]["arguments"] =
                slot["function"]["arguments"].get<std::string>() + call["function"]["arguments"].get<std::string>();
        }
      }
    if (!choice["finish_reason"].is_null()) out.finish_reason = choice["finish_reason"];
    return true;
  });
  return out;
}

}  // namespace

class TestOpenAiTools : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  ServerProcess server_;
  std::vector<ordered_json> tools_;

  // Both tools offered, a call of one of them required.
  json required_call_request() const {
    json body = request({user("Weather or time?")});
    body["tools"] = tools_;
    body["tool_choice"] = "required";
    return body;
  }

  // required_call_request() answered whole: one call, finish_reason "tool_calls", valid arguments; the call in
  // `call`.
  void check_required_call(httplib::Client& client, json& call) {
    const HttpReply reply = kvchat::test::post_json(client, "/v1/chat/completions", required_call_request().dump());
    QVERIFY2(reply.status == 200, reply.body.c_str());
    const json answer = reply.json();
    const json& choice = answer["choices"][0];
    QCOMPARE(choice["finish_reason"].get<std::string>(), std::string("tool_calls"));
    QVERIFY2(choice["message"]["tool_calls"].size() == 1, reply.body.c_str());
    call = choice["message"]["tool_calls"][0];
    check_arguments(call);
  }

  // A call's arguments, checked: valid JSON, valid against the tool's parameters.
  void check_arguments(const json& call) {
    const std::string name = call["function"]["name"];
    const ordered_json parameters = parameters_of(tools_, name);
    QVERIFY2(!parameters.is_null(), name.c_str());
    const ordered_json arguments =
        ordered_json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    QVERIFY2(arguments.is_object(), call.dump().c_str());
    const std::string violation = kvchat::test::schema_violation(parameters, arguments);
    QVERIFY2(violation.empty(), (violation + " in " + call.dump()).c_str());
    QVERIFY(call["id"].is_string() && !call["id"].get<std::string>().empty());
    QCOMPARE(call["type"].get<std::string>(), std::string("function"));
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    const std::string model = kvchat::test::make_tiny_tool_use_model(dir_.filePath("model").toStdString());
    tools_ = {ordered_json::parse(kWeatherTool), ordered_json::parse(kTimeTool)};
    QVERIFY(server_.start({"--model", QString::fromStdString(model), "--model-id", kModelId, "--threads", "1"}));
  }

  void a_named_function_is_called_then_its_result_answered() {
    httplib::Client client = server_.client();
    std::vector<json> messages = {user("What is the weather in Paris?")};
    json body = request(messages);
    body["tools"] = tools_;
    body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    const HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QVERIFY2(whole.status == 200, whole.body.c_str());
    const json answer = whole.json();
    const json& message = answer["choices"][0]["message"];
    QCOMPARE(answer["choices"][0]["finish_reason"].get<std::string>(), std::string("tool_calls"));
    QVERIFY2(message["content"].is_null(), whole.body.c_str());
    QCOMPARE(message["tool_calls"].size(), std::size_t(1));
    QCOMPARE(message["tool_calls"][0]["function"]["name"].get<std::string>(), std::string("get_weather"));
    check_arguments(message["tool_calls"][0]);

    // Streamed: the same call, assembled from delta.tool_calls.
    const Streamed streamed = stream(client, body);
    QCOMPARE(streamed.status, 200);
    QCOMPARE(streamed.finish_reason, std::string("tool_calls"));
    QCOMPARE(streamed.content, std::string());
    QCOMPARE(streamed.tool_calls.size(), std::size_t(1));
    QCOMPARE(streamed.tool_calls[0]["function"], message["tool_calls"][0]["function"]);
    QCOMPARE(streamed.tool_calls[0]["id"], message["tool_calls"][0]["id"]);

    // The second step: the call and the tool's result go back; the model answers in text.
    messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", message["tool_calls"]}});
    messages.push_back({{"role", "tool"},
                        {"tool_call_id", message["tool_calls"][0]["id"]},
                        {"name", "get_weather"},
                        {"content", "{\"temperature\": 21, \"sky\": \"clear\"}"}});
    json follow_up = request(messages);
    follow_up["tools"] = tools_;
    follow_up["max_tokens"] = 8;
    const HttpReply final_answer = kvchat::test::post_json(client, "/v1/chat/completions", follow_up.dump());
    QCOMPARE(final_answer.status, 200);
    const json final_body = final_answer.json();
    QVERIFY2(final_body["choices"][0]["message"]["content"].is_string(), final_answer.body.c_str());
    // The prompt holds the conversation so far: the first request's prompt and its call come before the result.
    QVERIFY(final_body["usage"]["prompt_tokens"].get<int>() >
            answer["usage"]["prompt_tokens"].get<int>() + answer["usage"]["completion_tokens"].get<int>() - 1);
  }

  void required_calls_one_of_the_tools() {
    httplib::Client client = server_.client();
    json call;
    check_required_call(client, call);
  }

  // Functionary's calls name their function outside the JSON (<function=NAME>{...}</function>), each function a
  // branch of the constraint: "required" with two tools forces a call of either, whole and streamed alike; a
  // named function is that one.
  void functionary_forces_a_call_among_several_tools() {
    QTemporaryDir dir;
    const std::string model = kvchat::test::make_tiny_tool_use_model(dir.filePath("functionary").toStdString(),
                                                                     "meetkai-functionary-medium-v3.1.json");
    ServerProcess functionary;
    QVERIFY(functionary.start({"--model", QString::fromStdString(model), "--model-id", kModelId, "--threads", "1"}));
    httplib::Client client = functionary.client();
    json call;
    check_required_call(client, call);
    if (QTest::currentTestFailed()) return;
    json body = required_call_request();
    const Streamed streamed = stream(client, body);
    QCOMPARE(streamed.status, 200);
    QCOMPARE(streamed.finish_reason, std::string("tool_calls"));
    QVERIFY2(streamed.tool_calls.size() == 1, streamed.content.c_str());
    QCOMPARE(streamed.tool_calls[0]["function"], call["function"]);

    body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
    const HttpReply named = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QVERIFY2(named.status == 200, named.body.c_str());
    const json named_call = named.json()["choices"][0]["message"]["tool_calls"][0];
    QCOMPARE(named_call["function"]["name"].get<std::string>(), std::string("get_time"));
    check_arguments(named_call);
  }

  void tool_requests_that_cannot_be_honoured_are_refused_by_name() {
    httplib::Client client = server_.client();
    json body = request({user("Hi")});
    body["tools"] = tools_;
    body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_stock_price"}}}};
    HttpReply reply = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QCOMPARE(reply.status, 400);
    QCOMPARE(reply.json()["error"]["param"].get<std::string>(), std::string("tool_choice"));

    body = request({user("Hi")});
    body["tool_choice"] = "required";
    reply = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QCOMPARE(reply.status, 400);
    QCOMPARE(reply.json()["error"]["param"].get<std::string>(), std::string("tool_choice"));

    body = request({user("Hi")});
    body["tools"] = json::array(
        {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", ordered_json::parse(kPatternSchema)}}}}});
    body["tool_choice"] = "required";
    reply = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QCOMPARE(reply.status, 400);
    QCOMPARE(reply.json()["error"]["param"].get<std::string>(), std::string("tools[0].function.parameters"));

    // More functions than the constraint can follow at once: refused, never some of them silently left out.
    body = request({user("Hi")});
    body["tools"] = json::array();
    for (int i = 0; i < 300; ++i)
      body["tools"].push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}}}});
    body["tool_choice"] = "required";
    reply = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QCOMPARE(reply.status, 400);
    QCOMPARE(reply.json()["error"]["param"].get<std::string>(), std::string("tools"));
    QCOMPARE(reply.json()["error"]["message"].get<std::string>(),
             std::string("'tools': a required call can choose among at most 256 functions; this request offers 300"));

    body = request({user("Hi"), {{"role", "tool"}, {"content", "21"}}});
    reply = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QCOMPARE(reply.status, 400);
    QCOMPARE(reply.json()["error"]["param"].get<std::string>(), std::string("messages[1].tool_call_id"));
  }

  void json_schema_replies_are_valid_whole_and_streamed() {
    httplib::Client client = server_.client();
    const ordered_json schema = ordered_json::parse(kAnswerSchema);
    json body = request({user("Rate the story as JSON.")});
    body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "rating"}, {"schema", schema}}}};
    const HttpReply whole = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QVERIFY2(whole.status == 200, whole.body.c_str());
    const json answer = whole.json();
    QCOMPARE(answer["choices"][0]["finish_reason"].get<std::string>(), std::string("stop"));
    const std::string text = answer["choices"][0]["message"]["content"];
    const ordered_json value = ordered_json::parse(text, nullptr, false);
    QVERIFY2(value.is_object(), text.c_str());
    const std::string violation = kvchat::test::schema_violation(schema, value);
    QVERIFY2(violation.empty(), (violation + " in " + text).c_str());
    const Streamed streamed = stream(client, body);
    QCOMPARE(streamed.content, text);

    body["response_format"] = {{"type", "json_object"}};
    const HttpReply object = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QCOMPARE(object.status, 200);
    // A random model writes strings until max_tokens: what it wrote is the start of an object, whole when it stopped.
    const json object_answer = object.json();
    const std::string object_text = object_answer["choices"][0]["message"]["content"];
    const auto any_object = kvchat::any_json_object_grammar();
    kvchat::JsonMatcher matcher(any_object);
    QVERIFY2(matcher.advance(object_text), object_text.c_str());
    if (object_answer["choices"][0]["finish_reason"] == "stop")
      QVERIFY2(json::parse(object_text, nullptr, false).is_object(), object_text.c_str());
    else
      QCOMPARE(object_answer["choices"][0]["finish_reason"].get<std::string>(), std::string("length"));
  }

  void a_schema_the_constraint_cannot_follow_is_refused_naming_the_keyword() {
    httplib::Client client = server_.client();
    json body = request({user("Hi")});
    body["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "code"}, {"schema", ordered_json::parse(kPatternSchema)}}}};
    const HttpReply reply = kvchat::test::post_json(client, "/v1/chat/completions", body.dump());
    QCOMPARE(reply.status, 400);
    const json error = reply.json()["error"];
    QCOMPARE(error["param"].get<std::string>(), std::string("response_format.json_schema.schema"));
    QVERIFY2(error["message"].get<std::string>().find("/properties/code/pattern: the keyword 'pattern'") !=
                 std::string::npos,
             reply.body.c_str());
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestOpenAiTools)

}  // namespace app_test_openai_tools

#include "test_openai_tools.moc"
