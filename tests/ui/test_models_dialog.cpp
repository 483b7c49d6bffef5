// File > Models, offscreen over real files: the recent models (most recent first, a model loaded again moved
// up, a deleted file shown missing and removable, a damaged one with the reader's error in its row) with their
// format, size, architecture and quantization from metadata alone; the folders to scan (saved) and what a scan
// finds in them (GGUF files, Hugging Face folders, within the depth); Enter loads a model; and a chat offers
// the model its last reply came from without loading it.
#include <QtTest>
#include "common/test_suite.h"

#include <QDir>
#include <QFile>
#include <QLabel>
#include <QListWidget>
#include <QPushButton>
#include <QTemporaryDir>
#include <QTreeWidget>

#include "common/chat_fixture.h"
#include "ui/main_window.h"
#include "ui/message_input.h"
#include "ui/models_dialog.h"
#include "ui/stats_format.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_models_dialog {

using kvchat::app::BackendHost;
using kvchat::app::ChatController;
using kvchat::ui::MainWindow;
using kvchat::ui::ModelsDialog;

class ModelsDialogTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void cleanup();
  void recent_models_show_their_metadata();
  void a_scan_finds_models_in_the_folders_and_enter_loads_one();
  void a_chat_offers_the_model_its_last_reply_came_from();

 private:
  void open_window() {
    QVERIFY(fixture_->open(kvchat::test::greedy_chat_settings(6)));
    window_ = std::make_unique<MainWindow>(controller());
    window_->show();
    QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
    QApplication::setActiveWindow(window_.get());
    QVERIFY(QTest::qWaitForWindowActive(window_.get()));
  }
  bool load(const QString& path) {
    QSignalSpy loaded(&controller()->backendHost(), &BackendHost::modelLoaded);
    controller()->loadModel(path, true);
    return loaded.wait(60000) && controller()->backendHost().modelInfo().path == path;
  }
  ChatController* controller() const { return fixture_->controller(); }
  QString shared(const char* path) const { return QString::fromStdString(kvchat::test::shared_path(path)); }
  static QStringList row(const QTreeWidget* list, int index) {
    QStringList texts;
    for (int column = 0; column <= ModelsDialog::StatusColumn; ++column)
      texts << list->topLevelItem(index)->text(column);
    return texts;
  }
  static bool copy_folder(const QString& from, const QString& to) {
    if (!QDir().mkpath(to)) return false;
    for (const QFileInfo& entry : QDir(from).entryInfoList(QDir::Files))
      if (!QFile::copy(entry.absoluteFilePath(), QDir(to).filePath(entry.fileName()))) return false;
    return true;
  }
  static qint64 folder_bytes(const QString& folder) {
    qint64 bytes = 0;
    for (const QFileInfo& entry : QDir(folder).entryInfoList(QDir::Files)) bytes += entry.size();
    return bytes;
  }

  std::unique_ptr<kvchat::test::ChatFixture> fixture_ = std::make_unique<kvchat::test::ChatFixture>();
  std::unique_ptr<MainWindow> window_;
  QTemporaryDir files_;
};

void ModelsDialogTest::cleanup() {
  window_.reset();
  fixture_ = std::make_unique<kvchat::test::ChatFixture>();
}

