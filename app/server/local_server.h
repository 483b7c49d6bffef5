#pragma once
// The desktop app's "Serve the loaded model on localhost:PORT": the same OpenAI server as `kvchat-cli
// serve` (app/server/openai_server.h), on the model the app has loaded, beside the app's own chats. The server
// has its own sessions (the app's conversations are never run by it); the model and the kernels are
// shared, and compute_lock.h keeps a model load or a thread-count change from running under it.
//
// Lives on the GUI thread. Starting binds the port and starts the server's threads at once (a port in use,
// or threads the machine cannot start, is a failed() signal saying so, never a silent failure or an
// abort); the server then runs on threads of its own. Stopping closes the port at
// once, stops running generations at their next token, and lets the last requests end on a thread of
// its own, so the GUI never waits for a slow client.
#include <QObject>
#include <QSettings>
#include <QString>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace kvchat {
struct LoadedModel;
}

namespace kvchat::app {

namespace openai {
class OpenAiServer;
}

// The setting, in its own QSettings group ("local_server"), apart from the chat settings; the API key in
// a file of its own beside the settings file (api_key_path(), owner-only), never in the settings file.
struct LocalServerSettings {
  bool enabled = false;
  int port = 8080;  // 0 = any free port (tests)
  QString api_key;  // empty = none required
  static constexpr int kDefaultPort = 8080;

  // A bad port keeps the default, logged. A key an older version left in the settings file is moved to
  // the key file (and removed from the settings file once the key file holds it).
  static LocalServerSettings load(QSettings& settings);
  void save(QSettings& settings) const;
  // "kvchat-server-api-key" next to the settings file (the remote backend's key is "kvchat-api-key").
  static QString api_key_path(const QSettings& settings);
  bool operator==(const LocalServerSettings& other) const {
    return enabled == other.enabled && port == other.port && api_key == other.api_key;
  }
  bool operator!=(const LocalServerSettings& other) const { return !(*this == other); }
};

class LocalServer : public QObject {
  Q_OBJECT
 public:
  explicit LocalServer(QObject* parent = nullptr);
  ~LocalServer() override;  // stops and waits for the last requests

  // Serves `model` as `settings` say (restarting when the model or a setting changed), or stops when
  // they are off or `model` is null. `budget_bytes`: the server's sessions' KV cache budget.
  // `threads`: the server's own compute threads (the app's setting; 0 = the machine's cores).
  void apply(const LocalServerSettings& settings, std::shared_ptr<const LoadedModel> model, std::int64_t budget_bytes,
             int threads = 0);
  void stop();

  bool isServing() const { return server_ != nullptr; }
  int port() const { return port_; }  // the bound port while serving
  QString url() const;                // "http://127.0.0.1:PORT", empty when not serving

 Q_SIGNALS:
  void servingChanged(bool serving, const QString& url);
  void failed(const QString& message);

 private:
  void start(const LocalServerSettings& settings, std::shared_ptr<const LoadedModel> model, std::int64_t budget_bytes,
             int threads);
  void reap_finished_stops();

  std::shared_ptr<const LoadedModel> model_;
  std::shared_ptr<openai::OpenAiServer> server_;
  std::thread serve_thread_;
  LocalServerSettings settings_;
  std::int64_t budget_bytes_ = 0;
  int threads_ = 0;
  int port_ = 0;
  struct Stopping;
  std::vector<std::unique_ptr<Stopping>> stopping_;  // servers finishing their last requests
};

}  // namespace kvchat::app
