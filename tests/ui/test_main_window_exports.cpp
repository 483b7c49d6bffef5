// File > Export in the window, offscreen over stories260K: the dialog says what the file will hold (the
// other versions of regenerated replies included) and the written file has them; the export folder is
// remembered across a restart.
#include <QtTest>
#include "common/test_suite.h"

#include <QDir>
#include <QFile>
#include <QFileDialog>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>

#include "common/chat_fixture.h"
#include "ui/main_window.h"
#include "ui/message_input.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_main_window_exports {

using kvchat::app::ChatController;
using kvchat::ui::MainWindow;

class MainWindowExportsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void cleanup();
  void the_dialog_says_what_is_exported_and_the_file_has_it();
  void the_export_folder_is_remembered_across_a_restart();

 private:
  void open_window() {
    QVERIFY(fixture_->open(kvchat::test::greedy_chat_settings(8)));
    window_ = std::make_unique<MainWindow>(fixture_->controller());
    window_->show();
    QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
  }
  void type_and_send(const QString& text) {
    QTest::keyClicks(window_->messageInput(), text);
    QTest::keyClick(window_->messageInput(), Qt::Key_Return);
    QVERIFY(fixture_->waitIdle());
  }
  // Exports through the dialog into `folder` as `name`; returns the dialog's summary line.
  QString export_through_dialog(const QString& folder, const QString& name) {
    QFileDialog* dialog = window_->openExportDialog();
    auto* label = dialog ? dialog->findChild<QLabel*>("exportContentsLabel") : nullptr;
    const QString summary = label ? label->text() : QString();
    if (!dialog) return summary;
    dialog->setDirectory(folder);
    dialog->selectFile(QDir(folder).filePath(name));
    static_cast<QDialog*>(dialog)->accept();
    return summary;
  }

  std::unique_ptr<kvchat::test::ChatFixture> fixture_ = std::make_unique<kvchat::test::ChatFixture>();
  std::unique_ptr<MainWindow> window_;
};

void MainWindowExportsTest::cleanup() {
  window_.reset();
  fixture_ = std::make_unique<kvchat::test::ChatFixture>();
}

void MainWindowExportsTest::the_dialog_says_what_is_exported_and_the_file_has_it() {
  open_window();
  type_and_send("Once upon a time");
  ChatController* controller = fixture_->controller();
  QFileDialog* plain = window_->openExportDialog();
  QVERIFY(plain);
  QCOMPARE(plain->findChild<QLabel*>("exportContentsLabel")->text(),
           QStringLiteral("Exports all 2 messages of this chat as it reads, each reply with its model and figures. No "
                          "reply was regenerated: there are no other versions."));
  plain->reject();

  QVERIFY(controller->regenerate());
  QVERIFY(fixture_->waitIdle());
  const auto records = controller->currentMessages();
  QCOMPARE(records.size(), 3);
  const QString folder = fixture_->path("exports");
  QVERIFY(QDir().mkpath(folder));
  const QString summary = export_through_dialog(folder, "story.json");
  QCOMPARE(summary, QStringLiteral("Exports all 2 messages of this chat as it reads, each reply with its model and "
                                   "figures, and the 1 other version of regenerated replies, each marked as such (in "
                                   "JSON, a reply's \u201calternatives\u201d)."));
  const QString written = QDir(folder).filePath("story.json");
  QTRY_VERIFY(QFile::exists(written));
  QFile file(written);
  QVERIFY(file.open(QIODevice::ReadOnly));
  const QJsonArray items = QJsonDocument::fromJson(file.readAll()).object().value("messages").toArray();
  QCOMPARE(items.size(), 2);
  QCOMPARE(items[1].toObject().value("id").toInteger(), records[2].id);
  const QJsonArray alternatives = items[1].toObject().value("alternatives").toArray();
  QCOMPARE(alternatives.size(), 1);
  QCOMPARE(alternatives[0].toObject().value("id").toInteger(), records[1].id);
  QCOMPARE(alternatives[0].toObject().value("text").toString(), records[1].text);
}

void MainWindowExportsTest::the_export_folder_is_remembered_across_a_restart() {
  open_window();
  type_and_send("Once upon a time");
  const QString folder = fixture_->path("my exports");
  QVERIFY(QDir().mkpath(folder));
  export_through_dialog(folder, "story.md");
  QTRY_VERIFY(QFile::exists(QDir(folder).filePath("story.md")));

  window_.reset();
  QVERIFY(fixture_->restart());
  window_ = std::make_unique<MainWindow>(fixture_->controller());
  QFileDialog* dialog = window_->openExportDialog();
  QVERIFY(dialog);
  QCOMPARE(QFileInfo(dialog->directory().absolutePath()).canonicalFilePath(), QFileInfo(folder).canonicalFilePath());
  dialog->reject();
}

KVCHAT_TEST_MAIN(MainWindowExportsTest)

}  // namespace ui_test_main_window_exports

#include "test_main_window_exports.moc"
