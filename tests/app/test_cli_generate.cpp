// kvchat-cli generate end to end: text prompts through the stories260K tokenizer and model reproduce
// llama2.c's run.c continuations; random-weight models of real shapes; clear errors on bad input.
#include <QtTest>
#include "common/test_suite.h"

#include <QDir>
#include <QFile>
#include <nlohmann/json.hpp>

#include "common/cli_runner.h"
#include "common/json_fixture.h"
#include "common/model_folder_copy.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_generate {

using kvchat::test::load_json;
using kvchat::test::run_cli;
using kvchat::test::shared_path;

namespace {
QString shared(const std::string& relative) { return QString::fromStdString(shared_path(relative)); }

// The single line a failing command must print on stderr.
void expect_error(const QStringList& arguments, int exit_code, const std::string& fragment) {
  auto result = run_cli(arguments);
  QCOMPARE(result.exit_code, exit_code);
  QVERIFY2(result.err.find(fragment) != std::string::npos, result.err.c_str());
  QCOMPARE(std::count(result.err.begin(), result.err.end(), '\n'), 1L);
  QVERIFY(result.out.empty());
}
}  // namespace

class CliGenerateTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void text_prompt_reproduces_run_c_data();
  void text_prompt_reproduces_run_c();
  void prompt_ids_with_every_cache_mode_agree();
  void random_weights_of_a_real_config();
  void speculative_lookup_gives_the_same_ids();
  void bad_input_gives_one_clear_line();
};

void CliGenerateTest::text_prompt_reproduces_run_c_data() {
  QTest::addColumn<int>("case_index");
  auto cases = load_json(shared_path("fixtures/reference/stories260K_greedy.json"));
  for (int i = 0; i < int(cases.size()); ++i) QTest::newRow(cases[i]["prompt"].get<std::string>().c_str()) << i;
}

