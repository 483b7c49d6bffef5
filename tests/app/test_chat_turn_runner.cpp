// ChatTurnRunner on stories260K, greedy: streamed text, token-exact continuation across turns, stopping
// mid-reply and continuing, and the context limit (stop with an error, or drop the oldest turns).
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <string>
#include <vector>

#include "app/chat/chat_turn_runner.h"
#include "common/test_paths.h"
#include "common/tiny_llama3_chat_model.h"
#include "engine/generation/session.h"
#include "engine/model/model_loader.h"
#include "engine/text/constraint/json_grammar.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_chat_turn_runner {

using kvchat::ChatMessage;
using kvchat::GenerationConfig;
using kvchat::KvCacheMode;
using kvchat::LoadedModel;
using kvchat::Session;
using kvchat::StopReason;
using kvchat::TokenId;
using kvchat::app::ChatTurnRunner;
using kvchat::app::ContextLimitError;
using kvchat::app::ContextOverflowPolicy;
using kvchat::app::ReplyProgress;
using kvchat::app::TurnOptions;
using kvchat::app::TurnOutcome;

namespace {

TurnOptions greedy(int max_new_tokens, KvCacheMode mode = KvCacheMode::Contiguous) {
  TurnOptions options;
  options.generation.max_new_tokens = max_new_tokens;
  options.generation.sampling.temperature = 0.0f;
  options.generation.cache_mode = mode;
  return options;
}

}  // namespace

class ChatTurnRunnerTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase();
  void reply_text_is_the_decoded_greedy_continuation();
  void second_turn_reuses_the_whole_cache();
  void stopped_turn_then_next_turn_matches_a_fresh_session();
  void regenerated_and_edited_turns_reuse_the_cache();
  void cache_off_gives_the_same_tokens();
  void context_limit_stop_policy_throws_a_clear_error();
  void context_limit_drop_policy_leaves_out_the_oldest_turns();
  void ids_past_the_tokenizer_are_never_sampled();
  void a_huge_max_new_tokens_is_bounded_by_the_context();
  void a_constrained_reply_is_whole_json_and_is_not_continued();

 private:
  LoadedModel model_;
};

void ChatTurnRunnerTest::initTestCase() {
  model_ = kvchat::load_model_directory(kvchat::test::shared_path("models/stories260K"));
  QVERIFY(model_.tokenizer);
}

void ChatTurnRunnerTest::reply_text_is_the_decoded_greedy_continuation() {
  const ChatTurnRunner runner(model_);
  const std::vector<ChatMessage> messages = {{"user", "Once upon a time"}};
  // Independent path: the plain tokenizer encoding and a bare Session.
  const std::vector<TokenId> prompt = model_.tokenizer->encode("Once upon a time", true, false);
  Session reference(model_.model, KvCacheMode::Contiguous);
  GenerationConfig config = greedy(48).generation;
  const auto expected = reference.generate(prompt, config);

  Session session(model_.model, KvCacheMode::Contiguous);
  std::string streamed;
  int callbacks = 0;
  const TurnOutcome outcome = runner.run(session, messages, greedy(48), nullptr, [&](const ReplyProgress& progress) {
    streamed.append(progress.chunk);
    ++callbacks;
    QCOMPARE(progress.generated_tokens, callbacks);
  });
  QCOMPARE(outcome.prompt_ids, prompt);
  QCOMPARE(outcome.generated_ids, expected.generated);
  QCOMPARE(outcome.reply, model_.tokenizer->decode(expected.generated, /*skip_special_tokens=*/true));
  QCOMPARE(streamed, outcome.reply);
  QVERIFY(!outcome.reply.empty());
  QCOMPARE(outcome.stats.generated_tokens, static_cast<int>(expected.generated.size()));
  QCOMPARE(outcome.context_limit, static_cast<int>(model_.config.max_position_embeddings));
  QCOMPARE(outcome.dropped_messages, 0);
}

