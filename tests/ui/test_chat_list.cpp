// The chat list's own commands, offscreen over stories260K: pinned chats lead the list with a marker, from the
// Chat menu or the list's context menu, and the shortcuts sheet lists the key.
#include <QtTest>
#include "common/test_suite.h"

#include <QAction>
#include <QLineEdit>
#include <QListView>
#include <QTableWidget>
#include <QTextBrowser>
#include <QToolButton>

#include "app/store/conversation_store.h"
#include "common/chat_fixture.h"
#include "common/list_view_rows.h"
#include "ui/chat_view.h"
#include "ui/main_window.h"
#include "ui/message_widget.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_chat_list {

using kvchat::app::ChatController;
using kvchat::app::ConversationStore;
using kvchat::app::MessageRecord;
using kvchat::ui::MainWindow;
using kvchat::ui::MessageWidget;

class ChatListTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void cleanup();
  void pinned_chats_lead_the_list_with_a_marker();
  void the_search_field_filters_the_list_and_finds_the_message();
  void a_chat_is_duplicated_and_a_message_deleted();

 private:
  // Chats saved before the window opens, oldest first, each with one user message.
  QList<qint64> save_chats(const QStringList& titles);
  void open_window();
  QStringList list_texts() const;
  ChatController* controller() const { return fixture_->controller(); }

  std::unique_ptr<kvchat::test::ChatFixture> fixture_ = std::make_unique<kvchat::test::ChatFixture>();
  std::unique_ptr<MainWindow> window_;
};

void ChatListTest::cleanup() {
  window_.reset();
  fixture_ = std::make_unique<kvchat::test::ChatFixture>();
}

QList<qint64> ChatListTest::save_chats(const QStringList& titles) {
  ConversationStore store(fixture_->databasePath());
  QList<qint64> ids;
  for (const QString& title : titles) {
    MessageRecord message;
    message.conversation_id = store.create_conversation(title);
    message.role = kvchat::app::MessageRole::User;
    message.text = QStringLiteral("About ") + title;
    store.add_message(message);
    ids << message.conversation_id;
  }
  return ids;
}

void ChatListTest::open_window() {
  QVERIFY(fixture_->open(kvchat::test::greedy_chat_settings()));
  window_ = std::make_unique<MainWindow>(controller());
  window_->show();
  QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
}

QStringList ChatListTest::list_texts() const {
  QStringList texts;
  for (int row = 0; row < kvchat::test::list_count(window_->conversationList()); ++row)
    texts << kvchat::test::list_text(window_->conversationList(), row);
  return texts;
}

void ChatListTest::pinned_chats_lead_the_list_with_a_marker() {
  const QList<qint64> ids = save_chats({QStringLiteral("Apples"), QStringLiteral("Bees"), QStringLiteral("Clouds")});
  open_window();
  if (QTest::currentTestFailed()) return;
  QListView* list = window_->conversationList();
  QCOMPARE(list_texts(), (QStringList{"Clouds", "Bees", "Apples"}));

  auto* pin = window_->findChild<QAction*>(QStringLiteral("pinChatAction"));
  QVERIFY(pin);
  QCOMPARE(pin->shortcut(), QKeySequence(QStringLiteral("Ctrl+Shift+P")));
  // In the list's context menu too.
  QCOMPARE(list->contextMenuPolicy(), Qt::ActionsContextMenu);
  QVERIFY(list->actions().contains(pin));

  kvchat::test::select_list_row(list, 2);  // Apples, the oldest
  QCOMPARE(controller()->currentConversationId(), ids[0]);
  QCOMPARE(pin->text(), QStringLiteral("&Pin the chat"));
  pin->trigger();
  const QString marker = MainWindow::pinnedMarker();
  QCOMPARE(list_texts(), (QStringList{marker + "Apples", "Clouds", "Bees"}));
  QCOMPARE(kvchat::test::list_row(list, 0).data(MainWindow::kPinnedRole).toBool(), true);
  QCOMPARE(kvchat::test::list_row(list, 1).data(MainWindow::kPinnedRole).toBool(), false);
  QCOMPARE(kvchat::test::current_list_row(list), 0);  // still the selected chat
  QCOMPARE(pin->text(), QStringLiteral("Un&pin the chat"));
  QVERIFY(controller()->conversation(ids[0])->pinned);

  kvchat::test::select_list_row(list, 2);  // Bees
  QCOMPARE(pin->text(), QStringLiteral("&Pin the chat"));
  pin->trigger();
  // Among the pinned, the most recently updated first, as among the others.
  QCOMPARE(list_texts(), (QStringList{marker + "Bees", marker + "Apples", "Clouds"}));

  // The sheet lists the key, read from the action.
  QDialog* sheet = window_->openShortcutsSheet();
  auto* table = sheet->findChild<QTableWidget*>(QStringLiteral("shortcutsTable"));
  QVERIFY(table);
  QStringList pin_keys;
  for (int row = 0; row < table->rowCount(); ++row)
    if (table->item(row, 1)->text().startsWith(QStringLiteral("Unpin the chat")))
      pin_keys << table->item(row, 2)->text();
  QCOMPARE(pin_keys, (QStringList{QKeySequence(QStringLiteral("Ctrl+Shift+P")).toString(QKeySequence::NativeText)}));
  sheet->close();

  kvchat::test::select_list_row(list, 1);  // Apples
  pin->trigger();                          // unpinned: back among the others, in its place by date
  QCOMPARE(list_texts(), (QStringList{marker + "Bees", "Clouds", "Apples"}));
  QVERIFY(!controller()->conversation(ids[0])->pinned);
}

