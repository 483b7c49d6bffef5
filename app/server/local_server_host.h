#pragma once
// The desktop app's local server as one concern, held by the window apart from the chat: its settings (saved
// in the settings file), the LocalServer, and when it runs. The server runs on the loaded model and stops while
// another loads; a change of its settings, of the sessions' budget or of the thread count restarts it.
// Lives on the GUI thread.
#include <QObject>

#include <cstdint>
#include <memory>

#include "app/server/local_server.h"

class QSettings;

namespace kvchat {
struct LoadedModel;
}

namespace kvchat::app {

class LocalServerHost : public QObject {
  Q_OBJECT
 public:
  // Reads the settings from `settings_storage` (not owned, must outlive the host). Serves nothing until serve().
  explicit LocalServerHost(QSettings* settings_storage, QObject* parent = nullptr);
  ~LocalServerHost() override;  // stops the server and waits for its last requests

  const LocalServerSettings& settings() const { return settings_; }
  // Settings -> "Serve the loaded model on localhost:PORT": saved, and applied at once (the server starts,
  // restarts or stops).
  void applySettings(const LocalServerSettings& settings);
  LocalServer& server() const { return *server_; }

  // What there is to serve: the loaded model (null while one loads, or none), the sessions' KV cache budget
  // and the compute threads (0: the machine's cores). Served when the settings say so.
  void serve(std::shared_ptr<const LoadedModel> model, std::int64_t budget_bytes, int threads);
  void stop();

 private:
  void apply();

  QSettings* settings_storage_;
  LocalServerSettings settings_;
  LocalServer* server_;  // a child
  std::shared_ptr<const LoadedModel> model_;
  std::int64_t budget_bytes_ = 0;
  int threads_ = 0;
};

}  // namespace kvchat::app
