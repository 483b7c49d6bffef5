// ChatController on stories260K, what the window's defects needed from it: a failed turn is stored as failed
// and never poisons the chat (a 5,000-character and a 2 MB message), a message sent while another chat
// generates waits for it, "New chat" reuses an empty one, Continue goes on with a reply cut short, the
// per-step decode times of each reply are recorded by the engine thread, a chat's cache can be cleared.
#include <QtTest>
#include "common/test_suite.h"

#include <QDirIterator>

#include <QSignalSpy>

#include "app/chat/draft_counter.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "app/store/message_stats_json.h"
#include "common/chat_fixture.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_chat_controller_turns {

using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::app::MessageRecord;
using kvchat::test::ChatFixture;
using kvchat::test::greedy_chat_settings;

class ChatControllerTurnsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void a_rejected_message_is_stored_as_failed_and_left_out();
  void a_two_megabyte_message_does_not_brick_the_chat();
  void at_the_models_maximum_the_error_does_not_suggest_raising_the_limit();
  void a_message_sent_while_another_chat_generates_waits_for_it();
  void new_chat_reuses_an_empty_one();
  void continue_goes_on_with_a_reply_cut_short();
  void decode_times_are_recorded_per_step();
  void clearing_a_chats_cache_frees_it();
  void switching_alternatives_reuses_the_common_prefix();
  void the_draft_count_is_answered_by_a_queued_signal();
};

namespace {

ChatSettings small_window_settings() {
  ChatSettings settings = greedy_chat_settings(16);
  settings.context_limit = 128;
  settings.context_overflow = kvchat::app::ContextOverflowPolicy::Stop;
  return settings;
}

// Sends a message that cannot fit, then a short one; returns the chat's records.
QList<MessageRecord> send_too_long_then_short(ChatFixture& fixture, const QString& too_long) {
  ChatController* controller = fixture.controller();
  QSignalSpy failed(controller, &ChatController::replyFailed);
  QSignalSpy errors(controller, &ChatController::errorOccurred);
  [&] { QVERIFY(controller->send("Once upon a time")); }();
  [&] { QVERIFY(fixture.waitIdle()); }();
  [&] { QVERIFY(controller->send(too_long)); }();
  [&] { QVERIFY(fixture.waitIdle()); }();
  [&] {
    QCOMPARE(failed.count(), 1);  // shown once: as the failed reply,
    QCOMPARE(errors.count(), 0);  // not again as a separate error
  }();
  [&] { QVERIFY(controller->send("Lily went to the park")); }();
  [&] { QVERIFY(fixture.waitIdle()); }();
  [&] { QCOMPARE(failed.count(), 1); }();  // the next turn works
  return controller->currentMessages();
}

}  // namespace

void ChatControllerTurnsTest::a_rejected_message_is_stored_as_failed_and_left_out() {
  ChatFixture fixture;
  QVERIFY(fixture.open(small_window_settings()));
  const QString long_message = QString("The cat sat on the mat. ").repeated(210).left(5000);
  // Counted before sending: it would not fit.
  const auto measure = fixture.controller()->measureDraft(long_message);
  QVERIFY(measure);
  QVERIFY(!measure->fits);
  QVERIFY(measure->draft_tokens > 128);
  QCOMPARE(measure->context_limit, 128);
  QVERIFY(fixture.controller()->measureDraft("Tom ran")->fits);
  const auto records = send_too_long_then_short(fixture, long_message);
  QCOMPARE(records.size(), 6);
  QCOMPARE(records[2].text, long_message);
  const MessageRecord& failed = records[3];
  QVERIFY(kvchat::app::is_failed_reply(failed));
  QVERIFY(failed.complete);
  QVERIFY(failed.text.isEmpty());
  QVERIFY2(kvchat::app::reply_error(failed).contains("context limit is 128 tokens"),
           qPrintable(kvchat::app::reply_error(failed)));
  QVERIFY(!kvchat::app::is_failed_reply(records[5]));
  QVERIFY(!records[5].text.isEmpty());
  // The model was given the chat without the failed turn.
  const auto engine = fixture.controller()->engineMessages(fixture.controller()->currentConversationId());
  QCOMPARE(engine.size(), size_t{4});
  QCOMPARE(engine[2].content, std::string("Lily went to the park"));
  // Reloaded from the file, the failed turn is the same.
  fixture.close();
  kvchat::app::ConversationStore store(fixture.databasePath());
  QCOMPARE(kvchat::app::reply_error(store.message(failed.id).value()), kvchat::app::reply_error(failed));
}

