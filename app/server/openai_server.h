#pragma once
// An OpenAI-compatible HTTP server on one loaded model: GET /health, GET /v1/models,
// POST /v1/chat/completions and POST /v1/completions (each also without /v1, for clients given the bare
// base URL), streamed as server-sent events or answered whole. Browser pages of the allowed origins may
// call it (CORS preflights are answered without the key). Connections, header and body times and sizes are
// bounded (app/server/bounded_http_server.h).
// cpp-httplib serves the sockets on its own thread pool (no Qt event loop), so `kvchat-cli serve` and,
// later, the desktop app can both host it. No endpoint reads or writes files; with a cache folder the
// sessions' KV snapshots are written there by the SnapshotStore.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/types.h"

namespace kvchat {
struct LoadedModel;
class SnapshotStore;
class ComputeContext;
}  // namespace kvchat

namespace kvchat::app::openai {

class ServerSessions;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback only unless asked: the API has no per-user access control
  int port = 8080;                 // 0 = any free port (bound_port() says which)
  std::string api_key;             // "" = no key required
  int parallel = 1;                // requests generating at once, 1 to kMaxParallel
  int max_queue = 16;              // requests waiting for a slot beyond those, 0 to kMaxQueue
  std::size_t max_body_bytes = std::size_t(8) << 20;  // 1 byte to kMaxBodyBytes
  std::string model_id;                               // the name /v1/models lists and requests may give
  std::int64_t memory_budget_bytes = 0;               // the sessions' KV caches together; 0 = no budget
  // Browser pages allowed to call the API (CORS): "" = pages served from this machine (http(s)://localhost,
  // 127.0.0.1 or [::1], any port), "*" = any page, else a comma-separated list of origins
  // ("https://chat.example.org"). A request from another page is refused 403.
  std::string cors_origin;
  int header_timeout_ms = 10000;  // from a request's first byte to the end of its headers
  int body_timeout_ms = 60000;    // from there to the end of its body
  // What the requests compute with (threads, kernels, the kernels' pool): the server's own, so that it and
  // the desktop app hosting it keep their own settings. Null: the process-wide settings.
  std::shared_ptr<const ComputeContext> compute;
  SpeculativeConfig speculative;    // every request's (kvchat-cli serve --speculative)
  KvDtype kv_dtype = KvDtype::F32;  // how the sessions' caches store K/V (kvchat-cli serve --kv-dtype)

  static constexpr int kMaxParallel = 64;
  static constexpr int kMaxQueue = 256;
  static constexpr std::size_t kMaxBodyBytes = std::size_t(256) << 20;
  // Connections beyond the running and queued requests' own: enough for health checks, model lists and
  // clients still sending, while as many more idle ones cannot lock anyone out.
  static constexpr int kSpareConnections = 32;
};

class OpenAiServer {
 public:
  // `model` must outlive the server. `snapshots` may be null. Throws std::invalid_argument for options
  // out of their range.
  OpenAiServer(const LoadedModel& model, std::shared_ptr<SnapshotStore> snapshots, ServerOptions options);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds the socket and starts the server's threads (one per allowed connection); throws
  // std::runtime_error when the address cannot be bound or the threads cannot start.
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
