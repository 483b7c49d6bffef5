// ChatController on stories260K, greedy: deleting a message from the middle of a chat gives the next turn the
// prompt of what remains (a fresh encode, the cache reused only up to the deleted turn) and the reply a fresh
// chat with the same messages gives; a copied chat answers as the original would.
#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <vector>

#include "app/chat/chat_turn_runner.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "app/store/message_stats_json.h"
#include "common/chat_fixture.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_chat_edits {

using kvchat::ChatMessage;
using kvchat::TokenId;
using kvchat::app::ChatController;
using kvchat::app::ChatTurnRunner;
using kvchat::app::ConversationStore;
using kvchat::app::MessageRecord;
using kvchat::test::ChatFixture;
using kvchat::test::greedy_chat_settings;

class ChatEditsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase();
  void a_deleted_middle_turn_leaves_the_prompt_of_what_remains();
  void deleting_one_reply_shows_its_remaining_alternative();
  void a_copied_chat_answers_as_the_original();
  void editing_an_earlier_message_forks_the_chat();

 private:
  kvchat::LoadedModel model_;
};

namespace {

std::size_t common_prefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

void send_and_wait(ChatFixture& fixture, const QString& text) {
  QVERIFY(fixture.controller()->send(text));
  QVERIFY(fixture.waitIdle());
}

}  // namespace

void ChatEditsTest::initTestCase() {
  model_ = kvchat::load_model_directory(kvchat::test::shared_path("models/stories260K"));
  QVERIFY(model_.tokenizer);
}

void ChatEditsTest::a_deleted_middle_turn_leaves_the_prompt_of_what_remains() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(16)));
  ChatController* controller = fixture.controller();
  for (const char* text : {"Once upon a time", "Lily went to the park", "The sun was hot"}) {
    send_and_wait(fixture, QString::fromUtf8(text));
    if (QTest::currentTestFailed()) return;
  }
  const qint64 chat = controller->currentConversationId();
  const ChatTurnRunner runner(model_);
  // The third turn's prompt: the cache holds it, and the third reply after it.
  std::vector<ChatMessage> third_prompt = controller->engineMessages(chat);
  third_prompt.pop_back();
  const std::vector<TokenId> third_prompt_ids = runner.encode_messages(third_prompt);

  QList<MessageRecord> records = controller->currentMessages();
  QCOMPARE(records.size(), 6);
  QVERIFY(!controller->deleteMessage(records[2].id + 1000));  // not a message of this chat
  QVERIFY(controller->deleteMessage(records[2].id));          // "Lily went to the park" and its reply
  const QList<MessageRecord> remaining = controller->currentMessages();
  QCOMPARE(remaining.size(), 4);
  QCOMPARE(remaining[0].id, records[0].id);
  QCOMPARE(remaining[1].id, records[1].id);
  QCOMPARE(remaining[2].id, records[4].id);
  QCOMPARE(remaining[3].id, records[5].id);

  send_and_wait(fixture, QStringLiteral("Tom had a dog"));
  const MessageRecord reply = controller->currentMessages().last();
  QCOMPARE(reply.role, kvchat::app::MessageRole::Assistant);
  QVERIFY(!reply.text.isEmpty());
  std::vector<ChatMessage> prompt = controller->engineMessages(chat);
  prompt.pop_back();
  const std::vector<TokenId> expected_ids = runner.encode_messages(prompt);
  const auto stats = kvchat::app::stats_from_json(reply.stats);
  QCOMPARE(stats.prompt_tokens, static_cast<int>(expected_ids.size()));
  // Reused only up to where the deleted turn was: the cache was trimmed there, never used past it.
  const std::size_t shared = common_prefix(expected_ids, third_prompt_ids);
  QVERIFY(shared < expected_ids.size());
  QCOMPARE(stats.reused_tokens, static_cast<int>(shared));
  QCOMPARE(stats.prefilled_tokens, stats.prompt_tokens - stats.reused_tokens);

  // A fresh chat holding the same messages (the replies with their ids) answers the same, from no cache.
  ChatFixture fresh;
  qint64 fresh_chat = 0;
  {
    ConversationStore store(fresh.databasePath());
    fresh_chat = store.create_conversation(QStringLiteral("Fresh"));
    for (MessageRecord message : remaining) {
      message.conversation_id = fresh_chat;
      store.add_message(message);
    }
  }
  QVERIFY(fresh.open(greedy_chat_settings(16)));
  fresh.controller()->selectConversation(fresh_chat);
  send_and_wait(fresh, QStringLiteral("Tom had a dog"));
  const MessageRecord fresh_reply = fresh.controller()->currentMessages().last();
  const auto fresh_stats = kvchat::app::stats_from_json(fresh_reply.stats);
  QCOMPARE(fresh_stats.reused_tokens, 0);
  QCOMPARE(fresh_stats.prompt_tokens, stats.prompt_tokens);
  QCOMPARE(fresh_reply.text, reply.text);
  QCOMPARE(fresh_reply.token_ids, reply.token_ids);
}