void ChatControllerTurnsTest::a_two_megabyte_message_does_not_brick_the_chat() {
  ChatFixture fixture;
  ChatSettings settings = small_window_settings();
  settings.context_overflow = kvchat::app::ContextOverflowPolicy::DropOldestTurns;
  QVERIFY(fixture.open(settings));
  const QString huge = QString("Tom ran. ").repeated(2 * 1024 * 1024 / 9);
  const auto records = send_too_long_then_short(fixture, huge);
  QCOMPARE(records.size(), 6);
  QVERIFY(kvchat::app::is_failed_reply(records[3]));
  QVERIFY2(kvchat::app::reply_error(records[3]).contains("the last message alone is"),
           qPrintable(kvchat::app::reply_error(records[3])));
  QVERIFY(!kvchat::app::is_failed_reply(records[5]));
  for (const auto& message : fixture.controller()->engineMessages(fixture.controller()->currentConversationId()))
    QVERIFY(message.content.size() < 1000);
}

void ChatControllerTurnsTest::at_the_models_maximum_the_error_does_not_suggest_raising_the_limit() {
  ChatFixture fixture;
  ChatSettings settings = greedy_chat_settings(8);
  settings.context_limit = 0;  // the model's 512
  settings.context_overflow = kvchat::app::ContextOverflowPolicy::DropOldestTurns;
  QVERIFY(fixture.open(settings));
  QVERIFY(fixture.controller()->send(QString("The cat sat on the mat. ").repeated(210)));
  QVERIFY(fixture.waitIdle());
  const QString error = kvchat::app::reply_error(fixture.controller()->currentMessages().at(1));
  QVERIFY2(error.endsWith("tokens long and the context limit is 512 tokens, the model's maximum: shorten it"),
           qPrintable(error));
  QVERIFY(!error.contains("raise"));
}

void ChatControllerTurnsTest::a_message_sent_while_another_chat_generates_waits_for_it() {
  ChatFixture fixture;
  ChatSettings settings = greedy_chat_settings(200);
  settings.kv_cache_enabled = false;  // slow on purpose, so that the second message arrives mid-reply
  QVERIFY(fixture.open(settings));
  ChatController* controller = fixture.controller();
  const qint64 first = controller->newConversation();
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(controller->isGenerating());
  MessageRecord second_chat_user;
  controller->newConversation();
  const qint64 second = controller->currentConversationId();
  QVERIFY(second != first);
  QSignalSpy queued(controller, &ChatController::turnQueued);
  QVERIFY(controller->send("Tom saw a big dog"));
  QCOMPARE(queued.count(), 1);
  QCOMPARE(queued.first().at(0).toLongLong(), second);
  QCOMPARE(queued.first().at(1).toLongLong(), first);
  QVERIFY(controller->isQueued(second));
  QCOMPARE(controller->generatingConversationId(), first);
  QCOMPARE(controller->currentMessages().size(), 1);  // the message is saved at once
  QVERIFY(fixture.waitIdle());
  const auto records = controller->currentMessages();
  QCOMPARE(records.size(), 2);
  QCOMPARE(records[1].role, kvchat::app::MessageRole::Assistant);
  QVERIFY(!records[1].text.isEmpty());
  QVERIFY(!kvchat::app::is_failed_reply(records[1]));
  controller->selectConversation(first);
  QCOMPARE(controller->currentMessages().size(), 2);
}

