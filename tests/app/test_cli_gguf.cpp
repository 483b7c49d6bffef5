// kvchat-cli with GGUF files (fixtures made by llama.cpp, see fixtures/gguf/README.md): generate reproduces
// llama.cpp's greedy ids on stories260K-Q8_0.gguf / -F32.gguf, a text prompt gives the same ids on the GGUF
// file as on the Hugging Face directory, tokenize reproduces llama.cpp's llama-bpe cases with
// llama3-vocab-only.gguf, render uses the file's chat template, and the help texts name both kinds of model.
#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cli_runner.h"
#include "common/json_fixture.h"
#include "common/test_paths.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_gguf {

using kvchat::test::CliResult;
using kvchat::test::load_json;
using kvchat::test::run_cli;
using kvchat::test::shared_path;
using nlohmann::json;

namespace {

QString shared(const std::string& relative) { return QString::fromStdString(shared_path(relative)); }
QString gguf(const std::string& name) { return shared("fixtures/gguf/" + name); }

QString id_list(const json& ids) {
  QStringList parts;
  for (const auto& id : ids) parts << QString::number(id.get<int>());
  return parts.join(',');
}

std::vector<json> output_lines(const std::string& out) {
  std::vector<json> lines;
  std::istringstream stream(out);
  for (std::string line; std::getline(stream, line);) lines.push_back(json::parse(line));
  return lines;
}

bool is_stop_id(int id, const json& stop_ids) {
  for (const auto& stop : stop_ids)
    if (stop.get<int>() == id) return true;
  return false;
}

}  // namespace

class CliGgufTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void generate_reproduces_llama_cpp_greedy_data();
  void generate_reproduces_llama_cpp_greedy();
  void text_prompt_on_the_file_equals_the_directory();
  void tokenize_with_a_gguf_file_reproduces_llama_bpe_cases();
  void render_uses_the_files_chat_template();
  void help_texts_name_directories_and_gguf_files();
  void long_context_opens_phi3_with_its_long_factors();
};

void CliGgufTest::generate_reproduces_llama_cpp_greedy_data() {
  QTest::addColumn<QString>("file");
  QTest::addColumn<int>("case_index");
  QTest::newRow("Q8_0 prompt 0") << QStringLiteral("stories260K-Q8_0") << 0;
  for (int i = 0; i < 4; ++i)
    QTest::newRow(("F32 prompt " + std::to_string(i)).c_str()) << QStringLiteral("stories260K-F32") << i;
}

