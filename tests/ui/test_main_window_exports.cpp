// File > Export in the window, offscreen over stories260K: the dialog says what the file will hold (the
// other versions of regenerated replies included) and the written file has them; the export folder is
// remembered across a restart. Export all chats and Import chats go through their dialogs too, and a file cut
// short imports nothing.
#include <QtTest>
#include "common/test_suite.h"

#include <QDir>
#include <QFile>
#include <QFileDialog>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QMessageBox>
#include <QTemporaryDir>

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
  void all_chats_export_and_import_through_the_file_menu();

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

// File > Export all chats writes the archive through its dialog; File > Import chats adds its chat as a new one;
// a file cut short adds nothing and the error dialog says what is wrong with which file.
void MainWindowExportsTest::all_chats_export_and_import_through_the_file_menu() {
  open_window();
  type_and_send("Once upon a time");
  ChatController* controller = fixture_->controller();
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("all.json"));
  window_->findChild<QAction*>("exportAllAction")->trigger();
  auto* save = window_->findChild<QFileDialog*>("exportAllDialog");
  QVERIFY(save);
  save->setDirectory(dir.path());
  save->selectFile(path);
  static_cast<QDialog*>(save)->accept();
  QFile file(path);
  QVERIFY(file.open(QIODevice::ReadOnly));
  const QByteArray archive = file.readAll();
  QCOMPARE(QJsonDocument::fromJson(archive).object().value("format").toString(), QStringLiteral("kvchat-chats"));

  window_->findChild<QAction*>("importAction")->trigger();
  auto* open = window_->findChild<QFileDialog*>("importDialog");
  QVERIFY(open);
  open->setDirectory(dir.path());
  open->selectFile(path);
  static_cast<QDialog*>(open)->accept();
  QCOMPARE(controller->conversations().size(), 2);
  QCOMPARE(controller->conversations()[0].title, controller->conversations()[1].title);
  QVERIFY(controller->conversations()[0].id != controller->conversations()[1].id);

  const QString cut = dir.filePath(QStringLiteral("cut.json"));
  QFile cut_file(cut);
  QVERIFY(cut_file.open(QIODevice::WriteOnly));
  cut_file.write(archive.left(archive.size() / 2));
  cut_file.close();
  QVERIFY(!window_->importConversations(cut));
  auto* box = window_->findChild<QMessageBox*>("importErrorDialog");
  QVERIFY(box);
  QVERIFY2(
      box->text().startsWith(QStringLiteral("Nothing was imported. cannot import %1: it is not valid JSON (").arg(cut)),
      qPrintable(box->text()));
  QCOMPARE(controller->conversations().size(), 2);
}

KVCHAT_TEST_MAIN(MainWindowExportsTest)

}  // namespace ui_test_main_window_exports

#include "test_main_window_exports.moc"