// The window's token counter asks without waiting: the count is made on the counting thread and answered later by
// a queued signal, with exactly the figures measureDraft gives.
void ChatControllerTurnsTest::the_draft_count_is_answered_by_a_queued_signal() {
  ChatFixture fixture;
  QVERIFY(fixture.open(small_window_settings()));
  ChatController* controller = fixture.controller();
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  const QString draft = QStringLiteral("Tom ran to the park");
  QSignalSpy answers(controller, &ChatController::draftMeasured);
  const quint64 earlier = controller->requestDraftMeasure(QStringLiteral("Tom"));
  const quint64 request = controller->requestDraftMeasure(draft);
  QVERIFY(request > earlier);
  QCOMPARE(answers.count(), 0);  // not counted here: the answer is queued
  QVERIFY(QTest::qWaitFor([&] { return !answers.isEmpty() && answers.last().at(0).toULongLong() == request; }, 10000));
  QVERIFY(answers.last().at(1).toBool());
  const auto answered = answers.last().at(2).value<kvchat::app::DraftMeasure>();
  const auto measure = controller->measureDraft(draft);
  QVERIFY(measure);
  QCOMPARE(answered.draft_tokens, measure->draft_tokens);
  QCOMPARE(answered.prompt_tokens, measure->prompt_tokens);
  QCOMPARE(answered.context_limit, 128);
  QCOMPARE(answered.fits, true);
  const auto& tokenizer = *controller->backendHost().modelInfo().model->tokenizer;
  QCOMPARE(answered.draft_tokens, static_cast<int>(tokenizer.encode(draft.toStdString(), false).size()));
  // The prompt is the chat so far and the draft: more than the draft alone, and what the turn then sends.
  QVERIFY(answered.prompt_tokens > answered.draft_tokens);
  QVERIFY(controller->send(draft));
  QVERIFY(fixture.waitIdle());
  QCOMPARE(kvchat::app::stats_from_json(controller->currentMessages().last().stats).prompt_tokens,
           answered.prompt_tokens);
}

void ChatControllerTurnsTest::new_chat_reuses_an_empty_one() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings()));
  ChatController* controller = fixture.controller();
  const qint64 first = controller->newConversation();
  QCOMPARE(controller->newConversation(), first);
  QCOMPARE(controller->newConversation(), first);
  QCOMPARE(controller->conversations().size(), 1);
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  const qint64 second = controller->newConversation();
  QVERIFY(second != first);
  controller->selectConversation(first);
  QCOMPARE(controller->newConversation(), second);
  QCOMPARE(controller->conversations().size(), 2);
  // An empty chat given its own system prompt is not a spare one.
  controller->setSystemPrompt(second, "Tell a story about a frog.");
  controller->selectConversation(first);
  const qint64 third = controller->newConversation();
  QVERIFY(third != second);
  QCOMPARE(controller->conversations().size(), 3);
}