void ChatEditsTest::deleting_one_reply_shows_its_remaining_alternative() {
  ChatFixture fixture;
  kvchat::app::ChatSettings settings = greedy_chat_settings(12);
  QVERIFY(fixture.open(settings));
  ChatController* controller = fixture.controller();
  send_and_wait(fixture, QStringLiteral("Once upon a time"));
  QVERIFY(controller->regenerate());
  QVERIFY(fixture.waitIdle());
  QList<MessageRecord> records = controller->currentMessages();
  QCOMPARE(records.size(), 3);
  QVERIFY(kvchat::app::is_hidden_alternative(records[1]));
  QVERIFY(!kvchat::app::is_hidden_alternative(records[2]));
  QVERIFY(controller->deleteMessage(records[2].id));  // the shown reply: the other one is shown now
  const QList<MessageRecord> after = controller->currentMessages();
  QCOMPARE(after.size(), 2);
  QCOMPARE(after[1].id, records[1].id);
  QVERIFY(!kvchat::app::is_hidden_alternative(after[1]));
  QCOMPARE(kvchat::app::messages_in_context(after).size(), 2);
  // The user message goes with every reply to it.
  QVERIFY(controller->deleteMessage(after[0].id));
  QVERIFY(controller->currentMessages().isEmpty());
}

void ChatEditsTest::a_copied_chat_answers_as_the_original() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(16)));
  ChatController* controller = fixture.controller();
  send_and_wait(fixture, QStringLiteral("Once upon a time"));
  const qint64 original = controller->currentConversationId();
  const QList<MessageRecord> before = controller->currentMessages();
  const qint64 copy = controller->duplicateConversation(original);
  QVERIFY(copy > 0);
  QCOMPARE(controller->currentConversationId(), copy);
  QCOMPARE(controller->conversation(copy)->title, controller->conversation(original)->title + " (copy)");
  const QList<MessageRecord> copied = controller->currentMessages();
  QCOMPARE(copied.size(), before.size());
  for (int i = 0; i < before.size(); ++i) {
    QCOMPARE(copied[i].text, before[i].text);
    QCOMPARE(copied[i].token_ids, before[i].token_ids);
    QCOMPARE(copied[i].stats, before[i].stats);
  }
  send_and_wait(fixture, QStringLiteral("Tom had a dog"));
  const MessageRecord copy_reply = controller->currentMessages().last();
  controller->selectConversation(original);
  send_and_wait(fixture, QStringLiteral("Tom had a dog"));
  const MessageRecord original_reply = controller->currentMessages().last();
  QCOMPARE(copy_reply.text, original_reply.text);
  QCOMPARE(copy_reply.token_ids, original_reply.token_ids);
  QCOMPARE(controller->conversation(original)->message_count, 4);
}

