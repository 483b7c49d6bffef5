// Titles by the model (Settings > Title new chats with the model), on stories260K: off by default; on, a new
// chat's first reply is followed by a separate short generation whose first line becomes the title, without
// touching the chat's cache; a title the user set is never replaced.
#include <QtTest>
#include "common/test_suite.h"

#include <QSignalSpy>

#include "app/store/chat_history.h"
#include "app/store/message_stats_json.h"
#include "common/chat_fixture.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_chat_model_titles {

using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::test::ChatFixture;
using kvchat::test::greedy_chat_settings;

class ChatModelTitlesTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void off_by_default_the_first_message_titles_the_chat();
  void the_model_titles_a_new_chat_without_touching_its_cache();
  void a_title_set_by_the_user_is_kept();
};

void ChatModelTitlesTest::off_by_default_the_first_message_titles_the_chat() {
  QVERIFY(!ChatSettings{}.model_titles);
  ChatFixture fixture;
  QVERIFY(fixture.open(greedy_chat_settings(12)));
  QSignalSpy titled(fixture.controller(), &ChatController::conversationTitled);
  QVERIFY(fixture.controller()->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  QTest::qWait(200);  // nothing is on its way: no title was asked for
  QCOMPARE(titled.count(), 0);
  QCOMPARE(fixture.controller()->conversation(fixture.controller()->currentConversationId())->title,
           QStringLiteral("Once upon a time"));
}

void ChatModelTitlesTest::the_model_titles_a_new_chat_without_touching_its_cache() {
  ChatFixture fixture;
  ChatSettings settings = greedy_chat_settings(12);
  settings.model_titles = true;
  QVERIFY(fixture.open(settings));
  ChatController* controller = fixture.controller();
  QSignalSpy titled(controller, &ChatController::conversationTitled);
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  const qint64 chat = controller->currentConversationId();
  const qint64 cached_before = controller->cacheGauge().conversation_tokens;
  QVERIFY(cached_before > 0);
  QVERIFY(titled.wait(60000));
  QCOMPARE(titled.first().at(0).toLongLong(), chat);
  const QString title = titled.first().at(1).toString();
  QCOMPARE(controller->conversation(chat)->title, title);
  QCOMPARE(title, QStringLiteral("Lily was very happy and said, \"Thank yo\u2026"));
  // The chat's own session is as the reply left it: the next turn reuses all of it.
  QCOMPARE(controller->cacheGauge().conversation_tokens, cached_before);
  QVERIFY(controller->send("Lily"));
  QVERIFY(fixture.waitIdle());
  const auto stats = kvchat::app::stats_from_json(controller->currentMessages().last().stats);
  QCOMPARE(stats.reused_tokens, static_cast<int>(cached_before));
  // Only the first reply asks for a title.
  QTest::qWait(200);
  QCOMPARE(titled.count(), 1);
}

void ChatModelTitlesTest::a_title_set_by_the_user_is_kept() {
  ChatFixture fixture;
  ChatSettings settings = greedy_chat_settings(12);
  settings.model_titles = true;
  QVERIFY(fixture.open(settings));
  ChatController* controller = fixture.controller();
  QSignalSpy titled(controller, &ChatController::conversationTitled);
  // Renamed before the first reply: no title is asked for.
  const qint64 renamed_first = controller->newConversation();
  controller->renameConversation(renamed_first, QStringLiteral("My stories"));
  QVERIFY(controller->send("Once upon a time"));
  QVERIFY(fixture.waitIdle());
  QTest::qWait(200);
  QCOMPARE(titled.count(), 0);
  QCOMPARE(controller->conversation(renamed_first)->title, QStringLiteral("My stories"));
  // Renamed while the title is being written (right after it was asked for, before the engine's answer can
  // arrive): the user's title stays.
  const qint64 chat = controller->newConversation();
  QMetaObject::Connection rename_once;
  rename_once = connect(controller, &ChatController::lastReplyStatsChanged, this, [&] {
    QObject::disconnect(rename_once);
    controller->renameConversation(chat, QStringLiteral("Dogs"));
  });
  QVERIFY(controller->send("Tom had a dog"));
  QVERIFY(fixture.waitIdle());
  QVERIFY(titled.wait(60000));
  QCOMPARE(titled.first().at(0).toLongLong(), chat);
  QCOMPARE(titled.first().at(1).toString(), QStringLiteral("Dogs"));
  QCOMPARE(controller->conversation(chat)->title, QStringLiteral("Dogs"));
}

KVCHAT_TEST_GUILESS_MAIN(ChatModelTitlesTest)

}  // namespace app_test_chat_model_titles

#include "test_chat_model_titles.moc"
