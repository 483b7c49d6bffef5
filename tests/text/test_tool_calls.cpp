// Tool calls parsed back out of model replies, for each chat-template family: the calls a reply holds, its
// text before them, malformed calls kept as text, the family each real template is detected as, and the
// streaming parser agreeing with the whole-reply one however the reply is cut into pieces.
#include <QStringList>
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <cctype>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_fixture.h"
#include "common/test_paths.h"
#include "engine/text/tool_calls.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_tool_calls {

using kvchat::ParsedReply;
using kvchat::ToolCall;
using kvchat::ToolCallFormat;
using kvchat::ToolCallStream;

namespace {

struct Expected {
  std::string name;
  std::string arguments;
};

struct Case {
  const char* tag;
  ToolCallFormat format;
  std::string reply;
  std::string content;
  std::vector<Expected> calls;
};

Case with_calls(const char* tag, ToolCallFormat format, const std::string& reply, const std::string& content,
                std::vector<Expected> calls) {
  return {tag, format, reply, content, std::move(calls)};
}

// A reply that must come back unchanged, as content, with no calls.
Case text(const char* tag, ToolCallFormat format, const std::string& reply) { return {tag, format, reply, reply, {}}; }

const std::string kWeather = R"({"name": "get_weather", "arguments": {"city": "Paris"}})";
const std::string kHotels =
    R"({"name": "search_hotels", "arguments": {"city": "Zürich", "max_price": 150.5, "amenities": ["wifi", "pool"]}})";
const Expected kWeatherCall{"get_weather", R"({"city":"Paris"})"};
const Expected kHotelsCall{"search_hotels", R"({"city":"Zürich","max_price":150.5,"amenities":["wifi","pool"]})"};
const Expected kTimeCall{"get_time", R"({"zone":"CET"})"};
// Spaces dropped, key order kept, escapes of plain characters written as the characters.
const Expected kCompactCall{"f", R"({"b":[1,2,3],"a":{"x":null},"s":"Zürich"})"};
const char* const kLoose = R"({"b": [1, 2,  3], "a" : {"x": null}, "s": "Z\u00fcrich"})";
const Expected kUnicodeCall{"translate", R"({"text":"naïve 你好 🦙 «ok»"})"};
const char* const kUnicode = R"({"text": "naïve 你好 🦙 «ok»"})";

std::string hermes(const std::string& call) { return "<tool_call>\n" + call + "\n</tool_call>"; }
std::string llama3(const std::string& name, const std::string& parameters) {
  return "{\"name\": \"" + name + "\", \"parameters\": " + parameters + "}";
}

const std::vector<Case>& cases() {
  using F = ToolCallFormat;
  static const std::vector<Case> all = {
      with_calls("hermes/one call", F::Hermes, hermes(kWeather), "", {kWeatherCall}),
      with_calls("hermes/two calls", F::Hermes, hermes(kWeather) + "\n" + hermes(kHotels), "",
                 {kWeatherCall, kHotelsCall}),
      with_calls("hermes/content before", F::Hermes, "Let me check. " + hermes(kWeather), "Let me check.",
                 {kWeatherCall}),
      with_calls("hermes/thinking before", F::Hermes,
                 "<think>\nThe user wants the weather.\n</think>\n\n" + hermes(kWeather),
                 "<think>\nThe user wants the weather.\n</think>", {kWeatherCall}),
      with_calls("hermes/last closing tag missing", F::Hermes, "<tool_call>\n" + kWeather + "\n", "", {kWeatherCall}),
      with_calls("hermes/closing tag inside a string", F::Hermes,
                 hermes(R"({"name": "render", "arguments": {"html": "</tool_call>"}})"), "",
                 {{"render", R"({"html":"</tool_call>"})"}}),
      with_calls("hermes/compact", F::Hermes, hermes(std::string(R"({"name": "f", "arguments": )") + kLoose + "}"), "",
                 {kCompactCall}),
      with_calls("hermes/unicode", F::Hermes,
                 hermes(std::string(R"({"name": "translate", "arguments": )") + kUnicode + "}"), "", {kUnicodeCall}),
      text("hermes/bad json", F::Hermes, hermes(R"({"name": "get_weather", "arguments": {"city": }})")),
      text("hermes/missing name", F::Hermes, hermes(R"({"arguments": {"city": "Paris"}})")),
      text("hermes/name not a string", F::Hermes, hermes(R"({"name": 7, "arguments": {"city": "Paris"}})")),
      text("hermes/arguments not an object", F::Hermes, hermes(R"({"name": "get_weather", "arguments": "Paris"})")),
      text("hermes/arguments missing", F::Hermes, hermes(R"({"name": "get_weather"})")),
      text("hermes/second call malformed", F::Hermes, hermes(kWeather) + hermes(R"({"name": "f", "arguments": 1})")),
      text("hermes/text after the call", F::Hermes, hermes(kWeather) + " Done."),
      text("hermes/unfinished object", F::Hermes, "Sure. <tool_call>\n{\"name\": \"get_weather\", \"argu"),
      text("hermes/plain text", F::Hermes, "The weather in Paris is mild.\n"),
      text("hermes/opener in prose", F::Hermes, "Calls go in <tool_call> tags, like <tool_call>this</tool_call>."),

      with_calls("llama3/one call", F::Llama3Json, llama3("get_weather", R"({"city": "Paris"})"), "", {kWeatherCall}),
      with_calls("llama3/python tag", F::Llama3Json, "<|python_tag|>" + llama3("get_weather", R"({"city": "Paris"})"),
                 "", {kWeatherCall}),
      with_calls("llama3/two calls", F::Llama3Json,
                 "<|python_tag|>" + llama3("get_weather", R"({"city": "Paris"})") + "; " +
                     llama3("get_time", R"({"zone": "CET"})"),
                 "", {kWeatherCall, kTimeCall}),
      with_calls("llama3/arguments key", F::Llama3Json, kWeather, "", {kWeatherCall}),
      with_calls("llama3/leading whitespace", F::Llama3Json,
                 "\n\n " + llama3("get_weather", R"({"city": "Paris"})") + "\n", "", {kWeatherCall}),
      with_calls("llama3/content before", F::Llama3Json,
                 "Let me check. <|python_tag|>" + llama3("get_weather", R"({"city": "Paris"})"), "Let me check.",
                 {kWeatherCall}),
      with_calls("llama3/compact", F::Llama3Json, llama3("f", kLoose), "", {kCompactCall}),
      with_calls("llama3/unicode", F::Llama3Json, llama3("translate", kUnicode), "", {kUnicodeCall}),
      text("llama3/bad json", F::Llama3Json, R"({"name": "get_weather", "parameters": {"city": "Paris"})"),
      text("llama3/missing name", F::Llama3Json, R"({"parameters": {"city": "Paris"}})"),
      text("llama3/parameters not an object", F::Llama3Json, llama3("get_weather", R"(["Paris"])")),
      text("llama3/json answer", F::Llama3Json, R"({"answer": 42})"),
      text("llama3/text after the call", F::Llama3Json, llama3("get_weather", R"({"city": "Paris"})") + " Done."),
      text("llama3/built-in tool syntax", F::Llama3Json, R"(<|python_tag|>brave_search.call(query="Paris weather"))"),
      text("llama3/plain text", F::Llama3Json, "Paris is the capital of France."),
      text("llama3/object later in prose", F::Llama3Json, R"(Write {"name": "x"} to name it.)"),

      with_calls("mistral/one call", F::Mistral,
                 R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2C3d4e"}])", "",
                 {kWeatherCall}),
      with_calls("mistral/two calls", F::Mistral, "[TOOL_CALLS] [" + kWeather + ", " + kHotels + "]", "",
                 {kWeatherCall, kHotelsCall}),
      with_calls("mistral/content before", F::Mistral, "Let me check.\n\n[TOOL_CALLS][" + kWeather + "]",
                 "Let me check.", {kWeatherCall}),
      with_calls("mistral/name and args", F::Mistral, R"([TOOL_CALLS]get_weather[ARGS]{"city": "Paris"})", "",
                 {kWeatherCall}),
      with_calls("mistral/two names and args", F::Mistral,
                 R"([TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"})", "",
                 {kWeatherCall, kTimeCall}),
      with_calls("mistral/call id", F::Mistral, R"([TOOL_CALLS]get_weather[CALL_ID]x7Yz0Q1w2[ARGS]{"city": "Paris"})",
                 "", {kWeatherCall}),
      with_calls("mistral/compact", F::Mistral, std::string("[TOOL_CALLS]f[ARGS]") + kLoose, "", {kCompactCall}),
      with_calls("mistral/unicode", F::Mistral,
                 std::string(R"([TOOL_CALLS] [{"name": "translate", "arguments": )") + kUnicode + "}]", "",
                 {kUnicodeCall}),
      text("mistral/bad json", F::Mistral, R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}])"),
      text("mistral/missing name", F::Mistral, R"([TOOL_CALLS] [{"arguments": {"city": "Paris"}}])"),
      text("mistral/arguments not an object", F::Mistral,
           "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}]"),
      text("mistral/args not an object", F::Mistral, R"([TOOL_CALLS]get_weather[ARGS]["Paris"])"),
      text("mistral/name with a space", F::Mistral, R"([TOOL_CALLS]get weather[ARGS]{"city": "Paris"})"),
      text("mistral/no args marker", F::Mistral, R"([TOOL_CALLS]get_weather{"city": "Paris"})"),
      text("mistral/empty list", F::Mistral, "[TOOL_CALLS] []"),
      text("mistral/plain text", F::Mistral, "See [1] and [TOOL] for details."),

      with_calls("functionary/one call", F::Functionary, R"(<function=get_weather>{"city": "Paris"}</function>)", "",
                 {kWeatherCall}),
      with_calls(
          "functionary/two calls", F::Functionary,
          "<function=get_weather>{\"city\": \"Paris\"}</function>\n<function=get_time>{\"zone\": \"CET\"}</function>",
          "", {kWeatherCall, kTimeCall}),
      with_calls("functionary/content before", F::Functionary,
                 R"(Let me check. <function=get_weather>{"city": "Paris"}</function>)", "Let me check.",
                 {kWeatherCall}),
      with_calls("functionary/python", F::Functionary, "<|python_tag|>import math\nprint(\"pi\", math.pi)\n", "",
                 {{"python", "{\"code\":\"import math\\nprint(\\\"pi\\\", math.pi)\"}"}}),
      with_calls("functionary/call then python", F::Functionary,
                 R"(<function=get_weather>{"city": "Paris"}</function><|python_tag|>print(18.5 * 9 / 5 + 32))", "",
                 {kWeatherCall, {"python", R"x({"code":"print(18.5 * 9 / 5 + 32)"})x"}}),
      with_calls("functionary/compact", F::Functionary, std::string("<function=f>") + kLoose + "</function>", "",
                 {kCompactCall}),
      with_calls("functionary/unicode", F::Functionary, std::string("<function=translate>") + kUnicode + "</function>",
                 "", {kUnicodeCall}),
      text("functionary/bad json", F::Functionary, R"(<function=get_weather>{"city": "Paris"</function>)"),
      text("functionary/missing name", F::Functionary, R"(<function=>{"city": "Paris"}</function>)"),
      text("functionary/arguments not an object", F::Functionary, R"(<function=get_weather>["Paris"]</function>)"),
      text("functionary/empty python", F::Functionary, "<|python_tag|>  \n"),
      text("functionary/text after the call", F::Functionary,
           R"(<function=get_weather>{"city": "Paris"}</function> Done.)"),
      text("functionary/plain text", F::Functionary, "Use <b>bold</b> and <fun> for emphasis."),

      with_calls("firefunction/one call", F::FireFunction, " functools[" + kWeather + "]", "", {kWeatherCall}),
      with_calls(
          "firefunction/two calls", F::FireFunction,
          "functools[" + kWeather + ", {\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"CET\\\"}\"}]", "",
          {kWeatherCall, kTimeCall}),
      with_calls("firefunction/content before", F::FireFunction, "Let me check. functools[" + kWeather + "]",
                 "Let me check.", {kWeatherCall}),
      with_calls("firefunction/compact", F::FireFunction,
                 std::string(R"(functools[{"name": "f", "arguments": )") + kLoose + "}]", "", {kCompactCall}),
      with_calls("firefunction/unicode", F::FireFunction,
                 std::string(R"(functools[{"name": "translate", "arguments": )") + kUnicode + "}]", "", {kUnicodeCall}),
      text("firefunction/bad json", F::FireFunction, R"(functools[{"name": "get_weather", "arguments": {"city"}}])"),
      text("firefunction/missing name", F::FireFunction, R"(functools[{"arguments": {"city": "Paris"}}])"),
      text("firefunction/arguments not an object", F::FireFunction,
           R"(functools[{"name": "get_weather", "arguments": [1]}])"),
      text("firefunction/string arguments not an object", F::FireFunction,
           R"(functools[{"name": "get_weather", "arguments": "Paris"}])"),
      text("firefunction/empty list", F::FireFunction, "functools[]"),
      text("firefunction/text after the calls", F::FireFunction, "functools[" + kWeather + "] Done."),
      text("firefunction/plain text", F::FireFunction, "Python's functools module has functools.lru_cache."),

      text("none/calls stay text", F::None, "Let me check. " + hermes(kWeather)),
  };
  return all;
}

