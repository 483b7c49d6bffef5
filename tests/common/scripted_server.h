#pragma once
// A "server" on 127.0.0.1 (a free port) that answers each HTTP request with whatever bytes the test's
// responder writes, raw: what a hostile or broken OpenAI-compatible server sends (an endless stream, JSON
// nested 100,000 deep, a line without an end, a gzip bomb, silence). Connections are taken one at a time
// on a thread of its own; a responder runs until it returns, and its writes fail once the client has gone.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <QString>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace kvchat::test {

class ScriptedConnection {
 public:
  ScriptedConnection(int fd, std::string request, const std::atomic<bool>& stopping)
      : fd_(fd), request_(std::move(request)), stopping_(stopping) {}

  const std::string& request() const { return request_; }  // the request line, headers and body
  bool is_models_request() const {
    return request_.rfind("GET ", 0) == 0 && request_.find("/models") != std::string::npos;
  }
  // False once the client has closed the connection (or the server is stopping).
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      if (stopping_) return false;
      const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (sent <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(sent));
    }
    return true;
  }
  bool send_head(const std::string& status_line, const std::string& headers = "Content-Type: text/event-stream\r\n") {
    return send("HTTP/1.1 " + status_line + "\r\n" + headers + "Connection: close\r\n\r\n");
  }
  // Sends nothing until the client closes the connection or the server stops.
  void wait_for_client_to_go() {
    while (!stopping_) {
      pollfd poll_fd{fd_, POLLIN, 0};
      if (::poll(&poll_fd, 1, 50) > 0) {
        char byte;
        if (::recv(fd_, &byte, 1, 0) <= 0) return;
      }
    }
  }

 private:
  int fd_;
  std::string request_;
  const std::atomic<bool>& stopping_;
};

class ScriptedServer {
 public:
  using Responder = std::function<void(ScriptedConnection&)>;

  ~ScriptedServer() { stop(); }

  bool start(Responder responder) {
    responder_ = std::move(responder);
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 8) != 0 || ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      return false;
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
    return true;
  }
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
    if (listener_ >= 0) ::close(listener_);
    listener_ = -1;
  }
  int port() const { return port_; }
  QString base_url() const { return QStringLiteral("http://127.0.0.1:%1/v1").arg(port_); }
  int requests() const { return requests_; }
  std::string last_request() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_request_;
  }

 private:
  void serve() {
    while (!stopping_) {
      pollfd poll_fd{listener_, POLLIN, 0};
      if (::poll(&poll_fd, 1, 50) <= 0) continue;
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      std::string request = read_request(fd);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        last_request_ = request;
      }
      ++requests_;
      ScriptedConnection connection(fd, std::move(request), stopping_);
      responder_(connection);
      ::shutdown(fd, SHUT_RDWR);
      ::close(fd);
    }
  }

  // The head, and the body up to its Content-Length.
  std::string read_request(int fd) {
    std::string request;
    char buffer[4096];
    std::size_t wanted = std::string::npos;
    while (!stopping_ && (wanted == std::string::npos || request.size() < wanted)) {
      pollfd poll_fd{fd, POLLIN, 0};
      if (::poll(&poll_fd, 1, 50) <= 0) continue;
      const ssize_t got = ::recv(fd, buffer, sizeof buffer, 0);
      if (got <= 0) break;
      request.append(buffer, static_cast<std::size_t>(got));
      const std::size_t head_end = request.find("\r\n\r\n");
      if (wanted == std::string::npos && head_end != std::string::npos) {
        std::size_t body = 0;
        const std::size_t field = request.find("Content-Length: ");
        if (field != std::string::npos && field < head_end) body = std::stoul(request.substr(field + 16));
        wanted = head_end + 4 + body;
      }
    }
    return request;
  }

  Responder responder_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> requests_{0};
  mutable std::mutex mutex_;
  std::string last_request_;
  std::thread thread_;
};

// Sends a 200 head with Content-Encoding: gzip, then `pattern` compressed, again and again, until the client
// goes: a few kilobytes on the wire for every megabyte it unpacks to.
inline void send_gzip_bomb(ScriptedConnection& connection, const std::string& pattern) {
  if (!connection.send_head("200 OK", "Content-Type: text/event-stream\r\nContent-Encoding: gzip\r\n")) return;
  httplib::detail::gzip_compressor compressor;
  bool open = true;
  while (open)
    compressor.compress(pattern.data(), pattern.size(), false, [&](const char* data, size_t size) {
      return open = connection.send(std::string_view(data, size));
    });
}

// One server-sent event carrying `text` as the reply's next piece (`text` is JSON-escaped by the caller).
inline std::string content_event(const std::string& escaped_text) {
  return R"(data: {"choices":[{"index":0,"delta":{"content":")" + escaped_text + "\"}}]}\n\n";
}

}  // namespace kvchat::test
