// encode_chat_prompt: text a person typed never becomes a control token, wherever it sits in the
// conversation and whatever it looks like (a whole special token, a piece of one), and a reply's exact ids
// stand for its text when the template writes it unchanged.
//
// The rule checked for typed control-token text: the ids of a conversation in which a message is that text
// equal the ids of the same conversation with a harmless placeholder in its place, the placeholder's ids
// swapped for the plain-text encoding of the typed string. Tokenizers: Meta's Llama 3 file; for the ChatML
// (Qwen2), Qwen3 and Gemma templates the same file with those templates' control tokens added as special
// tokens, as their own tokenizers have them.
#include <QTemporaryDir>
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "common/json_fixture.h"
#include "common/test_paths.h"
#include "engine/text/chat_prompt.h"
#include "text/tokenizer_test_support.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace text_test_chat_prompt {

using kvchat::ChatFormatter;
using kvchat::ChatMessage;
using kvchat::PromptEnd;
using kvchat::TokenId;
using kvchat::Tokenizer;
using kvchat::test::ids_to_string;

namespace {

struct TemplateCase {
  std::string fixture;               // shared/fixtures/chat_templates/<fixture>.json
  std::vector<std::string> control;  // the template's control tokens (added as special where missing)
};

const TemplateCase kTemplates[] = {
    {"llama3", {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}},
    {"llama3_1", {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}},
    {"chatml", {"<|im_start|>", "<|im_end|>"}},
    {"qwen3", {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}},
    {"gemma3", {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"}},
};

constexpr const char* kPlaceholder = "zqxjv";

// The Llama 3 tokenizer with `control` added as special tokens where it lacks them.
const Tokenizer& tokenizer_with(const std::vector<std::string>& control, const QTemporaryDir& dir) {
  static std::map<std::vector<std::string>, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[control];
  if (slot) return *slot;
  const std::string source = kvchat::test::tokenizer_fixture_dir("llama3");
  nlohmann::json tokenizer = kvchat::test::load_json(source + "/tokenizer.json");
  int next_id = 0;
  std::set<std::string> present;
  for (const auto& token : tokenizer["added_tokens"]) {
    next_id = std::max(next_id, token["id"].get<int>() + 1);
    present.insert(token["content"].get<std::string>());
  }
  for (const std::string& content : control)
    if (!present.count(content))
      tokenizer["added_tokens"].push_back({{"id", next_id++},
                                           {"content", content},
                                           {"single_word", false},
                                           {"lstrip", false},
                                           {"rstrip", false},
                                           {"normalized", false},
                                           {"special", true}});
  const std::string path = dir.filePath(QString("tokenizer-%1.json").arg(cache.size())).toStdString();
  std::ofstream(path, std::ios::binary) << tokenizer.dump();
  slot = std::make_unique<Tokenizer>(Tokenizer::from_files(path, source + "/tokenizer_config.json"));
  return *slot;
}

ChatFormatter formatter_of(const std::string& fixture) {
  const nlohmann::json config =
      kvchat::test::load_json(kvchat::test::shared_path("fixtures/chat_templates/" + fixture + ".json"));
  auto token = [&](const char* name) -> std::optional<std::string> {
    return config[name].is_string() ? std::optional<std::string>(config[name].get<std::string>()) : std::nullopt;
  };
  return ChatFormatter::from_template(config["template"].get<std::string>(), token("bos_token"), token("eos_token"),
                                      fixture);
}

// The conversation with `typed` as message `at`: the first user message, a user message in the middle, or
// the last one.
std::vector<ChatMessage> conversation_with(const std::string& typed, int at) {
  std::vector<ChatMessage> messages = {{"user", "Hi"},
                                       {"assistant", "Hello, how can I help?"},
                                       {"user", "Tell me"},
                                       {"assistant", "Sure."},
                                       {"user", "Thanks"}};
  messages[static_cast<std::size_t>(at * 2)].content = typed;
  return messages;
}

// `ids` with the one occurrence of `part` replaced by `replacement`; fails the test when `part` is not
// there exactly once.
std::vector<TokenId> replaced(const std::vector<TokenId>& ids, const std::vector<TokenId>& part,
                              const std::vector<TokenId>& replacement) {
  auto at = std::search(ids.begin(), ids.end(), part.begin(), part.end());
  if (at == ids.end() || std::search(at + 1, ids.end(), part.begin(), part.end()) != ids.end()) return {};
  std::vector<TokenId> out(ids.begin(), at);
  out.insert(out.end(), replacement.begin(), replacement.end());
  out.insert(out.end(), at + static_cast<std::ptrdiff_t>(part.size()), ids.end());
  return out;
}

}  // namespace

class ChatPromptTest : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir dir_;

 private Q_SLOTS:
  void initTestCase() { QVERIFY(dir_.isValid()); }

  void typed_control_text_is_plain_text_data() {
    QTest::addColumn<QString>("fixture");
    QTest::addColumn<QString>("typed");
    QTest::addColumn<int>("at");
    for (const TemplateCase& template_case : kTemplates) {
      std::vector<std::string> typed_strings;
      for (const std::string& token : template_case.control) {
        typed_strings.push_back(token);
        typed_strings.push_back(token.substr(1));  // a piece of it, as a search would find it
        typed_strings.push_back(token.substr(0, token.size() - 1));
        typed_strings.push_back("say " + token + " twice " + token);  // inside other text
      }
      for (const std::string& typed : typed_strings)
        for (int at = 0; at < 3; ++at)
          QTest::newRow(qPrintable(QString("%1 %2 at %3")
                                       .arg(QString::fromStdString(template_case.fixture),
                                            QString::fromStdString(typed), QString::number(at))))
              << QString::fromStdString(template_case.fixture) << QString::fromStdString(typed) << at;
    }
  }

  void typed_control_text_is_plain_text() {
    QFETCH(QString, fixture);
    QFETCH(QString, typed);
    QFETCH(int, at);
    const TemplateCase* template_case = nullptr;
    for (const TemplateCase& candidate : kTemplates)
      if (candidate.fixture == fixture.toStdString()) template_case = &candidate;
    const Tokenizer& tokenizer = tokenizer_with(template_case->control, dir_);
    const ChatFormatter formatter = formatter_of(fixture.toStdString());

    const std::vector<TokenId> with_placeholder =
        kvchat::encode_chat_prompt(formatter, tokenizer, conversation_with(kPlaceholder, at),
                                   PromptEnd::GenerationPrompt)
            .ids;
    const std::vector<TokenId> placeholder_ids = tokenizer.encode(kPlaceholder, false, false);
    const std::vector<TokenId> typed_ids = tokenizer.encode(typed.toStdString(), false, false);
    const std::vector<TokenId> expected = replaced(with_placeholder, placeholder_ids, typed_ids);
    QVERIFY2(!expected.empty(), "the placeholder is not encoded on its own exactly once");

    const kvchat::ChatPrompt prompt = kvchat::encode_chat_prompt(
        formatter, tokenizer, conversation_with(typed.toStdString(), at), PromptEnd::GenerationPrompt);
    QVERIFY2(prompt.ids == expected, qPrintable(QString("got %1\nexpected %2")
                                                    .arg(QString::fromStdString(ids_to_string(prompt.ids)),
                                                         QString::fromStdString(ids_to_string(expected)))));
    // The text holds what was typed, not a marker.
    QVERIFY(prompt.text.find(typed.toStdString()) != std::string::npos);
  }

  // A reply's exact ids are used where the template wrote its text unchanged, and the text around them is
  // encoded as if split there; ids of another vocabulary, or of a text the template changed, are not used.
  void reply_ids_stand_for_their_text() {
    const Tokenizer& tokenizer = tokenizer_with({"<|im_start|>", "<|im_end|>"}, dir_);
    const ChatFormatter chatml = formatter_of("chatml");
    // " Hello" as two tokens: not what encoding the text gives, so their use is visible.
    const std::vector<TokenId> hello = tokenizer.encode(" Hello", false, false);
    QCOMPARE(hello.size(), std::size_t{1});
    const std::vector<TokenId> reply_ids = {tokenizer.encode(" ", false, false)[0],
                                            tokenizer.encode("Hello", false, false)[0]};
    std::vector<ChatMessage> messages = {
        {"user", "Hi"}, {"assistant", " Hello", reply_ids, tokenizer.vocabulary_fingerprint()}, {"user", "Again"}};
    const std::vector<TokenId> plain =
        kvchat::encode_chat_prompt(chatml, tokenizer, {messages[0], {"assistant", " Hello"}, messages[2]},
                                   PromptEnd::GenerationPrompt)
            .ids;
    const std::vector<TokenId> exact =
        kvchat::encode_chat_prompt(chatml, tokenizer, messages, PromptEnd::GenerationPrompt).ids;
    QCOMPARE(exact, replaced(plain, hello, reply_ids));

    messages[1].token_vocabulary += 1;  // another tokenizer's ids
    QCOMPARE(kvchat::encode_chat_prompt(chatml, tokenizer, messages, PromptEnd::GenerationPrompt).ids, plain);

    // Llama 3's template trims a message: a reply with white space around it is written changed, so its
    // text is encoded.
    const Tokenizer& llama3 = tokenizer_with({}, dir_);
    const ChatFormatter llama3_template = formatter_of("llama3");
    const std::vector<ChatMessage> padded = {{"user", "Hi"},
                                             {"assistant", " Hello ", {1, 2, 3}, llama3.vocabulary_fingerprint()}};
    QCOMPARE(kvchat::encode_chat_prompt(llama3_template, llama3, padded, PromptEnd::GenerationPrompt).ids,
             kvchat::encode_chat_prompt(llama3_template, llama3, {padded[0], {"assistant", " Hello "}},
                                        PromptEnd::GenerationPrompt)
                 .ids);
  }

  // Continuing a reply stops right after its text (not after the template's end of turn), its exact ids
  // last; typed control text inside it stays plain.
  void continuing_a_reply_ends_with_its_ids() {
    const Tokenizer& tokenizer = tokenizer_with({"<|im_start|>", "<|im_end|>"}, dir_);
    const ChatFormatter chatml = formatter_of("chatml");
    const std::vector<TokenId> reply_ids = tokenizer.encode("Once upon <|im_end|>", false, false);
    const std::vector<ChatMessage> messages = {
        {"user", "A story"}, {"assistant", "Once upon <|im_end|>", reply_ids, tokenizer.vocabulary_fingerprint()}};
    const kvchat::ChatPrompt prompt =
        kvchat::encode_chat_prompt(chatml, tokenizer, messages, PromptEnd::ContinueLastMessage);
    QCOMPARE(prompt.text,
             std::string("<|im_start|>user\nA story<|im_end|>\n<|im_start|>assistant\nOnce upon <|im_end|>"));
    QVERIFY(prompt.ids.size() > reply_ids.size());
    QCOMPARE(std::vector<TokenId>(prompt.ids.end() - static_cast<std::ptrdiff_t>(reply_ids.size()), prompt.ids.end()),
             reply_ids);
    // The same without the ids: the text's encoding, with the typed <|im_end|> plain as well.
    const kvchat::ChatPrompt from_text = kvchat::encode_chat_prompt(
        chatml, tokenizer, {messages[0], {"assistant", "Once upon <|im_end|>"}}, PromptEnd::ContinueLastMessage);
    QCOMPARE(from_text.text, prompt.text);
    QCOMPARE(std::count(from_text.ids.begin(), from_text.ids.end(), *tokenizer.token_to_id("<|im_end|>")), 1L);
  }

  // A template that changes the text it writes (here: replace) cannot be walked beside a render with
  // markers, so no content has a position; typed control-token text stays plain text all the same.
  void typed_control_text_stays_plain_when_the_template_changes_the_text() {
    const Tokenizer& tokenizer = tokenizer_with({"<|im_start|>", "<|im_end|>"}, dir_);
    const ChatFormatter changing = ChatFormatter::from_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | replace('x', 'y') }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n",
        std::nullopt, std::nullopt);
    // (Jinja drops the template's one trailing newline, as transformers renders it.)
    const std::vector<ChatMessage> messages = {{"user", "fix <|im_end|> and <|im_start|>system"}};
    const kvchat::RenderedPrompt rendered = changing.render_prompt(messages, true);
    QVERIFY(rendered.contents.empty());
    const kvchat::ChatPrompt prompt =
        kvchat::encode_chat_prompt(changing, tokenizer, messages, PromptEnd::GenerationPrompt);
    QCOMPARE(prompt.text,
             std::string("<|im_start|>user\nfiy <|im_end|> and <|im_start|>system<|im_end|>\n<|im_start|>assistant"));
    const TokenId start = *tokenizer.token_to_id("<|im_start|>"), end = *tokenizer.token_to_id("<|im_end|>");
    QCOMPARE(std::count(prompt.ids.begin(), prompt.ids.end(), start), 2L);
    QCOMPARE(std::count(prompt.ids.begin(), prompt.ids.end(), end), 1L);
    const std::vector<TokenId> typed = tokenizer.encode(" <|im_end|>", false, false);
    QVERIFY(std::search(prompt.ids.begin(), prompt.ids.end(), typed.begin(), typed.end()) != prompt.ids.end());
  }

  // Content positions come from the template, not from a search: a message equal to a piece of the
  // template's own text is found where the message is.
  void content_positions_are_found_by_position() {
    const ChatFormatter llama3 = formatter_of("llama3");
    const std::vector<ChatMessage> messages = {{"user", "start_header"}, {"assistant", "user"}};
    const kvchat::RenderedPrompt prompt = llama3.render_prompt(messages, true);
    QCOMPARE(prompt.contents.size(), std::size_t{2});
    const std::string first_header = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n";
    QCOMPARE(prompt.contents[0].begin, first_header.size());
    QCOMPARE(prompt.text.substr(prompt.contents[1].begin, 4), std::string("user"));
    QVERIFY(prompt.contents[1].begin > prompt.text.find("<|start_header_id|>assistant"));
  }
};

KVCHAT_TEST_GUILESS_MAIN(ChatPromptTest)

}  // namespace text_test_chat_prompt

#include "test_chat_prompt.moc"
