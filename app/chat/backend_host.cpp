#include "app/chat/backend_host.h"

#include <spdlog/spdlog.h>

#include <QSettings>

#include "app/model_catalog.h"

namespace kvchat::app {

BackendHost::BackendHost(QSettings* settings_storage, QObject* parent)
    : QObject(parent), settings_storage_(settings_storage) {
  EngineWorker::register_meta_types();
  qRegisterMetaType<kvchat::app::DraftMeasure>("kvchat::app::DraftMeasure");
  qRegisterMetaType<kvchat::app::DraftRequest>("kvchat::app::DraftRequest");
  engine_ = new EngineWorker;
  engine_->moveToThread(&engine_thread_);
  engine_thread_.setObjectName("engine");
  remote_ = new RemoteWorker;
  remote_->moveToThread(&remote_thread_);
  remote_thread_.setObjectName("remote");
  draft_counter_ = new DraftCounter;
  draft_counter_->moveToThread(&draft_thread_);
  draft_thread_.setObjectName("draft-counter");

  connect(engine_, &EngineWorker::loaded, this, [this](const ModelInfo& info) {
    model_info_ = info;
    model_loaded_ = true;
    model_loading_ = false;
    save_recent_models(*settings_storage_, with_recent_model(load_recent_models(*settings_storage_), info.path));
    Q_EMIT modelLoaded(info);
  });
  connect(engine_, &EngineWorker::loadFailed, this, [this](const QString& path, const QString& message) {
    model_loading_ = false;  // the previous model, if any, stays
    Q_EMIT modelLoadFailed(path, message);
  });
  engine_thread_.start();
  remote_thread_.start();
  draft_thread_.start();
}

BackendHost::~BackendHost() { shutdown(); }

void BackendHost::shutdown() {
  if (!engine_) return;
  engine_thread_.quit();
  remote_thread_.quit();
  draft_thread_.quit();
  engine_thread_.wait();
  remote_thread_.wait();  // a remote turn sees its stop flag at the next chunk and closes the connection
  draft_thread_.wait();
  delete engine_;
  delete remote_;
  delete draft_counter_;
  engine_ = nullptr;
  remote_ = nullptr;
  draft_counter_ = nullptr;
}

void BackendHost::loadModel(const QString& path, int threads, bool long_context) {
  model_loading_ = true;
  Q_EMIT modelLoading(path);
  spdlog::debug("loading model {} with {} threads{}", path.toStdString(), threads,
                long_context ? ", LongRoPE models for their long context" : "");
  QMetaObject::invokeMethod(
      engine_, [worker = engine_, path, threads, long_context] { worker->loadModel(path, threads, long_context); },
      Qt::QueuedConnection);
}

TurnBackend* BackendHost::turnBackend(BackendKind kind) const {
  if (kind == BackendKind::Remote) return remote_;
  return engine_;
}

QStringList BackendHost::recentModels() const { return load_recent_models(*settings_storage_); }

void BackendHost::removeRecentModel(const QString& path) {
  QStringList recent = load_recent_models(*settings_storage_);
  recent.removeAll(path);
  save_recent_models(*settings_storage_, recent);
}

QStringList BackendHost::modelFolders() const { return load_model_folders(*settings_storage_); }

void BackendHost::setModelFolders(const QStringList& folders) { save_model_folders(*settings_storage_, folders); }

}  // namespace kvchat::app