void ChatControllerTurnsTest::continue_goes_on_with_a_reply_cut_short() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(12)));
  ChatController* controller = fixture.controller();
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  const MessageRecord cut = controller->currentMessages().at(1);
  QCOMPARE(kvchat::app::stats_from_json(cut.stats).stop_reason, kvchat::StopReason::MaxTokens);
  QVERIFY(controller->continuableReply());
  QCOMPARE(controller->continuableReply()->id, cut.id);
  const int cached_before = static_cast<int>(controller->cacheGauge().conversation_tokens);

  QVERIFY(controller->continueReply());
  QVERIFY(fixture.waitIdle());
  const auto records = controller->currentMessages();
  QCOMPARE(records.size(), 2);  // the same reply grew
  QCOMPARE(records[1].id, cut.id);
  QVERIFY(records[1].text.startsWith(cut.text));
  QVERIFY(records[1].text.size() > cut.text.size());
  QVERIFY(records[1].stats.value(kvchat::app::kReplyContinuedKey).toBool());
  const auto stats = kvchat::app::stats_from_json(records[1].stats);
  QCOMPARE(stats.generated_tokens, 12);
  // The model went on from its own tokens: everything it had was still in the cache.
  QCOMPARE(stats.reused_tokens, cached_before);
  QCOMPARE(stats.prefilled_tokens, stats.prompt_tokens - cached_before);
  QVERIFY(stats.prefilled_tokens <= 1);

  // Greedy: the continued reply is what one longer reply would have been.
  ChatFixture longer;
  QVERIFY(longer.open(greedy_chat_settings(24)));
  QVERIFY(longer.controller()->send("Once upon a time"));
  QVERIFY(longer.waitIdle());
  QCOMPARE(records[1].text, longer.controller()->currentMessages().at(1).text);
  // Each reply is stored with its exact ids: the continued one's are the first part's and the new ones,
  // the same as the longer reply's.
  QCOMPARE(cut.token_ids.size(), std::size_t{12});
  QCOMPARE(records[1].token_ids.size(), std::size_t{24});
  QCOMPARE(records[1].token_ids, longer.controller()->currentMessages().at(1).token_ids);
  QVERIFY(std::equal(cut.token_ids.begin(), cut.token_ids.end(), records[1].token_ids.begin()));

  // A reply that ended by itself cannot be continued.
  MessageRecord finished;
  finished.role = kvchat::app::MessageRole::Assistant;
  finished.text = QStringLiteral("x");
  finished.stats = QJsonObject{{"stop_reason", "eos"}};
  QVERIFY(!kvchat::app::is_continuable_reply(finished));
}

void ChatControllerTurnsTest::decode_times_are_recorded_per_step() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(20)));
  ChatController* controller = fixture.controller();
  QVERIFY(!controller->lastDecodeTimings());
  QSignalSpy changed(controller, &ChatController::decodeTimingsChanged);
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  QCOMPARE(changed.count(), 1);
  const auto stats = kvchat::app::stats_from_json(controller->currentMessages().at(1).stats);
  const auto timings = controller->lastDecodeTimings();
  QVERIFY(timings);
  QCOMPARE(timings->step_ms.size(), stats.generated_tokens - 1);  // every step after the first token
  QCOMPARE(timings->first_position, stats.prompt_tokens + 1);
  QCOMPARE(timings->cache_mode, kvchat::KvCacheMode::Contiguous);
  for (double ms : timings->step_ms) QVERIFY(ms > 0.0);
  QVERIFY(!controller->previousDecodeTimings());

  ChatSettings off = controller->settings();
  off.kv_cache_enabled = false;
  controller->applySettings(off);
  QVERIFY(controller->send("Tom ran"));
  QVERIFY(fixture.waitIdle());
  QCOMPARE(controller->lastDecodeTimings()->cache_mode, kvchat::KvCacheMode::Off);
  QCOMPARE(controller->previousDecodeTimings()->step_ms, timings->step_ms);
}