QString describe(const std::vector<ToolCall>& calls, bool with_ids) {
  QStringList lines;
  for (const ToolCall& call : calls)
    lines << QString::fromStdString((with_ids ? call.id + " " : std::string()) + call.name + " " + call.arguments);
  return lines.join('\n');
}

QString describe(const std::vector<Expected>& calls) {
  QStringList lines;
  for (const Expected& call : calls) lines << QString::fromStdString(call.name + " " + call.arguments);
  return lines.join('\n');
}

#define COMPARE_STR(actual, expected) QCOMPARE(QString::fromStdString(actual), QString::fromStdString(expected))

// What a client of the stream sees when `reply` arrives cut at `cuts`: the text push() sent, then finish()'s
// content, with finish()'s calls.
ParsedReply streamed(ToolCallFormat format, const std::string& reply, std::vector<std::size_t> cuts) {
  cuts.push_back(reply.size());
  ToolCallStream stream(format);
  std::string sent;
  std::size_t from = 0;
  for (std::size_t cut : cuts) {
    sent += stream.push(std::string_view(reply).substr(from, cut - from));
    from = cut;
  }
  ParsedReply end = stream.finish();
  end.content = sent + end.content;
  return end;
}

const Case& current_case() {
  QFETCH(int, index);
  return cases()[static_cast<std::size_t>(index)];
}

