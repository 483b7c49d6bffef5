// The main window, offscreen over stories260K, as a new user met it a second time: the live speed is always
// readable and shown in the streaming reply's header; a reply stopped by the context limit offers the ways
// out; the token counter counts an edit as what it replaces; a continued reply keeps each part's figures;
// figures that no longer apply are cleared, and a restarted chat shows its snapshot on disk; passing notices
// never move the transcript; every chat action has keys, listed in a sheet built from the actions; the
// system prompt dialog gives the focus back; a waiting message can be withdrawn; the text size applies to
// the transcript; a small window and the Settings dialog fit; and the small things (copy feedback, an empty
// file, quitting mid-reply, equal titles, the welcome text's contrast).
#include <QtTest>
#include "common/test_suite.h"

#include <QChart>
#include <QChartView>
#include <QClipboard>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDir>
#include <QDockWidget>
#include <QGraphicsTextItem>
#include <QInputDialog>
#include <QLabel>
#include <QLegend>
#include <QListView>
#include <QMenu>
#include <QMenuBar>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QScrollArea>
#include <QScrollBar>
#include <QSplitter>
#include <QStatusBar>
#include <QTableWidget>
#include <QToolButton>
#include <QValueAxis>

#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "common/chat_fixture.h"
#include "common/list_view_rows.h"
#include "common/model_folder_copy.h"
#include "ui/appearance.h"
#include "ui/caches_dialog.h"
#include "ui/chat_view.h"
#include "ui/code_block_widget.h"
#include "ui/decode_chart_panel.h"
#include "ui/elided_label.h"
#include "ui/main_window.h"
#include "ui/message_body.h"
#include "ui/message_input.h"
#include "ui/message_text_view.h"
#include "ui/message_widget.h"
#include "ui/settings_dialog.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_main_window_usability {

using kvchat::app::BackendHost;
using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::ui::ElidedLabel;
using kvchat::ui::MainWindow;
using kvchat::ui::MessageWidget;

namespace {

// WCAG's contrast ratio of two colours (1 to 21).
double contrast(const QColor& a, const QColor& b) {
  const auto luminance = [](const QColor& colour) {
    const auto channel = [](double value) {
      return value <= 0.03928 ? value / 12.92 : std::pow((value + 0.055) / 1.055, 2.4);
    };
    return 0.2126 * channel(colour.redF()) + 0.7152 * channel(colour.greenF()) + 0.0722 * channel(colour.blueF());
  };
  const double x = luminance(a), y = luminance(b);
  return (std::max(x, y) + 0.05) / (std::min(x, y) + 0.05);
}

}  // namespace

class MainWindowUsabilityTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void cleanup();
  void the_live_speed_is_never_elided_and_shows_in_the_streaming_reply();
  void a_reply_stopped_by_the_context_limit_offers_the_ways_out();
  void the_token_counter_leaves_out_the_message_being_replaced();
  void a_continued_reply_keeps_each_parts_figures();
  void figures_that_no_longer_apply_are_cleared();
  void a_restarted_chat_shows_its_snapshot_on_disk();
  void passing_notices_do_not_move_the_transcript();
  void every_chat_action_has_keys_listed_in_the_sheet();
  void the_system_prompt_dialog_gives_the_focus_back();
  void a_waiting_message_can_be_withdrawn();
  void the_text_size_applies_to_the_transcript();
  void a_small_window_shrinks_the_sidebar_and_elides_titles();
  void the_docked_chart_leaves_room_for_the_transcript();
  void the_settings_dialog_fits_a_small_screen();
  void copy_buttons_say_copied();
  void an_empty_file_is_called_empty();
  void quitting_mid_reply_is_labelled_as_such();
  void equal_titles_are_told_apart_by_date();
  void the_welcome_text_is_legible();
  void the_dark_appearance_is_legible_and_kept();
  void switching_appearance_recolours_warnings_and_errors_at_once();

 private:
  void open_window(const ChatSettings& settings);
  ChatController* controller() const { return fixture_->controller(); }
  void type_and_send(const QString& text) {
    QTest::keyClicks(window_->messageInput(), text);
    QTest::keyClick(window_->messageInput(), Qt::Key_Return);
  }
  void activate() {
    QApplication::setActiveWindow(window_.get());
    QVERIFY(QTest::qWaitForWindowActive(window_.get()));
  }
  MessageWidget* last_widget() const { return window_->chatView()->messageWidgets().back(); }

  std::unique_ptr<kvchat::test::ChatFixture> fixture_ = std::make_unique<kvchat::test::ChatFixture>();
  std::unique_ptr<MainWindow> window_;
};

void MainWindowUsabilityTest::cleanup() {
  window_.reset();
  kvchat::ui::apply_appearance(kvchat::ui::Appearance::System);  // the palette is the application's
  fixture_ = std::make_unique<kvchat::test::ChatFixture>();
}

void MainWindowUsabilityTest::open_window(const ChatSettings& settings) {
  QVERIFY(fixture_->open(settings));
  window_ = std::make_unique<MainWindow>(controller());
  window_->show();
  QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
  window_->messageInput()->setFocus();
}

