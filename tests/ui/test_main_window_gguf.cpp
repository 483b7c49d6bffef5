// The main window with a GGUF file, offscreen, over a real controller, store and settings file (greedy):
// File > Open model file offers a GGUF-filtered picker, the chosen stories260K-Q8_0.gguf loads, the status
// bar and the model tooltip show its architecture, quantization type and sizes, the next start opens it
// again, and typing a message gives the reply the engine itself generates on the same file.
#include <QtTest>
#include "common/test_suite.h"

#include <QAction>
#include <QFileDialog>
#include <QFileInfo>
#include <QLabel>
#include <QMenuBar>
#include <QSettings>
#include <QSignalSpy>
#include <QTemporaryDir>

#include <memory>
#include <vector>

#include "app/chat/chat_controller.h"
#include "common/test_paths.h"
#include "engine/generation/session.h"
#include "engine/model/model_loader.h"
#include "ui/chat_view.h"
#include "ui/main_window.h"
#include "ui/message_input.h"
#include "ui/message_widget.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_main_window_gguf {

using kvchat::app::BackendHost;
using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::ui::MainWindow;

namespace {

QString gguf_path() { return QString::fromStdString(kvchat::test::shared_path("fixtures/gguf/stories260K-Q8_0.gguf")); }
QString hf_directory() { return QString::fromStdString(kvchat::test::shared_path("models/stories260K")); }

ChatSettings greedy_settings(const QString& model_path) {
  ChatSettings settings;
  settings.temperature = 0.0;
  settings.repetition_penalty = 1.0;
  settings.max_new_tokens = 32;
  settings.model_path = model_path;
  settings.threads = 1;
  return settings;
}

QAction* find_action(QMainWindow* window, const QString& object_name) {
  for (QAction* action : window->menuBar()->findChildren<QAction*>())
    if (action->objectName() == object_name) return action;
  return window->findChild<QAction*>(object_name);
}

}  // namespace

class MainWindowGgufTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void init();
  void cleanup();
  void file_menu_opens_a_gguf_file_and_shows_its_type();
  void next_start_opens_the_remembered_gguf_file();

 private:
  void open_window(const ChatSettings& settings);

  std::unique_ptr<QTemporaryDir> dir_;
  std::unique_ptr<QSettings> ini_;
  std::unique_ptr<ChatController> controller_;
  std::unique_ptr<MainWindow> window_;
};

void MainWindowGgufTest::init() {
  dir_ = std::make_unique<QTemporaryDir>();
  ini_ = std::make_unique<QSettings>(dir_->filePath("kvchat.ini"), QSettings::IniFormat);
}

void MainWindowGgufTest::cleanup() {
  window_.reset();
  controller_.reset();
  ini_.reset();
  dir_.reset();
}

void MainWindowGgufTest::open_window(const ChatSettings& settings) {
  settings.save(*ini_);
  ini_->sync();
  controller_ = std::make_unique<ChatController>(dir_->filePath("chats.sqlite3"), ini_.get());
  window_ = std::make_unique<MainWindow>(controller_.get());
  window_->show();
  QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
  QSignalSpy loaded(&controller_->backendHost(), &BackendHost::modelLoaded);
  controller_->loadModel(QString());
  QVERIFY(loaded.wait(60000));
}

