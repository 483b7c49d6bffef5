// Tokenizers built from GGUF metadata reproduce llama.cpp's recorded ids (the llama-bpe and
// llama-spm cases, stories260K's prompts) and agree with the Llama 3 tokenizer.json on its encode
// and chat cases.
#include <QElapsedTimer>
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <map>
#include <memory>

#include "engine/gguf/gguf_file.h"
#include "engine/text/chat_template.h"
#include "engine/text/tokenizer.h"
#include "tokenizer_test_support.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_gguf_tokenizer {

using namespace kvchat;
using namespace kvchat::test;

namespace {

std::string gguf_fixture(const std::string& name) { return shared_path("fixtures/gguf/" + name); }

const Tokenizer& gguf_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::from_gguf(GgufFile(gguf_fixture(name))));
  return *slot;
}

const nlohmann::json& cases_of(const std::string& file) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(file);
  if (it == cache.end()) it = cache.emplace(file, load_json(file)).first;
  return it->second;
}

// The llama.cpp case files and the vocabulary each was recorded on.
const std::map<QString, std::pair<std::string, std::string>>& llama_cpp_case_sets() {
  static const std::map<QString, std::pair<std::string, std::string>> sets = {
      {"llama-bpe", {"tokenizer-llama-bpe.json", "llama3-vocab-only.gguf"}},
      {"llama-spm", {"tokenizer-llama-spm.json", "ggml-vocab-llama-spm.gguf"}}};
  return sets;
}

std::string mismatch(const std::string& text, const std::vector<TokenId>& expected,
                     const std::vector<TokenId>& actual) {
  return "text " + escaped(text) + "\n   expected " + ids_to_string(expected) + "\n   actual   " +
         ids_to_string(actual);
}

}  // namespace

class GgufTokenizerTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void llama_cpp_cases_data() {
    QTest::addColumn<QString>("set");
    QTest::addColumn<int>("index");
    for (const auto& [set, files] : llama_cpp_case_sets()) {
      const auto& cases = cases_of(gguf_fixture(files.first));
      QVERIFY2(cases.size() == 46, "a llama.cpp case file should hold 46 cases");
      for (std::size_t i = 0; i < cases.size(); ++i)
        QTest::newRow((set.toStdString() + "#" + std::to_string(i)).c_str()) << set << static_cast<int>(i);
    }
  }
  // ids = llama.cpp's tokenize(text, add_special=false, parse_special=false); decoding gives the
  // text back (llama.cpp's detokenizer does too: the prefix space it adds is stripped again).
  void llama_cpp_cases() {
    QFETCH(QString, set);
    QFETCH(int, index);
    const auto& [case_file, vocab_file] = llama_cpp_case_sets().at(set);
    const auto& c = cases_of(gguf_fixture(case_file))[index];
    const Tokenizer& tokenizer = gguf_tokenizer(vocab_file);
    const std::string text = c["text"].get<std::string>();
    const auto expected = json_ids(c["ids"]);
    const auto actual = tokenizer.encode(text, false, false);
    QVERIFY2(actual == expected, qPrintable(QString::fromStdString(mismatch(text, expected, actual))));
    QCOMPARE(QString::fromStdString(tokenizer.decode(actual, false, false)), QString::fromStdString(text));
  }

  // The same file through its tokenizer.json and through the GGUF metadata: same ids on every
  // recorded encode case (add_special_tokens aside: the GGUF adds BOS, that tokenizer.json does not).
  void llama3_encode_cases_match_tokenizer_json() {
    const auto& cases = cases_of(tokenizer_fixture_dir("llama3") + "/encode.json");
    QCOMPARE(cases.size(), std::size_t(151));
    const Tokenizer& json_tokenizer = cached_tokenizer(tokenizer_fixture_dir("llama3"));
    const Tokenizer& gguf = gguf_tokenizer("llama3-vocab-only.gguf");
    int failures = 0;
    for (const auto& c : cases) {
      const std::string text = c["text"].get<std::string>();
      const bool parse_special = c["parse_special"].get<bool>();
      const auto expected = json_ids(c["ids"]);
      const auto from_gguf = gguf.encode(text, false, parse_special);
      const auto from_json = json_tokenizer.encode(text, c["add_special_tokens"].get<bool>(), parse_special);
      if (from_gguf != expected || from_json != from_gguf) {
        ++failures;
        qWarning("case %s: %s\n   tokenizer.json %s", c["id"].get<std::string>().c_str(),
                 mismatch(text, expected, from_gguf).c_str(), ids_to_string(from_json).c_str());
      }
    }
    QCOMPARE(failures, 0);
  }

  void llama3_chat_cases_match_tokenizer_json() {
    const auto& cases = cases_of(tokenizer_fixture_dir("llama3") + "/chat_template.json");
    QVERIFY(!cases.empty());
    const Tokenizer& json_tokenizer = cached_tokenizer(tokenizer_fixture_dir("llama3"));
    const Tokenizer& gguf = gguf_tokenizer("llama3-vocab-only.gguf");
    for (const auto& c : cases) {
      const std::string text = c["text"].get<std::string>();
      const auto expected = json_ids(c["ids"]);
      const auto from_gguf = gguf.encode(text, false, true);
      QVERIFY2(from_gguf == expected, qPrintable(QString::fromStdString(mismatch(text, expected, from_gguf))));
      QVERIFY(json_tokenizer.encode(text, false, true) == from_gguf);
      QCOMPARE(QString::fromStdString(gguf.decode(from_gguf, false, false)), QString::fromStdString(text));
    }
  }

  void llama3_special_tokens_and_template() {
    const Tokenizer& gguf = gguf_tokenizer("llama3-vocab-only.gguf");
    QCOMPARE(gguf.vocab_size(), 128256);
    QCOMPARE(gguf.bos_id().value_or(-1), 128000);
    QCOMPARE(gguf.eos_id().value_or(-1), 128001);
    QCOMPARE(gguf.eot_id().value_or(-1), 128009);
    QVERIFY(gguf.add_bos_token());
    QVERIFY(!gguf.add_eos_token());
    QVERIFY(gguf.is_special(128009));
    QVERIFY(!gguf.is_special(9906));  // "Hello"
    QCOMPARE(gguf.encode("Hello", true, false), (std::vector<TokenId>{128000, 9906}));

    // Typed text never becomes a control token; the chat path may.
    QVERIFY(gguf.encode("<|eot_id|>", false, false) != std::vector<TokenId>{128009});
    QCOMPARE(gguf.encode("<|eot_id|>", false, true), std::vector<TokenId>{128009});

    const auto config = load_json(tokenizer_fixture_dir("llama3") + "/tokenizer_config.json");
    QVERIFY(gguf.chat_template().has_value());
    QCOMPARE(QString::fromStdString(*gguf.chat_template()),
             QString::fromStdString(config["chat_template"].get<std::string>()));

    // A formatter made from the GGUF template renders like the one read from tokenizer_config.json.
    ChatFormatter from_gguf = ChatFormatter::from_template(*gguf.chat_template(), gguf.id_to_token(*gguf.bos_id()),
                                                           gguf.id_to_token(*gguf.eos_id()), "llama3-vocab-only.gguf");
    ChatFormatter from_config =
        ChatFormatter::from_tokenizer_config(tokenizer_fixture_dir("llama3") + "/tokenizer_config.json");
    const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi <|eot_id|> there"}};
    const RenderedPrompt prompt =
        from_gguf.render_prompt(messages, true, nlohmann::ordered_json::object(), "2025-02-01");
    QCOMPARE(QString::fromStdString(prompt.text), QString::fromStdString(from_config.render(
                                                      messages, true, nlohmann::ordered_json::object(), "2025-02-01")));
    // The user's "<|eot_id|>" stays text when the prompt is encoded with its plain ranges.
    const auto ids = gguf.encode_chat(prompt.text, prompt.content_ranges);
    QCOMPARE(std::count(ids.begin(), ids.end(), 128009), std::ptrdiff_t(2));  // after the system and user turns
  }

  // The whole 128k vocabulary builds (its time is printed, not asserted: speed belongs to benchmarks).
  void llama3_vocabulary_builds() {
    QElapsedTimer timer;
    timer.start();
    Tokenizer tokenizer = Tokenizer::from_gguf(GgufFile(gguf_fixture("llama3-vocab-only.gguf")));
    qInfo("llama3-vocab-only.gguf: tokenizer built in %lld ms", static_cast<long long>(timer.elapsed()));
    QCOMPARE(tokenizer.vocab_size(), 128256);
  }

  // stories260K's SentencePiece vocabulary encodes llama2.c's prompts (BOS included) as llama.cpp did.
  void stories260k_prompts() {
    const auto reference = load_json(gguf_fixture("stories260K-F32.json"));
    const Tokenizer& tokenizer = gguf_tokenizer("stories260K-F32.gguf");
    QVERIFY(tokenizer.add_bos_token());
    QCOMPARE(tokenizer.bos_id().value_or(-1), 1);
    QCOMPARE(tokenizer.eos_id().value_or(-1), 2);
    QVERIFY(!reference["greedy"].empty());
    for (const auto& run : reference["greedy"]) {
      const std::string prompt = run["prompt"].get<std::string>();
      const auto expected = json_ids(run["prompt_ids"]);
      const auto actual = tokenizer.encode(prompt, true, false);
      QVERIFY2(actual == expected, qPrintable(QString::fromStdString(mismatch(prompt, expected, actual))));
      QCOMPARE(QString::fromStdString(tokenizer.decode(actual, true)), QString::fromStdString(prompt));
    }
  }

  // SentencePiece path: control tokens never come out of typed text, byte fallback round-trips, and
  // streaming gives what decode gives.
  void sentencepiece_special_text_and_streaming() {
    const Tokenizer& spm = gguf_tokenizer("ggml-vocab-llama-spm.gguf");
    const auto plain = spm.encode("<s>x</s>", false, false);
    QVERIFY(std::find(plain.begin(), plain.end(), 1) == plain.end());
    QVERIFY(std::find(plain.begin(), plain.end(), 2) == plain.end());
    QCOMPARE(spm.encode("<s>", false, true), std::vector<TokenId>{1});

    const std::string text = "Grüße 🦙 and\n\ttabs";
    const auto ids = spm.encode(text, true, false);
    QCOMPARE(ids.front(), 1);
    QCOMPARE(QString::fromStdString(spm.decode(ids, true)), QString::fromStdString(text));
    StreamingDecoder stream(spm, true, false);
    std::string joined;
    for (TokenId id : ids) joined += stream.push(id);
    joined += stream.finish();
    QCOMPARE(QString::fromStdString(joined), QString::fromStdString(text));
  }
};

KVCHAT_TEST_APPLESS_MAIN(GgufTokenizerTest)

}  // namespace text_test_gguf_tokenizer

#include "test_gguf_tokenizer.moc"