void MainWindowUsabilityTest::the_live_speed_is_never_elided_and_shows_in_the_streaming_reply() {
  ChatSettings settings = kvchat::test::greedy_chat_settings(200);
  settings.kv_cache_enabled = false;  // slow on purpose: the live figures are shown while it streams
  open_window(settings);
  QCOMPARE(window_->size(), QSize(1240, 780));
  QStringList header_figures;
  connect(controller(), &ChatController::decodeSpeedChanged, this, [&] {
    if (!controller()->isGenerating()) return;
    if (MessageWidget* reply = window_->chatView()->messageWidget(controller()->generatingMessageId()))
      header_figures << reply->liveFigures();
  });
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  QVERIFY(!header_figures.isEmpty());
  QVERIFY2(header_figures.back().startsWith("decoding ") && header_figures.back().contains(" tok/s"),
           qPrintable(header_figures.back()));
  QCOMPARE(last_widget()->liveFigures(), QString());  // finished: its stats line says it
  QCoreApplication::processEvents();
  auto* speed = qobject_cast<ElidedLabel*>(window_->speedLabel());
  QVERIFY2(speed->fullText().startsWith("decode ") && speed->fullText().endsWith(" tok"),
           qPrintable(speed->fullText()));
  QCOMPARE(speed->shownText(), speed->fullText());
  // Narrower: the other fields give way, the speed keeps its whole text.
  window_->resize(800, 500);
  QCoreApplication::processEvents();
  QCOMPARE(speed->shownText(), speed->fullText());
  int elided = 0;
  for (const char* name : {"modelLabel", "replyStatsLabel", "cacheLabel"}) {
    auto* field = window_->statusBar()->findChild<ElidedLabel*>(name);
    QVERIFY(field);
    if (field->shownText() != field->fullText()) ++elided;
  }
  QVERIFY(elided > 0);
}

void MainWindowUsabilityTest::a_reply_stopped_by_the_context_limit_offers_the_ways_out() {
  ChatSettings settings = kvchat::test::greedy_chat_settings(200);
  settings.context_limit = 40;  // "stop" policy: the reply runs into it
  open_window(settings);
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  const auto records = controller()->currentMessages();
  QCOMPARE(records.back().stats.value("stop_reason").toString(), QStringLiteral("context_full"));
  MessageWidget* reply = last_widget();
  QCoreApplication::processEvents();
  auto* note = reply->findChild<QLabel*>("cutShortLabel");
  QVERIFY(note);
  QVERIFY2(note->isVisible() && note->text().startsWith("Stopped at the context limit"), qPrintable(note->text()));
  QVERIFY(reply->newChatButton()->isVisible());
  QVERIFY(reply->dropOldestTurnsButton()->isVisible());
  reply->dropOldestTurnsButton()->click();
  QCOMPARE(controller()->settings().context_overflow, kvchat::app::ContextOverflowPolicy::DropOldestTurns);
  QTRY_VERIFY(!last_widget()->dropOldestTurnsButton()->isVisible());  // it is the policy now
  QVERIFY(last_widget()->newChatButton()->isVisible());
  const qint64 before = controller()->currentConversationId();
  last_widget()->newChatButton()->click();
  QVERIFY(controller()->currentConversationId() != before);
  QCOMPARE(controller()->currentMessages().size(), 0);
}

void MainWindowUsabilityTest::the_token_counter_leaves_out_the_message_being_replaced() {
  open_window(kvchat::test::greedy_chat_settings(40));
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  const QString text = controller()->currentMessages().at(0).text;
  const auto appended = controller()->measureDraft(text);
  const auto replacing = controller()->measureDraft(text, /*replacing_last_message=*/true);
  QVERIFY(appended && replacing);
  // Replacing the only message leaves the chat as a new one holding just that message.
  const int reply_and_message = appended->prompt_tokens - replacing->prompt_tokens;
  QVERIFY2(reply_and_message > 40, qPrintable(QString::number(reply_and_message)));
  window_->findChild<QPushButton*>("editButton")->click();
  QCOMPARE(window_->messageInput()->toPlainText(), text);
  QTRY_VERIFY(!window_->tokenCounterLabel()->text().isEmpty());
  const QString expected = QStringLiteral("%1 tokens \u00b7 %2 of %3 left in the context after it")
                               .arg(replacing->draft_tokens)
                               .arg(replacing->context_limit - replacing->prompt_tokens)
                               .arg(replacing->context_limit);
  QCOMPARE(window_->tokenCounterLabel()->text(), expected);
  const qint64 first = controller()->currentConversationId();
  window_->findChild<QPushButton*>("newChatButton")->click();
  const auto alone = controller()->measureDraft(text);
  QCOMPARE(alone->prompt_tokens, replacing->prompt_tokens);
  controller()->selectConversation(first);
}

