// Tool calls and structured output through `kvchat-cli serve` with client libraries an application uses, pinned
// npm packages (tests/common/npm_clients.h): the official `openai` SDK, the Vercel AI SDK (`ai` with
// `@ai-sdk/openai-compatible`, zod schemas) and LangChain (`@langchain/openai`). tests/app/openai_agent_clients.mjs
// runs every scenario once and reports each as JSON; the tests here check those reports. The model and server are
// tests/app/test_openai_tools.cpp's: random weights, NousResearch Hermes 2 Pro's tool-use chat template, calls and
// JSON made by constrained decoding.
// Checked, per client: a forced call of get_weather has arguments valid for its parameters, the library runs the
// tool on them and sends the result back, and the model then answers in text; streamed, the library assembles the
// same call as whole; response_format json_schema gives an object valid for the schema (the same one whichever
// client asks: the prompt is the same and decoding greedy); log probabilities are the log-softmax of the logits
// this process's engine computes for the same positions.
// Without node, npm or the registry, skipped.
#include <ATen/ATen.h>

#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <set>

#include "common/model_folder_copy.h"
#include "common/npm_clients.h"
#include "common/server_process.h"
#include "common/tiny_tool_use_model.h"
#include "engine/cache/kv_cache.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/text/chat_prompt.h"
#include "engine/text/tokenizer.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_openai_agent_clients {

using kvchat::test::ServerProcess;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

const char* kModelId = "tiny-hermes-tools";

// "" when `arguments` are valid for get_weather's parameters (openai_agent_clients.mjs): location and unit from
// their enums, nothing else; else what is wrong.
std::string weather_violation(const json& arguments) {
  if (!arguments.is_object()) return "not an object: " + arguments.dump();
  const std::set<std::string> locations = {"Paris", "Z\u00fcrich"};
  const std::set<std::string> units = {"celsius", "fahrenheit"};
  if (arguments.size() != 2) return "not exactly location and unit: " + arguments.dump();
  if (!arguments.contains("location") || !arguments["location"].is_string() ||
      !locations.count(arguments["location"].get<std::string>()))
    return "location not in its enum: " + arguments.dump();
  if (!arguments.contains("unit") || !arguments["unit"].is_string() ||
      !units.count(arguments["unit"].get<std::string>()))
    return "unit not in its enum: " + arguments.dump();
  return "";
}

// What the script's get_weather returns for `arguments`.
json weather_output(const json& arguments) {
  return {
      {"location", arguments["location"]}, {"temperature", arguments["unit"] == "celsius" ? 21 : 70}, {"sky", "clear"}};
}

// "" when `value` is valid for the forecast schema (openai_agent_clients.mjs): city from its enum, an integer
// temperature in [-30, 45], a boolean sunny, nothing else; else what is wrong.
std::string forecast_violation(const json& value) {
  if (!value.is_object()) return "not an object: " + value.dump();
  if (value.size() != 3) return "not exactly city, temperature and sunny: " + value.dump();
  if (!value.contains("city") || !value["city"].is_string() ||
      (value["city"] != "Paris" && value["city"] != "Z\u00fcrich"))
    return "city not in its enum: " + value.dump();
  if (!value.contains("temperature") || !value["temperature"].is_number_integer() ||
      value["temperature"].get<std::int64_t>() < -30 || value["temperature"].get<std::int64_t>() > 45)
    return "temperature not an integer in [-30, 45]: " + value.dump();
  if (!value.contains("sunny") || !value["sunny"].is_boolean()) return "sunny not a boolean: " + value.dump();
  return "";
}

bool is_text_finish(const json& reason) { return reason == "stop" || reason == "length"; }

