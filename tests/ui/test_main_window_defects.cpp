// The main window, offscreen, over a real controller and stories260K: what a new user ran into. A failed turn
// ends cleanly and is shown once; export adds the chosen type's extension and starts in a sensible folder;
// the context limit is capped at the model's; the status bar fits 800x500; another chat generating is shown
// and a message sent meanwhile waits; New chat reuses an empty chat, focuses the input, keeps drafts per chat;
// Tab stays among the controls and the transcript (one stop), and Ctrl+PgDn/PgUp/1..9 move between chats; the
// first screen says what the model is and Help > About names version and licences; a reply cut short by a crash
// is marked and continued.
#include <QtTest>
#include "common/test_suite.h"

#include <QDir>
#include <QFileDialog>
#include <QLabel>
#include <QListView>
#include <QMessageBox>
#include <QPushButton>
#include <QScrollBar>
#include <QSpinBox>
#include <QSplitter>
#include <QStandardPaths>
#include <QStatusBar>

#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "app/store/message_stats_json.h"
#include "common/chat_fixture.h"
#include "common/list_view_rows.h"
#include "ui/chat_view.h"
#include "ui/elided_label.h"
#include "ui/main_window.h"
#include "ui/message_input.h"
#include "ui/message_widget.h"
#include "ui/settings_dialog.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_main_window_defects {

using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::ui::MainWindow;
using kvchat::ui::MessageWidget;

class MainWindowDefectsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void cleanup();
  void a_failed_turn_ends_cleanly_and_is_shown_once();
  void export_adds_the_chosen_types_extension_and_starts_in_a_sensible_folder();
  void the_context_limit_is_capped_at_the_models_maximum();
  void the_status_bar_fits_at_800_by_500();
  void another_chat_generating_is_shown_and_a_message_waits_for_it();
  void new_chat_reuses_an_empty_one_focuses_the_input_and_keeps_drafts();
  void tab_stays_among_the_controls_and_shortcuts_move_between_chats();
  void the_first_screen_and_about_say_what_runs();
  void a_reply_cut_short_by_a_crash_is_marked_and_continued();
  void the_token_counter_shows_the_room_left();

 private:
  void open_window(const ChatSettings& settings);
  bool wait_idle() { return fixture_->waitIdle(); }
  ChatController* controller() const { return fixture_->controller(); }
  void type_and_send(const QString& text) {
    QTest::keyClicks(window_->messageInput(), text);
    QTest::keyClick(window_->messageInput(), Qt::Key_Return);
  }
  void activate() {
    QApplication::setActiveWindow(window_.get());
    QVERIFY(QTest::qWaitForWindowActive(window_.get()));
  }

  std::unique_ptr<kvchat::test::ChatFixture> fixture_ = std::make_unique<kvchat::test::ChatFixture>();
  std::unique_ptr<MainWindow> window_;
};

void MainWindowDefectsTest::cleanup() {
  window_.reset();
  fixture_ = std::make_unique<kvchat::test::ChatFixture>();
}

void MainWindowDefectsTest::open_window(const ChatSettings& settings) {
  QVERIFY(fixture_->open(settings));
  window_ = std::make_unique<MainWindow>(controller());
  window_->show();
  QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
  window_->messageInput()->setFocus();
}

