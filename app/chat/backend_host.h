#pragma once
// What answers the chat's turns, held apart from the chat itself: the engine's thread with its EngineWorker and
// the loaded model, the remote backend's thread with its RemoteWorker, and the draft counter's thread. It loads
// models and remembers which were loaded (File > Models); it knows nothing of conversations, the store or the
// settings' meaning. ChatController sends turns and cache requests to the workers it holds and keeps its own
// state in step with modelLoaded(); the window observes the model's state here (the model label, File > Models).
//
// Ownership: the workers live on the threads this object owns and are deleted by shutdown(), after their
// threads have finished; nothing else deletes them.
#include <QObject>
#include <QString>
#include <QStringList>
#include <QThread>

#include "app/chat/draft_counter.h"
#include "app/chat/engine_worker.h"
#include "app/remote/remote_worker.h"
#include "app/settings.h"

class QSettings;

namespace kvchat::app {

class BackendHost : public QObject {
  Q_OBJECT
 public:
  // `settings_storage` (not owned, must outlive this object) keeps the recent models and the model folders.
  // Starts the three threads; no model is loaded until loadModel().
  explicit BackendHost(QSettings* settings_storage, QObject* parent = nullptr);
  ~BackendHost() override;  // shutdown()

  // Ends the threads (each finishes what it is running: a stopped turn returns within a token) and deletes the
  // workers. Idempotent; nothing may be sent to a worker afterwards.
  void shutdown();

  // Loads `path` (a model directory or a .gguf file) on the engine thread: modelLoading() now, then modelLoaded()
  // or modelLoadFailed(). The model loaded before stays in use until the new one has loaded.
  // `long_context`: LongRoPE models opened for their whole context (ChatSettings::long_context).
  void loadModel(const QString& path, int threads, bool long_context = false);
  bool isModelLoaded() const { return model_loaded_; }
  bool isModelLoading() const { return model_loading_; }
  const ModelInfo& modelInfo() const { return model_info_; }

  // File > Models: the recently loaded models (most recent first; each successful load puts its path first)
  // and the folders the dialog scans, both kept in the settings file.
  QStringList recentModels() const;
  void removeRecentModel(const QString& path);
  QStringList modelFolders() const;
  void setModelFolders(const QStringList& folders);

  // The workers, for the chat's turns (each lives on its own thread: invoke, queued).
  EngineWorker* engine() const { return engine_; }
  RemoteWorker* remote() const { return remote_; }
  DraftCounter* draftCounter() const { return draft_counter_; }
  TurnBackend* turnBackend(BackendKind kind) const;

 Q_SIGNALS:
  void modelLoading(const QString& path);
  void modelLoaded(const kvchat::app::ModelInfo& info);
  void modelLoadFailed(const QString& path, const QString& message);

 private:
  QSettings* settings_storage_;
  QThread engine_thread_;
  EngineWorker* engine_ = nullptr;  // lives on engine_thread_
  QThread remote_thread_;
  RemoteWorker* remote_ = nullptr;  // lives on remote_thread_
  QThread draft_thread_;
  DraftCounter* draft_counter_ = nullptr;  // lives on draft_thread_
  ModelInfo model_info_;
  bool model_loaded_ = false;
  bool model_loading_ = false;
};

}  // namespace kvchat::app
