// Reproduces the reference tokenizer fixtures in ../shared exactly: encode, decode, per-token
// pieces + streaming chunks, the Llama 3 chat renders, and stories260K's llama2.c prompts.
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include "engine/text/tokenizer.h"
#include "tokenizer_test_support.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_tokenizer_fixtures {

using namespace kvchat;
using namespace kvchat::test;

class TokenizerFixturesTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void encode_data() { add_rows("encode.json"); }
  void encode() {
    QFETCH(QString, model);
    QFETCH(int, index);
    const auto c = fixture(model, "encode.json")[index];
    const Tokenizer& tokenizer = cached_tokenizer(tokenizer_fixture_dir(model.toStdString()));
    auto actual = tokenizer.encode(c["text"].get<std::string>(), c["add_special_tokens"].get<bool>(),
                                   c["parse_special"].get<bool>());
    auto expected = json_ids(c["ids"]);
    QVERIFY2(actual == expected,
             qPrintable(QString::fromStdString("text " + escaped(c["text"]) + "\n   expected " +
                                               ids_to_string(expected) + "\n   actual   " + ids_to_string(actual))));
  }

  void decode_data() { add_rows("decode.json"); }
  void decode() {
    QFETCH(QString, model);
    QFETCH(int, index);
    const auto c = fixture(model, "decode.json")[index];
    const Tokenizer& tokenizer = cached_tokenizer(tokenizer_fixture_dir(model.toStdString()));
    std::string actual = tokenizer.decode(json_ids(c["ids"]), c["skip_special_tokens"].get<bool>(),
                                          c["clean_up_tokenization_spaces"].get<bool>());
    std::string expected = c["text"].get<std::string>();
    QVERIFY2(actual == expected,
             qPrintable(QString::fromStdString("ids " + ids_to_string(json_ids(c["ids"])) + "\n   expected " +
                                               escaped(expected) + "\n   actual   " + escaped(actual))));
  }

  void decode_pieces_data() { add_rows("decode_pieces.json"); }
  void decode_pieces() {
    QFETCH(QString, model);
    QFETCH(int, index);
    const auto c = fixture(model, "decode_pieces.json")[index];
    const Tokenizer& tokenizer = cached_tokenizer(tokenizer_fixture_dir(model.toStdString()));
    auto ids = json_ids(c["ids"]);
    const auto& pieces = c["pieces"];
    const auto& stream = c["stream"];
    QCOMPARE(pieces.size(), ids.size());
    QCOMPARE(stream.size(), ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::string piece = tokenizer.decode({ids[i]}, false, false);
      QVERIFY2(piece == pieces[i].get<std::string>(),
               qPrintable(QString::fromStdString("piece " + std::to_string(i) + " of id " + std::to_string(ids[i]) +
                                                 ": expected " + escaped(pieces[i]) + ", actual " + escaped(piece))));
    }
    QCOMPARE(QString::fromStdString(tokenizer.decode(ids, false, false)),
             QString::fromStdString(c["full"].get<std::string>()));

    StreamingDecoder streaming(tokenizer, /*skip_special_tokens=*/false, /*clean_up=*/false);
    std::string joined;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::string chunk = streaming.push(ids[i]);
      if (i + 1 == ids.size()) chunk += streaming.finish();  // the fixture prints the rest at the last token
      joined += chunk;
      QVERIFY2(chunk == stream[i].get<std::string>(),
               qPrintable(QString::fromStdString("stream chunk " + std::to_string(i) + ": expected " +
                                                 escaped(stream[i]) + ", actual " + escaped(chunk))));
    }
    QCOMPARE(QString::fromStdString(joined), QString::fromStdString(c["full"].get<std::string>()));
  }

  void chat_template_ids() {
    const auto cases = load_json(tokenizer_fixture_dir("llama3") + "/chat_template.json");
    QVERIFY(!cases.empty());
    const Tokenizer& tokenizer = cached_tokenizer(tokenizer_fixture_dir("llama3"));
    int failures = 0;
    for (const auto& c : cases) {
      auto actual = tokenizer.encode(c["text"].get<std::string>(), false, true);
      auto expected = json_ids(c["ids"]);
      if (actual != expected) {
        ++failures;
        qWarning("chat case %s:\n  expected %s\n  actual   %s", c["id"].get<std::string>().c_str(),
                 ids_to_string(expected).c_str(), ids_to_string(actual).c_str());
      }
      // The template text contains only complete characters, so decoding gives it back.
      QCOMPARE(QString::fromStdString(tokenizer.decode(actual, false, false)),
               QString::fromStdString(c["text"].get<std::string>()));
    }
    QCOMPARE(failures, 0);
  }

  void stories260k_reference() {
    const auto cases = load_json(shared_path("fixtures/reference/stories260K_greedy.json"));
    QVERIFY(!cases.empty());
    const Tokenizer& tokenizer = cached_tokenizer(shared_path("models/stories260K"));
    QVERIFY(tokenizer.add_bos_token());
    QCOMPARE(tokenizer.bos_id().value_or(-1), 1);
    for (const auto& c : cases) {
      const std::string prompt = c["prompt"].get<std::string>();
      auto prompt_ids = json_ids(c["prompt_ids"]);
      auto generated_ids = json_ids(c["generated_ids"]);
      QCOMPARE(QString::fromStdString(ids_to_string(tokenizer.encode(prompt, true, false))),
               QString::fromStdString(ids_to_string(prompt_ids)));

      // Decoding the continuation alone drops its first leading space (the Strip decoder).
      std::string expected = c["generated_text"].get<std::string>();
      std::string alone = expected.rfind(' ', 0) == 0 ? expected.substr(1) : expected;
      QCOMPARE(QString::fromStdString(tokenizer.decode(generated_ids, true)), QString::fromStdString(alone));

      // After the prompt, the continuation keeps its space.
      std::vector<TokenId> all = prompt_ids;
      all.insert(all.end(), generated_ids.begin(), generated_ids.end());
      QCOMPARE(QString::fromStdString(tokenizer.decode(all, true)), QString::fromStdString(prompt + expected));
    }
  }

 private:
  static const nlohmann::json& fixture(const QString& model, const std::string& file) {
    static std::map<std::string, nlohmann::json> cache;
    std::string key = model.toStdString() + "/" + file;
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache.emplace(key, load_json(tokenizer_fixture_dir(model.toStdString()) + "/" + file)).first;
    return it->second;
  }

  static void add_rows(const std::string& file) {
    QTest::addColumn<QString>("model");
    QTest::addColumn<int>("index");
    for (const QString& model : {QString("llama3"), QString("llama2")}) {
      const auto& cases = fixture(model, file);
      QVERIFY2(!cases.empty(), "fixture file has no cases");
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto& c = cases[i];
        std::string name = model.toStdString() + "/" + c["id"].get<std::string>() + "#" + std::to_string(i);
        if (c.contains("parse_special")) name += c["parse_special"].get<bool>() ? "/special" : "/plain";
        if (c.contains("add_special_tokens") && c["add_special_tokens"].get<bool>()) name += "/bos";
        if (c.contains("skip_special_tokens") && c["skip_special_tokens"].get<bool>()) name += "/skip";
        if (c.contains("clean_up_tokenization_spaces") && c["clean_up_tokenization_spaces"].get<bool>())
          name += "/clean";
        QTest::newRow(name.c_str()) << model << static_cast<int>(i);
      }
    }
  }
};

KVCHAT_TEST_APPLESS_MAIN(TokenizerFixturesTest)

}  // namespace text_test_tokenizer_fixtures

#include "test_tokenizer_fixtures.moc"