void MainWindowGgufTest::file_menu_opens_a_gguf_file_and_shows_its_type() {
  open_window(greedy_settings(hf_directory()));
  QCOMPARE(window_->modelLabel()->text(), QStringLiteral("stories260K \u00b7 llama \u00b7 f32 \u00b7 1020.6 KiB"));

  // Both ways to open a model are in the File menu; the file one offers GGUF files.
  QAction* open_directory = find_action(window_.get(), "openModelDirectoryAction");
  QVERIFY(open_directory);
  QAction* open_file = find_action(window_.get(), "openModelFileAction");
  QVERIFY(open_file);
  open_file->trigger();
  auto* picker = window_->findChild<QFileDialog*>("openModelFileDialog");
  QVERIFY(picker);
  QCOMPARE(picker->fileMode(), QFileDialog::ExistingFile);
  QCOMPARE(picker->nameFilters().first(), QStringLiteral("GGUF models (*.gguf)"));

  QSignalSpy loaded(&controller_->backendHost(), &BackendHost::modelLoaded);
  Q_EMIT picker->fileSelected(gguf_path());
  picker->close();
  QVERIFY(loaded.wait(60000));

  // The status bar: name, architecture, quantization type, size on disk; the tooltip has both sizes.
  const qint64 file_bytes = QFileInfo(gguf_path()).size();
  QCOMPARE(file_bytes, qint64(344480));
  QCOMPARE(window_->modelLabel()->text(),
           QStringLiteral("stories260K-Q8_0.gguf \u00b7 llama \u00b7 Q8_0 \u00b7 336.4 KiB"));
  const QStringList tooltip = window_->modelLabel()->toolTip().split('\n');
  QCOMPARE(tooltip.size(), 3);
  QCOMPARE(tooltip[0], gguf_path());
  QVERIFY2(tooltip[1].startsWith(QStringLiteral("llama, Q8_0 weights (gguf): 336.4 KiB on disk, ")),
           qPrintable(tooltip[1]));
  QVERIFY2(tooltip[1].endsWith(QStringLiteral(" in memory")), qPrintable(tooltip[1]));
  QVERIFY2(tooltip[2].contains(QStringLiteral("5 layers, context 512 tokens")), qPrintable(tooltip[2]));
  QVERIFY(window_->windowTitle().endsWith(QStringLiteral("stories260K-Q8_0.gguf")));
  // The new-chat screen describes the model now loaded, not the embedded one it replaced.
  const QString welcome = window_->chatView()->placeholderText();
  QVERIFY2(welcome.contains(QStringLiteral("<b>stories260K-Q8_0.gguf</b> is loaded")), qPrintable(welcome));
  QVERIFY2(welcome.contains(QStringLiteral("<p>Architecture: llama \u00b7 chat template: no</p>")),
           qPrintable(welcome));
  QVERIFY2(welcome.contains(QStringLiteral("continues the text you type")), qPrintable(welcome));
  QVERIFY2(!welcome.contains(QStringLiteral("Once upon a time")), qPrintable(welcome));

  // The chosen file is the settings' model from now on.
  ini_->sync();
  QCOMPARE(ChatSettings::load(*ini_).model_path, gguf_path());

  // Typing a message: the reply is the engine's own greedy continuation on the same file.
  const kvchat::LoadedModel reference = kvchat::load_model(gguf_path().toStdString());
  const auto prompt = reference.tokenizer->encode("Once upon a time", true, false);
  kvchat::Session session(reference.model, kvchat::KvCacheMode::Contiguous);
  kvchat::GenerationConfig config;
  config.max_new_tokens = 32;
  const auto expected = session.generate(prompt, config);

  window_->messageInput()->setFocus();
  QTest::keyClicks(window_->messageInput(), "Once upon a time");
  QTest::keyClick(window_->messageInput(), Qt::Key_Return);
  QVERIFY(controller_->isGenerating());
  QVERIFY(QTest::qWaitFor([&] { return !controller_->isGenerating(); }, 120000));
  QTRY_COMPARE(window_->chatView()->messageWidgets().size(), 2);
  const auto widgets = window_->chatView()->messageWidgets();
  QCOMPARE(widgets[1]->role(), kvchat::app::MessageRole::Assistant);
  QCOMPARE(widgets[1]->text(), QString::fromStdString(reference.tokenizer->decode(expected.generated, true)));
  QCOMPARE(controller_->lastReplyStats()->generated_tokens, static_cast<int>(expected.generated.size()));
  QCOMPARE(controller_->currentMessages()[1].model, QStringLiteral("stories260K-Q8_0.gguf"));
}

void MainWindowGgufTest::next_start_opens_the_remembered_gguf_file() {
  // A settings file written before model_path existed: its model_directory key still names the model.
  {
    QSettings old(dir_->filePath("kvchat.ini"), QSettings::IniFormat);
    old.setValue("chat/model_directory", gguf_path());
    old.setValue("chat/temperature", 0.0);
    old.sync();
  }
  controller_ = std::make_unique<ChatController>(dir_->filePath("chats.sqlite3"), ini_.get());
  QCOMPARE(controller_->settings().model_path, gguf_path());
  window_ = std::make_unique<MainWindow>(controller_.get());
  window_->show();
  QSignalSpy loaded(&controller_->backendHost(), &BackendHost::modelLoaded);
  controller_->loadModel(QString());
  QVERIFY(loaded.wait(60000));
  QCOMPARE(window_->modelLabel()->text(),
           QStringLiteral("stories260K-Q8_0.gguf \u00b7 llama \u00b7 Q8_0 \u00b7 336.4 KiB"));
  QVERIFY(window_->modelLabel()->toolTip().contains(QStringLiteral("llama, Q8_0 weights (gguf)")));
}

KVCHAT_TEST_MAIN(MainWindowGgufTest)

}  // namespace ui_test_main_window_gguf

#include "test_main_window_gguf.moc"