void MainWindowDefectsTest::a_failed_turn_ends_cleanly_and_is_shown_once() {
  ChatSettings settings = kvchat::test::greedy_chat_settings(16);
  settings.context_limit = 128;  // "stop" policy: a long message is refused
  open_window(settings);
  type_and_send("Once upon a time");
  QVERIFY(wait_idle());
  const QString too_long = QString("The cat sat on the mat. ").repeated(210).left(5000);
  // The window warns and does not send it; the controller (the CLI, a script) still can: the window must
  // then show the failed turn properly.
  window_->messageInput()->setPlainText(too_long);
  QTest::keyClick(window_->messageInput(), Qt::Key_Return);
  QVERIFY(!controller()->isGenerating());
  QCOMPARE(controller()->currentMessages().size(), 2);
  QVERIFY2(window_->tokenCounterLabel()->text().contains("this message does not fit"),
           qPrintable(window_->tokenCounterLabel()->text()));
  QVERIFY(window_->noticeLabel()->text().startsWith("Not sent"));
  window_->messageInput()->clear();
  QVERIFY(controller()->send(too_long));
  QVERIFY(wait_idle());
  QCoreApplication::processEvents();

  QVERIFY2(!window_->speedLabel()->text().contains("Generating"), qPrintable(window_->speedLabel()->text()));
  auto* send = window_->findChild<QPushButton*>("sendButton");
  QCOMPARE(send->text(), QStringLiteral("Send"));
  QVERIFY(send->isEnabled());
  const auto widgets = window_->chatView()->messageWidgets();
  QCOMPARE(widgets.size(), 4);
  QVERIFY(widgets[3]->isFailed());
  const QString error = kvchat::app::reply_error(controller()->currentMessages().at(3));
  QVERIFY(!error.isEmpty());
  QCOMPARE(widgets[3]->statsText(), QStringLiteral("Error: ") + error);
  // Once: no second copy in a banner or in the status bar.
  QVERIFY(!window_->chatView()->findChild<QLabel*>("chatError"));
  int shown = 0;
  for (QLabel* label : window_->findChildren<QLabel*>())
    if (label->isVisible() && label->text().contains(error)) ++shown;
  QCOMPARE(shown, 1);

  // The chat goes on: the refused message is not given to the model again.
  type_and_send("Lily went to the park");
  QVERIFY(wait_idle());
  const auto records = controller()->currentMessages();
  QCOMPARE(records.size(), 6);
  QVERIFY(!kvchat::app::is_failed_reply(records[5]));
  QVERIFY(!records[5].text.isEmpty());
  // And after switching chats nothing claims to be generating.
  window_->findChild<QPushButton*>("newChatButton")->click();
  QVERIFY(!window_->speedLabel()->text().contains("Generating"));
}

void MainWindowDefectsTest::export_adds_the_chosen_types_extension_and_starts_in_a_sensible_folder() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  QVERIFY(wait_idle());
  const QString previous_current = QDir::currentPath();
  QVERIFY(QDir::setCurrent(QDir::tempPath()));
  QFileDialog* dialog = window_->openExportDialog();
  QVERIFY(dialog);
  QCOMPARE(dialog->objectName(), QStringLiteral("exportDialog"));
  QString expected = QStandardPaths::writableLocation(QStandardPaths::DocumentsLocation);
  if (expected.isEmpty() || !QFileInfo(expected).isDir()) expected = QDir::homePath();
  QCOMPARE(QFileInfo(dialog->directory().absolutePath()).canonicalFilePath(), QFileInfo(expected).canonicalFilePath());
  QDir::setCurrent(previous_current);

  const QString folder = fixture_->path("exports");
  QVERIFY(QDir().mkpath(folder));
  dialog->setDirectory(folder);
  dialog->selectNameFilter("Text (*.txt)");
  dialog->selectFile(QDir(folder).filePath("chat1_text"));
  static_cast<QDialog*>(dialog)->accept();  // QFileDialog::accept() is protected; the dialog's own override runs
  const QString written = QDir(folder).filePath("chat1_text.txt");
  QTRY_VERIFY(QFile::exists(written));
  QVERIFY(!QFile::exists(QDir(folder).filePath("chat1_text")));
  QFile file(written);
  QVERIFY(file.open(QIODevice::ReadOnly));
  const QString text = QString::fromUtf8(file.readAll());
  QVERIFY2(text.startsWith("Once upon a time\n") && text.contains("\nUser:\nOnce upon a time\n"), qPrintable(text));

  // The next export starts where the last one went.
  QFileDialog* again = window_->openExportDialog();
  QCOMPARE(QFileInfo(again->directory().absolutePath()).canonicalFilePath(), QFileInfo(folder).canonicalFilePath());
  again->reject();
}

void MainWindowDefectsTest::the_context_limit_is_capped_at_the_models_maximum() {
  ChatSettings settings = kvchat::test::greedy_chat_settings();
  settings.context_limit = 4096;  // saved while a bigger model was open
  open_window(settings);
  kvchat::ui::SettingsDialog* dialog = window_->openSettingsDialog();
  auto* spin = dialog->findChild<QSpinBox*>("contextLimitSpin");
  QVERIFY(spin);
  QCOMPARE(spin->maximum(), 512);
  QCOMPARE(spin->value(), 512);
  auto* note = dialog->findChild<QLabel*>("contextLimitNote");
  QVERIFY(note && note->isVisible());
  QVERIFY2(note->text().contains("at most 512, the model's maximum"), qPrintable(note->text()));
  spin->setValue(100000);
  QCOMPARE(spin->value(), 512);
  QCOMPARE(dialog->settings().context_limit, 512);
  dialog->reject();
}