// Each entry of a chat reply's logprobs.content against the engine in this process: the prompt as the server renders
// it (the model's chat template) prefilled into a KV cache, then one cached step per greedy token, each row's
// log-softmax taken. An entry is a token whose text completes (the tokens of a character split over several come
// with the last one, as the reply's text does), so entry i is the i-th greedy token whose decoded text is not
// empty: its log probability is that token's in its row, and its two alternatives are the row's largest.
void check_logprobs_against_the_engine(const std::string& model_path, const std::string& question,
                                       std::size_t prompt_tokens, const json& content) {
  const kvchat::LoadedModel model = kvchat::load_model(model_path);
  std::vector<kvchat::TokenId> sequence =
      kvchat::encode_chat_prompt(model.formatter, *model.tokenizer, {{"user", question}},
                                 kvchat::PromptEnd::GenerationPrompt)
          .ids;
  QCOMPARE(sequence.size(), prompt_tokens);  // the server's prompt
  constexpr double kTolerance = 1e-4;
  const auto cache = kvchat::make_kv_cache(kvchat::KvCacheMode::Contiguous, model.model->cache_shape());
  kvchat::StreamingDecoder decoder(*model.tokenizer, /*skip_special_tokens=*/true);
  at::Tensor logits = model.model->forward(sequence, 0, cache.get());
  std::size_t entry_index = 0;
  for (int step = 0; step < 64 && entry_index < content.size(); ++step) {
    if (step > 0) logits = model.model->forward({sequence.back()}, cache->size(), cache.get());
    const at::Tensor row = at::log_softmax(logits.to(at::kDouble), 0);
    const auto [values, ids] = row.topk(2);
    sequence.push_back(static_cast<kvchat::TokenId>(ids[0].item<std::int64_t>()));
    const std::string text = decoder.push(sequence.back());
    if (text.empty()) continue;
    const json& entry = content[entry_index++];
    const std::string where = "entry " + std::to_string(entry_index - 1) + " (token " + std::to_string(step) + ", \"" +
                              text + "\"): " + entry.dump();
    QVERIFY2(entry["token"] == text, where.c_str());
    const json& top = entry["top_logprobs"];
    QVERIFY2(top.is_array() && top.size() == 2, where.c_str());
    QVERIFY2(std::abs(entry["logprob"].get<double>() - values[0].item<double>()) < kTolerance,
             (where + " against " + std::to_string(values[0].item<double>())).c_str());
    for (int k = 0; k < 2; ++k)
      QVERIFY2(std::abs(top[k]["logprob"].get<double>() - values[k].item<double>()) < kTolerance,
               (where + " against " + std::to_string(values[k].item<double>())).c_str());
    QVERIFY2(entry["token"] == top[0]["token"] && entry["bytes"] == top[0]["bytes"], where.c_str());
  }
  QCOMPARE(entry_index, content.size());
}

}  // namespace