void ChatTurnRunnerTest::second_turn_reuses_the_whole_cache() {
  const ChatTurnRunner runner(model_);
  Session session(model_.model, KvCacheMode::Contiguous);
  std::vector<ChatMessage> messages = {{"user", "Once upon a time"}};
  const TurnOutcome first = runner.run(session, messages, greedy(40), nullptr, {});
  const auto cached_after_first = session.cache_tokens();
  QCOMPARE(first.stats.cache_tokens, cached_after_first);
  QVERIFY(cached_after_first > 0);

  messages.push_back({"assistant", first.reply});
  messages.push_back({"user", "Lily went to the park"});
  const TurnOutcome second = runner.run(session, messages, greedy(40), nullptr, {});
  // Everything the cache held is reused; only the new tokens are prefilled.
  QCOMPARE(static_cast<std::int64_t>(second.stats.reused_tokens), cached_after_first);
  QCOMPARE(second.stats.prefilled_tokens, second.stats.prompt_tokens - second.stats.reused_tokens);
  // The new prompt starts with exactly the ids of the first turn: prompt + the sampled reply.
  std::vector<TokenId> first_turn = first.prompt_ids;
  first_turn.insert(first_turn.end(), first.generated_ids.begin(), first.generated_ids.end());
  if (first.stats.stop_reason == StopReason::Eos) first_turn.pop_back();
  QVERIFY(second.prompt_ids.size() > first_turn.size());
  QVERIFY(std::equal(first_turn.begin(), first_turn.end(), second.prompt_ids.begin()));
  // The cache grew by this turn's tokens: what was prefilled plus every sampled token but the last
  // (whose K/V is computed when the next turn feeds it).
  QCOMPARE(session.cache_tokens(),
           cached_after_first + second.stats.prefilled_tokens + second.stats.generated_tokens - 1);
}

void ChatTurnRunnerTest::stopped_turn_then_next_turn_matches_a_fresh_session() {
  const ChatTurnRunner runner(model_);
  Session session(model_.model, KvCacheMode::Contiguous);
  std::vector<ChatMessage> messages = {{"user", "Tom had a red ball"}};
  std::atomic<bool> stop{false};
  const TurnOutcome stopped = runner.run(session, messages, greedy(200), &stop, [&](const ReplyProgress& progress) {
    if (progress.generated_tokens == 3) stop.store(true);
  });
  QCOMPARE(stopped.stats.stop_reason, StopReason::Stopped);
  QCOMPARE(stopped.stats.generated_tokens, 3);  // the flag is seen before the next token

  messages.push_back({"assistant", stopped.reply});
  messages.push_back({"user", "The sun was hot"});
  const TurnOutcome next = runner.run(session, messages, greedy(40), nullptr, {});
  QVERIFY(next.stats.reused_tokens > 0);

  Session fresh(model_.model, KvCacheMode::Contiguous);
  const auto expected = fresh.generate(next.prompt_ids, greedy(40).generation);
  QCOMPARE(next.generated_ids, expected.generated);
}