void MainWindowUsabilityTest::a_continued_reply_keeps_each_parts_figures() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  const qint64 reply_id = controller()->currentMessages().back().id;
  QVERIFY(controller()->continueReply());
  QVERIFY(fixture_->waitIdle());
  const auto reply = controller()->currentMessages().back();
  QCOMPARE(reply.id, reply_id);
  QVERIFY(reply.stats.value(kvchat::app::kReplyContinuedKey).toBool());
  const QJsonArray earlier = reply.stats.value(kvchat::app::kReplyEarlierPartsKey).toArray();
  QCOMPARE(earlier.size(), 1);
  QCOMPARE(earlier[0].toObject().value("generated_tokens").toInt(), 8);
  QCOMPARE(earlier[0].toObject().value("stop_reason").toString(), QStringLiteral("max_tokens"));
  QCOMPARE(reply.stats.value("generated_tokens").toInt(), 8);
  QCoreApplication::processEvents();
  const QString stats = last_widget()->statsText();
  QVERIFY2(stats.startsWith("16 tokens in 2 parts (8 + 8)\npart 1: prefill "), qPrintable(stats));
  QVERIFY2(stats.contains("\npart 2: prefill "), qPrintable(stats));

  // A third part keeps both earlier ones, oldest first.
  QVERIFY(controller()->continueReply());
  QVERIFY(fixture_->waitIdle());
  const QJsonArray three =
      controller()->currentMessages().back().stats.value(kvchat::app::kReplyEarlierPartsKey).toArray();
  QCOMPARE(three.size(), 2);
  QVERIFY(!three[1].toObject().contains(kvchat::app::kReplyEarlierPartsKey));
  QVERIFY(last_widget()->statsText().startsWith("24 tokens in 3 parts (8 + 8 + 8)"));
}

void MainWindowUsabilityTest::figures_that_no_longer_apply_are_cleared() {
  open_window(kvchat::test::greedy_chat_settings(12));
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  QCoreApplication::processEvents();
  QVERIFY(!window_->speedLabel()->text().isEmpty());
  QVERIFY(!window_->replyStatsLabel()->text().isEmpty());
  // Another model (the same files, loaded again): the previous one's figures say nothing about it.
  QSignalSpy loaded(&controller()->backendHost(), &BackendHost::modelLoaded);
  window_->openModel(kvchat::test::stories_model_directory());
  QVERIFY(loaded.wait(60000));
  QCoreApplication::processEvents();
  QCOMPARE(window_->speedLabel()->text(), QString());
  QCOMPARE(window_->replyStatsLabel()->text(), QString());

  // A deleted chat's figures go with it.
  type_and_send("Tom ran");
  QVERIFY(fixture_->waitIdle());
  QCoreApplication::processEvents();
  QVERIFY(!window_->speedLabel()->text().isEmpty());
  window_->setConfirmHandler([](const QString&, const QString&) { return true; });
  controller()->deleteConversation(controller()->currentConversationId());
  QCoreApplication::processEvents();
  QCOMPARE(window_->speedLabel()->text(), QString());
  QCOMPARE(window_->replyStatsLabel()->text(), QString());
}

void MainWindowUsabilityTest::a_restarted_chat_shows_its_snapshot_on_disk() {
  ChatSettings settings = kvchat::test::greedy_chat_settings(16);
  open_window(settings);
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  const qint64 chat = controller()->currentConversationId();
  window_.reset();
  fixture_->close();  // writes the queued snapshot

  open_window(settings);
  controller()->selectConversation(chat);
  const auto* gauge = qobject_cast<ElidedLabel*>(window_->cacheLabel());
  QTRY_VERIFY2(gauge->fullText().startsWith("KV on disk: "), qPrintable(gauge->fullText()));
  QVERIFY2(gauge->fullText().contains(" tokens, ") && gauge->fullText().contains("(restored on the next turn)"),
           qPrintable(gauge->fullText()));
  const auto figures = controller()->cacheGauge();
  QVERIFY(figures.snapshot_tokens > 16);
  QVERIFY(gauge->fullText().startsWith(QStringLiteral("KV on disk: %1 tokens").arg(figures.snapshot_tokens)));
}

void MainWindowUsabilityTest::passing_notices_do_not_move_the_transcript() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  QCoreApplication::processEvents();
  const QRect transcript = window_->chatView()->geometry();
  window_->findChild<QAction*>("clearCacheAction")->trigger();
  QVERIFY(window_->noticeLabel()->isVisible());
  QCoreApplication::processEvents();
  QCOMPARE(window_->chatView()->geometry(), transcript);
  window_->findChild<QPushButton*>("editButton")->click();
  QVERIFY(window_->findChild<QLabel*>("editingLabel")->isVisible());
  QTRY_VERIFY(!window_->tokenCounterLabel()->text().isEmpty());
  QCoreApplication::processEvents();
  QCOMPARE(window_->chatView()->geometry(), transcript);
}