// The reference's generated_ids end with a stop id (BOS=1 or EOS=2) when llama.cpp stopped; kvchat-cli stops
// on the ids its tokenizer and config name. Both must agree on every id up to where either of them stops.
void CliGgufTest::generate_reproduces_llama_cpp_greedy() {
  QFETCH(QString, file);
  QFETCH(int, case_index);
  const json reference = load_json(shared_path("fixtures/gguf/" + file.toStdString() + ".json"))["greedy"][case_index];
  const CliResult result = run_cli({"generate", "--model", gguf(file.toStdString() + ".gguf"), "--prompt-ids",
                                    id_list(reference["prompt_ids"]), "--max-new-tokens",
                                    QString::number(reference["steps"].get<int>()), "--threads", "1", "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  const json output = json::parse(result.out);
  QVERIFY(output["prompt_ids"] == reference["prompt_ids"]);
  const auto generated = output["generated_ids"].get<std::vector<int>>();
  const auto expected = reference["generated_ids"].get<std::vector<int>>();
  const std::size_t common = std::min(generated.size(), expected.size());
  QVERIFY(common > 0);
  for (std::size_t i = 0; i < common; ++i) QCOMPARE(generated[i], expected[i]);
  if (generated.size() != expected.size()) {  // the shorter one stopped on a stop id
    const auto& shorter = generated.size() < expected.size() ? generated : expected;
    QVERIFY2(is_stop_id(shorter.back(), reference["stop_ids"]), "ended early without a stop id");
  } else if (output["stop_reason"] == "max_tokens") {
    QCOMPARE(static_cast<int>(generated.size()), reference["steps"].get<int>());
  }
  if (case_index == 0 && file == QStringLiteral("stories260K-Q8_0"))
    QCOMPARE(generated.size(), std::size_t(64));  // no stop within 64 steps: every id compared
}

void CliGgufTest::text_prompt_on_the_file_equals_the_directory() {
  std::vector<json> outputs;
  for (const QString& model :
       {gguf("stories260K-Q8_0.gguf"), gguf("stories260K-F32.gguf"), shared("models/stories260K")}) {
    const CliResult result = run_cli({"generate", "--model", model, "--prompt", "Once upon a time", "--max-new-tokens",
                                      "64", "--threads", "1", "--json"});
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    outputs.push_back(json::parse(result.out));
  }
  const json llama_cpp = load_json(shared_path("fixtures/gguf/stories260K-Q8_0.json"))["greedy"][0];
  QCOMPARE(llama_cpp["prompt"].get<std::string>(), std::string("Once upon a time"));
  for (const json& output : outputs) {
    QVERIFY2(output["prompt_ids"] == llama_cpp["prompt_ids"],
             output["prompt_ids"].dump().c_str());                    // [1,403,407,261,378]
    QVERIFY(output["generated_ids"] == outputs[2]["generated_ids"]);  // the same ids as the directory
    QCOMPARE(output["generated_text"].get<std::string>(), outputs[2]["generated_text"].get<std::string>());
  }
  QVERIFY(outputs[0]["generated_ids"] == llama_cpp["generated_ids"]);
}

void CliGgufTest::tokenize_with_a_gguf_file_reproduces_llama_bpe_cases() {
  const json cases = load_json(shared_path("fixtures/gguf/tokenizer-llama-bpe.json"));
  QCOMPARE(cases.size(), std::size_t(46));
  // One --text case ...
  CliResult single = run_cli(
      {"tokenize", "--tokenizer", gguf("llama3-vocab-only.gguf"), "--text", "Hello world", "--no-special-tokens"});
  QVERIFY2(single.exit_code == 0, single.err.c_str());
  QCOMPARE(QByteArray::fromStdString(single.out), QByteArray("{\"ids\":[9906,1917]}\n"));
  single = run_cli({"tokenize", "--tokenizer", gguf("llama3-vocab-only.gguf"), "--text", "Hello world"});
  QCOMPARE(QByteArray::fromStdString(single.out), QByteArray("{\"ids\":[128000,9906,1917]}\n"));  // add_bos_token

  // ... and all of llama.cpp's cases as JSON lines (no BOS, special tokens not parsed, as llama.cpp ran them).
  std::string input;
  for (const auto& c : cases) input += json{{"text", c["text"]}, {"add_special_tokens", false}}.dump() + "\n";
  const CliResult result = run_cli({"tokenize", "--tokenizer", gguf("llama3-vocab-only.gguf"), "--jsonl"}, input);
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  const auto lines = output_lines(result.out);
  QCOMPARE(lines.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i)
    QVERIFY2(lines[i]["ids"] == cases[i]["ids"], (cases[i]["text"].dump() + " -> " + lines[i].dump()).c_str());

  // Decoding goes through the file's vocabulary too.
  const CliResult decoded =
      run_cli({"tokenize", "--tokenizer", gguf("llama3-vocab-only.gguf"), "--decode", "--text", "9906,1917"});
  QCOMPARE(QByteArray::fromStdString(decoded.out), QByteArray("{\"text\":\"Hello world\"}\n"));
}

void CliGgufTest::render_uses_the_files_chat_template() {
  const std::string request =
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "}],)"
      R"( "add_generation_prompt": true})";
  const CliResult from_file =
      run_cli({"render", "--tokenizer", gguf("llama3-vocab-only.gguf"), "--date", "2024-07-26"}, request);
  QVERIFY2(from_file.exit_code == 0, from_file.err.c_str());
  QCOMPARE(QByteArray::fromStdString(from_file.out),
           QByteArray("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n"));
  // The same template as the tokenizer_config.json it was converted from.
  const CliResult from_config =
      run_cli({"render", "--tokenizer-config", shared("fixtures/tokenizers/llama3/tokenizer_config.json"), "--date",
               "2024-07-26"},
              request);
  QVERIFY2(from_config.exit_code == 0, from_config.err.c_str());
  QCOMPARE(QByteArray::fromStdString(from_file.out), QByteArray::fromStdString(from_config.out));

  const CliResult no_template = run_cli({"render", "--tokenizer", gguf("stories260K-Q8_0.gguf")}, request);
  QCOMPARE(no_template.exit_code, 1);
  QVERIFY2(no_template.err.find("has no chat template") != std::string::npos, no_template.err.c_str());
  const CliResult both = run_cli({"render", "--tokenizer", gguf("llama3-vocab-only.gguf"), "--tokenizer-config",
                                  shared("fixtures/tokenizers/llama3/tokenizer_config.json")},
                                 request);
  QCOMPARE(both.exit_code, 2);
  QVERIFY2(both.err.find("give exactly one of --tokenizer-config") != std::string::npos, both.err.c_str());
}

void CliGgufTest::help_texts_name_directories_and_gguf_files() {
  for (const char* command : {"generate", "chat", "bench"}) {
    const CliResult help = run_cli({command, "--help"});
    QCOMPARE(help.exit_code, 0);
    QVERIFY2(help.out.find("--model DIR|FILE.gguf") != std::string::npos, command);
  }
  for (const char* command : {"tokenize", "render", "tokenizer-bench"}) {
    const CliResult help = run_cli({command, "--help"});
    QCOMPARE(help.exit_code, 0);
    QVERIFY2(help.out.find("--tokenizer DIR|FILE.gguf") != std::string::npos, command);
  }
  const CliResult generate = run_cli({"generate", "--help"});
  QVERIFY2(generate.out.find("needs a model directory with tokenizer.json") == std::string::npos, generate.out.c_str());
  QVERIFY2(generate.out.find("a GGUF file's tokenizer") != std::string::npos, generate.out.c_str());
}

// --long-context: the phi3 fixture's GGUF file takes its long LongRoPE factors (its next token is the argmax of the
// reference with them, where that is clear of the rounding the kernels add), generates past the original 512
// positions, and another model is refused naming LongRoPE.
void CliGgufTest::long_context_opens_phi3_with_its_long_factors() {
  const std::string folder = kvchat::test::source_dir() + "/tests/fixtures/families/phi3";
  const json reference = load_json(folder + "/reference.json");
  const auto prompt = reference["prompt"].get<std::vector<int>>();
  QString ids;
  for (int id : prompt) ids += (ids.isEmpty() ? "" : ",") + QString::number(id);
  const QString file = QString::fromStdString(folder + "/model-Q8_0.gguf");
  const auto next_of = [&](const char* logits_key, bool long_context) {
    QStringList arguments{"generate", "--model", file, "--prompt-ids", ids, "--max-new-tokens", "1", "--json"};
    if (long_context) arguments << "--long-context";
    const CliResult result = run_cli(arguments);
    if (result.exit_code != 0) QTest::qFail(result.err.c_str(), __FILE__, __LINE__);
    const auto vocab = reference["vocab_size"].get<std::size_t>();
    std::vector<float> logits(prompt.size() * vocab);
    std::ifstream in(folder + "/" + reference[logits_key]["model-Q8_0.gguf"].get<std::string>(), std::ios::binary);
    in.read(reinterpret_cast<char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
    const float* last = logits.data() + (prompt.size() - 1) * vocab;
    std::vector<float> sorted(last, last + vocab);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const int expected = static_cast<int>(std::max_element(last, last + vocab) - last);
    const int got = json::parse(result.out)["generated_ids"][0].get<int>();
    return std::tuple<int, int, float>{got, expected, sorted[0] - sorted[1]};
  };
  const auto [long_got, long_expected, long_margin] = next_of("logits_long_context", true);
  const auto [short_got, short_expected, short_margin] = next_of("logits", false);
  QVERIFY2(long_expected != short_expected, "the fixture's prompt does not tell the factor sets apart");
  if (long_margin > 0.05f) QCOMPARE(long_got, long_expected);
  if (short_margin > 0.05f) QCOMPARE(short_got, short_expected);
  QVERIFY(long_margin > 0.05f || short_margin > 0.05f);

  const CliResult past = run_cli({"generate", "--model", file, "--prompt-ids", ids, "--max-new-tokens", "600",
                                  "--long-context", "--ignore-eos", "--json"});
  QVERIFY2(past.exit_code == 0, past.err.c_str());
  const json output = json::parse(past.out);
  // 64 + 600 positions, past the 512 the short factors are limited to (there the reply stops at the context's end).
  QCOMPARE(output["stop_reason"].get<std::string>(), std::string("max_tokens"));
  QCOMPARE(output["generated_ids"].size(), std::size_t(600));
  const CliResult limited =
      run_cli({"generate", "--model", file, "--prompt-ids", ids, "--max-new-tokens", "600", "--ignore-eos", "--json"});
  QVERIFY2(limited.exit_code == 0, limited.err.c_str());
  QCOMPARE(json::parse(limited.out)["stop_reason"].get<std::string>(), std::string("context_full"));

  const CliResult refused =
      run_cli({"generate", "--model", shared("models/stories260K"), "--prompt-ids", "1,2,3", "--long-context"});
  QVERIFY(refused.exit_code != 0);
  QVERIFY2(refused.err.find("LongRoPE") != std::string::npos, refused.err.c_str());
}

KVCHAT_TEST_GUILESS_MAIN(CliGgufTest)

}  // namespace app_test_cli_gguf

#include "test_cli_gguf.moc"