// A regenerate sends the same messages again, an edit changes the last user message: both reuse the
// cache up to the exact ids of the last turn boundary they share, and reply as a fresh session would.
void ChatTurnRunnerTest::regenerated_and_edited_turns_reuse_the_cache() {
  const ChatTurnRunner runner(model_);
  Session session(model_.model, KvCacheMode::Contiguous);
  auto fresh_reply = [&](const std::vector<TokenId>& prompt) {
    Session fresh(model_.model, KvCacheMode::Contiguous);
    return fresh.generate(prompt, greedy(20).generation).generated;
  };
  std::vector<ChatMessage> messages = {{"user", "Tom had a red ball"}};
  const TurnOutcome first = runner.run(session, messages, greedy(20), nullptr, {});

  // Regenerate: the very same prompt ids; all but the last prompt token come from the cache.
  const TurnOutcome again = runner.run(session, messages, greedy(20), nullptr, {});
  QCOMPARE(again.prompt_ids, first.prompt_ids);
  QCOMPARE(again.stats.reused_tokens, static_cast<int>(first.prompt_ids.size()) - 1);
  QCOMPARE(again.stats.prefilled_tokens, 1);
  QCOMPARE(again.generated_ids, first.generated_ids);

  messages.push_back({"assistant", again.reply});
  messages.push_back({"user", "The sun was hot"});
  const TurnOutcome second = runner.run(session, messages, greedy(20), nullptr, {});
  // The turn continues the exact ids of the first turn: prompt and reply as sampled.
  std::vector<TokenId> first_turn = first.prompt_ids;
  first_turn.insert(first_turn.end(), first.generated_ids.begin(), first.generated_ids.end());
  if (first.stats.stop_reason == StopReason::Eos) first_turn.pop_back();
  QVERIFY(std::equal(first_turn.begin(), first_turn.end(), second.prompt_ids.begin()));
  // Everything cached is reused: the first turn's ids but a last sampled token that was never fed.
  QCOMPARE(static_cast<std::int64_t>(second.stats.reused_tokens), again.stats.cache_tokens);
  QVERIFY(second.stats.reused_tokens >= static_cast<int>(first_turn.size()) - 1);

  // Edit the last message: everything up to the end of the first reply is reused, and more if the
  // edited text's ids still agree.
  messages.back().content = "The moon was bright";
  const auto cached_before_edit = session.history();
  const TurnOutcome edited = runner.run(session, messages, greedy(20), nullptr, {});
  QVERIFY(std::equal(first_turn.begin(), first_turn.end(), edited.prompt_ids.begin()));
  std::size_t shared = 0;
  while (shared < cached_before_edit.size() && shared < edited.prompt_ids.size() &&
         cached_before_edit[shared] == edited.prompt_ids[shared])
    ++shared;
  QVERIFY(shared >= first_turn.size());
  QCOMPARE(edited.stats.reused_tokens, static_cast<int>(shared));
  QCOMPARE(edited.stats.prefilled_tokens, static_cast<int>(edited.prompt_ids.size() - shared));
  QCOMPARE(edited.generated_ids, fresh_reply(edited.prompt_ids));

  // Regenerate the edited turn: its own prompt boundary serves it.
  const TurnOutcome edited_again = runner.run(session, messages, greedy(20), nullptr, {});
  QCOMPARE(edited_again.prompt_ids, edited.prompt_ids);
  QCOMPARE(edited_again.stats.reused_tokens, static_cast<int>(edited.prompt_ids.size()) - 1);
  QCOMPARE(edited_again.generated_ids, edited.generated_ids);
}

void ChatTurnRunnerTest::cache_off_gives_the_same_tokens() {
  const ChatTurnRunner runner(model_);
  std::vector<TurnOutcome> outcomes[2];
  const KvCacheMode modes[2] = {KvCacheMode::Contiguous, KvCacheMode::Off};
  for (int m = 0; m < 2; ++m) {
    Session session(model_.model, modes[m]);
    std::vector<ChatMessage> messages = {{"user", "The cat"}};
    outcomes[m].push_back(runner.run(session, messages, greedy(30, modes[m]), nullptr, {}));
    messages.push_back({"assistant", outcomes[m].back().reply});
    messages.push_back({"user", "A bird sang"});
    outcomes[m].push_back(runner.run(session, messages, greedy(30, modes[m]), nullptr, {}));
  }
  for (int turn = 0; turn < 2; ++turn) {
    QCOMPARE(outcomes[1][turn].prompt_ids, outcomes[0][turn].prompt_ids);
    QCOMPARE(outcomes[1][turn].generated_ids, outcomes[0][turn].generated_ids);
    QCOMPARE(outcomes[1][turn].stats.cache_mode, KvCacheMode::Off);
    QCOMPARE(outcomes[1][turn].stats.cache_tokens, std::int64_t(0));
    QCOMPARE(outcomes[1][turn].stats.reused_tokens, 0);
    QCOMPARE(outcomes[1][turn].stats.prefilled_tokens, outcomes[1][turn].stats.prompt_tokens);
  }
  QVERIFY(outcomes[0][1].stats.reused_tokens > 0);
}