void MainWindowUsabilityTest::every_chat_action_has_keys_listed_in_the_sheet() {
  {
    // A chat whose reply has a code block, for "copy the last code block".
    kvchat::app::ConversationStore store(fixture_->databasePath());
    const qint64 id = store.create_conversation("Code");
    kvchat::app::MessageRecord user;
    user.conversation_id = id;
    user.role = kvchat::app::MessageRole::User;
    user.text = "Show me code";
    user.complete = true;
    store.add_message(user);
    kvchat::app::MessageRecord reply = user;
    reply.role = kvchat::app::MessageRole::Assistant;
    reply.text = "Here:\n\n```python\nprint('first')\n```\n\nand\n\n```sh\necho second\n```\n";
    store.add_message(reply);
  }
  open_window(kvchat::test::greedy_chat_settings(12));
  activate();
  controller()->newConversation();
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  ChatSettings shorter = controller()->settings();
  shorter.max_new_tokens = 4;
  controller()->applySettings(shorter);
  QVERIFY(controller()->regenerate());
  QVERIFY(fixture_->waitIdle());
  QTRY_COMPARE(last_widget()->alternativesText(), QStringLiteral("2/2"));
  window_->messageInput()->setFocus();

  // Tab reaches the transcript (one stop), where the keys scroll it.
  bool reached = false;
  for (int i = 0; i < 12 && !reached; ++i) {
    QTest::keyClick(QApplication::focusWidget(), Qt::Key_Tab);
    reached = QApplication::focusWidget() == window_->chatView();
  }
  QVERIFY(reached);
  window_->messageInput()->setFocus();

  // Versions of the last reply.
  QTest::keyClick(window_->messageInput(), Qt::Key_Left, Qt::AltModifier);
  QTRY_COMPARE(last_widget()->alternativesText(), QStringLiteral("1/2"));
  QTest::keyClick(window_->messageInput(), Qt::Key_Right, Qt::AltModifier);
  QTRY_COMPARE(last_widget()->alternativesText(), QStringLiteral("2/2"));

  // Copying the last reply.
  QGuiApplication::clipboard()->clear();
  QTest::keyClick(window_->messageInput(), Qt::Key_C, Qt::ControlModifier | Qt::ShiftModifier);
  QCOMPARE(QGuiApplication::clipboard()->text(), controller()->currentMessages().back().text);

  // F2 renames, Delete (in the list only) deletes.
  const qint64 current = controller()->currentConversationId();
  QTimer::singleShot(0, this, [] {
    auto* dialog = qobject_cast<QInputDialog*>(QApplication::activeModalWidget());
    if (!dialog) return;
    dialog->setTextValue("Renamed from the keyboard");
    dialog->accept();
  });
  QTest::keyClick(window_->messageInput(), Qt::Key_F2);
  QCOMPARE(controller()->conversation(current)->title, QStringLiteral("Renamed from the keyboard"));
  activate();  // the dialog had it
  int asked = 0;
  window_->setConfirmHandler([&](const QString&, const QString&) {
    ++asked;
    return true;
  });
  QTest::keyClick(window_->messageInput(), Qt::Key_Delete);
  QCOMPARE(asked, 0);
  QCOMPARE(controller()->conversations().size(), 2);

  // The code chat: copying its last code block.
  window_->conversationList()->setFocus();
  controller()->selectConversation(controller()->conversations().back().id);
  QTest::keyClick(window_->messageInput(), Qt::Key_K, Qt::ControlModifier | Qt::ShiftModifier);
  QCOMPARE(QGuiApplication::clipboard()->text(), QStringLiteral("echo second"));
  window_->conversationList()->setFocus();
  QTest::keyClick(window_->conversationList(), Qt::Key_Delete);
  QCOMPARE(asked, 1);
  QCOMPARE(controller()->conversations().size(), 1);

  // The Chat menu holds them all.
  for (const char* name :
       {"renameChatAction", "deleteChatAction", "editLastAction", "stopAction", "previousVersionAction",
        "nextVersionAction", "copyLastReplyAction", "copyLastCodeBlockAction"}) {
    auto* action = window_->findChild<QAction*>(name);
    QVERIFY2(action && !action->shortcut().isEmpty(), name);
    QVERIFY2(!action->associatedObjects().isEmpty(), name);
  }

  // The sheet lists every action that has keys, from the actions themselves.
  window_->findChild<QAction*>("keyboardShortcutsAction")->trigger();
  auto* sheet = window_->findChild<QDialog*>("shortcutsSheet");
  QVERIFY(sheet && sheet->isVisible());
  auto* table = sheet->findChild<QTableWidget*>("shortcutsTable");
  QSet<QString> rows;
  for (int row = 0; row < table->rowCount(); ++row)
    rows.insert(table->item(row, 1)->text() + "|" + table->item(row, 2)->text());
  int listed = 0;
  for (QAction* menu_action : window_->menuBar()->actions())
    for (QAction* action : menu_action->menu()->actions()) {
      if (action->shortcut().isEmpty()) continue;
      QString text = action->text().remove('&');
      if (action->shortcutContext() == Qt::WidgetWithChildrenShortcut) text += " (in the chat list)";
      QStringList keys;
      for (const QKeySequence& keys_of : action->shortcuts()) keys << keys_of.toString(QKeySequence::NativeText);
      QVERIFY2(rows.contains(text + "|" + keys.join(" or ")), qPrintable(text));
      ++listed;
    }
  QVERIFY(listed >= 15);
  QVERIFY(rows.contains("Rename the chat\u2026|F2"));
  QVERIFY(rows.contains("Go to chat 1 of the list|Ctrl+1"));
  sheet->close();
}