// Chat > Duplicate the chat (also in the list's context menu) selects the copy; a message's Delete button,
// once confirmed, deletes it and its replies from that chat only.
void ChatListTest::a_chat_is_duplicated_and_a_message_deleted() {
  const QList<qint64> ids = save_chats({QStringLiteral("Apples"), QStringLiteral("Bees")});
  open_window();
  if (QTest::currentTestFailed()) return;
  QListView* list = window_->conversationList();
  kvchat::test::select_list_row(list, 1);  // Apples
  auto* duplicate = window_->findChild<QAction*>(QStringLiteral("duplicateChatAction"));
  QVERIFY(duplicate);
  QVERIFY(list->actions().contains(duplicate));
  duplicate->trigger();
  QCOMPARE(list_texts(), (QStringList{"Apples (copy)", "Bees", "Apples"}));
  QCOMPARE(kvchat::test::current_list_row(list), 0);
  const qint64 copy = controller()->currentConversationId();
  QVERIFY(copy != ids[0]);
  QCOMPARE(controller()->currentMessages().size(), 1);
  QCOMPARE(controller()->currentMessages()[0].text, QStringLiteral("About Apples"));

  QStringList asked;
  bool answer = false;
  window_->setConfirmHandler([&](const QString&, const QString& text) {
    asked << text;
    return answer;
  });
  QList<MessageWidget*> widgets = window_->chatView()->messageWidgets();
  QCOMPARE(widgets.size(), 1);
  QVERIFY(widgets[0]->deleteButton());
  widgets[0]->deleteButton()->click();  // declined: nothing changes
  QCOMPARE(asked.size(), 1);
  QCOMPARE(controller()->currentMessages().size(), 1);
  answer = true;
  window_->chatView()->messageWidgets()[0]->deleteButton()->click();
  QCOMPARE(asked.size(), 2);
  QVERIFY(controller()->currentMessages().isEmpty());
  QCOMPARE(controller()->conversation(ids[0])->message_count, 1);  // the original keeps its message
}

// Typing in the search field leaves only the chats it finds; picking one goes to its first matching message
// with the word selected; Chat > Find in the chat steps through a transcript's occurrences.
void ChatListTest::the_search_field_filters_the_list_and_finds_the_message() {
  const QList<qint64> ids = save_chats({QStringLiteral("Apples"), QStringLiteral("Bees"), QStringLiteral("Clouds")});
  qint64 reply_id = 0;
  {
    ConversationStore store(fixture_->databasePath());
    MessageRecord reply;
    reply.conversation_id = ids[1];
    reply.role = kvchat::app::MessageRole::Assistant;
    reply.text = QStringLiteral("Bees make honey. Honey keeps for years.");
    reply_id = store.add_message(reply);
  }
  open_window();
  if (QTest::currentTestFailed()) return;
  QLineEdit* search = window_->chatSearchField();
  QVERIFY(search);
  QTest::keyClicks(search, QStringLiteral("hon"));
  QCOMPARE(list_texts(), (QStringList{"Bees"}));
  QTest::keyClicks(search, QStringLiteral("ey \"AND"));  // typed syntax is text: no chat has "AND"
  QCOMPARE(list_texts(), QStringList{});
  search->clear();
  QCOMPARE(list_texts(), (QStringList{"Bees", "Clouds", "Apples"}));
  QTest::keyClicks(search, QStringLiteral("about"));  // each chat's first message
  QCOMPARE(list_texts(), (QStringList{"Bees", "Clouds", "Apples"}));
  search->setText(QStringLiteral("Honey"));
  QCOMPARE(list_texts(), (QStringList{"Bees"}));
  QCOMPARE(kvchat::test::list_row(window_->conversationList(), 0).data(MainWindow::kFirstMatchRole).toLongLong(),
           reply_id);
  kvchat::test::select_list_row(window_->conversationList(), 0);
  QCOMPARE(controller()->currentConversationId(), ids[1]);
  QCOMPARE(window_->chatView()->foundMessageId(), reply_id);

  auto* find = window_->findChild<QAction*>(QStringLiteral("findInChatAction"));
  QVERIFY(find);
  QCOMPARE(find->shortcut(), QKeySequence(QKeySequence::Find));
  find->trigger();
  QLineEdit* field = window_->findInChatField();
  QVERIFY(field->isVisible());
  QTest::keyClicks(field, QStringLiteral("honey"));
  QStringList selections;
  for (int i = 0; i < 3; ++i) {
    QTest::keyClick(field, Qt::Key_Return);
    QCOMPARE(window_->chatView()->foundMessageId(), reply_id);
    for (QTextBrowser* view : window_->chatView()->findChildren<QTextBrowser*>())
      if (view->textCursor().hasSelection())
        selections << QStringLiteral("%1@%2").arg(view->textCursor().selectedText()).arg(view->textCursor().position());
  }
  // The two occurrences in turn, then round again to the first.
  QCOMPARE(selections.size(), 3);
  QVERIFY(selections[0] != selections[1]);
  QCOMPARE(selections[2], selections[0]);
  for (const QString& selection : selections)
    QVERIFY2(selection.startsWith(QStringLiteral("honey@"), Qt::CaseInsensitive), qPrintable(selection));
  QTest::keyClick(field, Qt::Key_Escape);
  QVERIFY(!field->isVisible());
}

KVCHAT_TEST_MAIN(ChatListTest)

}  // namespace ui_test_chat_list

#include "test_chat_list.moc"
