#pragma once
// `kvchat-cli serve` as a child process on a free port, and small HTTP helpers for talking to it.
#include <httplib.h>

#include <QProcess>
#include <QStringList>
#include <QThread>

#include <csignal>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_paths.h"

namespace kvchat::test {

class ServerProcess {
 public:
  // Starts the server with --port 0 and waits for its `listening on http://HOST:PORT` line.
  bool start(const QStringList& arguments) {
    process_.start(QString::fromStdString(build_dir()) + QStringLiteral("/kvchat-cli"),
                   QStringList{"serve", "--port", "0"} + arguments);
    if (!process_.waitForStarted(30000)) return false;
    const std::string marker = "listening on http://127.0.0.1:";
    if (!wait_for_log(marker, 120000)) return false;
    const std::size_t at = log_.find(marker) + marker.size();
    port_ = std::stoi(log_.substr(at));
    return port_ > 0;
  }
  ~ServerProcess() {
    if (process_.state() != QProcess::NotRunning && !stop()) process_.kill();
    process_.waitForFinished(5000);
  }
  // SIGTERM; true when the server then exited with status 0.
  bool stop() {
    process_.terminate();
    if (!process_.waitForFinished(30000)) return false;
    log();
    return process_.exitStatus() == QProcess::NormalExit && process_.exitCode() == 0;
  }
  // SIGKILL, as a crash or a pulled plug would end it: no response finished, no connection closed cleanly.
  void kill() {
    process_.kill();
    process_.waitForFinished(30000);
  }
  int port() const { return port_; }
  qint64 pid() const { return process_.processId(); }
  bool running() const { return process_.state() == QProcess::Running; }

  // Everything the server wrote on stderr so far.
  const std::string& log() {
    log_ += process_.readAllStandardError().toStdString();
    return log_;
  }
  // Waits until the log holds `text` (counting from `from`); false at the timeout or when the server exits.
  bool wait_for_log(const std::string& text, int timeout_ms, std::size_t from = 0) {
    for (int waited = 0; waited < timeout_ms; waited += 50) {
      if (log().find(text, from) != std::string::npos) return true;
      if (process_.state() == QProcess::NotRunning) return log().find(text, from) != std::string::npos;
      process_.waitForReadyRead(50);
    }
    return false;
  }

  httplib::Client client() const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(300, 0);
    client.set_write_timeout(60, 0);
    client.set_connection_timeout(30, 0);
    return client;
  }

 private:
  QProcess process_;
  std::string log_;
  int port_ = 0;
};

struct HttpReply {
  int status = 0;  // 0: no answer
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
};

inline HttpReply post_json(httplib::Client& client, const std::string& path, const std::string& body,
                           const httplib::Headers& headers = {}) {
  auto result = client.Post(path.c_str(), headers, body, "application/json");
  // No answer: the body says what the client saw (a refused connection, a read that failed, ...).
  if (!result) return HttpReply{0, "no answer: " + httplib::to_string(result.error())};
  return HttpReply{result->status, result->body};
}

// POSTs and hands every server-sent event's data (the text after "data: ") to `on_event` as it arrives;
// `on_event` returning false closes the connection. Returns the status (0 when there was no answer or
// the connection was closed by on_event).
inline int post_stream(httplib::Client& client, const std::string& path, const std::string& body,
                       const httplib::Headers& headers, const std::function<bool(const std::string&)>& on_event) {
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.headers = headers;
  request.body = body;
  request.set_header("Content-Type", "application/json");
  std::string pending;
  request.content_receiver = [&](const char* data, std::size_t length, std::uint64_t, std::uint64_t) {
    pending.append(data, length);
    for (std::size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string line = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (line.rfind("data: ", 0) != 0) continue;
      if (!on_event(line.substr(6))) return false;
    }
    return true;
  };
  auto result = client.send(request);
  return result ? result->status : 0;
}

}  // namespace kvchat::test