void MainWindowUsabilityTest::the_system_prompt_dialog_gives_the_focus_back() {
  open_window(kvchat::test::greedy_chat_settings(8));
  activate();
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  controller()->setSystemPrompt(controller()->currentConversationId(), "You tell stories.");
  QTest::mouseClick(window_->findChild<QPushButton*>("systemPromptButton"), Qt::LeftButton);
  auto* dialog = window_->findChild<QDialog*>("systemPromptDialog");
  QVERIFY(dialog && dialog->isVisible());
  auto* editor = dialog->findChild<QPlainTextEdit*>("systemPromptEditor");
  QCOMPARE(editor->toPlainText(), QStringLiteral("You tell stories."));
  QVERIFY(!editor->textCursor().hasSelection());  // typing adds, it does not replace
  QTest::keyClicks(editor, " Short ones.");
  dialog->accept();
  QCOMPARE(controller()->conversation(controller()->currentConversationId())->system_prompt,
           QStringLiteral("You tell stories. Short ones."));
  QTRY_COMPARE(QApplication::focusWidget(), window_->messageInput());
  // A space typed next is text, not a click on the button.
  QTest::keyClick(QApplication::focusWidget(), Qt::Key_Space);
  QVERIFY(!window_->findChild<QDialog*>("systemPromptDialog") ||
          !window_->findChild<QDialog*>("systemPromptDialog")->isVisible());
  QCOMPARE(window_->messageInput()->toPlainText(), QStringLiteral(" "));
}

void MainWindowUsabilityTest::a_waiting_message_can_be_withdrawn() {
  ChatSettings settings = kvchat::test::greedy_chat_settings(200);
  settings.kv_cache_enabled = false;  // slow on purpose
  open_window(settings);
  activate();
  type_and_send("Once upon a time");
  QVERIFY(controller()->isGenerating());
  window_->findChild<QPushButton*>("newChatButton")->click();
  const qint64 waiting_chat = controller()->currentConversationId();
  type_and_send("Tom saw a big dog");
  QVERIFY(controller()->isQueued(waiting_chat));
  auto* send = window_->findChild<QPushButton*>("sendButton");
  QCOMPARE(send->text(), QStringLiteral("Stop"));
  QVERIFY(send->isEnabled());
  QTest::keyClick(window_->messageInput(), Qt::Key_Escape);
  QVERIFY(!controller()->isQueued(waiting_chat));
  QVERIFY(controller()->isGenerating());  // the other chat's reply goes on
  QCOMPARE(controller()->currentMessages().size(), 0);
  QCOMPARE(window_->messageInput()->toPlainText(), QStringLiteral("Tom saw a big dog"));
  QCOMPARE(send->text(), QStringLiteral("Send"));
  QVERIFY(window_->noticeLabel()->text().startsWith("Not sent"));
  // And with the button.
  type_and_send("");
  QVERIFY(controller()->isQueued(waiting_chat));
  send->click();
  QVERIFY(!controller()->isQueued(waiting_chat));
  QCOMPARE(controller()->currentMessages().size(), 0);
  QVERIFY(fixture_->waitIdle());
  QCOMPARE(controller()->currentMessages().size(), 0);  // nothing was answered later
}

void MainWindowUsabilityTest::the_text_size_applies_to_the_transcript() {
  {
    kvchat::app::ConversationStore store(fixture_->databasePath());
    const qint64 id = store.create_conversation("Code");
    kvchat::app::MessageRecord reply;
    reply.conversation_id = id;
    reply.role = kvchat::app::MessageRole::Assistant;
    reply.complete = true;
    reply.text = "Some prose over a few words.\n\n```sh\necho code\n```\n";
    store.add_message(reply);
  }
  open_window(kvchat::test::greedy_chat_settings(8));
  controller()->selectConversation(1);
  QTRY_COMPARE(window_->chatView()->messageWidgets().size(), 1);
  const auto views = [this] {
    return window_->chatView()->messageWidgets()[0]->findChildren<kvchat::ui::MessageTextView*>();
  };
  QCOMPARE(views().size(), 2);
  QCoreApplication::processEvents();
  const int prose_height = views()[0]->height();
  window_->setChatFontSize(24);
  QCoreApplication::processEvents();
  for (kvchat::ui::MessageTextView* view : views()) {
    QCOMPARE(view->font().pointSize(), 24);
    QCOMPARE(view->document()->defaultFont().pointSize(), 24);
  }
  QVERIFY(views()[1]->font().fixedPitch());
  QVERIFY2(views()[0]->height() > prose_height * 3 / 2,
           qPrintable(QStringLiteral("%1 -> %2").arg(prose_height).arg(views()[0]->height())));
  // The next start: the saved size, on the transcript too.
  window_ = std::make_unique<MainWindow>(controller());
  window_->show();
  QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
  for (kvchat::ui::MessageTextView* view : views()) QCOMPARE(view->document()->defaultFont().pointSize(), 24);
  QVERIFY(views()[0]->height() > prose_height * 3 / 2);
}

