// ChatFormatter: tokenizer_config.json loading (template forms, special token forms, bad files),
// plain concatenation for models without a template, and the content ranges of render_prompt.
#include <QTemporaryDir>
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/test_paths.h"
#include "engine/text/chat_template.h"
#include "engine/text/jinja/jinja_pystr.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_chat_formatter {

using kvchat::ChatFormatter;
using kvchat::ChatMessage;
using kvchat::TemplateError;
using json = nlohmann::ordered_json;

#define COMPARE_STR(actual, expected) QCOMPARE(QString::fromStdString(actual), QString::fromStdString(expected))

class ChatFormatterTest : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir dir_;

  std::string write(const std::string& name, const std::string& text) {
    std::string path = dir_.filePath(QString::fromStdString(name)).toStdString();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::string error_loading(const std::string& path) {
    try {
      ChatFormatter::from_tokenizer_config(path);
    } catch (const TemplateError& error) {
      return error.what();
    }
    return "";
  }

 private Q_SLOTS:
  void initTestCase() { QVERIFY(dir_.isValid()); }

  void plain_formatter_concatenates_contents() {
    ChatFormatter plain = ChatFormatter::plain();
    QVERIFY(!plain.has_template());
    std::vector<ChatMessage> messages = {{"system", "Once upon"}, {"user", " a time"}, {"assistant", ", there"}};
    COMPARE_STR(plain.render(messages, true), "Once upon a time, there");
    kvchat::RenderedPrompt prompt = plain.render_prompt(messages, true);
    QVERIFY(!prompt.uses_template);
    QCOMPARE(prompt.content_ranges.size(), std::size_t{3});
    QCOMPARE(prompt.content_ranges[0], (std::pair<size_t, size_t>{0, 9}));
    QCOMPARE(prompt.content_ranges[1], (std::pair<size_t, size_t>{9, 16}));
    QCOMPARE(prompt.content_ranges[2], (std::pair<size_t, size_t>{16, 23}));
  }

  void content_ranges_point_at_the_message_text_even_when_trimmed() {
    // The Llama 3 template trims every content; the ranges must cover the trimmed text.
    ChatFormatter llama3 = ChatFormatter::from_tokenizer_config(
        kvchat::test::shared_path("fixtures/tokenizers/llama3/tokenizer_config.json"));
    QVERIFY(llama3.has_template());
    std::vector<ChatMessage> messages = {{"system", "  Be brief.\n"},
                                         {"user", "<|eot_id|> is not a token here"},
                                         {"assistant", "user"},  // also occurs earlier, as a role name
                                         {"user", "\n\nagain  "}};
    kvchat::RenderedPrompt prompt = llama3.render_prompt(messages, true);
    QVERIFY(prompt.uses_template);
    QCOMPARE(prompt.content_ranges.size(), messages.size());
    std::size_t previous_end = 0;
    for (std::size_t i = 0; i < messages.size(); ++i) {
      auto [first, last] = prompt.content_ranges[i];
      QVERIFY(first >= previous_end && last <= prompt.text.size());
      COMPARE_STR(prompt.text.substr(first, last - first),
                  kvchat::jinja::pystr::strip(messages[i].content, std::nullopt, true, true));
      previous_end = last;
    }
    // The assistant's "user" is the one in its own turn, after the assistant header.
    std::string assistant_header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    QCOMPARE(prompt.content_ranges[2].first, prompt.text.find(assistant_header) + assistant_header.size());
  }

  void template_list_uses_default_and_token_objects_give_their_content() {
    json config = {{"chat_template", json::array({{{"name", "tool_use"}, {"template", "TOOLS"}},
                                                  {{"name", "default"},
                                                   {"template",
                                                    "{{ bos_token }}|{{ eos_token }}|"
                                                    "{{ unk_token is defined }}|{{ x }}"}}})},
                   {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                   {"eos_token", "</s>"},
                   {"unk_token", nullptr}};
    ChatFormatter formatter = ChatFormatter::from_tokenizer_config(write("list.json", config.dump()));
    QVERIFY(formatter.has_template());
    COMPARE_STR(formatter.render({}, false, {{"x", 42}}), "<s>|</s>|False|42");
  }

  void extra_context_is_merged_on_top() {
    json config = {{"chat_template",
                    "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
                    "{{ add_generation_prompt }}|{{ enable_thinking }}|{{ tools | tojson }}"}};
    ChatFormatter formatter = ChatFormatter::from_tokenizer_config(write("extra.json", config.dump()));
    COMPARE_STR(formatter.render({{"user", "hi"}}, true, {{"enable_thinking", false}}), "user:hi;True|False|null");
    COMPARE_STR(formatter.render({{"user", "hi"}}, false, {{"tools", json::array({"t"})}}), "user:hi;False||[\"t\"]");
  }

  void config_without_template_is_plain() {
    ChatFormatter formatter = ChatFormatter::from_tokenizer_config(write("none.json", R"({"bos_token": "<s>"})"));
    QVERIFY(!formatter.has_template());
    COMPARE_STR(formatter.render({{"user", "a"}, {"assistant", "b"}}, true), "ab");
  }

  void bad_configs_name_the_file() {
    std::string invalid = write("invalid.json", "{\"chat_template\": ");
    QVERIFY2(error_loading(invalid).find(invalid) != std::string::npos, error_loading(invalid).c_str());
    std::string not_string = write("number.json", R"({"chat_template": 42})");
    QVERIFY2(error_loading(not_string).find(not_string) != std::string::npos, error_loading(not_string).c_str());
    std::string no_default = write("nodefault.json", R"({"chat_template": [{"name": "rag", "template": "x"}]})");
    QVERIFY2(error_loading(no_default).find("default") != std::string::npos, error_loading(no_default).c_str());
    std::string bad_syntax = write("syntax.json", R"({"chat_template": "{% for %}"})");
    QVERIFY2(error_loading(bad_syntax).find(bad_syntax) != std::string::npos, error_loading(bad_syntax).c_str());
    std::string missing = dir_.filePath(QStringLiteral("missing.json")).toStdString();
    QVERIFY2(error_loading(missing).find(missing) != std::string::npos, error_loading(missing).c_str());
  }
};

KVCHAT_TEST_APPLESS_MAIN(ChatFormatterTest)

}  // namespace text_test_chat_formatter

#include "test_chat_formatter.moc"