void ModelsDialogTest::recent_models_show_their_metadata() {
  open_window();
  const QString q8 = files_.filePath("stories-q8.gguf");
  const QString damaged = files_.filePath("damaged.gguf");
  const QString gone = files_.filePath("gone.gguf");
  const QString folder = files_.filePath("models/story-folder");
  QVERIFY(QFile::copy(shared("fixtures/gguf/stories260K-Q8_0.gguf"), q8));
  QVERIFY(QFile::copy(shared("fixtures/gguf/stories260K-Q4_0.gguf"), damaged));
  QVERIFY(QFile::copy(shared("fixtures/gguf/stories260K-F32.gguf"), gone));
  QVERIFY(copy_folder(shared("models/stories260K"), folder));
  for (const QString& path : {q8, damaged, gone, folder, q8}) QVERIFY2(load(path), qPrintable(path));
  // Afterwards: one file deleted, one cut to its first 64 bytes (a new file: the loaded one stays mapped intact).
  QVERIFY(QFile::remove(gone));
  QFile original(shared("fixtures/gguf/stories260K-Q4_0.gguf"));
  QVERIFY(original.open(QIODevice::ReadOnly));
  QVERIFY(QFile::remove(damaged));
  QFile cut(damaged);
  QVERIFY(cut.open(QIODevice::WriteOnly));
  QCOMPARE(cut.write(original.read(64)), qint64(64));
  cut.close();

  // Keyboard: Ctrl+M.
  QTest::keyClick(window_->messageInput(), Qt::Key_M, Qt::ControlModifier);
  auto* dialog = window_->findChild<ModelsDialog*>("modelsDialog");
  QVERIFY(dialog && dialog->isVisible());
  const QTreeWidget* recent = dialog->recentList();
  QCOMPARE(recent->topLevelItemCount(), 5);
  using kvchat::ui::format_bytes;
  QCOMPARE(row(recent, 0),
           (QStringList{"stories-q8.gguf", "GGUF", format_bytes(QFileInfo(q8).size()), "llama", "Q8_0", "Loaded"}));
  QCOMPARE(row(recent, 1), (QStringList{"story-folder", "Hugging Face folder", format_bytes(folder_bytes(folder)),
                                        "llama (LlamaForCausalLM)", "", ""}));
  QCOMPARE(row(recent, 2), (QStringList{"gone.gguf", "GGUF", "", "", "", "Missing"}));
  QCOMPARE(row(recent, 3).mid(0, 5), (QStringList{"damaged.gguf", "GGUF", "64 B", "", ""}));
  QCOMPARE(row(recent, 3)[5],
           QStringLiteral("Cannot be read: %1: header at offset 8: tensor count 47 cannot fit in the "
                          "remaining 40 bytes (limit 1048576)")
               .arg(damaged));
  QCOMPARE(row(recent, 4).mid(0, 4),
           (QStringList{"stories260K", "Hugging Face folder", format_bytes(folder_bytes(shared("models/stories260K"))),
                        "llama (LlamaForCausalLM)"}));
  QCOMPARE(recent->topLevelItem(2)->data(ModelsDialog::NameColumn, ModelsDialog::kPathRole).toString(), gone);

  // The missing one is removed from the list (and from the settings).
  const_cast<QTreeWidget*>(recent)->setCurrentItem(recent->topLevelItem(2));
  dialog->findChild<QPushButton*>("removeRecentModelButton")->click();
  QCOMPARE(recent->topLevelItemCount(), 4);
  QCOMPARE(controller()->backendHost().recentModels(),
           (QStringList{q8, folder, damaged, QDir::cleanPath(shared("models/stories260K"))}));
  // Enter on a damaged one loads nothing: its row says why.
  const_cast<QTreeWidget*>(recent)->setCurrentItem(recent->topLevelItem(2));
  QSignalSpy loading(&controller()->backendHost(), &BackendHost::modelLoading);
  QTest::keyClick(const_cast<QTreeWidget*>(recent), Qt::Key_Return);
  QCOMPARE(loading.count(), 0);
  QVERIFY(dialog->isVisible());
  dialog->close();
}

