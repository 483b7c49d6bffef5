#pragma once
// An OpenAiServer inside the test process on a free port, served on a thread of its own: tests then
// reach its sessions directly (hold a slot, read the figures) while they talk HTTP to it.
#include <httplib.h>

#include <memory>
#include <thread>

#include "app/server/openai_server.h"
#include "engine/model/model_loader.h"

namespace kvchat::test {

class InProcessServer {
 public:
  // `model` must outlive the server.
  InProcessServer(const LoadedModel& model, app::openai::ServerOptions options,
                  std::shared_ptr<SnapshotStore> snapshots = nullptr) {
    options.port = 0;
    server_ = std::make_unique<app::openai::OpenAiServer>(model, std::move(snapshots), options);
    server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  ~InProcessServer() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    server_->stop();
    thread_.join();
  }
  app::openai::OpenAiServer& server() { return *server_; }
  int port() const { return server_->bound_port(); }
  httplib::Client client() const {
    httplib::Client client("127.0.0.1", port());
    client.set_read_timeout(300, 0);
    client.set_write_timeout(60, 0);
    client.set_connection_timeout(30, 0);
    return client;
  }

 private:
  std::unique_ptr<app::openai::OpenAiServer> server_;
  std::thread thread_;
};

}  // namespace kvchat::test