void MainWindowUsabilityTest::a_small_window_shrinks_the_sidebar_and_elides_titles() {
  open_window(kvchat::test::greedy_chat_settings(8));
  const QString long_title = QStringLiteral("A very long chat title that goes on and on about a little cat and a dog");
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  controller()->renameConversation(controller()->currentConversationId(), long_title);
  window_->resize(640, 420);
  QCoreApplication::processEvents();
  auto* sidebar = window_->findChild<QWidget*>("sidebar");
  QVERIFY2(sidebar->width() <= 140, qPrintable(QString::number(sidebar->width())));
  QListView* list = window_->conversationList();
  QVERIFY(!list->horizontalScrollBar()->isVisible());
  QCOMPARE(list->horizontalScrollBar()->maximum(), 0);
  // The row is the list's width, so its text is drawn elided within it.
  QVERIFY(list->visualRect(kvchat::test::list_row(list, 0)).width() <= list->viewport()->width());
  // The title above the chat elides before it reaches the button.
  auto* title = window_->findChild<ElidedLabel*>("conversationTitle");
  QVERIFY(title);
  QCOMPARE(title->fullText(), long_title);
  auto* button = window_->findChild<QPushButton*>("systemPromptButton");
  QVERIFY(title->geometry().right() < button->geometry().left());
  QVERIFY2(title->shownText().endsWith(QChar(0x2026)), qPrintable(title->shownText()));
  QVERIFY(window_->chatView()->width() >= 400);
}

void MainWindowUsabilityTest::the_docked_chart_leaves_room_for_the_transcript() {
  open_window(kvchat::test::greedy_chat_settings(8));
  window_->resize(800, 500);
  window_->findChild<QAction*>("decodeChartAction")->trigger();
  QVERIFY(window_->decodeChartDock()->isVisible());
  for (int pass = 0; pass < 5; ++pass) QCoreApplication::processEvents();  // the dock placed, then sized
  const int transcript = window_->chatView()->viewport()->height();
  QVERIFY2(transcript >= window_->height() * 2 / 5, qPrintable(QStringLiteral("%1 of %2 (chart dock %3)")
                                                                   .arg(transcript)
                                                                   .arg(window_->height())
                                                                   .arg(window_->decodeChartDock()->height())));
  // The x axis title is drawn whole (not elided), inside the chart view.
  auto* view = window_->decodeChart()->findChild<QChartView*>();
  QVERIFY(view);
  const QString axis_title = window_->decodeChart()->chart()->axes(Qt::Horizontal).value(0)->titleText();
  QVERIFY(!axis_title.isEmpty());
  const QGraphicsTextItem* title = nullptr;
  for (QGraphicsItem* item : view->scene()->items()) {
    auto* text = qgraphicsitem_cast<QGraphicsTextItem*>(item);
    if (text && text->toPlainText() == axis_title) title = text;
  }
  QVERIFY2(title && title->isVisible(), "the x axis title is drawn unshortened");
  const QRect shown = view->mapFromScene(title->sceneBoundingRect()).boundingRect();
  QVERIFY2(view->viewport()->rect().contains(shown), qPrintable(QStringLiteral("title at y %1..%2, view %3 high")
                                                                    .arg(shown.top())
                                                                    .arg(shown.bottom())
                                                                    .arg(view->viewport()->height())));
}

void MainWindowUsabilityTest::the_settings_dialog_fits_a_small_screen() {
  open_window(kvchat::test::greedy_chat_settings(8));
  kvchat::ui::SettingsDialog* dialog = window_->openSettingsDialog();
  QVERIFY(QTest::qWaitForWindowExposed(dialog));
  QVERIFY2(dialog->height() <= 700, qPrintable(QString::number(dialog->height())));
  QVERIFY(dialog->minimumSizeHint().height() <= 400);
  auto* scroll = dialog->findChild<QScrollArea*>("settingsScrollArea");
  QVERIFY(scroll);
  // Every setting is in the scrolled page; the buttons are not.
  for (const char* name : {"kvCacheCheck", "contextLimitSpin", "overflowCombo", "snapshotDirectoryEdit"})
    QVERIFY2(scroll->widget()->isAncestorOf(dialog->findChild<QWidget*>(name)), name);
  QVERIFY(!scroll->isAncestorOf(dialog->findChild<QDialogButtonBox*>()));
  QVERIFY(dialog->findChild<QLabel*>("contextLimitNote")->wordWrap());
  dialog->reject();
}

void MainWindowUsabilityTest::copy_buttons_say_copied() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  QToolButton* copy = last_widget()->copyButton();
  const QString label = copy->text();
  copy->click();
  QCOMPARE(copy->text(), QStringLiteral("Copied"));
  QCOMPARE(QGuiApplication::clipboard()->text(), last_widget()->text());
  QTRY_COMPARE_WITH_TIMEOUT(copy->text(), label, kvchat::ui::kCopiedFeedbackMs * 4);
}

void MainWindowUsabilityTest::an_empty_file_is_called_empty() {
  open_window(kvchat::test::greedy_chat_settings(8));
  const std::string folder =
      kvchat::test::copy_reference_model("stories260K", fixture_->path("empty-config").toStdString());
  kvchat::test::write_file_bytes(folder + "/config.json", "");
  QSignalSpy failed(&controller()->backendHost(), &BackendHost::modelLoadFailed);
  window_->openModel(QString::fromStdString(folder));
  QVERIFY(failed.wait(60000));
  auto* box = window_->findChild<QMessageBox*>("modelLoadErrorDialog");
  QVERIFY(box);
  QVERIFY2(box->text().contains("config.json: empty file (0 bytes)"), qPrintable(box->text()));
  box->close();
}