void ModelsDialogTest::a_scan_finds_models_in_the_folders_and_enter_loads_one() {
  open_window();
  const QString root = files_.filePath("library");
  QVERIFY(QDir().mkpath(root + "/a/b"));
  QVERIFY(QDir().mkpath(root + "/deep/1/2/3/4"));
  QVERIFY(QFile::copy(shared("fixtures/gguf/stories260K-Q4_0.gguf"), root + "/a/b/x.gguf"));
  QVERIFY(QFile::copy(shared("fixtures/gguf/stories260K-Q4_0.gguf"), root + "/deep/1/2/3/4/too-deep.gguf"));
  QVERIFY(copy_folder(shared("models/stories260K"), root + "/hf"));
  QVERIFY(QDir().mkpath(root + "/hf/inside"));
  QVERIFY(QFile::copy(shared("fixtures/gguf/stories260K-Q8_0.gguf"), root + "/hf/inside/not-looked-at.gguf"));
  QFile notes(root + "/notes.txt");
  QVERIFY(notes.open(QIODevice::WriteOnly));
  notes.write("not a model");
  notes.close();

  ModelsDialog* dialog = window_->openModelsDialog();
  QSignalSpy scanned(dialog, &ModelsDialog::scanFinished);
  dialog->addFolder(root);
  QVERIFY(scanned.wait(30000));
  QCOMPARE(controller()->backendHost().modelFolders(), QStringList{root});
  QCOMPARE(dialog->foldersList()->count(), 1);
  const QTreeWidget* found = dialog->foundList();
  QCOMPARE(found->topLevelItemCount(), 2);
  QCOMPARE(row(found, 0),
           (QStringList{"x.gguf", "GGUF", kvchat::ui::format_bytes(QFileInfo(root + "/a/b/x.gguf").size()), "llama",
                        "Q4_0", ""}));
  QCOMPARE(row(found, 1).mid(0, 5),
           (QStringList{"hf", "Hugging Face folder", kvchat::ui::format_bytes(folder_bytes(root + "/hf")),
                        "llama (LlamaForCausalLM)", ""}));
  // Enter loads the chosen one and closes the dialog.
  const_cast<QTreeWidget*>(found)->setFocus();
  const_cast<QTreeWidget*>(found)->setCurrentItem(found->topLevelItem(0));
  QSignalSpy loaded(&controller()->backendHost(), &BackendHost::modelLoaded);
  QTest::keyClick(const_cast<QTreeWidget*>(found), Qt::Key_Return);
  QVERIFY(loaded.wait(60000));
  QCOMPARE(controller()->backendHost().modelInfo().path, root + "/a/b/x.gguf");
  QCOMPARE(controller()->backendHost().recentModels().first(), root + "/a/b/x.gguf");

  // The folder is kept: a new dialog scans it again.
  ModelsDialog* again = window_->openModelsDialog();
  QSignalSpy rescanned(again, &ModelsDialog::scanFinished);
  QVERIFY(rescanned.wait(30000));
  QCOMPARE(again->foundList()->topLevelItemCount(), 2);
  QCOMPARE(again->foundList()->topLevelItem(0)->text(ModelsDialog::StatusColumn), QStringLiteral("Loaded"));
  again->close();
}

void ModelsDialogTest::a_chat_offers_the_model_its_last_reply_came_from() {
  open_window();
  const QString folder = shared("models/stories260K");
  const QString q8 = files_.filePath("offered-q8.gguf");
  QVERIFY(QFile::copy(shared("fixtures/gguf/stories260K-Q8_0.gguf"), q8));
  QWidget* bar = window_->lastModelBar();
  QVERIFY(controller()->send("Once upon a time"));
  QVERIFY(fixture_->waitIdle());
  const qint64 folder_chat = controller()->currentConversationId();
  QVERIFY(bar->isHidden());
  controller()->newConversation();
  QVERIFY(load(q8));
  QVERIFY(controller()->send("Once upon a time"));
  QVERIFY(fixture_->waitIdle());
  const qint64 gguf_chat = controller()->currentConversationId();
  QVERIFY(bar->isHidden());

  QSignalSpy loading(&controller()->backendHost(), &BackendHost::modelLoading);
  controller()->selectConversation(folder_chat);
  QVERIFY(bar->isVisible());
  QCOMPARE(bar->findChild<QLabel*>("lastModelLabel")->text(), QStringLiteral("This chat last used stories260K"));
  auto* button = bar->findChild<QPushButton*>("loadLastModelButton");
  QCOMPARE(button->text(), QStringLiteral("Load stories260K"));
  QCOMPARE(loading.count(), 0);  // offered, not loaded
  QCOMPARE(controller()->backendHost().modelInfo().path, q8);

  QSignalSpy loaded(&controller()->backendHost(), &BackendHost::modelLoaded);
  button->click();
  QVERIFY(loaded.wait(60000));
  QCOMPARE(controller()->backendHost().modelInfo().path, folder);
  QVERIFY(bar->isHidden());
  controller()->selectConversation(gguf_chat);
  QVERIFY(bar->isVisible());
  QCOMPARE(bar->findChild<QLabel*>("lastModelLabel")->text(), QStringLiteral("This chat last used offered-q8.gguf"));
}

KVCHAT_TEST_MAIN(ModelsDialogTest)

}  // namespace ui_test_models_dialog

#include "test_models_dialog.moc"