// The model's turns in a rendered conversation, as it would have written them: between each header and its end.
std::vector<std::string> model_turns(const std::string& rendered, const std::string& header,
                                     const std::vector<std::string>& ends) {
  std::vector<std::string> turns;
  for (std::size_t at = rendered.find(header); at != std::string::npos; at = rendered.find(header, at)) {
    at += header.size();
    std::size_t end = rendered.size();
    for (const std::string& marker : ends) end = std::min(end, rendered.find(marker, at));
    turns.push_back(rendered.substr(at, end - at));
  }
  return turns;
}

}  // namespace

class ToolCallsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void names_each_format() {
    QCOMPARE(kvchat::to_string(ToolCallFormat::None), "none");
    QCOMPARE(kvchat::to_string(ToolCallFormat::Hermes), "hermes");
    QCOMPARE(kvchat::to_string(ToolCallFormat::Llama3Json), "llama3_json");
    QCOMPARE(kvchat::to_string(ToolCallFormat::Mistral), "mistral");
    QCOMPARE(kvchat::to_string(ToolCallFormat::Functionary), "functionary");
    QCOMPARE(kvchat::to_string(ToolCallFormat::FireFunction), "firefunction");
  }

  void detects_each_fixture_template_data() {
    QTest::addColumn<QString>("fixture");
    QTest::addColumn<QString>("format");
    QTest::newRow("hermes 2 pro") << "tool_use/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.json"
                                  << "hermes";
    QTest::newRow("firefunction v2") << "tool_use/fireworks-ai-llama-3-firefunction-v2.json"
                                     << "firefunction";
    QTest::newRow("functionary v3.1") << "tool_use/meetkai-functionary-medium-v3.1.json"
                                      << "functionary";
    QTest::newRow("qwen3") << "qwen3.json"
                           << "hermes";
    for (const char* plain : {"llama3", "llama3_1", "chatml", "gemma3", "deepseek_v3", "zephyr"})
      QTest::newRow(plain) << QString("%1.json").arg(plain) << "none";
  }
  void detects_each_fixture_template() {
    QFETCH(QString, fixture);
    QFETCH(QString, format);
    const nlohmann::json file =
        kvchat::test::load_json(kvchat::test::shared_path("fixtures/chat_templates/" + fixture.toStdString()));
    const std::string source = file.at("template").get<std::string>();
    QVERIFY(source.size() > 100);
    QCOMPARE(QString(kvchat::to_string(kvchat::tool_call_format_for_template(source))), format);
  }

  void detects_families_by_their_markers_data() {
    QTest::addColumn<QString>("source");
    QTest::addColumn<QString>("format");
    QTest::newRow("llama 3.1") << R"({{- "Environment: ipython\n" }}{{- '<|python_tag|>' + tool_call.name }})"
                               << "llama3_json";
    QTest::newRow("llama 3.2") << R"({{- 'Respond in the format {"name": function name, "parameters": )"
                                  R"(dictionary of argument name and its value}.' }})"
                               << "llama3_json";
    QTest::newRow("mistral v3") << "{{- \"[TOOL_CALLS] [\" }}{%- for tool in message.tool_calls %}"
                                << "mistral";
    QTest::newRow("mistral v11") << R"({{- "[TOOL_CALLS]" + tool.name + "[ARGS]" + arguments }})"
                                 << "mistral";
    QTest::newRow("functionary over llama") << R"(Environment: ipython <|python_tag|> <function=)"
                                            << "functionary";
    QTest::newRow("hermes over llama") << R"(Environment: ipython <tool_call>)"
                                       << "hermes";
    QTest::newRow("granite's own tag") << R"({{- '<|tool_call|>' + tool_call | tojson }})"
                                       << "none";
    QTest::newRow("no tools") << "{% for m in messages %}{{ m.content }}{% endfor %}"
                              << "none";
  }
  void detects_families_by_their_markers() {
    QFETCH(QString, source);
    QFETCH(QString, format);
    QCOMPARE(QString(kvchat::to_string(kvchat::tool_call_format_for_template(source.toStdString()))), format);
  }

  void parses_whole_replies_data() {
    QTest::addColumn<int>("index");
    for (std::size_t i = 0; i < cases().size(); ++i) QTest::newRow(cases()[i].tag) << static_cast<int>(i);
  }
  void parses_whole_replies() {
    const Case& expected = current_case();
    const ParsedReply parsed = kvchat::parse_tool_calls(expected.format, expected.reply);
    COMPARE_STR(parsed.content, expected.content);
    QCOMPARE(describe(parsed.tool_calls, false), describe(expected.calls));
    for (const ToolCall& call : parsed.tool_calls) QVERIFY(!call.id.empty());
  }

  void gives_each_call_a_distinct_id() {
    const std::string twice = hermes(kWeather) + "\n" + hermes(kWeather);
    const ParsedReply first = kvchat::parse_tool_calls(ToolCallFormat::Hermes, twice);
    QCOMPARE(first.tool_calls.size(), std::size_t{2});
    QVERIFY(first.tool_calls[0].id != first.tool_calls[1].id);
    for (const ToolCall& call : first.tool_calls) QVERIFY(QString::fromStdString(call.id).startsWith("call_"));
    QCOMPARE(describe(kvchat::parse_tool_calls(ToolCallFormat::Hermes, twice).tool_calls, true),
             describe(first.tool_calls, true));  // the same on every run

    // Mistral's own ids are kept, one repeated is replaced, and those made are 9 letters or digits.
    const ParsedReply mistral = kvchat::parse_tool_calls(
        ToolCallFormat::Mistral,
        R"([TOOL_CALLS] [{"name": "a", "arguments": {}, "id": "a1b2C3d4e"}, {"name": "b", "arguments": {}},)"
        R"( {"name": "c", "arguments": {}, "id": "a1b2C3d4e"}])");
    QCOMPARE(mistral.tool_calls.size(), std::size_t{3});
    COMPARE_STR(mistral.tool_calls[0].id, std::string("a1b2C3d4e"));
    for (const ToolCall& call : {mistral.tool_calls[1], mistral.tool_calls[2]}) {
      QCOMPARE(call.id.size(), std::size_t{9});
      for (char c : call.id) QVERIFY(std::isalnum(static_cast<unsigned char>(c)));
      QVERIFY(call.id != mistral.tool_calls[0].id);
    }
    QVERIFY(mistral.tool_calls[1].id != mistral.tool_calls[2].id);
    const ParsedReply with_call_id = kvchat::parse_tool_calls(
        ToolCallFormat::Mistral, R"([TOOL_CALLS]get_weather[CALL_ID]x7Yz0Q1w2[ARGS]{"city": "Paris"})");
    QCOMPARE(with_call_id.tool_calls.size(), std::size_t{1});
    COMPARE_STR(with_call_id.tool_calls[0].id, std::string("x7Yz0Q1w2"));
  }

  // What each real template renders for a turn with tool calls (what its models learned to
  // write) parses back to that turn's calls.
  void parses_what_the_fixture_templates_render_data() {
    QTest::addColumn<QString>("fixture");
    QTest::addColumn<QString>("header");
    QTest::addColumn<QStringList>("ends");
    const QString llama_header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    QTest::newRow("hermes 2 pro") << "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.json"
                                  << "<|im_start|>assistant" << QStringList{"<|im_end|>"};
    QTest::newRow("firefunction v2") << "fireworks-ai-llama-3-firefunction-v2.json" << llama_header
                                     << QStringList{"<|eot_id|>"};
    QTest::newRow("functionary v3.1") << "meetkai-functionary-medium-v3.1.json" << llama_header
                                      << QStringList{"<|eot_id|>", "<|eom_id|>"};
  }
  void parses_what_the_fixture_templates_render() {
    QFETCH(QString, fixture);
    QFETCH(QString, header);
    QFETCH(QStringList, ends);
    std::vector<std::string> end_markers;
    for (const QString& end : ends) end_markers.push_back(end.toStdString());
    const nlohmann::json file =
        kvchat::test::load_json(kvchat::test::shared_path("fixtures/chat_templates/tool_use/" + fixture.toStdString()));
    const ToolCallFormat format = kvchat::tool_call_format_for_template(file.at("template").get<std::string>());
    int turns_checked = 0;
    for (const nlohmann::json& test_case : file.at("cases")) {
      if (!test_case.value("rendered", nlohmann::json()).is_string()) continue;
      std::vector<nlohmann::json> expected;  // one array of {name, arguments} per model turn with calls
      for (const nlohmann::json& message : test_case.at("messages")) {
        if (message.value("role", "") != "assistant" || message.value("tool_calls", nlohmann::json()).empty()) continue;
        nlohmann::json calls = nlohmann::json::array();
        for (const nlohmann::json& call : message.at("tool_calls")) {
          const nlohmann::json& arguments = call.at("function").at("arguments");
          calls.push_back(
              {{"name", call.at("function").at("name")},
               {"arguments", arguments.is_string() ? nlohmann::json::parse(arguments.get<std::string>()) : arguments}});
        }
        expected.push_back(calls);
      }
      std::vector<nlohmann::json> found;
      for (const std::string& turn :
           model_turns(test_case.at("rendered").get<std::string>(), header.toStdString(), end_markers)) {
        const ParsedReply parsed = kvchat::parse_tool_calls(format, turn);
        if (parsed.tool_calls.empty()) continue;
        nlohmann::json calls = nlohmann::json::array();
        for (const ToolCall& call : parsed.tool_calls)
          calls.push_back({{"name", call.name}, {"arguments", nlohmann::json::parse(call.arguments)}});
        found.push_back(calls);
      }
      const std::string name = test_case.at("name").get<std::string>();
      QVERIFY2(nlohmann::json(found) == nlohmann::json(expected),
               qPrintable(QString::fromStdString(name + ": found " + nlohmann::json(found).dump() + ", expected " +
                                                 nlohmann::json(expected).dump())));
      turns_checked += static_cast<int>(expected.size());
    }
    QVERIFY2(turns_checked > 0, "no model turn with tool calls");
  }

  void streams_byte_by_byte_data() { parses_whole_replies_data(); }
  void streams_byte_by_byte() {
    const Case& test_case = current_case();
    const ParsedReply whole = kvchat::parse_tool_calls(test_case.format, test_case.reply);
    std::vector<std::size_t> cuts;
    for (std::size_t i = 1; i < test_case.reply.size(); ++i) cuts.push_back(i);
    const ParsedReply pieces = streamed(test_case.format, test_case.reply, cuts);
    COMPARE_STR(pieces.content, whole.content);
    QCOMPARE(describe(pieces.tool_calls, true), describe(whole.tool_calls, true));
  }

  void streams_random_splits_data() { parses_whole_replies_data(); }
  void streams_random_splits() {
    const Case& test_case = current_case();
    const ParsedReply whole = kvchat::parse_tool_calls(test_case.format, test_case.reply);
    std::mt19937 random(11);
    for (int round = 0; round < 40; ++round) {
      std::vector<std::size_t> cuts;
      for (std::size_t at = 0; at < test_case.reply.size(); cuts.push_back(at)) at += 1 + random() % 12;
      if (!cuts.empty()) cuts.pop_back();  // the last one is at or past the end
      const ParsedReply pieces = streamed(test_case.format, test_case.reply, cuts);
      COMPARE_STR(pieces.content, whole.content);
      QCOMPARE(describe(pieces.tool_calls, true), describe(whole.tool_calls, true));
    }
  }

  void sends_text_before_an_opener_data() {
    QTest::addColumn<int>("format");
    QTest::addColumn<QString>("opener_start");
    QTest::addColumn<QString>("rest");
    using F = ToolCallFormat;
    QTest::newRow("hermes") << int(F::Hermes) << "<tool_"
                            << QString::fromStdString("call>\n" + kWeather + "\n</tool_call>");
    QTest::newRow("llama3") << int(F::Llama3Json) << "<|python_" << QString::fromStdString("tag|>" + kWeather);
    QTest::newRow("mistral") << int(F::Mistral) << "[TOOL_" << QString::fromStdString("CALLS] [" + kWeather + "]");
    QTest::newRow("functionary") << int(F::Functionary) << "<func"
                                 << R"(tion=get_weather>{"city": "Paris"}</function>)";
    QTest::newRow("functionary python") << int(F::Functionary) << "<|py"
                                        << "thon_tag|>print(1)";
    QTest::newRow("firefunction") << int(F::FireFunction) << "functo"
                                  << QString::fromStdString("ols[" + kWeather + "]");
  }
  void sends_text_before_an_opener() {
    QFETCH(int, format);
    QFETCH(QString, opener_start);
    QFETCH(QString, rest);
    ToolCallStream stream(static_cast<ToolCallFormat>(format));
    COMPARE_STR(stream.push("Let me "), std::string("Let me"));  // the space waits: a call may follow it
    COMPARE_STR(stream.push("check. "), std::string(" check."));
    COMPARE_STR(stream.push(opener_start.toStdString()), std::string());
    COMPARE_STR(stream.push(rest.toStdString()), std::string());
    const ParsedReply end = stream.finish();
    COMPARE_STR(end.content, std::string());
    QCOMPARE(end.tool_calls.size(), std::size_t{1});
  }

  void sends_what_turns_out_not_to_be_an_opener() {
    ToolCallStream hermes_stream(ToolCallFormat::Hermes);
    COMPARE_STR(hermes_stream.push("a <tool_"), std::string("a"));
    COMPARE_STR(hermes_stream.push("box> b "), std::string(" <tool_box> b"));
    const ParsedReply hermes_end = hermes_stream.finish();
    COMPARE_STR(hermes_end.content, std::string(" "));
    QVERIFY(hermes_end.tool_calls.empty());

    ToolCallStream firefunction(ToolCallFormat::FireFunction);
    COMPARE_STR(firefunction.push("use functools"), std::string("use"));
    COMPARE_STR(firefunction.push(".partial"), std::string(" functools.partial"));

    // Llama 3's bare object is a call only at the start of the reply.
    ToolCallStream llama3(ToolCallFormat::Llama3Json);
    COMPARE_STR(llama3.push("\n{\"name\""), std::string());
    COMPARE_STR(llama3.push(": 1}"), std::string());
    COMPARE_STR(llama3.finish().content, std::string("\n{\"name\": 1}"));
    COMPARE_STR(llama3.push("Hello {"), std::string("Hello {"));  // finish() readied it for a new reply
  }

  void passes_everything_through_without_a_format() {
    const std::string reply = "  Let me check. " + hermes(kWeather) + "\n";
    const ParsedReply parsed = kvchat::parse_tool_calls(ToolCallFormat::None, reply);
    COMPARE_STR(parsed.content, reply);
    QVERIFY(parsed.tool_calls.empty());
    ToolCallStream stream(ToolCallFormat::None);
    COMPARE_STR(stream.push("  Let me check. <tool_"), std::string("  Let me check. <tool_"));
    COMPARE_STR(stream.push("call>\n"), std::string("call>\n"));
    const ParsedReply end = stream.finish();
    COMPARE_STR(end.content, std::string());
    QVERIFY(end.tool_calls.empty());
  }
};

KVCHAT_TEST_APPLESS_MAIN(ToolCallsTest)

}  // namespace text_test_tool_calls

#include "test_tool_calls.moc"