void ChatTurnRunnerTest::context_limit_stop_policy_throws_a_clear_error() {
  const ChatTurnRunner runner(model_);
  Session session(model_.model, KvCacheMode::Contiguous);
  const std::vector<ChatMessage> messages = {{"user", "Once upon a time there was a little girl named Lily"}};
  const auto prompt_tokens = runner.encode_messages(messages).size();
  TurnOptions options = greedy(50);
  options.context_limit = static_cast<int>(prompt_tokens);  // no room for a single new token
  try {
    runner.run(session, messages, options, nullptr, {});
    QFAIL("a prompt that fills the whole context must be refused");
  } catch (const ContextLimitError& error) {
    const QString message = QString::fromUtf8(error.what());
    QVERIFY2(message.contains(QString::number(prompt_tokens) + " tokens"), error.what());
    QVERIFY2(message.contains("context limit is " + QString::number(prompt_tokens)), error.what());
  }
  // With a little room the reply is cut at the limit and says so.
  options.context_limit = static_cast<int>(prompt_tokens) + 5;
  const TurnOutcome outcome = runner.run(session, messages, options, nullptr, {});
  QCOMPARE(outcome.stats.generated_tokens, 5);
  QCOMPARE(outcome.stats.stop_reason, StopReason::ContextFull);
}

void ChatTurnRunnerTest::context_limit_drop_policy_leaves_out_the_oldest_turns() {
  const ChatTurnRunner runner(model_);
  std::vector<ChatMessage> messages = {
      {"system", "Stories for children."},
      {"user", "Once upon a time there was a big dog"},
      {"assistant", "The dog liked to run in the park with his friend the cat every day."},
      {"user", "One day the dog saw a bird"},
      {"assistant", "The bird was blue and it sang a happy song for the dog and the cat."},
      {"user", "Lily came to play"},
  };
  const auto full_tokens = runner.encode_messages(messages).size();
  TurnOptions options = greedy(16);
  options.overflow = ContextOverflowPolicy::DropOldestTurns;
  options.context_limit = static_cast<int>(full_tokens);  // full prompt + reply room does not fit
  Session session(model_.model, KvCacheMode::Contiguous);
  const TurnOutcome outcome = runner.run(session, messages, options, nullptr, {});
  QVERIFY(outcome.dropped_messages > 0);
  QCOMPARE(outcome.dropped_messages % 2, 0);  // whole exchanges: the first kept turn is a user's
  // The prompt is exactly the system prompt plus the kept messages.
  std::vector<ChatMessage> kept = {messages[0]};
  kept.insert(kept.end(), messages.begin() + 1 + outcome.dropped_messages, messages.end());
  QCOMPARE(outcome.prompt_ids, runner.encode_messages(kept));
  QVERIFY(static_cast<int>(outcome.prompt_ids.size()) + outcome.stats.generated_tokens <= options.context_limit);

  // A last message longer than the window on its own cannot be fitted.
  options.context_limit = 4;
  QVERIFY_THROWS_EXCEPTION(ContextLimitError, runner.run(session, messages, options, nullptr, {}));
}

