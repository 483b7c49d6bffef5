#include "app/server/local_server.h"

#include <spdlog/spdlog.h>

#include <QDir>
#include <QFileInfo>

#include <atomic>
#include <stdexcept>

#include "app/server/openai_server.h"
#include "app/settings.h"
#include "engine/compute/compute_context.h"
#include "engine/compute/compute_options.h"
#include "engine/model/model_loader.h"

namespace kvchat::app {

namespace {
const QString kGroup = QStringLiteral("local_server");
}  // namespace

LocalServerSettings LocalServerSettings::load(QSettings& settings) {
  LocalServerSettings loaded;
  settings.beginGroup(kGroup);
  loaded.enabled = settings.value(QStringLiteral("enabled"), false).toBool();
  bool ok = false;
  const int port = settings.value(QStringLiteral("port"), kDefaultPort).toInt(&ok);
  if (ok && port >= 0 && port <= 65535)
    loaded.port = port;
  else
    spdlog::warn("settings {}/port: {} is not a port (0 to 65535); using {}", kGroup.toStdString(),
                 settings.value(QStringLiteral("port")).toString().toStdString(), kDefaultPort);
  const QVariant stored_key = settings.value(QStringLiteral("api_key"));
  settings.endGroup();
  const QString key_path = api_key_path(settings);
  loaded.api_key = read_key_file(key_path);
  if (stored_key.isValid()) {
    // Where older versions kept it: readable by anyone who can read the settings file.
    const QString old_key = stored_key.toString().trimmed();
    if (loaded.api_key.isEmpty() && !old_key.isEmpty()) {
      write_key_file(key_path, old_key);
      loaded.api_key = read_key_file(key_path);
    }
    if (loaded.api_key.isEmpty() && !old_key.isEmpty()) {
      spdlog::error("settings {}: the local server's API key could not be moved to {}; it stays in the settings file",
                    settings.fileName().toStdString(), key_path.toStdString());
      loaded.api_key = old_key;
    } else {
      settings.remove(kGroup + QStringLiteral("/api_key"));
      settings.sync();
      spdlog::info("settings {}: the local server's API key moved to {} (owner-only)",
                   settings.fileName().toStdString(), key_path.toStdString());
    }
  }
  return loaded;
}

QString LocalServerSettings::api_key_path(const QSettings& settings) {
  return QFileInfo(settings.fileName()).absoluteDir().filePath(QStringLiteral("kvchat-server-api-key"));
}

void LocalServerSettings::save(QSettings& settings) const {
  settings.beginGroup(kGroup);
  settings.setValue(QStringLiteral("enabled"), enabled);
  settings.setValue(QStringLiteral("port"), port);
  settings.remove(QStringLiteral("api_key"));
  settings.endGroup();
  write_key_file(api_key_path(settings), api_key);
  settings.sync();
}

// A stopped server whose last requests are still ending, and the model they run on.
struct LocalServer::Stopping {
  std::shared_ptr<const LoadedModel> model;
  std::shared_ptr<openai::OpenAiServer> server;
  std::thread serve_thread;
  std::thread joiner;
  std::atomic<bool> done{false};
};

LocalServer::LocalServer(QObject* parent) : QObject(parent) {}

LocalServer::~LocalServer() {
  stop();
  for (auto& stopping : stopping_) stopping->joiner.join();
}

QString LocalServer::url() const { return server_ ? QStringLiteral("http://127.0.0.1:%1").arg(port_) : QString(); }

void LocalServer::apply(const LocalServerSettings& settings, std::shared_ptr<const LoadedModel> model,
                        std::int64_t budget_bytes, int threads) {
  reap_finished_stops();
  const bool wanted = settings.enabled && model != nullptr;
  if (server_ && wanted && model == model_ && settings == settings_ && budget_bytes == budget_bytes_ &&
      threads == threads_)
    return;
  stop();
  if (wanted) start(settings, std::move(model), budget_bytes, threads);
}

void LocalServer::start(const LocalServerSettings& settings, std::shared_ptr<const LoadedModel> model,
                        std::int64_t budget_bytes, int threads) {
  openai::ServerOptions options;
  options.host = "127.0.0.1";  // this machine only: the setting says localhost
  options.port = settings.port;
  options.api_key = settings.api_key.toStdString();
  options.memory_budget_bytes = budget_bytes;
  options.model_id = QFileInfo(QDir::cleanPath(QString::fromStdString(model->path))).fileName().toStdString();
  // The app's thread setting, in a context of the server's own: its requests never wait for the chat's.
  // Every thread the server needs starts here, where a failure (out of memory or of threads) is caught and
  // shown: bind() starts the connection threads before it holds the port, then the listening thread.
  std::thread serve_thread;
  try {
    options.compute = std::make_shared<const ComputeContext>(ComputeContext::Options{threads, fast_kernels_enabled()});
    auto server = std::make_shared<openai::OpenAiServer>(*model, nullptr, options);
    server->bind();
    serve_thread = std::thread([server] { server->serve(); });
    port_ = server->bound_port();
    server_ = std::move(server);
  } catch (const std::exception& error) {
    const QString message =
        tr("Cannot serve the model on localhost:%1: %2").arg(settings.port).arg(QString::fromStdString(error.what()));
    spdlog::error("{}", message.toStdString());
    Q_EMIT failed(message);
    return;
  }
  model_ = std::move(model);
  settings_ = settings;
  budget_bytes_ = budget_bytes;
  threads_ = threads;
  serve_thread_ = std::move(serve_thread);
  spdlog::info("serving {} on {} (KV cache budget {} MiB)", options.model_id, url().toStdString(), budget_bytes >> 20);
  Q_EMIT servingChanged(true, url());
}

void LocalServer::stop() {
  if (!server_) return;
  server_->stop();  // the port is closed when this returns
  auto stopping = std::make_unique<Stopping>();
  stopping->model = std::move(model_);
  stopping->server = std::move(server_);
  stopping->serve_thread = std::move(serve_thread_);
  Stopping* state = stopping.get();
  stopping->joiner = std::thread([state] {
    state->serve_thread.join();
    state->server.reset();  // before the model it runs on
    state->model.reset();
    state->done.store(true);
  });
  stopping_.push_back(std::move(stopping));
  spdlog::info("stopped serving on port {}", port_);
  port_ = 0;
  Q_EMIT servingChanged(false, QString());
}

void LocalServer::reap_finished_stops() {
  for (auto it = stopping_.begin(); it != stopping_.end();) {
    if ((*it)->done.load()) {
      (*it)->joiner.join();
      it = stopping_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace kvchat::app
