// Tokenizer::from_gguf on small GGUF files written here: each tokenizer.ggml.pre value splits text
// as llama.cpp's regexes do, SentencePiece merges follow scores (not ranks), and malformed metadata
// is refused with an error naming the key.
#include <QTemporaryDir>
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <functional>
#include <map>
#include <optional>

#include "engine/gguf/gguf_file.h"
#include "engine/text/tokenizer.h"
#include "gguf/gguf_builder.h"
#include "tokenizer_test_support.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_gguf_tokenizer_metadata {

using namespace kvchat;
using namespace kvchat::test;

namespace {

// ---- a tiny GGUF metadata writer (value type ids as in the format)

std::string kv_head(const std::string& key, std::uint32_t type) {
  std::string out = gguf_string(key);
  append_le<std::uint32_t>(out, type);
  return out;
}
std::string kv_string(const std::string& key, const std::string& value) { return kv_head(key, 8) + gguf_string(value); }
std::string kv_bool(const std::string& key, bool value) {
  std::string out = kv_head(key, 7);
  append_le<std::uint8_t>(out, value ? 1 : 0);
  return out;
}
template <typename T>
std::string kv_array(const std::string& key, std::uint32_t element_type, const std::vector<T>& values) {
  std::string out = kv_head(key, 9);
  append_le<std::uint32_t>(out, element_type);
  append_le<std::uint64_t>(out, values.size());
  for (const T& value : values) {
    if constexpr (std::is_same_v<T, std::string>) {
      out += gguf_string(value);
    } else {
      append_le<T>(out, value);
    }
  }
  return out;
}

// Metadata by key, so that a case can drop or replace one entry.
using Metadata = std::map<std::string, std::string>;

std::string gguf_bytes(const Metadata& metadata) {
  GgufPieces pieces;
  pieces.magic_and_version = "GGUF";
  append_le<std::uint32_t>(pieces.magic_and_version, 3);
  for (const auto& entry : metadata) pieces.metadata.push_back(entry.second);
  return pieces.bytes();
}

// GPT-2's byte-to-character table: printable bytes stand for themselves, the rest for U+0100 on.
std::string byte_level(unsigned char byte) {
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  int code = byte;
  if (!printable(byte)) {
    code = 256;
    for (int b = 0; b < byte; ++b) code += printable(b) ? 0 : 1;
  }
  std::string out;
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
  return out;
}

// Byte-level vocabulary: ids 0-255 are the bytes, then "12", "123", "1234", "ab" and its merges.
Metadata byte_level_vocab(const std::optional<std::string>& pre) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_level(static_cast<unsigned char>(b)));
  for (const char* extra : {"12", "123", "1234", "ab"}) tokens.push_back(extra);
  Metadata m;
  m["tokenizer.ggml.model"] = kv_string("tokenizer.ggml.model", "gpt2");
  if (pre) m["tokenizer.ggml.pre"] = kv_string("tokenizer.ggml.pre", *pre);
  m["tokenizer.ggml.tokens"] = kv_array<std::string>("tokenizer.ggml.tokens", 8, tokens);
  m["tokenizer.ggml.token_type"] =
      kv_array<std::int32_t>("tokenizer.ggml.token_type", 5, std::vector<std::int32_t>(tokens.size(), 1));
  m["tokenizer.ggml.merges"] =
      kv_array<std::string>("tokenizer.ggml.merges", 8, std::vector<std::string>{"1 2", "12 3", "123 4", "a b"});
  m["tokenizer.ggml.bos_token_id"] = gguf_kv_u32("tokenizer.ggml.bos_token_id", 0);
  return m;
}

// SentencePiece vocabulary: <unk> <s> </s>, "▁", letters, "ab" and "bc" (scores chosen by the
// caller), a user-defined "<x>" and the byte token <0x64> ("d").
Metadata sentencepiece_vocab(float score_ab, float score_bc) {
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a",     "b",
                                           "c",     "ab",  "bc",   "<x>",          "<0x64>"};
  const std::vector<std::int32_t> types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 4, 6};
  const std::vector<float> scores = {0, 0, 0, -1, -2, -3, -4, score_ab, score_bc, 0, 0};
  Metadata m;
  m["tokenizer.ggml.model"] = kv_string("tokenizer.ggml.model", "llama");
  m["tokenizer.ggml.tokens"] = kv_array<std::string>("tokenizer.ggml.tokens", 8, tokens);
  m["tokenizer.ggml.token_type"] = kv_array<std::int32_t>("tokenizer.ggml.token_type", 5, types);
  m["tokenizer.ggml.scores"] = kv_array<float>("tokenizer.ggml.scores", 6, scores);
  return m;
}

}  // namespace