void MainWindowDefectsTest::the_status_bar_fits_at_800_by_500() {
  open_window(kvchat::test::greedy_chat_settings(8));
  QVERIFY(window_->minimumSize().width() > 0 && window_->minimumSize().width() <= 800);
  QVERIFY(window_->minimumSize().height() > 0 && window_->minimumSize().height() <= 500);
  type_and_send("Once upon a time");
  QVERIFY(wait_idle());
  window_->resize(800, 500);
  // A long passing message, as exports and evictions write them.
  QVERIFY(window_->exportCurrentConversation(fixture_->path("a-rather-long-file-name-for-an-exported-chat.md")));
  QTRY_VERIFY(window_->noticeLabel()->text().startsWith("Exported to"));
  // Shown whole, outside the status bar's fields.
  QVERIFY(window_->noticeLabel()->isVisible());
  QVERIFY(!window_->statusBar()->isAncestorOf(window_->noticeLabel()));
  QVERIFY(window_->noticeLabel()->height() >= window_->noticeLabel()->heightForWidth(window_->noticeLabel()->width()));
  QCoreApplication::processEvents();
  QCOMPARE(window_->width(), 800);
  QList<QWidget*> fields;
  // The fields share one row (statusFields), which ranks them when the room runs short.
  QWidget* row = window_->statusBar()->findChild<QWidget*>("statusFields");
  QVERIFY(row);
  QVERIFY(row->geometry().right() <= window_->statusBar()->width());
  for (QWidget* child : row->findChildren<QWidget*>(QString(), Qt::FindDirectChildrenOnly))
    if (child->isVisible()) fields << child;
  QVERIFY(fields.size() >= 5);
  for (int i = 0; i < fields.size(); ++i) {
    QVERIFY2(fields[i]->geometry().right() <= row->width(), qPrintable(fields[i]->objectName()));
    for (int j = i + 1; j < fields.size(); ++j)
      QVERIFY2(!fields[i]->geometry().intersects(fields[j]->geometry()),
               qPrintable(fields[i]->objectName() + " overlaps " + fields[j]->objectName()));
  }
  // A field too narrow for its text says so with an ellipsis instead of cutting a figure.
  for (auto* label : window_->statusBar()->findChildren<kvchat::ui::ElidedLabel*>()) {
    if (!label->isVisible() || label->fullText().isEmpty()) continue;
    const QString shown = label->shownText();
    QVERIFY2(shown == label->fullText() || shown.endsWith(QChar(0x2026)),
             qPrintable(label->objectName() + ": " + shown));
  }
  // The sidebar gives way to the chat.
  auto* splitter = window_->findChild<QSplitter*>("mainSplitter");
  splitter->setSizes({0, 800});
  QVERIFY(window_->chatView()->width() >= 500);
}

void MainWindowDefectsTest::another_chat_generating_is_shown_and_a_message_waits_for_it() {
  ChatSettings settings = kvchat::test::greedy_chat_settings(200);
  settings.kv_cache_enabled = false;  // slow on purpose
  open_window(settings);
  type_and_send("Once upon a time");
  QVERIFY(controller()->isGenerating());
  const qint64 first = controller()->currentConversationId();
  window_->findChild<QPushButton*>("newChatButton")->click();
  QVERIFY(controller()->currentConversationId() != first);
  auto* send = window_->findChild<QPushButton*>("sendButton");
  QCOMPARE(send->text(), QStringLiteral("Send"));
  QVERIFY(send->isEnabled());
  auto* list = window_->conversationList();
  QString generating_item;
  for (int row = 0; row < kvchat::test::list_count(list); ++row)
    if (kvchat::test::list_row(list, row).data(kvchat::ui::ConversationListModel::ConversationIdRole).toLongLong() ==
        first)
      generating_item = kvchat::test::list_text(list, row);
  QCOMPARE(generating_item, QStringLiteral("Once upon a time \u00b7 generating\u2026"));
  auto* waiting = window_->findChild<QLabel*>("waitingLabel");
  QVERIFY(waiting->isVisible());
  QVERIFY2(waiting->text().contains("\u201cOnce upon a time\u201d is generating"), qPrintable(waiting->text()));

  type_and_send("Tom saw a big dog");
  QCOMPARE(window_->messageInput()->toPlainText(), QString());
  QVERIFY(controller()->isQueued(controller()->currentConversationId()));
  QVERIFY2(waiting->text().contains("Waiting for the reply in \u201cOnce upon a time\u201d"),
           qPrintable(waiting->text()));
  QVERIFY(list->currentIndex().data().toString().endsWith("\u00b7 waiting\u2026"));
  QVERIFY(wait_idle());
  QTRY_COMPARE(window_->chatView()->messageWidgets().size(), 2);
  QVERIFY(!window_->chatView()->messageWidgets()[1]->text().isEmpty());
  QVERIFY(!waiting->isVisible());
}