// A tokenizer smaller than the embedding table (the random chat model's 1000 rows, a tokenizer that ends
// at id 517): the rows past it have no text, so a reply never samples them and always decodes.
void ChatTurnRunnerTest::ids_past_the_tokenizer_are_never_sampled() {
  QTemporaryDir dir;
  const LoadedModel model =
      kvchat::load_model_directory(kvchat::test::make_tiny_llama3_chat_model(dir.filePath("model").toStdString(), 517));
  QCOMPARE(model.tokenizer->vocab_size(), 517);
  QCOMPARE(model.config.vocab_size, std::int64_t(1000));
  // Without the limit, greedy decoding of this model picks a row past 517 within these steps.
  Session unlimited(model.model, KvCacheMode::Contiguous);
  const std::vector<TokenId> prompt = ChatTurnRunner(model).encode_messages({{"user", "Tell me a story"}});
  GenerationConfig config = greedy(48).generation;
  const auto free_run = unlimited.generate(prompt, config).generated;
  QVERIFY(std::any_of(free_run.begin(), free_run.end(), [](TokenId id) { return id >= 517; }));

  Session session(model.model, KvCacheMode::Contiguous);
  const TurnOutcome outcome =
      ChatTurnRunner(model).run(session, {{"user", "Tell me a story"}}, greedy(48), nullptr, {});
  QVERIFY(!outcome.generated_ids.empty());
  for (TokenId id : outcome.generated_ids) QVERIFY2(id < 517, qPrintable(QString("sampled id %1").arg(id)));
  QCOMPARE(outcome.reply, model.tokenizer->decode(outcome.reply_ids, true));
}

// max_new_tokens far past the context: the reply stops at the context limit, nothing is sized by the
// requested count.
void ChatTurnRunnerTest::a_huge_max_new_tokens_is_bounded_by_the_context() {
  const ChatTurnRunner runner(model_);
  Session session(model_.model, KvCacheMode::Contiguous);
  TurnOptions options = greedy(2147483647);
  options.context_limit = 40;
  const TurnOutcome outcome = runner.run(session, {{"user", "Once upon a time"}}, options, nullptr, {});
  QVERIFY(outcome.stats.stop_reason == StopReason::ContextFull || outcome.stats.stop_reason == StopReason::Eos);
  QVERIFY(static_cast<int>(outcome.prompt_ids.size()) + outcome.stats.generated_tokens <= 40);
}

// A turn with a grammar (a chat whose replies are JSON): the runner makes the vocabulary's trie itself when none is
// given, the reply is the JSON the constraint allowed, to the byte (no clean-up of spaces), and a reply to go on
// with is refused rather than continued outside the constraint.
void ChatTurnRunnerTest::a_constrained_reply_is_whole_json_and_is_not_continued() {
  const ChatTurnRunner runner(model_);
  Session session(model_.model, KvCacheMode::Contiguous);
  TurnOptions options = greedy(200);
  options.generation.grammar = std::make_shared<const kvchat::JsonGrammar>(kvchat::compile_json_schema(
      std::string_view(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}},)"
                       R"( "required": ["name"], "additionalProperties": false})")));
  const std::vector<ChatMessage> messages = {{"user", "Once upon a time"}};
  const TurnOutcome outcome = runner.run(session, messages, options, nullptr, {});
  QCOMPARE(outcome.stats.stop_reason, StopReason::Eos);
  QVERIFY2(nlohmann::json::parse(outcome.reply, nullptr, false).is_object(), outcome.reply.c_str());
  QCOMPARE(outcome.reply, model_.tokenizer->decode(outcome.reply_ids, true, false));

  std::vector<ChatMessage> cut = messages;
  cut.push_back({"assistant", outcome.reply.substr(0, 3)});
  options.continue_reply = true;
  try {
    runner.run(session, cut, options, nullptr, {});
    QFAIL("a constrained reply was continued");
  } catch (const std::invalid_argument& error) {
    QCOMPARE(std::string(error.what()),
             std::string("a reply in JSON cannot be continued: regenerate it (or raise max tokens) to get a whole "
                         "JSON reply"));
  }
}

KVCHAT_TEST_APPLESS_MAIN(ChatTurnRunnerTest)

}  // namespace app_test_chat_turn_runner

#include "test_chat_turn_runner.moc"
