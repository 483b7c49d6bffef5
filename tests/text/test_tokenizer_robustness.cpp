// Malformed files, invalid input, long runs, the chat path's protected ranges and the streaming
// decoder's guarantees (whole characters only, same text as decode()).
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer/tokenizer_byte_level.h"
#include "engine/text/utf8.h"
#include "tokenizer_test_support.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_tokenizer_robustness {

using namespace kvchat;
using namespace kvchat::test;
namespace fs = std::filesystem;

namespace {

const Tokenizer& llama3() { return cached_tokenizer(tokenizer_fixture_dir("llama3")); }
const Tokenizer& llama2() { return cached_tokenizer(tokenizer_fixture_dir("llama2")); }

// A small SentencePiece-style tokenizer.json written by the tests (Metaspace pre-tokenizer,
// string-form template, pair-form merges).
nlohmann::json tiny_tokenizer_json() {
  return nlohmann::json::parse(R"JSON({
    "version": "1.0",
    "added_tokens": [
      {"id": 0, "content": "<unk>", "special": true, "lstrip": false, "rstrip": false, "normalized": false, "single_word": false},
      {"id": 1, "content": "<s>", "special": true, "lstrip": false, "rstrip": false, "normalized": false, "single_word": false},
      {"id": 2, "content": "</s>", "special": true, "lstrip": false, "rstrip": false, "normalized": false, "single_word": false},
      {"id": 9, "content": "[SEP]", "special": true, "lstrip": true, "rstrip": true, "normalized": false, "single_word": false}
    ],
    "normalizer": null,
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true},
    "post_processor": {"type": "TemplateProcessing", "single": "<s> $A",
                       "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
              "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "\u2581": 3, "a": 4, "b": 5, "\u2581a": 6, "ab": 7, "\u2581ab": 8},
              "merges": [["\u2581", "a"], ["a", "b"], ["\u2581a", "b"]]}
  })JSON");
}

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("kvchat_tok_" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name, std::ios::binary) << content;
    return (path_ / name).string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// Loads `tokenizer_json` (and optionally a config) and returns the TokenizerError message, or
// "" when loading succeeded.
std::string load_error(const std::string& tokenizer_json, const std::string& config = {}) {
  TempDir dir;
  std::string path = dir.write("tokenizer.json", tokenizer_json);
  std::string config_path = config.empty() ? std::string() : dir.write("tokenizer_config.json", config);
  try {
    Tokenizer::from_files(path, config_path);
  } catch (const TokenizerError& e) {
    return e.what();
  }
  return "";
}

std::string streamed(const Tokenizer& tokenizer, const std::vector<TokenId>& ids, bool skip_special,
                     std::optional<bool> clean_up, std::vector<std::string>* chunks = nullptr) {
  StreamingDecoder decoder(tokenizer, skip_special, clean_up);
  std::string joined;
  for (TokenId id : ids) {
    std::string chunk = decoder.push(id);
    if (chunks) chunks->push_back(chunk);
    joined += chunk;
  }
  std::string rest = decoder.finish();
  if (chunks) chunks->push_back(rest);
  return joined + rest;
}

}  // namespace

class TokenizerRobustnessTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void malformed_files_data() {
    QTest::addColumn<QString>("tokenizer_json");
    QTest::addColumn<QString>("config");
    QTest::addColumn<QString>("message");
    auto with = [](const std::function<void(nlohmann::json&)>& edit) {
      auto j = tiny_tokenizer_json();
      edit(j);
      return QString::fromStdString(j.dump());
    };
    QTest::newRow("invalid json") << QString("{\"model\": {") << QString() << QString("invalid JSON");
    QTest::newRow("not an object") << QString("[1, 2]") << QString() << QString("top level is not a JSON object");
    QTest::newRow("missing model") << with([](auto& j) { j.erase("model"); }) << QString()
                                   << QString("missing 'model'");
    QTest::newRow("unknown model type") << with([](auto& j) { j["model"]["type"] = "Unigram"; }) << QString()
                                        << QString("unsupported model type 'Unigram'");
    QTest::newRow("unknown pre_tokenizer") << with([](auto& j) {
      j["pre_tokenizer"] = {{"type", "Whitespace"}};
    }) << QString() << QString("unsupported pre_tokenizer type 'Whitespace' in");
    QTest::newRow("unknown normalizer") << with([](auto& j) {
      j["normalizer"] = {{"type", "BertNormalizer"}};
    }) << QString() << QString("unsupported normalizer type 'BertNormalizer'");
    QTest::newRow("unknown decoder") << with([](auto& j) {
      j["decoder"] = {{"type", "WordPiece"}};
    }) << QString() << QString("unsupported decoder type 'WordPiece'");
    QTest::newRow("unknown post_processor") << with([](auto& j) {
      j["post_processor"] = {{"type", "BertProcessing"}};
    }) << QString() << QString("unsupported post_processor type 'BertProcessing'");
    QTest::newRow("merge names unknown token") << with([](auto& j) {
      j["model"]["merges"].push_back({"a", "zz"});
    }) << QString() << QString("model.merges[3] names unknown token 'zz'");
    QTest::newRow("merge result not in vocab") << with([](auto& j) { j["model"]["merges"].push_back("b a"); })
                                               << QString() << QString("model.merges[3] produces 'ba'");
    QTest::newRow("vocab not an object") << with([](auto& j) { j["model"]["vocab"] = nlohmann::json::array(); })
                                         << QString() << QString("model.vocab is not an object");
    QTest::newRow("bad regex") << with([](auto& j) {
      j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
    }) << QString() << QString("invalid regex pattern '(unclosed'");
    // Settings of the wrong type: the JSON library's type_error escaped as a crash (found by fuzzing).
    QTest::newRow("added token flag not a boolean") << with([](auto& j) {
      j["added_tokens"] = {{{"id", 0}, {"content", "<x>"}, {"special", "yes"}}};
    }) << QString() << QString("added_tokens[0]: 'special' is not a boolean");
    QTest::newRow("pre_tokenizer flag not a boolean") << with([](auto& j) {
      j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", 1}};
    }) << QString() << QString("ByteLevel: 'use_regex' is not a boolean");
    QTest::newRow("decoder count not an integer") << with([](auto& j) {
      j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", "1"}};
    }) << QString() << QString("Strip: 'start' is not an integer");
    QTest::newRow("model flag not a boolean") << with([](auto& j) { j["model"]["byte_fallback"] = "true"; })
                                              << QString() << QString("model: 'byte_fallback' is not a boolean");
    QTest::newRow("config class not a string") << with([](auto&) {}) << QString(R"({"tokenizer_class": 7})")
                                               << QString("tokenizer_config.json: 'tokenizer_class' is not a string");
    QTest::newRow("config invalid json") << with([](auto&) {}) << QString("{oops")
                                         << QString("tokenizer_config.json: invalid JSON");
    // Valid JSON syntax, but past a double: the JSON library's out_of_range, not a parse_error.
    QTest::newRow("number beyond double") << QString(R"({"model": {"dropout": 1e400}})") << QString()
                                          << QString("tokenizer.json: invalid JSON: [json.exception.out_of_range.406]");
    QTest::newRow("config number beyond double")
        << with([](auto&) {}) << QString(R"({"model_max_length": -1e999})")
        << QString("tokenizer_config.json: invalid JSON: [json.exception.out_of_range.406]");
    QTest::newRow("config unknown bos") << with([](auto&) {}) << QString(R"({"bos_token": "<bos>"})")
                                        << QString("bos_token '<bos>' is not a token");
  }
  void malformed_files() {
    QFETCH(QString, tokenizer_json);
    QFETCH(QString, config);
    QFETCH(QString, message);
    std::string error = load_error(tokenizer_json.toStdString(), config.toStdString());
    QVERIFY2(!error.empty(), "loading succeeded");
    QVERIFY2(error.find(message.toStdString()) != std::string::npos, error.c_str());
  }

  // Ids index vectors: one huge id in a small file must not allocate gigabytes (10^8 took 4 GB,
  // 5 * 10^8 threw bad_alloc). The error names the file, the token and the id.
  void sparse_ids_are_rejected() {
    struct Case {
      std::function<void(nlohmann::json&)> edit;
      std::string message;
    };
    const Case cases[] = {
        {[](auto& j) { j["model"]["vocab"]["b"] = 100000000; },
         "model.vocab entry 'b': id 100000000 is too large for 9 tokens (ids must be below 1042)"},
        {[](auto& j) { j["model"]["vocab"]["b"] = 500000000; },
         "model.vocab entry 'b': id 500000000 is too large for 9 tokens (ids must be below 1042)"},
        {[](auto& j) { j["added_tokens"][3]["id"] = 100000000; },
         "added token '[SEP]': id 100000000 is too large for 13 tokens (ids must be below 1050)"},
    };
    for (const Case& c : cases) {
      TempDir dir;
      nlohmann::json j = tiny_tokenizer_json();
      c.edit(j);
      std::string path = dir.write("tokenizer.json", j.dump());
      std::string error;
      try {
        Tokenizer::from_files(path, "");
      } catch (const TokenizerError& e) {
        error = e.what();
      }
      QCOMPARE(QString::fromStdString(error), QString::fromStdString(path + ": " + c.message));
    }
    // Gaps within the limit stay accepted (added tokens often sit past the model's vocabulary).
    TempDir dir;
    nlohmann::json j = tiny_tokenizer_json();
    j["added_tokens"][3]["id"] = 1049;
    QCOMPARE(Tokenizer::from_files(dir.write("tokenizer.json", j.dump()), "").vocab_size(), 1050);
  }

  void missing_directory_names_it() {
    try {
      Tokenizer::from_directory("/nonexistent/kvchat-model");
      QFAIL("no error");
    } catch (const TokenizerError& e) {
      QVERIFY(std::string(e.what()).find("/nonexistent/kvchat-model") != std::string::npos);
    }
  }

  void tiny_tokenizer_and_config() {
    TempDir dir;
    dir.write("tokenizer.json", tiny_tokenizer_json().dump());
    // No config: the file's template adds BOS; there is no bos_id without a config.
    {
      Tokenizer t = Tokenizer::from_directory(dir.path());
      QCOMPARE(QString::fromStdString(ids_to_string(t.encode("ab ab"))), QString("[1,8,8]"));
      QCOMPARE(QString::fromStdString(ids_to_string(t.encode("ab ab", false))), QString("[8,8]"));
      QVERIFY(!t.bos_id().has_value());
      QCOMPARE(QString::fromStdString(t.decode({8, 8})), QString("ab ab"));
      // Unknown characters fuse into one <unk>.
      QCOMPARE(QString::fromStdString(ids_to_string(t.encode("acca", false))), QString("[6,0,4]"));
      // lstrip/rstrip: the white space around [SEP] belongs to it; prepend_scheme "first" adds
      // the ▁ only at the start of the text.
      QCOMPARE(QString::fromStdString(ids_to_string(t.encode("ab [SEP] ab", false, true))), QString("[8,9,7]"));
      QCOMPARE(t.vocab_size(), 10);
    }
    // A Llama-class config rebuilds the template from add_bos_token / add_eos_token.
    dir.write("tokenizer_config.json",
              R"({"tokenizer_class": "LlamaTokenizer", "bos_token": {"content": "<s>", "__type": "AddedToken"},
                  "eos_token": "</s>", "add_bos_token": false, "add_eos_token": true,
                  "clean_up_tokenization_spaces": true})");
    {
      Tokenizer t = Tokenizer::from_directory(dir.path());
      QCOMPARE(t.bos_id().value_or(-1), 1);
      QCOMPARE(t.eos_id().value_or(-1), 2);
      QVERIFY(!t.add_bos_token());
      QCOMPARE(QString::fromStdString(ids_to_string(t.encode("ab"))), QString("[8,2]"));
    }
  }

  void byte_level_with_digits_and_gpt2_regex() {
    // GPT-2 style: every byte is a token (ids 0..255), plus "ab" and "Ġab"; digits split one by one.
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[tokenization::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
    vocab["ab"] = 256;
    vocab["\u0120a"] = 257;
    vocab["\u0120ab"] = 258;
    nlohmann::json file = {
        {"added_tokens", nlohmann::json::array()},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Digits"}, {"individual_digits", true}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}}},
        {"post_processor", {{"type", "ByteLevel"}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\u0120 a", "\u0120a b", "a b"}}}}};
    TempDir dir;
    dir.write("tokenizer.json", file.dump());
    Tokenizer t = Tokenizer::from_directory(dir.path());
    // "ab ab 42": the regex isolates " ab"; Digits isolates each digit.
    QCOMPARE(QString::fromStdString(ids_to_string(t.encode("ab ab 42"))),
             QString::fromStdString(ids_to_string({256, 258, ' ', '4', '2'})));
    QCOMPARE(QString::fromStdString(t.decode({256, 258, ' ', '4', '2'})), QString("ab ab 42"));
    // Non-ASCII goes through the byte map: "é" is two byte tokens.
    QCOMPARE(QString::fromStdString(ids_to_string(t.encode("\xC3\xA9"))), QString("[195,169]"));
  }

  // Qwen's tokenizers normalize to NFC: "e" + U+0301 is "é". Each form over a byte-level vocabulary, whose ids are
  // the bytes of what the normalizer made.
  void unicode_normal_forms_data() {
    QTest::addColumn<QString>("form");
    QTest::addColumn<QByteArray>("text");
    QTest::addColumn<QByteArray>("normalized");
    const QByteArray composed("caf\xC3\xA9"), decomposed("cafe\xCC\x81"), ligature("\xEF\xAC\x81ne");
    QTest::newRow("NFC composes") << "NFC" << decomposed << composed;
    QTest::newRow("NFC keeps a ligature") << "NFC" << ligature << ligature;
    QTest::newRow("NFD decomposes") << "NFD" << composed << decomposed;
    QTest::newRow("NFKC composes and unfolds") << "NFKC" << (decomposed + ligature) << (composed + "fine");
    QTest::newRow("NFKD decomposes and unfolds") << "NFKD" << (composed + ligature) << (decomposed + "fine");
    QTest::newRow("ASCII stays") << "NFC" << QByteArray("plain text") << QByteArray("plain text");
  }

  void unicode_normal_forms() {
    QFETCH(QString, form);
    QFETCH(QByteArray, text);
    QFETCH(QByteArray, normalized);
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[tokenization::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
    nlohmann::json file = {
        {"added_tokens", nlohmann::json::array()},
        {"normalizer", {{"type", form.toStdString()}}},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    TempDir dir;
    dir.write("tokenizer.json", file.dump());
    Tokenizer t = Tokenizer::from_directory(dir.path());
    std::vector<TokenId> expected;
    for (char byte : normalized) expected.push_back(static_cast<unsigned char>(byte));
    QCOMPARE(t.encode(text.toStdString(), false), expected);
  }

  void special_ids_and_flags() {
    QCOMPARE(llama3().vocab_size(), 128256);
    QCOMPARE(llama3().bos_id().value_or(-1), 128000);
    QCOMPARE(llama3().eos_id().value_or(-1), 128001);
    QVERIFY(!llama3().add_bos_token());  // PreTrainedTokenizerFast + ByteLevel post-processor
    QVERIFY(llama3().is_special(128009));
    QVERIFY(!llama3().is_special(9906));
    QCOMPARE(llama3().token_to_id("<|eot_id|>").value_or(-1), 128009);
    QCOMPARE(QString::fromStdString(llama3().id_to_token(9906)), QString("Hello"));
    QCOMPARE(QString::fromStdString(llama3().id_to_token(-5)), QString());
    QCOMPARE(llama2().vocab_size(), 32000);
    QVERIFY(llama2().add_bos_token());
    QCOMPARE(QString::fromStdString(llama2().id_to_token(13)), QString("<0x0A>"));
  }

  void unknown_id_in_decode_is_an_error() {
    QVERIFY_THROWS_EXCEPTION(TokenizerError, llama3().decode({9906, 500000}));
    QVERIFY_THROWS_EXCEPTION(TokenizerError, llama2().decode({-1}));
    StreamingDecoder streaming(llama2());
    QVERIFY_THROWS_EXCEPTION(TokenizerError, streaming.push(32000));
  }

  void invalid_utf8_input_is_replaced() {
    const std::vector<std::string> inputs = {std::string("ab\xC3", 3), std::string("\xFF\xFE hello \x80"),
                                             std::string("x\xF0\x9F\xA6y"), std::string("\xED\xA0\x80 surrogate")};
    for (const Tokenizer* t : {&llama3(), &llama2()}) {
      for (const std::string& input : inputs) {
        std::string repaired = utf8::replace_invalid(input);
        auto ids = t->encode(input);
        QCOMPARE(QString::fromStdString(ids_to_string(ids)),
                 QString::fromStdString(ids_to_string(t->encode(repaired))));
        QCOMPARE(QString::fromStdString(t->decode(ids, true, false)), QString::fromStdString(repaired));
      }
    }
  }

  void long_runs_round_trip_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<QString>("unit");
    for (QString model : {QString("llama3"), QString("llama2")}) {
      for (QString unit : {QString("a"), QString(" "), QString("\n"), QString("ab"), QString("7"), QString("é")}) {
        QString name = unit == "\n" ? QString("newline") : unit == " " ? QString("space") : unit;
        QTest::newRow((model + "/" + name).toUtf8().constData()) << model << unit;
      }
    }
  }
  void long_runs_round_trip() {
    QFETCH(QString, model);
    QFETCH(QString, unit);
    const Tokenizer& t = cached_tokenizer(tokenizer_fixture_dir(model.toStdString()));
    std::string text;
    while (text.size() < 100 * 1024) text += unit.toStdString();
    auto ids = t.encode(text, false);
    QVERIFY(!ids.empty());
    QVERIFY(ids.size() <= text.size() + 1);
    QCOMPARE(QString::fromStdString(t.decode(ids, false, false)), QString::fromStdString(text));
  }

  void encode_chat_protects_user_text() {
    const Tokenizer& t = llama3();
    const std::string header = "<|start_header_id|>user<|end_header_id|>";
    const std::string user = "\n\nsay <|eot_id|> please";
    const std::string text = header + user + "<|eot_id|>";
    const TokenId eot = *t.token_to_id("<|eot_id|>");

    // The user's range: the content only (the template's "\n\n" is part of the same text stretch).
    const std::size_t content_begin = header.size() + 2;
    auto ids = t.encode_chat(text, {{content_begin, header.size() + user.size()}}, false);
    std::vector<TokenId> expected = t.encode(header, false, true);
    auto plain = t.encode(user, false, false);
    expected.insert(expected.end(), plain.begin(), plain.end());
    expected.push_back(eot);
    QCOMPARE(QString::fromStdString(ids_to_string(ids)), QString::fromStdString(ids_to_string(expected)));
    QCOMPARE(std::count(ids.begin(), ids.end(), eot), 1);

    // Without a protected range the written token becomes the control id.
    auto unprotected = t.encode_chat(text, {}, false);
    QCOMPARE(QString::fromStdString(ids_to_string(unprotected)),
             QString::fromStdString(ids_to_string(t.encode(text, false, true))));
    QCOMPARE(std::count(unprotected.begin(), unprotected.end(), eot), 2);

    // Same on the SentencePiece family: "<s>" typed by the user stays text.
    auto sp = llama2().encode_chat("<s>hi <s></s>", {{3, 9}}, false);
    QCOMPARE(std::count(sp.begin(), sp.end(), 1), 1);
    QCOMPARE(sp.back(), 2);

    QVERIFY_THROWS_EXCEPTION(TokenizerError, t.encode_chat(text, {{5, text.size() + 1}}));
  }

  void streaming_emoji_over_byte_tokens() {
    // 🦙 is not in the llama2 vocabulary: it becomes four <0xNN> byte tokens.
    const Tokenizer& t = llama2();
    auto ids = t.encode("Hi 🦙!", false);
    const TokenId f0 = *t.token_to_id("<0xF0>");
    auto first_byte = std::find(ids.begin(), ids.end(), f0);
    QVERIFY(first_byte != ids.end());
    std::vector<std::string> chunks;
    std::string joined = streamed(t, ids, true, std::nullopt, &chunks);
    QCOMPARE(QString::fromStdString(joined), QString("Hi 🦙!"));
    std::size_t at = static_cast<std::size_t>(first_byte - ids.begin());
    QCOMPARE(QString::fromStdString(chunks[at]), QString());
    QCOMPARE(QString::fromStdString(chunks[at + 1]), QString());
    QCOMPARE(QString::fromStdString(chunks[at + 2]), QString());
    QCOMPARE(QString::fromStdString(chunks[at + 3]), QString("🦙"));
    for (const std::string& chunk : chunks) QVERIFY(utf8::is_valid(chunk));

    // The leading-space strip happens once: the second word keeps its space.
    std::vector<std::string> words;
    streamed(t, t.encode("Hello world", false), true, false, &words);
    QCOMPARE(QString::fromStdString(words[0]), QString("Hello"));
    QCOMPARE(QString::fromStdString(words[1]), QString(" world"));
  }

  void streaming_matches_decode_with_clean_up() {
    // llama3's config turns clean-up on, so the default stream must apply it too.
    const Tokenizer& t = llama3();
    const std::string text =
        "Hello , world ! It 's a test . Don 't stop , they 're ' quoting ' n ' t ?<|eot_id|> end .";
    auto ids = t.encode(text, false, true);
    QVERIFY(t.decode(ids) != t.decode(ids, false, false));
    for (bool skip : {false, true}) {
      std::vector<std::string> chunks;
      QCOMPARE(QString::fromStdString(streamed(t, ids, skip, std::nullopt, &chunks)),
               QString::fromStdString(t.decode(ids, skip)));
      QVERIFY(chunks.size() > 4);
    }
  }

  void streaming_random_ids_equal_decode() {
    // Arbitrary id sequences (partial characters, invalid bytes, specials) must still stream to
    // exactly decode()'s text, in valid UTF-8 chunks.
    for (const Tokenizer* t : {&llama3(), &llama2()}) {
      std::mt19937 rng(1234);
      std::uniform_int_distribution<TokenId> any(0, t->vocab_size() - 1);
      std::uniform_int_distribution<TokenId> low(0, 400);  // byte tokens and short pieces
      std::vector<TokenId> ids;
      for (int i = 0; i < 3000; ++i) ids.push_back(i % 3 ? low(rng) : any(rng));
      for (bool skip : {false, true}) {
        for (std::optional<bool> clean : {std::optional<bool>(false), std::optional<bool>(true)}) {
          std::vector<std::string> chunks;
          std::string joined = streamed(*t, ids, skip, clean, &chunks);
          QCOMPARE(QString::fromStdString(joined), QString::fromStdString(t->decode(ids, skip, clean)));
          for (const std::string& chunk : chunks) QVERIFY(utf8::is_valid(chunk));
        }
      }
    }
  }
};

KVCHAT_TEST_APPLESS_MAIN(TokenizerRobustnessTest)

}  // namespace text_test_tokenizer_robustness

#include "test_tokenizer_robustness.moc"