void ChatControllerTurnsTest::clearing_a_chats_cache_frees_it() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(8)));
  ChatController* controller = fixture.controller();
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  const qint64 id = controller->currentConversationId();
  QCOMPARE(controller->heldCaches().size(), 1);
  QCOMPARE(controller->heldCaches().first().conversation_id, id);
  QCOMPARE(controller->heldCaches().first().tokens, controller->cacheGauge().conversation_tokens);
  // The reply's snapshot on disk (written in the background) goes with it.
  auto snapshot_files = [&] {
    int files = 0;
    QDirIterator it(fixture.path("kv-snapshots"), {"*.kvsnap"}, QDir::Files, QDirIterator::Subdirectories);
    while (it.hasNext()) it.next(), ++files;
    return files;
  };
  QTRY_COMPARE_WITH_TIMEOUT(snapshot_files(), 1, 10000);
  QTRY_COMPARE_WITH_TIMEOUT(controller->cacheGauge().snapshot_tokens, controller->cacheGauge().conversation_tokens,
                            10000);
  QVERIFY(controller->clearCache(id));
  QTRY_VERIFY_WITH_TIMEOUT(controller->heldCaches().isEmpty(), 5000);
  QCOMPARE(controller->cacheGauge().conversation_tokens, 0);
  QCOMPARE(controller->cacheGauge().total_bytes, 0);
  QTRY_COMPARE_WITH_TIMEOUT(snapshot_files(), 0, 5000);
  QTRY_COMPARE_WITH_TIMEOUT(controller->cacheGauge().snapshot_tokens, qint64{0}, 5000);
  // The next turn prefills the whole chat again: nothing in memory, nothing on disk.
  QVERIFY(controller->send("Tom ran"));
  QVERIFY(fixture.waitIdle());
  const auto stats = kvchat::app::stats_from_json(controller->currentMessages().last().stats);
  QCOMPARE(stats.reused_tokens, 0);
  QCOMPARE(stats.restored_tokens, 0);
}

// After Regenerate and a switch back to the first reply, the next turn's prompt shares with the cache the
// first prompt and the two replies' common beginning: all of it is reused, compared id by id.
void ChatControllerTurnsTest::switching_alternatives_reuses_the_common_prefix() {
  ChatFixture fixture;
  ChatSettings settings = greedy_chat_settings(24);
  settings.temperature = 1.0;
  settings.top_k = 0;
  settings.top_p = 1.0;
  settings.min_p = 0.0;
  settings.seed = 0;  // a seed of its own for each turn: the replies differ somewhere
  QVERIFY(fixture.open(settings));
  ChatController* controller = fixture.controller();
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  QVERIFY(controller->regenerate());
  QVERIFY(fixture.waitIdle());
  auto records = controller->currentMessages();
  QCOMPARE(records.size(), 3);
  const MessageRecord first = records[1];
  const MessageRecord second = records[2];
  QVERIFY(kvchat::app::is_hidden_alternative(first));
  const auto second_stats = kvchat::app::stats_from_json(second.stats);
  QCOMPARE(second_stats.reused_tokens, second_stats.prompt_tokens - 1);  // Regenerate re-runs only the last id
  QVERIFY(!first.token_ids.empty());
  QVERIFY(!second.token_ids.empty());
  // What the cache holds after the second reply: its prompt and the reply's ids, all but the last sampled.
  const int cached = static_cast<int>(controller->cacheGauge().conversation_tokens);
  const int prompt_tokens = second_stats.prompt_tokens;
  QCOMPARE(cached, prompt_tokens + second_stats.generated_tokens - 1);

  QVERIFY(controller->showAlternative(first.id));
  QVERIFY(controller->send("The end"));
  QVERIFY(fixture.waitIdle());
  records = controller->currentMessages();
  const auto stats = kvchat::app::stats_from_json(records.last().stats);
  // The second reply's ids in the cache (an end-of-sequence id is not among a reply's ids).
  const std::size_t fed = static_cast<std::size_t>(cached - prompt_tokens);
  QVERIFY(fed <= second.token_ids.size());
  std::size_t common = 0;
  while (common < first.token_ids.size() && common < fed && first.token_ids[common] == second.token_ids[common])
    ++common;
  QCOMPARE(stats.reused_tokens, prompt_tokens + static_cast<int>(common));
  QCOMPARE(stats.prefilled_tokens, stats.prompt_tokens - stats.reused_tokens);
}

KVCHAT_TEST_MAIN(ChatControllerTurnsTest)

}  // namespace app_test_chat_controller_turns

#include "test_chat_controller_turns.moc"