void MainWindowUsabilityTest::quitting_mid_reply_is_labelled_as_such() {
  ChatSettings settings = kvchat::test::greedy_chat_settings(200);
  settings.kv_cache_enabled = false;
  open_window(settings);
  type_and_send("Once upon a time");
  QVERIFY(controller()->isGenerating());
  QTRY_VERIFY(!controller()->generatingText().isEmpty());
  window_->close();
  QVERIFY(fixture_->waitIdle());
  const auto reply = controller()->currentMessages().back();
  QCOMPARE(reply.stats.value("stop_reason").toString(), QStringLiteral("stopped"));
  QVERIFY(reply.stats.value(kvchat::app::kReplyClosedByAppKey).toBool());
  window_ = std::make_unique<MainWindow>(controller());
  window_->show();
  QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
  auto* note = last_widget()->findChild<QLabel*>("cutShortLabel");
  QCOMPARE(note->text(), QStringLiteral("Cut short: the app was quit during this reply."));

  // Stop by hand still says "stopped".
  type_and_send("Tom ran");
  QTRY_VERIFY(!controller()->generatingText().isEmpty());
  controller()->stop();
  QVERIFY(fixture_->waitIdle());
  QVERIFY(!controller()->currentMessages().back().stats.contains(kvchat::app::kReplyClosedByAppKey));
  QTRY_COMPARE(last_widget()->findChild<QLabel*>("cutShortLabel")->text(), QStringLiteral("Stopped before the end."));
}

void MainWindowUsabilityTest::equal_titles_are_told_apart_by_date() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  window_->findChild<QPushButton*>("newChatButton")->click();
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  window_->findChild<QPushButton*>("newChatButton")->click();
  type_and_send("Tom ran");
  QVERIFY(fixture_->waitIdle());
  QListView* list = window_->conversationList();
  QCOMPARE(kvchat::test::list_count(list), 3);
  QStringList texts;
  for (int row = 0; row < kvchat::test::list_count(list); ++row) texts << kvchat::test::list_text(list, row);
  QCOMPARE(texts.filter("Tom ran").size(), 1);
  QVERIFY(texts.contains("Tom ran"));  // a title of its own stays as it is
  const QStringList equal = texts.filter("Once upon a time \u00b7 ");
  QCOMPARE(equal.size(), 2);
  QVERIFY2(equal[0] != equal[1], qPrintable(equal.join(" | ")));
  kvchat::ui::CachesDialog* caches = window_->openCachesDialog();
  QStringList rows;
  for (int row = 0; row < caches->table()->rowCount(); ++row) rows << caches->table()->item(row, 0)->text();
  QCOMPARE(rows.filter("Once upon a time \u00b7 ").size(), 2);
  QVERIFY(rows.filter("Once upon a time \u00b7 ")[0] != rows.filter("Once upon a time \u00b7 ")[1]);
  caches->reject();
}

void MainWindowUsabilityTest::the_welcome_text_is_legible() {
  open_window(kvchat::test::greedy_chat_settings(8));
  auto* welcome = window_->chatView()->findChild<QLabel*>("chatPlaceholder");
  QVERIFY(welcome && welcome->isVisible());
  welcome->ensurePolished();
  const QColor text = welcome->palette().color(welcome->foregroundRole());
  const QWidget* viewport = window_->chatView()->viewport();
  const QColor background = viewport->palette().color(viewport->backgroundRole());
  const double ratio = contrast(text, background);
  QVERIFY2(ratio >= 4.5, qPrintable(QStringLiteral("%1 on %2: %3").arg(text.name(), background.name()).arg(ratio)));
}

