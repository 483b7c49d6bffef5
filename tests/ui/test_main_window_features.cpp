// The main window's additions for users of local chat apps, offscreen over stories260K: the decode-time chart
// plots the engine's own per-step times (cache on flat, cache off climbing) with the previous reply as a
// second line and saves as PNG; alternatives of a regenerated reply switch with ‹ ›; the caches dialog lists
// which chats hold a cache and clears one; the text size is a saved setting; bubbles follow a dark palette.
#include <QScatterSeries>
#include <QtTest>
#include <algorithm>
#include "common/test_suite.h"

#include <QDockWidget>
#include <QImage>
#include <QLabel>
#include <QLineSeries>
#include <QPalette>
#include <QPushButton>
#include <QTableWidget>
#include <QToolButton>

#include "app/store/chat_history.h"
#include "common/chat_fixture.h"
#include "ui/caches_dialog.h"
#include "ui/chat_view.h"
#include "ui/decode_chart_panel.h"
#include "ui/main_window.h"
#include "ui/message_body.h"
#include "ui/message_input.h"
#include "ui/message_text_view.h"
#include "ui/message_widget.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_main_window_features {

using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::ui::MainWindow;

class MainWindowFeaturesTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void cleanup();
  void the_chart_plots_the_engines_decode_times();
  void regenerated_replies_switch_with_the_arrows();
  void an_earlier_message_is_edited_into_a_branch();
  void the_caches_dialog_lists_and_clears_caches();
  void the_text_size_is_a_saved_setting();
  void bubbles_follow_a_dark_palette();

 private:
  void open_window(const ChatSettings& settings);
  ChatController* controller() const { return fixture_->controller(); }
  void type_and_send(const QString& text) {
    QTest::keyClicks(window_->messageInput(), text);
    QTest::keyClick(window_->messageInput(), Qt::Key_Return);
    QVERIFY(fixture_->waitIdle());
  }

  std::unique_ptr<kvchat::test::ChatFixture> fixture_ = std::make_unique<kvchat::test::ChatFixture>();
  std::unique_ptr<MainWindow> window_;
};

void MainWindowFeaturesTest::cleanup() {
  window_.reset();
  fixture_ = std::make_unique<kvchat::test::ChatFixture>();
}

void MainWindowFeaturesTest::open_window(const ChatSettings& settings) {
  QVERIFY(fixture_->open(settings));
  window_ = std::make_unique<MainWindow>(controller());
  window_->show();
  QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
  window_->messageInput()->setFocus();
}

void MainWindowFeaturesTest::the_chart_plots_the_engines_decode_times() {
  open_window(kvchat::test::greedy_chat_settings(60));
  kvchat::ui::DecodeChartPanel* chart = window_->decodeChart();
  QVERIFY(chart);
  QVERIFY(window_->decodeChartDock()->isHidden());
  window_->findChild<QAction*>("decodeChartAction")->trigger();
  QVERIFY(window_->decodeChartDock()->isVisible());
  QCOMPARE(chart->lastSeries()->count(), 0);

  type_and_send("Once upon a time");
  const auto cached = controller()->lastDecodeTimings();
  QVERIFY(cached);
  QCOMPARE(chart->lastSeries()->count(), cached->step_ms.size());
  for (int i = 0; i < cached->step_ms.size(); ++i) {
    QCOMPARE(chart->lastSeries()->at(i).x(), double(cached->first_position + i));
    QCOMPARE(chart->lastSeries()->at(i).y(), cached->step_ms[i]);
  }
  QCOMPARE(chart->lastSeries()->name(), QStringLiteral("last reply (cache on)"));

  ChatSettings off = controller()->settings();
  off.kv_cache_enabled = false;
  controller()->applySettings(off);
  type_and_send("Lily went to the park");
  const auto uncached = controller()->lastDecodeTimings();
  QCOMPARE(uncached->cache_mode, kvchat::KvCacheMode::Off);
  QCOMPARE(chart->lastSeries()->name(), QStringLiteral("last reply (cache off)"));
  QCOMPARE(chart->previousSeries()->name(), QStringLiteral("reply before (cache on)"));
  QCOMPARE(chart->previousSeries()->count(), cached->step_ms.size());
  QCOMPARE(chart->lastSeries()->count(), uncached->step_ms.size());
  QCOMPARE(chart->lastSeries()->at(0).y(), uncached->step_ms[0]);

  QVERIFY(!chart->proposalSeries()->isVisible());  // no speculative decoding: nothing marked

  // Prompt lookup: the tokens that came with an earlier pass are marked where the reply's line has them.
  ChatSettings lookup = controller()->settings();
  lookup.kv_cache_enabled = true;
  lookup.speculative = kvchat::SpeculativeMode::Lookup;
  controller()->applySettings(lookup);
  type_and_send("The cat sat on the mat. The cat sat on the mat. The cat sat");
  const auto speculative = controller()->lastDecodeTimings();
  QVERIFY(speculative);
  QCOMPARE(speculative->from_proposal.size(), speculative->step_ms.size());
  const int marked =
      static_cast<int>(std::count(speculative->from_proposal.begin(), speculative->from_proposal.end(), true));
  QVERIFY2(marked > 0, "no proposal held in the reply");
  QVERIFY(chart->proposalSeries()->isVisible());
  QCOMPARE(chart->proposalSeries()->count(), marked);
  for (int i = 0, point = 0; i < speculative->step_ms.size(); ++i)
    if (speculative->from_proposal[i]) {
      QCOMPARE(chart->proposalSeries()->at(point).x(), double(speculative->first_position + i));
      QCOMPARE(chart->proposalSeries()->at(point++).y(), speculative->step_ms[i]);
    }

  const QString png = fixture_->path("chart.png");
  QVERIFY(chart->savePng(png));
  QImage image(png);
  QVERIFY(!image.isNull());
  QVERIFY(image.width() > 100 && image.height() > 100);
}