class GgufTokenizerMetadataTest : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir dir_;
  int files_ = 0;

  Tokenizer load(const Metadata& metadata) {
    const std::string path = dir_.filePath(QString("vocab%1.gguf").arg(files_++)).toStdString();
    write_file_bytes(path, gguf_bytes(metadata));
    return Tokenizer::from_gguf(GgufFile(path));
  }

  // The error of loading `metadata`, "" when it loads.
  std::string error_of(const Metadata& metadata) {
    try {
      load(metadata);
    } catch (const std::exception& error) {
      return error.what();
    }
    return "";
  }

 private Q_SLOTS:
  void initTestCase() { QVERIFY(dir_.isValid()); }

  // "1234" shows each regex set: \p{N}{1,3} groups (llama-bpe), single digits (qwen2, smollm), one
  // run (gpt-2), runs cut into threes (default, also used when the key is absent).
  void pre_tokenizers_data() {
    QTest::addColumn<QString>("pre");
    QTest::addColumn<QString>("expected");
    QTest::newRow("llama-bpe") << "llama-bpe"
                               << "[257,52]";
    QTest::newRow("llama3") << "llama3"
                            << "[257,52]";
    QTest::newRow("qwen2") << "qwen2"
                           << "[49,50,51,52]";
    QTest::newRow("smollm") << "smollm"
                            << "[49,50,51,52]";
    QTest::newRow("gpt-2") << "gpt-2"
                           << "[258]";
    QTest::newRow("default") << "default"
                             << "[257,52]";
    QTest::newRow("absent") << ""
                            << "[257,52]";
  }
  void pre_tokenizers() {
    QFETCH(QString, pre);
    QFETCH(QString, expected);
    Tokenizer tokenizer = load(byte_level_vocab(pre.isEmpty() ? std::nullopt : std::optional(pre.toStdString())));
    QCOMPARE(QString::fromStdString(ids_to_string(tokenizer.encode("1234", false, false))), expected);
    QCOMPARE(tokenizer.encode("ab", false, false), std::vector<TokenId>{259});
    QCOMPARE(QString::fromStdString(tokenizer.decode(tokenizer.encode("ab 1234\n", false, false))),
             QString("ab 1234\n"));
    // llama.cpp adds BOS by default for llama-bpe only.
    QCOMPARE(tokenizer.add_bos_token(), pre == "llama-bpe" || pre == "llama3");
  }

  // Merges follow scores: the better scored of "ab" / "bc" wins in "abc".
  void sentencepiece_merges_by_score() {
    Tokenizer bc_first = load(sentencepiece_vocab(-6, -5));
    QCOMPARE(bc_first.encode("abc", false, false), (std::vector<TokenId>{3, 4, 8}));
    Tokenizer ab_first = load(sentencepiece_vocab(-5, -6));
    QCOMPARE(ab_first.encode("abc", false, false), (std::vector<TokenId>{3, 7, 6}));
    QCOMPARE(ab_first.encode("abc", true, false), (std::vector<TokenId>{1, 3, 7, 6}));  // add_bos defaults to true
    // Byte fallback, and a user-defined token matched in plain text; the text after it gets its
    // own leading "▁" as llama.cpp gives every stretch between tokens.
    QCOMPARE(ab_first.encode("d", false, false), (std::vector<TokenId>{3, 10}));
    QCOMPARE(ab_first.encode("a<x>b", false, false), (std::vector<TokenId>{3, 4, 9, 3, 5}));
    QCOMPARE(QString::fromStdString(ab_first.decode({3, 7, 6, 3, 10})), QString("abc d"));
    // Control tokens come from text only with parse_special.
    QVERIFY(ab_first.encode("<s>", false, false) != std::vector<TokenId>{1});
    QCOMPARE(ab_first.encode("<s>", false, true), std::vector<TokenId>{1});
    QCOMPARE(ab_first.unk_id().value_or(-1), 0);
  }

  void malformed() {
    struct Case {
      const char* name;
      std::function<Metadata()> make;
      const char* expected;
    };
    auto bpe = [] { return byte_level_vocab(std::string("llama-bpe")); };
    auto spm = [] { return sentencepiece_vocab(-5, -6); };
    const std::vector<Case> cases = {
        {"no tokens",
         [&] {
           auto m = bpe();
           m.erase("tokenizer.ggml.tokens");
           return m;
         },
         "missing tokenizer.ggml.tokens"},
        {"tokens not strings",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.tokens"] = kv_array<std::int32_t>("tokenizer.ggml.tokens", 5, {1, 2});
           return m;
         },
         "tokenizer.ggml.tokens"},
        {"short token_type",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.token_type"] =
               kv_array<std::int32_t>("tokenizer.ggml.token_type", 5, std::vector<std::int32_t>(259, 1));
           return m;
         },
         "tokenizer.ggml.token_type has 259 entries but tokenizer.ggml.tokens has 260"},
        {"bad token_type",
         [&] {
           auto m = bpe();
           std::vector<std::int32_t> t(260, 1);
           t[3] = 9;
           m["tokenizer.ggml.token_type"] = kv_array<std::int32_t>("tokenizer.ggml.token_type", 5, t);
           return m;
         },
         "tokenizer.ggml.token_type[3] = 9 is not a token type"},
        {"long scores",
         [&] {
           auto m = spm();
           m["tokenizer.ggml.scores"] = kv_array<float>("tokenizer.ggml.scores", 6, std::vector<float>(12, 0.f));
           return m;
         },
         "tokenizer.ggml.scores has 12 entries but tokenizer.ggml.tokens has 11"},
        {"no scores",
         [&] {
           auto m = spm();
           m.erase("tokenizer.ggml.scores");
           return m;
         },
         "missing tokenizer.ggml.scores"},
        {"no merges",
         [&] {
           auto m = bpe();
           m.erase("tokenizer.ggml.merges");
           return m;
         },
         "missing tokenizer.ggml.merges"},
        {"merge of unknown token",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.merges"] = kv_array<std::string>("tokenizer.ggml.merges", 8, {"1 2", "a zz"});
           return m;
         },
         "tokenizer.ggml.merges[1] names unknown token 'zz'"},
        {"merge without space",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.merges"] = kv_array<std::string>("tokenizer.ggml.merges", 8, {"ab"});
           return m;
         },
         "tokenizer.ggml.merges[0] 'ab' is not two tokens separated by a space"},
        {"bos out of range",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.bos_token_id"] = gguf_kv_u32("tokenizer.ggml.bos_token_id", 5000);
           return m;
         },
         "tokenizer.ggml.bos_token_id = 5000 is outside the vocabulary of 260 tokens"},
        {"eos out of range",
         [&] {
           auto m = spm();
           m["tokenizer.ggml.eos_token_id"] = gguf_kv_u32("tokenizer.ggml.eos_token_id", 11);
           return m;
         },
         "tokenizer.ggml.eos_token_id = 11 is outside the vocabulary of 11 tokens"},
        {"eot out of range",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.eot_token_id"] = gguf_kv_u32("tokenizer.ggml.eot_token_id", 260);
           return m;
         },
         "tokenizer.ggml.eot_token_id = 260 is outside"},
        {"add_bos without bos",
         [&] {
           auto m = bpe();
           m.erase("tokenizer.ggml.bos_token_id");
           return m;
         },
         "tokenizer.ggml.add_bos_token is true but there is no tokenizer.ggml.bos_token_id"},
        {"add_eos without eos",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.add_eos_token"] = kv_bool("tokenizer.ggml.add_eos_token", true);
           return m;
         },
         "tokenizer.ggml.add_eos_token is true but there is no tokenizer.ggml.eos_token_id"},
        {"unknown pre",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.pre"] = kv_string("tokenizer.ggml.pre", "llama-5");
           return m;
         },
         "unsupported tokenizer.ggml.pre 'llama-5'"},
        {"unknown model",
         [&] {
           auto m = bpe();
           m["tokenizer.ggml.model"] = kv_string("tokenizer.ggml.model", "bert");
           return m;
         },
         "unsupported tokenizer.ggml.model 'bert'"},
        {"no model",
         [&] {
           auto m = bpe();
           m.erase("tokenizer.ggml.model");
           return m;
         },
         "missing tokenizer.ggml.model"},
        {"repeated token",
         [&] {
           auto m = spm();
           m["tokenizer.ggml.tokens"] = kv_array<std::string>(
               "tokenizer.ggml.tokens", 8, {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc", "<x>", "<0x64>", "a"});
           return m;
         },
         "repeats token 'a'"},
    };
    QVERIFY(error_of(bpe()).empty());
    QVERIFY(error_of(spm()).empty());
    for (const Case& c : cases) {
      const std::string error = error_of(c.make());
      QVERIFY2(error.find(c.expected) != std::string::npos,
               qPrintable(QString("%1: expected an error containing \"%2\", got \"%3\"")
                              .arg(c.name, c.expected, QString::fromStdString(error))));
    }
  }
};

KVCHAT_TEST_APPLESS_MAIN(GgufTokenizerMetadataTest)

}  // namespace text_test_gguf_tokenizer_metadata

#include "test_gguf_tokenizer_metadata.moc"