void MainWindowUsabilityTest::the_dark_appearance_is_legible_and_kept() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  QAction* dark = window_->findChild<QAction*>("appearanceDarkAction");
  QVERIFY(dark && !dark->isChecked());
  QVERIFY(window_->findChild<QAction*>("appearanceSystemAction")->isChecked());
  QVERIFY(!kvchat::ui::is_dark(QApplication::palette()));
  dark->trigger();
  QVERIFY(kvchat::ui::is_dark(QApplication::palette()));
  QCOMPARE(controller()->settings().appearance, QStringLiteral("dark"));

  // The next start opens dark.
  window_.reset();
  kvchat::ui::apply_appearance(kvchat::ui::Appearance::System);
  QVERIFY(!kvchat::ui::is_dark(QApplication::palette()));
  QVERIFY(fixture_->restart());
  QCOMPARE(controller()->settings().appearance, QStringLiteral("dark"));
  window_ = std::make_unique<MainWindow>(controller());
  window_->show();
  QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
  QVERIFY(window_->findChild<QAction*>("appearanceDarkAction")->isChecked());
  QVERIFY(kvchat::ui::is_dark(QApplication::palette()));
  window_->findChild<QAction*>("decodeChartAction")->trigger();
  QCoreApplication::processEvents();

  const auto legible = [](const QString& what, const QColor& text, const QColor& background) {
    const double ratio = contrast(text, background);
    if (ratio >= 4.5) return QString();
    return QStringLiteral("%1: %2 on %3, contrast %4").arg(what, text.name(), background.name()).arg(ratio);
  };
  const QWidget* viewport = window_->chatView()->viewport();
  const QColor transcript = viewport->palette().color(viewport->backgroundRole());
  QVERIFY2(transcript.lightness() < 128, qPrintable(transcript.name()));
  const auto messages = window_->chatView()->messageWidgets();
  QVERIFY(!messages.isEmpty());
  const auto prose = messages.back()->body()->proseViews();
  QVERIFY(!prose.isEmpty());
  QString failed = legible("reply text", prose.first()->palette().color(QPalette::Text), transcript);
  QVERIFY2(failed.isEmpty(), qPrintable(failed));
  // A code block, as a reply shows one, in the transcript.
  auto* block = new kvchat::ui::CodeBlockWidget(window_->chatView()->widget());
  block->setCode(QStringLiteral("int main() { return 0; }"), QStringLiteral("cpp"));
  failed = legible("code", block->view()->palette().color(QPalette::Text), transcript);
  QVERIFY2(failed.isEmpty(), qPrintable(failed));
  auto* language = block->findChild<QLabel*>("codeLanguage");
  language->ensurePolished();
  failed = legible("code language", language->palette().color(language->foregroundRole()), transcript);
  QVERIFY2(failed.isEmpty(), qPrintable(failed));
  // A warning line (editing the last message) on the window's background.
  auto* warning = window_->findChild<QLabel*>("editingLabel");
  QVERIFY(warning);
  warning->ensurePolished();
  failed = legible("warning", warning->palette().color(warning->foregroundRole()),
                   window_->palette().color(QPalette::Window));
  QVERIFY2(failed.isEmpty(), qPrintable(failed));
  // The chart: its title, axis labels and titles, and legend against its background.
  QChart* chart = window_->decodeChart()->chart();
  const QColor chart_background = chart->backgroundBrush().color();
  QVERIFY2(chart_background.lightness() < 128, qPrintable(chart_background.name()));
  failed = legible("chart title", chart->titleBrush().color(), chart_background);
  QVERIFY2(failed.isEmpty(), qPrintable(failed));
  failed = legible("chart legend", chart->legend()->labelColor(), chart_background);
  QVERIFY2(failed.isEmpty(), qPrintable(failed));
  const auto axes = chart->axes();
  QCOMPARE(axes.size(), 2);
  for (QAbstractAxis* axis : axes) {
    failed = legible("axis labels", axis->labelsColor(), chart_background);
    QVERIFY2(failed.isEmpty(), qPrintable(failed));
    failed = legible("axis title", axis->titleBrush().color(), chart_background);
    QVERIFY2(failed.isEmpty(), qPrintable(failed));
  }
}

void MainWindowUsabilityTest::switching_appearance_recolours_warnings_and_errors_at_once() {
  open_window(kvchat::test::greedy_chat_settings(4));  // stopped by max tokens: a warning under the reply
  type_and_send("Once upon a time");
  QVERIFY(fixture_->waitIdle());
  window_->chatView()->showError(QStringLiteral("the model refused"));
  QCoreApplication::processEvents();
  auto* cut_short = last_widget()->findChild<QLabel*>("cutShortLabel");
  auto* editing = window_->findChild<QLabel*>("editingLabel");
  auto* error = window_->chatView()->findChild<QLabel*>("chatError");
  QVERIFY(cut_short && cut_short->isVisible() && editing && error);
  const auto text_colour = [](QLabel* label) {
    label->ensurePolished();
    return label->palette().color(label->foregroundRole());
  };
  const QPalette light = QApplication::palette();
  QVERIFY(!kvchat::ui::is_dark(light));
  QCOMPARE(text_colour(cut_short), kvchat::ui::warning_text_colour(light));
  QCOMPARE(text_colour(editing), kvchat::ui::warning_text_colour(light));
  QCOMPARE(text_colour(error), kvchat::ui::error_text_colour(light));

  // Dark, and back: every one of them takes the new palette's variant without a restart.
  window_->findChild<QAction*>("appearanceDarkAction")->trigger();
  QCoreApplication::processEvents();
  const QPalette dark = QApplication::palette();
  QVERIFY(kvchat::ui::is_dark(dark));
  QCOMPARE(text_colour(cut_short), kvchat::ui::warning_text_colour(dark));
  QCOMPARE(text_colour(editing), kvchat::ui::warning_text_colour(dark));
  QCOMPARE(text_colour(error), kvchat::ui::error_text_colour(dark));
  const QColor window_background = window_->palette().color(QPalette::Window);
  QVERIFY2(contrast(text_colour(editing), window_background) >= 4.5, qPrintable(text_colour(editing).name()));
  QVERIFY(error->styleSheet().contains(kvchat::ui::error_background_colour(dark).name()));

  window_->findChild<QAction*>("appearanceLightAction")->trigger();
  QCoreApplication::processEvents();
  QVERIFY(!kvchat::ui::is_dark(QApplication::palette()));
  QCOMPARE(text_colour(cut_short), kvchat::ui::warning_text_colour(QApplication::palette()));
  QCOMPARE(text_colour(error), kvchat::ui::error_text_colour(QApplication::palette()));
}

KVCHAT_TEST_MAIN(MainWindowUsabilityTest)

}  // namespace ui_test_main_window_usability

#include "test_main_window_usability.moc"
