// kvchat-cli tokenize: JSON lines in, JSON lines out, checked against the tokenizer fixtures.
#include <QtTest>
#include "common/test_suite.h"

#include <sstream>

#include <nlohmann/json.hpp>

#include "common/cli_runner.h"
#include "common/json_fixture.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_tokenize {

namespace {

using kvchat::test::CliResult;
using kvchat::test::load_json;
using kvchat::test::run_cli;
using nlohmann::json;

std::vector<json> output_lines(const std::string& out) {
  std::vector<json> lines;
  std::istringstream stream(out);
  for (std::string line; std::getline(stream, line);) lines.push_back(json::parse(line));
  return lines;
}

QString fixture_dir(const std::string& model) {
  return QString::fromStdString(kvchat::test::shared_path("fixtures/tokenizers/" + model));
}

}  // namespace

class CliTokenizeTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void jsonl_encode_matches_fixtures_data() {
    QTest::addColumn<QString>("model");
    QTest::newRow("llama3") << QString("llama3");
    QTest::newRow("llama2") << QString("llama2");
  }
  void jsonl_encode_matches_fixtures() {
    QFETCH(QString, model);
    const json cases = load_json(fixture_dir(model.toStdString()).toStdString() + "/encode.json");
    std::string input;
    for (const auto& c : cases) {
      input += json{{"text", c["text"]},
                    {"add_special_tokens", c["add_special_tokens"]},
                    {"parse_special", c["parse_special"]}}
                   .dump() +
               "\n";
    }
    input += "not json\n";  // a bad line answers with an error and the stream continues
    input += json{{"text", "Hello"}}.dump() + "\n";
    CliResult result = run_cli({"tokenize", "--tokenizer", fixture_dir(model.toStdString()), "--jsonl"}, input);
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    auto lines = output_lines(result.out);
    QCOMPARE(lines.size(), cases.size() + 2);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      QVERIFY2(lines[i]["ids"] == cases[i]["ids"],
               qPrintable(QString::fromStdString(cases[i]["id"].get<std::string>() + ": " + lines[i].dump())));
    }
    QVERIFY(lines[cases.size()].contains("error"));
    QVERIFY(lines[cases.size()]["error"].get<std::string>().find("line " + std::to_string(cases.size() + 1)) == 0);
    // Absent fields take the defaults: BOS as the tokenizer adds it, parse_special false.
    QVERIFY(lines[cases.size() + 1].contains("ids"));
  }

  void jsonl_decode_matches_fixtures() {
    const json cases = load_json(fixture_dir("llama3").toStdString() + "/decode.json");
    std::string input;
    for (const auto& c : cases) {
      input += json{{"ids", c["ids"]},
                    {"skip_special_tokens", c["skip_special_tokens"]},
                    {"clean_up_tokenization_spaces", c["clean_up_tokenization_spaces"]}}
                   .dump() +
               "\n";
    }
    input += json{{"ids", {9906, 999999}}}.dump() + "\n";
    CliResult result = run_cli({"tokenize", "--tokenizer", fixture_dir("llama3"), "--jsonl", "--decode"}, input);
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    auto lines = output_lines(result.out);
    QCOMPARE(lines.size(), cases.size() + 1);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      QVERIFY2(lines[i]["text"] == cases[i]["text"],
               qPrintable(QString::fromStdString(cases[i]["id"].get<std::string>() + ": " + lines[i].dump())));
    }
    QVERIFY(lines.back()["error"].get<std::string>().find("token id 999999") != std::string::npos);
  }

  void text_mode() {
    CliResult encoded = run_cli({"tokenize", "--tokenizer", fixture_dir("llama2"), "--text", "Hello world"});
    QVERIFY2(encoded.exit_code == 0, encoded.err.c_str());
    QCOMPARE(QString::fromStdString(encoded.out), QString("{\"ids\":[1,22557,1526]}\n"));
    CliResult decoded =
        run_cli({"tokenize", "--tokenizer", fixture_dir("llama2"), "--decode", "--text", "1,22557,1526"});
    QVERIFY2(decoded.exit_code == 0, decoded.err.c_str());
    QCOMPARE(QString::fromStdString(decoded.out), QString("{\"text\":\"<s> Hello world\"}\n"));
    CliResult missing = run_cli({"tokenize", "--tokenizer", "/nonexistent/tokenizer-dir", "--text", "x"});
    QVERIFY(missing.exit_code != 0);
    QVERIFY(missing.err.find("/nonexistent/tokenizer-dir") != std::string::npos);
  }
};

KVCHAT_TEST_GUILESS_MAIN(CliTokenizeTest)

}  // namespace app_test_cli_tokenize

#include "test_cli_tokenize.moc"