void CliGenerateTest::text_prompt_reproduces_run_c() {
  QFETCH(int, case_index);
  auto reference = load_json(shared_path("fixtures/reference/stories260K_greedy.json"))[case_index];
  const int max_new = reference["steps"].get<int>() - int(reference["prompt_ids"].size()) + 1;
  auto result = run_cli({"generate", "--model", shared("models/stories260K"), "--prompt",
                         QString::fromStdString(reference["prompt"].get<std::string>()), "--max-new-tokens",
                         QString::number(max_new), "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  auto output = nlohmann::json::parse(result.out);
  QVERIFY(output["prompt_ids"] == reference["prompt_ids"]);
  auto generated = output["generated_ids"].get<std::vector<int>>();
  auto expected = reference["generated_ids"].get<std::vector<int>>();
  const bool stopped = output["stop_reason"] == "eos";
  QCOMPARE(stopped, reference["stopped_on_bos"].get<bool>());
  if (stopped && expected.back() != generated.back()) generated.pop_back();  // the reference may omit the final BOS
  QVERIFY(generated == expected);
  // The text: equal to run.c's, up to the first character's leading space.
  std::string text = output["generated_text"].get<std::string>();
  std::string expected_text = reference["generated_text"].get<std::string>();
  auto strip = [](std::string s) { return s.empty() || s[0] != ' ' ? s : s.substr(1); };
  QCOMPARE(QString::fromStdString(strip(text)), QString::fromStdString(strip(expected_text)));
  QCOMPARE(output["stats"]["generated_tokens"].get<int>(), int(output["generated_ids"].size()));
}

void CliGenerateTest::prompt_ids_with_every_cache_mode_agree() {
  std::vector<nlohmann::json> outputs;
  for (const char* mode : {"on", "naive", "off"}) {
    auto result = run_cli({"generate", "--model", shared("models/tiny-llama3-random"), "--prompt-ids", "1,847,236,437",
                           "--max-new-tokens", "20", "--kv-cache", mode, "--temperature", "0.8", "--top-p", "0.9",
                           "--seed", "11", "--json"});
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    outputs.push_back(nlohmann::json::parse(result.out));
    QCOMPARE(outputs.back()["stats"]["cache_mode"].get<std::string>(), std::string(mode));
  }
  QVERIFY(!outputs[0]["generated_ids"].empty());
  QVERIFY(outputs[0]["generated_ids"] == outputs[1]["generated_ids"]);
  QVERIFY(outputs[0]["generated_ids"] == outputs[2]["generated_ids"]);
  QCOMPARE(outputs[2]["stats"]["cache_bytes"].get<long long>(), 0LL);
  // Cache bytes: 2 x 4 layers x 2 kv heads x 32 x tokens x 4 bytes.
  const long long tokens = outputs[0]["stats"]["cache_tokens"].get<long long>();
  QCOMPARE(outputs[0]["stats"]["cache_bytes"].get<long long>(), 2LL * 4 * 2 * 32 * tokens * 4);
}

void CliGenerateTest::random_weights_of_a_real_config() {
  auto result = run_cli({"generate", "--random-weights", shared("models/tiny-llama3-random/config.json"),
                         "--weights-seed", "3", "--prompt-ids", "1,2,3", "--max-new-tokens", "5", "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  auto output = nlohmann::json::parse(result.out);
  QCOMPARE(output["generated_ids"].size(), size_t(5));
  QCOMPARE(output["stop_reason"].get<std::string>(), std::string("max_tokens"));
  auto again = run_cli({"generate", "--random-weights", shared("models/tiny-llama3-random/config.json"),
                        "--weights-seed", "3", "--prompt-ids", "1,2,3", "--max-new-tokens", "5", "--json"});
  QVERIFY(nlohmann::json::parse(again.out)["generated_ids"] == output["generated_ids"]);  // seeded weights
}

// --speculative lookup: the same ids as plain decoding, and the stats say how many proposals held.
void CliGenerateTest::speculative_lookup_gives_the_same_ids() {
  std::vector<nlohmann::json> outputs;
  for (const char* mode : {"none", "lookup"}) {
    auto result = run_cli({"generate", "--model", shared("models/stories260K"), "--prompt", "Once upon a time",
                           "--max-new-tokens", "120", "--speculative", mode, "--draft-tokens", "5", "--json"});
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    outputs.push_back(nlohmann::json::parse(result.out));
  }
  // A draft model: the stories model's Q8_0 file proposes for its f32 original.
  auto draft = run_cli({"generate", "--model", shared("models/stories260K"), "--prompt", "Once upon a time",
                        "--max-new-tokens", "120", "--speculative", "draft", "--draft-model",
                        shared("fixtures/gguf/stories260K-Q8_0.gguf"), "--json"});
  QVERIFY2(draft.exit_code == 0, draft.err.c_str());
  outputs.push_back(nlohmann::json::parse(draft.out));
  QVERIFY2(outputs[2]["stats"]["accepted_tokens"].get<int>() > 0, outputs[2]["stats"].dump().c_str());
  QVERIFY(outputs[0]["generated_ids"] == outputs[2]["generated_ids"]);
  QCOMPARE(outputs[0]["generated_ids"].size(), size_t(120));
  QVERIFY(outputs[0]["generated_ids"] == outputs[1]["generated_ids"]);
  QVERIFY(!outputs[0]["stats"].contains("drafted_tokens"));
  const nlohmann::json& stats = outputs[1]["stats"];
  QVERIFY2(stats["drafted_tokens"].get<int>() > 0, stats.dump().c_str());
  QVERIFY(stats["accepted_tokens"].get<int>() <= stats["drafted_tokens"].get<int>());
  QVERIFY(stats["draft_checks"].get<int>() > 0);
}

void CliGenerateTest::bad_input_gives_one_clear_line() {
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1", "--speculative", "drafts"}, 2,
               "--speculative: unknown speculative decoding mode 'drafts' (expected none, lookup or draft)");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1", "--speculative", "draft"}, 2,
               "--speculative draft needs --draft-model DIR|FILE.gguf");
  expect_error({"generate", "--model", shared("models/tiny-llama3-random"), "--prompt-ids", "1", "--speculative",
                "draft", "--draft-model", shared("models/stories260K")},
               2, "has a vocabulary of 512 ids, the model 1000: a draft model must share the model's tokenizer");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1", "--draft-tokens", "0"}, 2,
               "--draft-tokens must be between 1 and 32");
  expect_error({"generate", "--model", "/nonexistent/model", "--prompt-ids", "1"}, 1, "/nonexistent/model");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1,600"}, 2,
               "outside the vocabulary");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1", "--kv-cache", "fast"}, 2,
               "unknown kv cache mode 'fast'");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1,x"}, 2,
               "comma-separated integers");
  expect_error({"generate", "--model", shared("models/stories260K")}, 2,
               "missing --prompt-ids, --prompt or --messages");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt", "a", "--prompt-ids", "1"}, 2,
               "give one of --prompt-ids, --prompt and --messages");
  expect_error({"generate", "--model", shared("models/stories260K"), "--messages", "/nonexistent/m.json"}, 2,
               "--messages /nonexistent/m.json: ");
  const QString not_messages = QDir::temp().filePath("kvchat-generate-not-messages.json");
  kvchat::test::write_file_bytes(not_messages.toStdString(), R"([{"role": "user"}])");
  expect_error({"generate", "--model", shared("models/stories260K"), "--messages", not_messages}, 2,
               "message 0 must be an object with a string \"role\" and a string \"content\"");
  QFile::remove(not_messages);
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1", "--dtype", "q4"}, 2,
               "unknown weight dtype 'q4'");
  expect_error({"generate", "--random-weights", shared("fixtures/configs/missing.json"), "--prompt-ids", "1"}, 1,
               "missing.json");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1", "--temperature", "nan"}, 2,
               "--temperature expects a finite number, got 'nan'");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1", "--top-p", "inf"}, 2,
               "--top-p expects a finite number");
  expect_error({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1", "--threads", "1000000000"}, 2,
               "--threads must be from 0 (all cores) to");
  std::string long_prompt = "1";
  for (int i = 0; i < 600; ++i) long_prompt += ",5";
  expect_error(
      {"generate", "--model", shared("models/stories260K"), "--prompt-ids", QString::fromStdString(long_prompt)}, 1,
      "more than the model's context of 512");
}

KVCHAT_TEST_GUILESS_MAIN(CliGenerateTest)

}  // namespace app_test_cli_generate

#include "test_cli_generate.moc"