void MainWindowDefectsTest::new_chat_reuses_an_empty_one_focuses_the_input_and_keeps_drafts() {
  open_window(kvchat::test::greedy_chat_settings(8));
  activate();
  auto* new_chat = window_->findChild<QPushButton*>("newChatButton");
  new_chat->setFocus();
  new_chat->click();
  new_chat->click();
  QCOMPARE(controller()->conversations().size(), 1);
  QCOMPARE(QApplication::focusWidget(), window_->messageInput());
  type_and_send("Once upon a time");
  QVERIFY(wait_idle());
  const qint64 first = controller()->currentConversationId();
  QTest::keyClicks(window_->messageInput(), "draft one");
  new_chat->click();
  const qint64 second = controller()->currentConversationId();
  QVERIFY(second != first);
  QCOMPARE(window_->messageInput()->toPlainText(), QString());
  QTest::keyClicks(window_->messageInput(), "draft two");
  controller()->selectConversation(first);
  QCOMPARE(window_->messageInput()->toPlainText(), QStringLiteral("draft one"));
  controller()->selectConversation(second);
  QCOMPARE(window_->messageInput()->toPlainText(), QStringLiteral("draft two"));
}

void MainWindowDefectsTest::tab_stays_among_the_controls_and_shortcuts_move_between_chats() {
  open_window(kvchat::test::greedy_chat_settings(8));
  activate();
  for (const char* text : {"Once upon a time", "Tom ran", "Lily sang"}) {
    type_and_send(text);
    QVERIFY(wait_idle());
  }
  const qint64 first = controller()->currentConversationId();
  window_->findChild<QPushButton*>("newChatButton")->click();
  type_and_send("The sun was hot");
  QVERIFY(wait_idle());
  const qint64 second = controller()->currentConversationId();
  controller()->selectConversation(first);
  QCOMPARE(window_->chatView()->messageWidgets().size(), 6);

  window_->messageInput()->setFocus();
  QList<QWidget*> stops;
  for (int i = 0; i < 40; ++i) {
    QTest::keyClick(QApplication::focusWidget(), Qt::Key_Tab);
    QWidget* focused = QApplication::focusWidget();
    if (focused == window_->messageInput()) break;
    stops << focused;
  }
  QCOMPARE(QApplication::focusWidget(), window_->messageInput());
  QVERIFY2(stops.size() <= 10, qPrintable(QString::number(stops.size())));
  // The transcript is one stop (it scrolls from the keyboard there); nothing inside it is another.
  QCOMPARE(stops.count(window_->chatView()), 1);
  for (QWidget* stop : stops)
    QVERIFY2(stop == window_->chatView() || !window_->chatView()->isAncestorOf(stop), qPrintable(stop->objectName()));

  // The transcript still scrolls from the keyboard.
  window_->resize(700, 450);
  QTRY_VERIFY(window_->chatView()->verticalScrollBar()->maximum() > 0);
  window_->chatView()->verticalScrollBar()->setValue(window_->chatView()->verticalScrollBar()->maximum());
  const int bottom = window_->chatView()->verticalScrollBar()->value();
  QTest::keyClick(window_->messageInput(), Qt::Key_PageUp, Qt::AltModifier);
  QVERIFY(window_->chatView()->verticalScrollBar()->value() < bottom);
  QTest::keyClick(window_->messageInput(), Qt::Key_PageDown, Qt::AltModifier);
  QCOMPARE(window_->chatView()->verticalScrollBar()->value(), bottom);

  // The list is most recent first: [second, first].
  QCOMPARE(kvchat::test::current_list_row(window_->conversationList()), 1);
  QTest::keyClick(window_->messageInput(), Qt::Key_PageUp, Qt::ControlModifier);
  QCOMPARE(controller()->currentConversationId(), second);
  QTest::keyClick(window_->messageInput(), Qt::Key_PageDown, Qt::ControlModifier);
  QCOMPARE(controller()->currentConversationId(), first);
  QTest::keyClick(window_->messageInput(), Qt::Key_1, Qt::ControlModifier);
  QCOMPARE(controller()->currentConversationId(), second);
  QTest::keyClick(window_->messageInput(), Qt::Key_Tab, Qt::ControlModifier);
  QCOMPARE(controller()->currentConversationId(), first);
  QCOMPARE(QApplication::focusWidget(), window_->messageInput());
}

