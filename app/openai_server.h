#pragma once
// An OpenAI-compatible HTTP server on one loaded model: GET /health, GET /v1/models,
// POST /v1/chat/completions and POST /v1/completions, streamed as server-sent events or answered whole.
// cpp-httplib serves the sockets on its own thread pool (no Qt event loop), so `kvchat-cli serve` and,
// later, the desktop app can both host it. No endpoint reads or writes files; with a cache folder the
// sessions' KV snapshots are written there by the SnapshotStore.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvchat {
struct LoadedModel;
class SnapshotStore;
}  // namespace kvchat

namespace kvchat::app::openai {

class ServerSessions;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback only unless asked: the API has no per-user access control
  int port = 8080;                  // 0 = any free port (bound_port() says which)
  std::string api_key;              // "" = no key required
  int parallel = 1;                 // requests generating at once
  int max_queue = 16;               // requests waiting for a slot beyond those
  std::size_t max_body_bytes = std::size_t(8) << 20;
  std::string model_id;             // the name /v1/models lists and requests must give
  std::int64_t memory_budget_bytes = 0;  // the sessions' KV caches together; 0 = no budget
};

class OpenAiServer {
 public:
  // `model` must outlive the server. `snapshots` may be null.
  OpenAiServer(const LoadedModel& model, std::shared_ptr<SnapshotStore> snapshots, ServerOptions options);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds the socket; throws std::runtime_error when the address cannot be bound.
  void bind();
  int bound_port() const;
  // Serves until stop() (from any thread). bind() first.
  void serve();
  // Refuses queued requests (503), stops running generations and ends serve().
  void stop();

  // Admission and sessions: their figures, and a slot a caller may hold (tests fill the queue with it).
  ServerSessions& sessions();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvchat::app::openai