void MainWindowFeaturesTest::regenerated_replies_switch_with_the_arrows() {
  open_window(kvchat::test::greedy_chat_settings(12));
  type_and_send("Once upon a time");
  const QString first_text = controller()->currentMessages().at(1).text;
  ChatSettings shorter = controller()->settings();
  shorter.max_new_tokens = 4;  // a different second reply
  controller()->applySettings(shorter);
  window_->findChild<QPushButton*>("regenerateButton")->click();
  QVERIFY(fixture_->waitIdle());
  QTRY_COMPARE(window_->chatView()->messageWidgets().size(), 2);
  kvchat::ui::MessageWidget* reply = window_->chatView()->messageWidgets()[1];
  QCOMPARE(reply->alternativesText(), QStringLiteral("2/2"));
  QVERIFY(reply->text() != first_text);
  reply->findChild<QToolButton*>("previousAlternativeButton")->click();
  QTRY_COMPARE(window_->chatView()->messageWidgets()[1]->text(), first_text);
  QCOMPARE(window_->chatView()->messageWidgets()[1]->alternativesText(), QStringLiteral("1/2"));
  // The next turn continues from the reply shown.
  const auto engine = controller()->engineMessages(controller()->currentConversationId());
  QCOMPARE(QString::fromStdString(engine.back().content), first_text);
}

// Edit on the first of two messages: the message box holds it, Resend forks the chat there. The transcript
// shows the edit and its reply with "2/2" on the edit; ‹ brings back the first branch, whole, with "1/2".
// From the keys: Ctrl+Shift+E twice edits the message before the last, Alt+Shift+Right shows the next branch.
void MainWindowFeaturesTest::an_earlier_message_is_edited_into_a_branch() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  type_and_send("Lily went to the park");
  const QList<kvchat::app::MessageRecord> original = controller()->currentMessages();
  QCOMPARE(original.size(), 4);
  QTRY_COMPARE(window_->chatView()->messageWidgets().size(), 4);
  kvchat::ui::MessageWidget* first = window_->chatView()->messageWidget(original[0].id);
  QVERIFY(first->editButton() && first->editButton()->isVisible());
  QVERIFY(!window_->chatView()->messageWidget(original[1].id)->editButton());  // replies are not edited
  first->editButton()->click();
  QCOMPARE(window_->messageInput()->toPlainText(), QStringLiteral("Once upon a time"));
  QVERIFY(window_->findChild<QLabel*>("editingLabel")->isVisible());
  QCOMPARE(window_->findChild<QPushButton*>("sendButton")->text(), QStringLiteral("Resend"));
  window_->messageInput()->clear();
  type_and_send("Tom had a dog");

  QTRY_COMPARE(window_->chatView()->messageWidgets().size(), 2);
  QList<kvchat::ui::MessageWidget*> widgets = window_->chatView()->messageWidgets();
  QCOMPARE(widgets[0]->text(), QStringLiteral("Tom had a dog"));
  QCOMPARE(widgets[0]->branchesText(), QStringLiteral("2/2"));
  QVERIFY(widgets[0]->findChild<QLabel*>("branchLabel")->isVisible());
  QVERIFY(!widgets[0]->findChild<QToolButton*>("nextBranchButton")->isEnabled());
  QCOMPARE(widgets[1]->role(), kvchat::app::MessageRole::Assistant);
  QVERIFY(!window_->findChild<QLabel*>("editingLabel")->isVisible());
  const auto engine = controller()->engineMessages(controller()->currentConversationId());
  QCOMPARE(engine.size(), std::size_t{2});
  QCOMPARE(QString::fromStdString(engine[0].content), QStringLiteral("Tom had a dog"));

  widgets[0]->findChild<QToolButton*>("previousBranchButton")->click();
  QTRY_COMPARE(window_->chatView()->messageWidgets().size(), 4);
  widgets = window_->chatView()->messageWidgets();
  for (int i = 0; i < 4; ++i) {
    QCOMPARE(widgets[i]->messageId(), original[i].id);
    QCOMPARE(widgets[i]->text(), original[i].text);
  }
  QCOMPARE(widgets[0]->branchesText(), QStringLiteral("1/2"));
  QCOMPARE(widgets[2]->branchesText(), QString());

  // The keys: the last message, then the one before it.
  window_->messageInput()->setFocus();
  QTest::keyClick(window_->messageInput(), Qt::Key_E, Qt::ControlModifier | Qt::ShiftModifier);
  QCOMPARE(window_->messageInput()->toPlainText(), QStringLiteral("Lily went to the park"));
  QTest::keyClick(window_->messageInput(), Qt::Key_E, Qt::ControlModifier | Qt::ShiftModifier);
  QCOMPARE(window_->messageInput()->toPlainText(), QStringLiteral("Once upon a time"));
  QTest::keyClick(window_->messageInput(), Qt::Key_Right, Qt::AltModifier | Qt::ShiftModifier);
  QTRY_COMPARE(window_->chatView()->messageWidgets().size(), 2);
  QCOMPARE(window_->chatView()->messageWidgets()[0]->branchesText(), QStringLiteral("2/2"));
  // Editing followed the message to its other version.
  QCOMPARE(window_->messageInput()->toPlainText(), QStringLiteral("Tom had a dog"));
  QTest::keyClick(window_->messageInput(), Qt::Key_Escape);
  QVERIFY(!window_->findChild<QLabel*>("editingLabel")->isVisible());
}