void MainWindowDefectsTest::the_first_screen_and_about_say_what_runs() {
  open_window(kvchat::test::greedy_chat_settings(8));
  const QString placeholder = window_->chatView()->placeholderText();
  QVERIFY2(placeholder.contains("<b>stories260K</b> is loaded"), qPrintable(placeholder));
  QVERIFY2(placeholder.contains("continues the text you type"), qPrintable(placeholder));
  QVERIFY2(placeholder.contains(QStringLiteral("<p>Architecture: llama \u00b7 chat template: no</p>")),
           qPrintable(placeholder));
  QVERIFY2(placeholder.contains(QStringLiteral("try \u201cOnce upon a time\u201d")), qPrintable(placeholder));
  type_and_send("Once upon a time");
  QVERIFY(wait_idle());
  QCOMPARE(window_->chatView()->placeholderText(), QString());

  QMessageBox* about = window_->openAboutDialog();
  QCOMPARE(about->objectName(), QStringLiteral("aboutDialog"));
  QVERIFY(about->isVisible());
  for (const QString& needle : {QStringLiteral("kvchat " KVCHAT_VERSION), QStringLiteral("stories260K"),
                                QStringLiteral("LGPL"), QStringLiteral("MIT"), QStringLiteral("LibTorch")})
    QVERIFY2(about->text().contains(needle), qPrintable(needle));
  about->accept();
}

void MainWindowDefectsTest::a_reply_cut_short_by_a_crash_is_marked_and_continued() {
  {
    // What a crash mid-reply leaves in the database: the partial reply, not complete.
    kvchat::app::ConversationStore store(fixture_->databasePath());
    const qint64 id = store.create_conversation("Once upon a time");
    kvchat::app::MessageRecord user;
    user.conversation_id = id;
    user.role = kvchat::app::MessageRole::User;
    user.text = "Once upon a time";
    store.add_message(user);
    kvchat::app::MessageRecord reply;
    reply.conversation_id = id;
    reply.role = kvchat::app::MessageRole::Assistant;
    reply.model = "stories260K";
    reply.text = ", there was a little girl";
    reply.complete = false;
    store.add_message(reply);
  }
  open_window(kvchat::test::greedy_chat_settings(8));
  QCOMPARE(window_->chatView()->messageWidgets().size(), 2);
  MessageWidget* widget = window_->chatView()->messageWidgets()[1];
  QCOMPARE(widget->cutShortText(), QStringLiteral("Cut short: the app closed before this reply finished."));
  QVERIFY(widget->continueButton()->isVisible());
  widget->continueButton()->click();
  QVERIFY(wait_idle());
  const auto records = controller()->currentMessages();
  QCOMPARE(records.size(), 2);
  QVERIFY(records[1].complete);
  QVERIFY(records[1].text.startsWith(", there was a little girl"));
  QVERIFY(records[1].text.size() > QString(", there was a little girl").size());
  QTRY_COMPARE(window_->chatView()->messageWidgets()[1]->text(), records[1].text);
  // Cut again, now by max tokens: still offered.
  QCOMPARE(window_->chatView()->messageWidgets()[1]->cutShortText(),
           QStringLiteral("Cut short at the max-tokens setting."));
}

void MainWindowDefectsTest::the_token_counter_shows_the_room_left() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  QVERIFY(wait_idle());
  QTest::keyClicks(window_->messageInput(), "Lily went to the park");
  const auto measure = controller()->measureDraft("Lily went to the park");
  QVERIFY(measure && measure->fits);
  const QString expected = QStringLiteral("%1 tokens \u00b7 %2 of 512 left in the context after it")
                               .arg(measure->draft_tokens)
                               .arg(512 - measure->prompt_tokens);
  QTRY_COMPARE(window_->tokenCounterLabel()->text(), expected);
  // The count is what the turn then gives the model.
  QTest::keyClick(window_->messageInput(), Qt::Key_Return);
  QVERIFY(wait_idle());
  const auto stats = kvchat::app::stats_from_json(controller()->currentMessages().at(3).stats);
  QCOMPARE(stats.prompt_tokens, measure->prompt_tokens);
  QTRY_COMPARE(window_->tokenCounterLabel()->text(), QString());
}

KVCHAT_TEST_MAIN(MainWindowDefectsTest)

}  // namespace ui_test_main_window_defects

#include "test_main_window_defects.moc"