class TestOpenAiAgentClients : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  ServerProcess server_;
  std::string model_path_;
  json result_;         // the script's report
  std::string errors_;  // its stderr

  // The report of `client`'s scenario `name`, or why there is none: the scenario threw (the error, with the
  // server's status and body when it refused a request) or did not run.
  std::string failure_of(const char* client, const char* name) const {
    if (!result_.contains(client) || !result_[client].contains(name))
      return std::string(client) + "." + name + " did not run: " + errors_;
    const json& report = result_[client][name];
    if (report.contains("error")) return std::string(client) + "." + name + " failed: " + report.dump();
    return "";
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    model_path_ = kvchat::test::make_tiny_tool_use_model(dir_.filePath("model").toStdString());
    QVERIFY(server_.start({"--model", QString::fromStdString(model_path_), "--model-id", kModelId, "--threads", "1"}));

    if (const QString unavailable = kvchat::test::install_npm_clients(); !unavailable.isEmpty())
      QSKIP(qPrintable(unavailable));
    QProcess node;
    node.start("node",
               {QString::fromStdString(kvchat::test::source_dir()) + "/tests/app/openai_agent_clients.mjs",
                kvchat::test::npm_clients_dir(), QString("http://127.0.0.1:%1/v1").arg(server_.port()), kModelId});
    if (!node.waitForStarted(30000)) QSKIP("node is not installed");
    QVERIFY(node.waitForFinished(600000));
    errors_ = node.readAllStandardError().toStdString();
    // One JSON line, the last; a failed scenario is in it, and the exit status is then 1.
    const QList<QByteArray> lines = node.readAllStandardOutput().trimmed().split('\n');
    result_ = json::parse(lines.last().toStdString(), nullptr, false);
    QVERIFY2(result_.is_object() && (node.exitCode() == 0 || node.exitCode() == 1),
             (lines.last().toStdString() + "\n" + errors_).c_str());
    for (const auto& [name, version] : kvchat::test::npm_client_packages())
      QCOMPARE(QString::fromStdString(result_["versions"].value(name.toStdString(), "")), version);
  }

  // openai: tools with tool_choice naming get_weather, the call run locally, its result sent back as a tool message.
  void openai_forced_call_is_answered_after_its_result() {
    const std::string failure = failure_of("openai", "tools");
    QVERIFY2(failure.empty(), failure.c_str());
    const json& report = result_["openai"]["tools"];
    QCOMPARE(report["finish_reason"].get<std::string>(), std::string("tool_calls"));
    QVERIFY2(report["content"].is_null(), report.dump().c_str());
    QCOMPARE(report["tool_calls"].size(), std::size_t(1));
    const json& call = report["tool_calls"][0];
    QCOMPARE(call["name"].get<std::string>(), std::string("get_weather"));
    QCOMPARE(call["type"].get<std::string>(), std::string("function"));
    QVERIFY(call["id"].is_string() && !call["id"].get<std::string>().empty());
    const json arguments = json::parse(call["arguments"].get<std::string>(), nullptr, false);
    const std::string violation = weather_violation(arguments);
    QVERIFY2(violation.empty(), violation.c_str());
    QCOMPARE(report["tool_output"], weather_output(arguments));
    QVERIFY2(report["final"].is_string(), report.dump().c_str());
    QVERIFY2(is_text_finish(report["final_finish_reason"]), report.dump().c_str());
    // The second prompt holds the first, the call and its result.
    QVERIFY2(report["usage"][1]["prompt_tokens"].get<int>() > report["usage"][0]["prompt_tokens"].get<int>(),
             report["usage"].dump().c_str());
  }

  // openai: the same two steps through chat.completions.stream(): the SDK assembles the call from
  // delta.tool_calls, and greedy on the same prompt it is the whole reply's call.
  void openai_streamed_call_is_assembled_as_the_whole_one() {
    std::string failure = failure_of("openai", "streamed_tools") + failure_of("openai", "tools");
    QVERIFY2(failure.empty(), failure.c_str());
    const json& report = result_["openai"]["streamed_tools"];
    const json& whole = result_["openai"]["tools"];
    QCOMPARE(report["finish_reason"].get<std::string>(), std::string("tool_calls"));
    // No text before the call (the role chunk's "" where the server sends one).
    QVERIFY2(report["content"].is_null() || report["content"] == "", report.dump().c_str());
    QCOMPARE(report["tool_calls"], whole["tool_calls"]);
    QCOMPARE(report["arguments_done_events"].get<int>(), 1);
    QCOMPARE(report["tool_output"], whole["tool_output"]);
    QVERIFY2(report["final"].is_string(), report.dump().c_str());
  }

  // openai: runTools, streamed, with the function forced: it runs once on the call's arguments, and the runner's
  // conversation holds the call and its result.
  void openai_run_tools_runs_the_forced_function_once() {
    std::string failure = failure_of("openai", "run_tools") + failure_of("openai", "tools");
    QVERIFY2(failure.empty(), failure.c_str());
    const json& report = result_["openai"]["run_tools"];
    const json& call = result_["openai"]["tools"]["tool_calls"][0];
    const json arguments = json::parse(call["arguments"].get<std::string>());
    QCOMPARE(report["function_inputs"], json::array({arguments}));
    const json& messages = report["messages"];
    QCOMPARE(messages.size(), std::size_t(3));
    QCOMPARE(messages[0]["role"].get<std::string>(), std::string("user"));
    QCOMPARE(messages[1]["role"].get<std::string>(), std::string("assistant"));
    QCOMPARE(messages[1]["tool_calls"], json::array({call}));
    QCOMPARE(messages[2]["role"].get<std::string>(), std::string("tool"));
    QCOMPARE(messages[2]["tool_call_id"], call["id"]);
    QCOMPARE(json::parse(messages[2]["content"].get<std::string>(), nullptr, false), weather_output(arguments));
  }

  // openai: response_format json_schema, strict.
  void openai_json_schema_reply_is_valid() {
    const std::string failure = failure_of("openai", "json_schema");
    QVERIFY2(failure.empty(), failure.c_str());
    const json& report = result_["openai"]["json_schema"];
    QCOMPARE(report["finish_reason"].get<std::string>(), std::string("stop"));
    const std::string violation = forecast_violation(report["value"]);
    QVERIFY2(violation.empty(), violation.c_str());
    QCOMPARE(json::parse(report["text"].get<std::string>()), report["value"]);
  }

  // openai: logprobs with top_logprobs 2, each equal to the log-softmax of the logits this process's engine gives
  // for that position (an uncached forward of the server's prompt and the tokens before it): the chosen token's
  // and the two largest, in order. Greedy, the chosen token is the first of them.
  void openai_logprobs_are_those_of_the_engine_logits() {
    const std::string failure = failure_of("openai", "logprobs");
    QVERIFY2(failure.empty(), failure.c_str());
    const json& report = result_["openai"]["logprobs"];
    QVERIFY2(report["text"].is_string() && report["question"].is_string(), report.dump().c_str());
    const json& content = report["content"];
    QVERIFY2(content.is_array() && !content.empty(), report.dump().c_str());
    check_logprobs_against_the_engine(model_path_, report["question"], report["prompt_tokens"], content);
  }

  // AI SDK: generateText with the call forced in step 0 (prepareStep) and toolChoice "none" in step 1: the SDK runs
  // the tool's execute on the call and sends its result; the second step answers in text.
  void ai_sdk_generate_text_runs_the_tool_then_answers() {
    const std::string failure = failure_of("ai_sdk", "generate_text");
    QVERIFY2(failure.empty(), failure.c_str());
    check_ai_sdk_steps(result_["ai_sdk"]["generate_text"]);
  }

  // AI SDK: streamText, the same two steps, its full stream read to the end; the call is generateText's.
  void ai_sdk_stream_text_runs_the_tool_then_answers() {
    const std::string failure = failure_of("ai_sdk", "stream_text");
    QVERIFY2(failure.empty(), failure.c_str());
    const json& report = result_["ai_sdk"]["stream_text"];
    check_ai_sdk_steps(report);
    if (QTest::currentTestFailed()) return;
    QCOMPARE(report["tool_call_parts"], report["steps"][0]["tool_calls"]);
    const json& parts = report["part_counts"];
    QVERIFY2(!parts.contains("error"), parts.dump().c_str());
    QCOMPARE(parts.value("tool-call", 0), 1);
    QCOMPARE(parts.value("tool-result", 0), 1);
    QCOMPARE(parts.value("finish-step", 0), 2);
    if (failure_of("ai_sdk", "generate_text").empty())
      QCOMPARE(report["steps"][0]["tool_calls"], result_["ai_sdk"]["generate_text"]["steps"][0]["tool_calls"]);
  }

  // AI SDK: generateText with Output.object and generateObject, a zod schema: valid objects, and the same
  // object as openai's json_schema reply (same prompt, same schema, greedy).
  void ai_sdk_structured_output_is_valid() {
    for (const char* name : {"output_object", "generate_object"}) {
      const std::string failure = failure_of("ai_sdk", name);
      QVERIFY2(failure.empty(), failure.c_str());
      const json& value = result_["ai_sdk"][name]["value"];
      const std::string violation = forecast_violation(value);
      QVERIFY2(violation.empty(), (std::string(name) + ": " + violation).c_str());
      if (failure_of("openai", "json_schema").empty()) QCOMPARE(value, result_["openai"]["json_schema"]["value"]);
    }
    QCOMPARE(json::parse(result_["ai_sdk"]["output_object"]["text"].get<std::string>()),
             result_["ai_sdk"]["output_object"]["value"]);
  }

  // LangChain: bindTools with tool_choice get_weather; the tool invoked on the AIMessage's call gives the
  // ToolMessage; sent back without forcing, the model answers in text.
  void langchain_bound_tool_is_called_then_answered() {
    const std::string failure = failure_of("langchain", "tools");
    QVERIFY2(failure.empty(), failure.c_str());
    check_langchain_tools(result_["langchain"]["tools"]);
  }

  // The same with both replies streamed (.stream(), chunks joined with concat): the same call, assembled from its
  // chunks (greedy: the same arguments), and the same answer.
  void langchain_streamed_tool_is_called_then_answered() {
    const std::string failure = failure_of("langchain", "streamed_tools");
    QVERIFY2(failure.empty(), failure.c_str());
    const json& report = result_["langchain"]["streamed_tools"];
    check_langchain_tools(report);
    if (failure_of("langchain", "tools").empty()) {
      const json& whole = result_["langchain"]["tools"];
      QCOMPARE(report["tool_calls"][0]["args"], whole["tool_calls"][0]["args"]);
      QCOMPARE(report["final"], whole["final"]);
    }
  }

  // LangChain: withStructuredOutput(zod schema, {method: "jsonSchema"}).
  void langchain_structured_output_is_valid() {
    const std::string failure = failure_of("langchain", "structured");
    QVERIFY2(failure.empty(), failure.c_str());
    const json& value = result_["langchain"]["structured"]["value"];
    const std::string violation = forecast_violation(value);
    QVERIFY2(violation.empty(), violation.c_str());
    if (failure_of("openai", "json_schema").empty()) QCOMPARE(value, result_["openai"]["json_schema"]["value"]);
  }

 private:
  void check_langchain_tools(const json& report) {
    QCOMPARE(report["content"], json(""));
    QCOMPARE(report["tool_calls"].size(), std::size_t(1));
    const json& call = report["tool_calls"][0];
    QCOMPARE(call["name"].get<std::string>(), std::string("get_weather"));
    QVERIFY(call["id"].is_string() && !call["id"].get<std::string>().empty());
    const std::string violation = weather_violation(call["args"]);
    QVERIFY2(violation.empty(), violation.c_str());
    QCOMPARE(report["executed"], json::array({call["args"]}));
    const json& tool_message = report["tool_message"];
    QCOMPARE(tool_message["tool_call_id"], call["id"]);
    QCOMPARE(tool_message["name"].get<std::string>(), std::string("get_weather"));
    QCOMPARE(json::parse(tool_message["content"].get<std::string>(), nullptr, false), weather_output(call["args"]));
    QVERIFY2(report["final"].is_string(), report.dump().c_str());
    QCOMPARE(report["final_tool_calls"].get<int>(), 0);
    QVERIFY2(report["usage"][1]["input_tokens"].get<int>() > report["usage"][0]["input_tokens"].get<int>(),
             report["usage"].dump().c_str());
  }

  // Two steps: a call of get_weather with valid input and the tool's result on it, then text and no call.
  void check_ai_sdk_steps(const json& report) {
    const json& steps = report["steps"];
    QCOMPARE(steps.size(), std::size_t(2));
    QCOMPARE(steps[0]["finish_reason"].get<std::string>(), std::string("tool-calls"));
    QCOMPARE(steps[0]["tool_calls"].size(), std::size_t(1));
    const json& call = steps[0]["tool_calls"][0];
    QCOMPARE(call["name"].get<std::string>(), std::string("get_weather"));
    QVERIFY(call["id"].is_string() && !call["id"].get<std::string>().empty());
    const std::string violation = weather_violation(call["input"]);
    QVERIFY2(violation.empty(), violation.c_str());
    const json expected_result = {
        {"id", call["id"]}, {"name", "get_weather"}, {"output", weather_output(call["input"])}};
    QCOMPARE(steps[0]["tool_results"], json::array({expected_result}));
    QCOMPARE(report["executed"], json::array({call["input"]}));
    QCOMPARE(steps[1]["tool_calls"], json::array());
    QVERIFY2(steps[1]["text"].is_string(), steps.dump().c_str());
    QVERIFY2(is_text_finish(steps[1]["finish_reason"]), steps.dump().c_str());
    QCOMPARE(report["text"], steps[1]["text"]);
    // The second prompt holds the first, the call and its result (toolChoice "none" still renders the tools).
    QVERIFY2(steps[1]["input_tokens"].get<int>() > steps[0]["input_tokens"].get<int>(), steps.dump().c_str());
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestOpenAiAgentClients)

}  // namespace app_test_openai_agent_clients

#include "test_openai_agent_clients.moc"
