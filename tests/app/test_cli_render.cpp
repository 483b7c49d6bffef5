// kvchat-cli render reproduces every Jinja2 reference render of ../shared/fixtures/chat_templates
// when given the fixture's template and special tokens as a tokenizer_config.json.
#include <QDir>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/cli_runner.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_render {

using json = nlohmann::ordered_json;
using kvchat::test::CliResult;
using kvchat::test::run_cli;

namespace {

// Keeps the fixture's key order (ordered_json), which the templates see; load_json would sort the keys.
json read_json(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return json::parse(buffer.str());
}

}  // namespace

class CliRenderTest : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir dir_;

 private Q_SLOTS:
  void initTestCase() { QVERIFY(dir_.isValid()); }

  void jsonl_reproduces_every_fixture_case() {
    namespace fs = std::filesystem;
    const fs::path folder = kvchat::test::shared_path("fixtures/chat_templates");
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(folder))
      if (entry.path().extension() == ".json") files.push_back(entry.path());
    QVERIFY(!files.empty());
    int checked = 0;
    std::vector<std::string> failures;
    for (const fs::path& path : files) {
      const std::string name = path.stem().string();
      json fixture = read_json(path.string());
      json config = {{"chat_template", fixture["template"]}};
      for (auto it = fixture["special_tokens"].begin(); it != fixture["special_tokens"].end(); ++it)
        config[it.key()] = it.value();
      const std::string config_path = dir_.filePath(QString::fromStdString(name + ".json")).toStdString();
      std::ofstream(config_path, std::ios::binary) << config.dump();

      std::string input;
      for (const json& c : fixture["cases"]) {
        json request = {{"messages", c["messages"]}, {"add_generation_prompt", c["add_generation_prompt"]}};
        if (c.contains("tools")) request["tools"] = c["tools"];
        if (c.contains("extra_context")) request["extra_context"] = c["extra_context"];
        input += request.dump() + "\n";
      }
      CliResult result =
          run_cli({"render", "--tokenizer-config", QString::fromStdString(config_path), "--date",
                   QString::fromStdString(fixture["fixed_date"].get<std::string>().substr(0, 10)), "--jsonl"},
                  input);
      QVERIFY2(result.exit_code == 0, result.err.c_str());
      QList<QByteArray> lines = QByteArray::fromStdString(result.out).split('\n');
      if (!lines.isEmpty() && lines.back().isEmpty()) lines.pop_back();
      QCOMPARE(lines.size(), static_cast<qsizetype>(fixture["cases"].size()));
      for (std::size_t i = 0; i < fixture["cases"].size(); ++i) {
        const json& c = fixture["cases"][i];
        json answer = json::parse(lines[static_cast<qsizetype>(i)].toStdString());
        const std::string label = name + "/" + c["name"].get<std::string>();
        if (c.value("error", false)) {
          if (!answer.contains("error")) failures.push_back(label + ": expected {\"error\"}, got " + answer.dump());
        } else if (!answer.contains("rendered") || answer["rendered"] != c["rendered"]) {
          failures.push_back(label + ": got " + answer.dump().substr(0, 300));
        }
        ++checked;
      }
    }
    for (const std::string& failure : failures) qWarning("%s", failure.c_str());
    QVERIFY2(failures.empty(), (std::to_string(failures.size()) + " case(s) differ").c_str());
    QVERIFY(checked > 0);
  }

  void real_tokenizer_config_and_plain_output() {
    const QString config =
        QString::fromStdString(kvchat::test::shared_path("fixtures/tokenizers/llama3/tokenizer_config.json"));
    CliResult result =
        run_cli({"render", "--tokenizer-config", config}, R"({"messages": [{"role": "user", "content": " Hi "}]})");
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    QCOMPARE(QByteArray::fromStdString(result.out),
             QByteArray("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n"));
  }

  void bad_lines_answer_with_an_error_and_bad_options_are_usage_errors() {
    const QString config =
        QString::fromStdString(kvchat::test::shared_path("fixtures/tokenizers/llama3/tokenizer_config.json"));
    CliResult result = run_cli({"render", "--tokenizer-config", config, "--jsonl"},
                               "{\"messages\": 3}\nnot json\n{\"messages\": []}\n");
    QCOMPARE(result.exit_code, 0);
    QList<QByteArray> lines = QByteArray::fromStdString(result.out).trimmed().split('\n');
    QCOMPARE(lines.size(), 3);
    QVERIFY2(json::parse(lines[0].toStdString())["error"].get<std::string>().find("messages") != std::string::npos,
             lines[0].constData());
    QVERIFY2(json::parse(lines[1].toStdString())["error"].get<std::string>().find("line 2") != std::string::npos,
             lines[1].constData());
    QCOMPARE(QString::fromStdString(json::parse(lines[2].toStdString())["rendered"].get<std::string>()),
             QStringLiteral("<|start_header_id|>assistant<|end_header_id|>\n\n"));

    CliResult bad_date = run_cli({"render", "--tokenizer-config", config, "--date", "26/07/2026"}, "");
    QCOMPARE(bad_date.exit_code, 2);
    QVERIFY(bad_date.err.find("--date") != std::string::npos);
    CliResult missing = run_cli({"render", "--tokenizer-config", dir_.filePath(QStringLiteral("absent.json"))}, "");
    QCOMPARE(missing.exit_code, 1);
    QVERIFY(missing.err.find("absent.json") != std::string::npos);
  }
};

KVCHAT_TEST_GUILESS_MAIN(CliRenderTest)

}  // namespace app_test_cli_render

#include "test_cli_render.moc"