void MainWindowFeaturesTest::the_caches_dialog_lists_and_clears_caches() {
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  const qint64 first = controller()->currentConversationId();
  window_->findChild<QPushButton*>("newChatButton")->click();
  type_and_send("Tom ran");
  kvchat::ui::CachesDialog* dialog = window_->openCachesDialog();
  QCOMPARE(dialog->table()->rowCount(), 2);
  QVERIFY2(dialog->totalLabel()->text().startsWith("2 chats hold"), qPrintable(dialog->totalLabel()->text()));
  QStringList titles;
  for (int row = 0; row < 2; ++row) titles << dialog->table()->item(row, 0)->text();
  titles.sort();
  QCOMPARE(titles, (QStringList{"Once upon a time", "Tom ran"}));
  auto* clear = dialog->findChild<QPushButton*>(QStringLiteral("clearCache_%1").arg(first));
  QVERIFY(clear);
  clear->click();
  QTRY_COMPARE(dialog->table()->rowCount(), 1);
  QCOMPARE(dialog->table()->item(0, 0)->text(), QStringLiteral("Tom ran"));
  QVERIFY(dialog->totalLabel()->text().startsWith("1 chat holds"));
  dialog->reject();
}

void MainWindowFeaturesTest::the_text_size_is_a_saved_setting() {
  open_window(kvchat::test::greedy_chat_settings(8));
  window_->setChatFontSize(17);
  QCOMPARE(window_->chatView()->font().pointSize(), 17);
  QCOMPARE(window_->messageInput()->font().pointSize(), 17);
  QCOMPARE(controller()->settings().font_point_size, 17);
  window_->setChatFontSize(500);
  QCOMPARE(window_->chatView()->font().pointSize(), ChatSettings::kMaxFontPointSize);
  // A new window (next start) opens with it.
  window_->setChatFontSize(15);
  window_ = std::make_unique<MainWindow>(controller());
  QCOMPARE(window_->chatView()->font().pointSize(), 15);
}

void MainWindowFeaturesTest::bubbles_follow_a_dark_palette() {
  const QPalette original = QApplication::palette();
  QPalette dark = original;
  dark.setColor(QPalette::Window, QColor(30, 30, 30));
  dark.setColor(QPalette::Base, QColor(20, 20, 20));
  dark.setColor(QPalette::Text, QColor(230, 230, 230));
  dark.setColor(QPalette::WindowText, QColor(230, 230, 230));
  QApplication::setPalette(dark);
  open_window(kvchat::test::greedy_chat_settings(8));
  type_and_send("Once upon a time");
  kvchat::ui::MessageWidget* reply = window_->chatView()->messageWidgets()[1];
  QCoreApplication::processEvents();
  // The reply's text is drawn in the palette's text colour over the bubble, not a fixed light-theme black.
  const QImage picture = reply->grab().toImage();
  int light_pixels = 0;
  for (int y = 0; y < picture.height(); ++y)
    for (int x = 0; x < picture.width(); ++x) light_pixels += qGray(picture.pixel(x, y)) > 180 ? 1 : 0;
  const int all = picture.width() * picture.height();
  QApplication::setPalette(original);
  // Mostly dark (background) with light glyphs: a light bubble would be mostly light pixels.
  QVERIFY2(light_pixels < all / 2, qPrintable(QStringLiteral("%1 of %2 pixels light").arg(light_pixels).arg(all)));
  QVERIFY(light_pixels > 0);
}

KVCHAT_TEST_MAIN(MainWindowFeaturesTest)

}  // namespace ui_test_main_window_features

#include "test_main_window_features.moc"