// Editing the second of three messages: the chat forks there. The shown path is the first turn, the edit and
// its reply; the model was given only that (its prompt counts the shown path's tokens, the cache reused up to
// where the paths part); switching back shows the old branch exactly, and a turn there reuses the prefix the
// two branches share. The branches are in the file: a second reader sees the same.
void ChatEditsTest::editing_an_earlier_message_forks_the_chat() {
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(16)));
  ChatController* controller = fixture.controller();
  for (const char* text : {"Once upon a time", "Lily went to the park", "The sun was hot"}) {
    send_and_wait(fixture, QString::fromUtf8(text));
    if (QTest::currentTestFailed()) return;
  }
  const qint64 chat = controller->currentConversationId();
  const ChatTurnRunner runner(model_);
  std::vector<ChatMessage> third_prompt = controller->engineMessages(chat);
  third_prompt.pop_back();
  const std::vector<TokenId> third_prompt_ids = runner.encode_messages(third_prompt);
  const QList<MessageRecord> original = controller->currentMessages();
  QCOMPARE(original.size(), 6);

  QVERIFY(!controller->editMessage(original[1].id, QStringLiteral("Tom had a dog")));  // a reply is not editable
  QVERIFY(controller->editMessage(original[2].id, QStringLiteral("Tom had a dog")));
  QVERIFY(fixture.waitIdle());
  // The chat's snapshot on disk is written in the background: until the edit's state replaces the third
  // turn's, a turn on the first branch could restore more than the live cache shares with it.
  QTRY_COMPARE_WITH_TIMEOUT(controller->cacheGauge().snapshot_tokens, controller->cacheGauge().conversation_tokens,
                            10000);
  const QList<MessageRecord> edited = controller->currentMessages();
  QCOMPARE(edited.size(), 4);
  QCOMPARE(edited[0].id, original[0].id);
  QCOMPARE(edited[1].id, original[1].id);
  QCOMPARE(edited[2].text, QStringLiteral("Tom had a dog"));
  QCOMPARE(edited[2].forked_from, original[2].id);
  QCOMPARE(edited[3].role, kvchat::app::MessageRole::Assistant);
  QVERIFY(!edited[3].text.isEmpty());
  const QHash<qint64, QList<qint64>> branches = controller->currentBranches();
  QCOMPARE(branches.size(), 1);
  QCOMPARE(branches.value(edited[2].id), (QList<qint64>{original[2].id, edited[2].id}));

  // The model was given the shown path only: the first turn and the edit.
  std::vector<ChatMessage> edit_prompt = controller->engineMessages(chat);
  QCOMPARE(edit_prompt.size(), std::size_t{4});
  edit_prompt.pop_back();
  QCOMPARE(QString::fromStdString(edit_prompt.back().content), QStringLiteral("Tom had a dog"));
  const std::vector<TokenId> edit_prompt_ids = runner.encode_messages(edit_prompt);
  const auto edit_stats = kvchat::app::stats_from_json(edited[3].stats);
  QCOMPARE(edit_stats.prompt_tokens, static_cast<int>(edit_prompt_ids.size()));
  const std::size_t shared_with_third = common_prefix(edit_prompt_ids, third_prompt_ids);
  QVERIFY(shared_with_third > 0 && shared_with_third < edit_prompt_ids.size());
  QCOMPARE(edit_stats.reused_tokens, static_cast<int>(shared_with_third));

  // Back to the first branch: exactly as it was.
  QVERIFY(!controller->showBranch(original[1].id));  // a reply starts no branch
  QVERIFY(controller->showBranch(original[2].id));
  const QList<MessageRecord> restored = controller->currentMessages();
  QCOMPARE(restored.size(), original.size());
  for (int i = 0; i < original.size(); ++i) {
    QCOMPARE(restored[i].id, original[i].id);
    QCOMPARE(restored[i].text, original[i].text);
    QCOMPARE(restored[i].token_ids, original[i].token_ids);
  }
  QCOMPARE(controller->currentBranches().value(original[2].id), (QList<qint64>{original[2].id, edited[2].id}));

  // A turn on it reuses what the cache (holding the edit's branch) shares with it.
  send_and_wait(fixture, QStringLiteral("Tom ran home"));
  const QList<MessageRecord> continued = controller->currentMessages();
  QCOMPARE(continued.size(), 8);
  std::vector<ChatMessage> back_prompt = controller->engineMessages(chat);
  back_prompt.pop_back();
  const std::vector<TokenId> back_prompt_ids = runner.encode_messages(back_prompt);
  const auto back_stats = kvchat::app::stats_from_json(continued.last().stats);
  QCOMPARE(back_stats.prompt_tokens, static_cast<int>(back_prompt_ids.size()));
  const std::size_t shared_with_edit = common_prefix(back_prompt_ids, edit_prompt_ids);
  QVERIFY(shared_with_edit > 0);
  QCOMPARE(back_stats.reused_tokens, static_cast<int>(shared_with_edit));
  QCOMPARE(back_stats.prefilled_tokens, back_stats.prompt_tokens - back_stats.reused_tokens);

  // The file holds both branches and which one is shown.
  ConversationStore reader(fixture.databasePath(), kvchat::app::StoreOpenMode::ReadOnly);
  const QList<MessageRecord> stored = reader.messages(chat);
  QCOMPARE(stored.size(), 10);
  QCOMPARE(kvchat::app::messages_on_shown_path(stored).size(), 8);
  QVERIFY(controller->showBranch(edited[2].id));
  QCOMPARE(kvchat::app::messages_on_shown_path(reader.messages(chat)).size(), 4);

  // A search hit in the hidden branch (the first branch's last reply) brings that branch back.
  QVERIFY(controller->revealMessage(continued.last().id));
  QCOMPARE(controller->currentMessages().size(), 8);
  QCOMPARE(controller->currentMessages().last().id, continued.last().id);
  QVERIFY(controller->revealMessage(continued.last().id));  // already shown: nothing to do
  QCOMPARE(controller->currentMessages().size(), 8);
  QVERIFY(controller->revealMessage(edited[3].id));  // and the edit's reply, the other way
  QCOMPARE(controller->currentMessages().size(), 4);
  QVERIFY(!controller->revealMessage(999999));
}

KVCHAT_TEST_MAIN(ChatEditsTest)

}  // namespace app_test_chat_edits

#include "test_chat_edits.moc"
