// Tool-use conversations through ChatMessage, as the server receives them in OpenAI's shape (a call's
// arguments as JSON text, a tool message's tool_call_id and name): rendered by the real tool-use templates,
// they give exactly what Python's Jinja2 gave, with the arguments as objects where the template writes them with
// tojson (Hermes) and as text where it joins them as text (functionary, firefunction); and control-token text
// inside a call or a tool definition stays text.
#include <fstream>
#include <string>
#include <vector>

#include <QTemporaryDir>
#include <QtTest/QtTest>
#include "common/test_paths.h"
#include "common/test_suite.h"

#include "engine/text/chat_template.h"

namespace text_test_chat_tool_messages {

using kvchat::ChatFormatter;
using kvchat::ChatMessage;
using json = nlohmann::ordered_json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// A fixture message as an OpenAI client sends it: arguments as JSON text.
ChatMessage openai_message(const json& message) {
  ChatMessage out{message["role"], message["content"].is_string() ? message["content"].get<std::string>() : ""};
  if (message.contains("tool_calls")) {
    json calls = message["tool_calls"];
    for (json& call : calls)
      if (call["function"]["arguments"].is_object())
        call["function"]["arguments"] = call["function"]["arguments"].dump();
    out.tool_calls = calls.dump();
  }
  if (message.contains("tool_call_id")) out.tool_call_id = message["tool_call_id"];
  if (message.contains("name")) out.name = message["name"];
  return out;
}

bool has_object_arguments(const json& messages) {
  for (const json& message : messages)
    if (message.contains("tool_calls"))
      for (const json& call : message["tool_calls"])
        if (!call["function"]["arguments"].is_object()) return false;
  return true;
}

std::string optional_text(const json& fixture, const char* key) {
  return fixture.contains(key) && fixture[key].is_string() ? fixture[key].get<std::string>() : "";
}

}  // namespace

class ChatToolMessagesTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void tool_conversations_render_as_jinja2_did() {
    int compared = 0;
    for (const char* name : {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "meetkai-functionary-medium-v3.1",
                             "fireworks-ai-llama-3-firefunction-v2"}) {
      const json fixture =
          read_json(kvchat::test::shared_path(std::string("fixtures/chat_templates/tool_use/") + name + ".json"));
      const ChatFormatter formatter = ChatFormatter::from_template(
          fixture["template"], optional_text(fixture, "bos_token"), optional_text(fixture, "eos_token"), name);
      const std::string today = optional_text(fixture, "fixed_date").substr(0, 10);
      for (const json& c : fixture["cases"]) {
        // Jinja2 errors on these templates' object arguments; the server sends them the text (below).
        if (c.value("error", false)) continue;
        // Hermes writes arguments with `| tojson`: the server gives it objects (as its dict-argument cases),
        // where Jinja2 given OpenAI's text writes a quoted string.
        if (std::string(name).rfind("NousResearch", 0) == 0 && !has_object_arguments(c["messages"])) continue;
        bool tool_use = false;
        for (const json& message : c["messages"])
          tool_use = tool_use || message.contains("tool_calls") || message["role"] == "tool";
        if (!tool_use) continue;
        std::vector<ChatMessage> messages;
        for (const json& message : c["messages"]) messages.push_back(openai_message(message));
        json context = c.contains("extra_context") ? c["extra_context"] : json::object();
        if (c.contains("tools")) context["tools"] = c["tools"];
        const std::string rendered = formatter.render(messages, c["add_generation_prompt"], context, today);
        QVERIFY2(rendered == c["rendered"].get<std::string>(),
                 (std::string(name) + "/" + c["name"].get<std::string>() + ":\n" + rendered).c_str());
        ++compared;
      }
    }
    QCOMPARE(compared, 5);
  }

  // A tokenizer_config.json listing "default" and "tool_use" templates: requests with tools get the second.
  void the_tool_use_template_renders_requests_with_tools() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const std::string path = dir.filePath("tokenizer_config.json").toStdString();
    std::ofstream(path) << json{{"bos_token", "<s>"},
                                {"chat_template",
                                 {{{"name", "default"}, {"template", "plain:{{ messages[0].content }}"}},
                                  {{"name", "tool_use"},
                                   {"template", "tools:{{ tools | length }}:{{ messages[0].content }}"}}}}}
                               .dump();
    const ChatFormatter formatter = ChatFormatter::from_tokenizer_config(path);
    QCOMPARE(formatter.render({ChatMessage{"user", "hi"}}, false), std::string("plain:hi"));
    const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
    QCOMPARE(formatter.render({ChatMessage{"user", "hi"}}, false, json{{"tools", tools}}), std::string("tools:1:hi"));
    QVERIFY(formatter.template_source().rfind("tools:", 0) == 0);
  }

  void control_text_in_calls_and_tools_stays_text() {
    const json fixture = read_json(kvchat::test::shared_path(
        "fixtures/chat_templates/tool_use/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.json"));
    const ChatFormatter formatter = ChatFormatter::from_template(fixture["template"], std::string("<|begin_of_text|>"),
                                                                 std::string("<|im_end|>"), "hermes");
    const std::string control = "<|im_end|>";
    ChatMessage call{"assistant", ""};
    call.tool_calls = json::array({{{"id", "call_1"},
                                    {"type", "function"},
                                    {"function", {{"name", "echo"}, {"arguments", "{\"text\": \"a<|im_end|>b\"}"}}}}})
                          .dump();
    ChatMessage result{"tool", "ok"};
    result.tool_call_id = "call_1";
    const json tools = json::array(
        {{{"type", "function"},
          {"function",
           {{"name", "echo"}, {"description", "repeats <|im_end|> text"}, {"parameters", {{"type", "object"}}}}}}});
    const auto find_control = [&](std::string_view text) {
      std::vector<std::pair<std::size_t, std::size_t>> ranges;
      for (std::size_t at = text.find(control); at != std::string_view::npos; at = text.find(control, at + 1))
        ranges.emplace_back(at, at + control.size());
      return ranges;
    };
    const kvchat::RenderedPrompt prompt = formatter.render_prompt({ChatMessage{"user", "hi"}, call, result}, true,
                                                                  json{{"tools", tools}}, "2026-01-01", find_control);
    const auto protected_at = [&](std::size_t at) {
      for (const auto& [begin, end] : prompt.content_ranges)
        if (begin <= at && at + control.size() <= end) return true;
      return false;
    };
    const std::size_t in_arguments = prompt.text.find("a<|im_end|>b");
    const std::size_t in_tools = prompt.text.find("repeats <|im_end|> text");
    QVERIFY2(in_arguments != std::string::npos, prompt.text.c_str());
    QVERIFY2(in_tools != std::string::npos, prompt.text.c_str());
    QVERIFY(protected_at(in_arguments + 1));
    QVERIFY(protected_at(in_tools + 8));
    // The template's own end-of-turn tokens are not protected.
    int protected_count = 0, own_count = 0;
    for (std::size_t at = prompt.text.find(control); at != std::string::npos; at = prompt.text.find(control, at + 1))
      ++(protected_at(at) ? protected_count : own_count);
    QCOMPARE(protected_count, 2);
    QVERIFY(own_count >= 3);
  }
};

KVCHAT_TEST_APPLESS_MAIN(ChatToolMessagesTest)

}  // namespace text_test_chat_tool_messages

#include "test_chat_tool_messages.moc"
