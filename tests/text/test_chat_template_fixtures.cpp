// Every chat template fixture rendered by the real Jinja2 (../shared/fixtures/chat_templates/**/*.json,
// held-out ones where present, and the Llama 3 tokenizer's chat_template.json) must come out byte for byte the same
// here.
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/template_rendering.h"
#include "common/test_paths.h"
#include "engine/text/chat_template.h"
#include "engine/text/chat_template_config.h"
#include "engine/text/tokenizer.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_chat_template_fixtures {

using kvchat::ChatTemplate;
using kvchat::TemplateError;
using json = nlohmann::ordered_json;

namespace {

json read_json(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " + path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return json::parse(buffer.str());
}

std::string diff(const std::string& expected, const std::string& actual) {
  std::size_t at = 0;
  while (at < expected.size() && at < actual.size() && expected[at] == actual[at]) ++at;
  std::size_t from = at > 40 ? at - 40 : 0;
  std::ostringstream out;
  out << "first difference at byte " << at << " (expected " << expected.size() << " bytes, got " << actual.size()
      << ")\n      expected: ..." << kvchat::test::visible(expected.substr(from, 120)) << "\n      actual:   ..."
      << kvchat::test::visible(actual.substr(from, 120));
  return out.str();
}

std::string fixed_date(const json& fixture) {
  // "2026-07-26T00:00:00": strftime_now is fixed to that day at midnight.
  return fixture.contains("fixed_date") ? fixture["fixed_date"].get<std::string>().substr(0, 10) : "";
}

}  // namespace

class ChatTemplateFixtureTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void renders_every_jinja2_fixture_exactly() {
    namespace fs = std::filesystem;
    const fs::path folder = kvchat::test::shared_path("fixtures/chat_templates");
    QVERIFY2(fs::is_directory(folder), folder.string().c_str());
    // (file, name in messages): the name is the path under its folder without ".json", so
    // "tool_use/NAME" for a sub-folder and "hidden/..." for held-out cases.
    std::vector<std::pair<fs::path, std::string>> files;
    // Held-out cases of the same layout are checked too wherever they are present, sub-folders included.
    const std::pair<fs::path, std::string> roots[] = {
        {folder, ""},
        {fs::path(kvchat::test::shared_path("hidden/chat_templates")), "hidden/"},
        {fs::path(kvchat::test::shared_dir()) / ".." / "hidden" / "chat_templates", "hidden/"}};
    for (const auto& [dir, prefix] : roots) {
      if (!fs::is_directory(dir)) continue;
      for (const auto& entry : fs::recursive_directory_iterator(dir)) {
        if (!entry.is_regular_file() || entry.path().extension() != ".json") continue;
        fs::path relative = entry.path().lexically_relative(dir);
        files.emplace_back(entry.path(), prefix + relative.replace_extension().generic_string());
      }
    }
    std::sort(files.begin(), files.end());
    QVERIFY(!files.empty());

    std::vector<std::string> failures;
    std::map<std::string, std::pair<int, int>> passed;  // per file: renders identical, expected errors raised
    int rendered = 0, errors = 0;
    for (const auto& [path, name] : files) {
      json fixture = read_json(path.string());
      std::unique_ptr<ChatTemplate> chat_template;
      try {
        chat_template = std::make_unique<ChatTemplate>(fixture["template"].get<std::string>());
      } catch (const TemplateError& error) {
        failures.push_back(name + ": template does not parse: " + error.what());
        continue;
      }
      const std::string today = fixed_date(fixture);
      for (const json& c : fixture["cases"]) {
        const std::string label = name + "/" + c["name"].get<std::string>();
        json context =
            kvchat::chat_template_context(c["messages"], c["add_generation_prompt"].get<bool>(),
                                          fixture["special_tokens"], c.contains("tools") ? c["tools"] : json(nullptr),
                                          c.contains("extra_context") ? c["extra_context"] : json::object());
        const bool expect_error = c.value("error", false);
        try {
          std::string actual = chat_template->render(context, today);
          if (expect_error) {
            failures.push_back(label + ": expected an error (" + c.value("error_message", std::string()) +
                               ") but rendered: " + kvchat::test::visible(actual.substr(0, 200)));
          } else if (actual != c["rendered"].get<std::string>()) {
            failures.push_back(label + ": " + diff(c["rendered"].get<std::string>(), actual));
          } else {
            ++rendered;
            ++passed[name].first;
          }
        } catch (const TemplateError& error) {
          if (expect_error) {
            ++errors;
            ++passed[name].second;
          } else {
            failures.push_back(label + ": unexpected TemplateError: " + error.what());
          }
        }
      }
    }
    for (const std::string& failure : failures) qWarning("%s", failure.c_str());
    for (const auto& [name, counts] : passed)
      qInfo("%s: %d identical, %d expected errors", name.c_str(), counts.first, counts.second);
    qInfo("%d renders identical, %d expected errors raised, %zu failures, %zu files", rendered, errors, failures.size(),
          files.size());
    QVERIFY2(failures.empty(), (std::to_string(failures.size()) + " chat template fixture case(s) differ").c_str());
    QVERIFY(rendered > 0);
    QVERIFY(errors > 0);
  }

  void renders_and_encodes_llama3_tokenizer_conversations() {
    const std::string folder = kvchat::test::shared_path("fixtures/tokenizers/llama3");
    kvchat::ChatFormatter formatter = kvchat::ChatFormatter::from_tokenizer_config(folder + "/tokenizer_config.json");
    QVERIFY(formatter.has_template());
    kvchat::Tokenizer tokenizer = kvchat::Tokenizer::from_directory(folder);
    json cases = read_json(folder + "/chat_template.json");
    QVERIFY(!cases.empty());
    std::vector<std::string> failures;
    for (const json& c : cases) {
      std::vector<kvchat::ChatMessage> messages;
      for (const json& m : c["messages"])
        messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      kvchat::RenderedPrompt prompt = formatter.render_prompt(messages, c["add_generation_prompt"].get<bool>());
      const std::string label = c["id"].get<std::string>() + (c["add_generation_prompt"].get<bool>() ? "+gen" : "");
      if (prompt.text != c["text"].get<std::string>()) {
        failures.push_back(label + ": " + diff(c["text"].get<std::string>(), prompt.text));
        continue;
      }
      // The chat path of the tokenizer (user text protected) gives the reference ids, since
      // none of these conversations types anything that looks like a control token.
      std::vector<kvchat::TokenId> ids = tokenizer.encode_chat(prompt.text, prompt.content_ranges, false);
      if (ids != c["ids"].get<std::vector<kvchat::TokenId>>()) failures.push_back(label + ": token ids differ");
    }
    for (const std::string& failure : failures) qWarning("%s", failure.c_str());
    QVERIFY2(failures.empty(), (std::to_string(failures.size()) + " llama3 conversation(s) differ").c_str());
  }
};

KVCHAT_TEST_APPLESS_MAIN(ChatTemplateFixtureTest)

}  // namespace text_test_chat_template_fixtures

#include "test_chat_template_fixtures.moc"
