#pragma once
// A ChatController on stories260K with greedy settings, a fresh database and settings file: what the
// controller- and window-level tests start from.
#include <QSettings>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>

#include <memory>

#include "app/chat/chat_controller.h"
#include "common/test_paths.h"

namespace kvchat::test {

inline QString stories_model_directory() { return QString::fromStdString(shared_path("models/stories260K")); }

inline kvchat::app::ChatSettings greedy_chat_settings(int max_new_tokens = 40) {
  kvchat::app::ChatSettings settings;
  settings.temperature = 0.0;
  settings.repetition_penalty = 1.0;
  settings.max_new_tokens = max_new_tokens;
  settings.model_path = stories_model_directory();
  settings.threads = 1;
  return settings;
}

class ChatFixture {
 public:
  ChatFixture() : ini_(dir_.filePath("kvchat.ini"), QSettings::IniFormat) {}
  QString path(const QString& name) const { return dir_.filePath(name); }
  QString databasePath() const { return path("chats.sqlite3"); }

  // Saves the settings and opens a controller on them; false when the model did not load within a minute.
  // KV snapshots go to this fixture's folder unless the settings name one.
  bool open(kvchat::app::ChatSettings settings) {
    if (settings.snapshot_directory.isEmpty()) settings.snapshot_directory = path("kv-snapshots");
    settings.save(ini_);
    ini_.sync();
    controller_ = std::make_unique<kvchat::app::ChatController>(databasePath(), &ini_);
    QSignalSpy loaded(&controller_->backendHost(), &kvchat::app::BackendHost::modelLoaded);
    controller_->loadModel(QString());
    return loaded.wait(60000);
  }
  kvchat::app::ChatController* controller() const { return controller_.get(); }
  void close() { controller_.reset(); }
  // The next start: a new controller on the same database and settings file, as the last one left them.
  bool restart() {
    controller_.reset();
    controller_ = std::make_unique<kvchat::app::ChatController>(databasePath(), &ini_);
    QSignalSpy loaded(&controller_->backendHost(), &kvchat::app::BackendHost::modelLoaded);
    controller_->loadModel(QString());
    return loaded.wait(60000);
  }
  // Until no turn runs and none waits.
  bool waitIdle() const {
    return QTest::qWaitFor(
        [&] { return !controller_->isGenerating() && controller_->queuedConversationIds().isEmpty(); }, 120000);
  }

 private:
  QTemporaryDir dir_;
  QSettings ini_;
  std::unique_ptr<kvchat::app::ChatController> controller_;
};

}  // namespace kvchat::test
