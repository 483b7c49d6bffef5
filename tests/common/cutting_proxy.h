#pragma once
// A TCP relay between a client and a `kvchat-cli serve`, for killing the server mid-reply at a known
// point: it passes bytes both ways until the first server-sent event carrying reply text has gone to the
// client, then runs `on_first_text` (the test kills the server, or presses Stop, there) and drops both
// connections (unless asked to keep relaying). On
// stories260K a whole reply takes tens of milliseconds, so killing on the client's side of a direct
// connection would often come after the reply had already ended.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace kvchat::test {

class CuttingProxy {
 public:
  // Listens on 127.0.0.1 (a free port) and relays one connection at a time to `target_port`. With
  // keep_relaying, the rest of the stream follows once on_first_text has returned, and nothing is dropped.
  bool start(int target_port, std::function<void()> on_first_text, bool keep_relaying = false) {
    target_port_ = target_port;
    keep_relaying_ = keep_relaying;
    on_first_text_ = std::move(on_first_text);
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 4) != 0 || ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      return false;
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
    return true;
  }
  ~CuttingProxy() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }
  bool cut() const { return cut_; }

 private:
  static int connect_to(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  void serve() {
    while (!stopping_) {
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      const int server = connect_to(target_port_);
      if (server >= 0) relay(client, server);
      ::close(client);
      if (server >= 0) ::close(server);
    }
  }

  void relay(int client, int server) {
    char buffer[65536];
    while (true) {
      pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(fds, 2, 1000) < 0) return;
      if (stopping_) return;
      for (int side = 0; side < 2; ++side) {
        if (!(fds[side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(fds[side].fd, buffer, sizeof buffer);
        if (n <= 0) return;
        const int to = side == 0 ? server : client;
        // Up to the end of the first event with text: what the client gets before the server dies.
        const std::size_t end =
            side == 1 && !cut_ ? end_of_first_text(std::string(buffer, static_cast<size_t>(n))) : std::string::npos;
        const ssize_t forward = end == std::string::npos ? n : static_cast<ssize_t>(end);
        if (::write(to, buffer, static_cast<size_t>(forward)) != forward) return;
        if (end != std::string::npos) {
          cut_ = true;
          on_first_text_();
          if (!keep_relaying_) {
            ::shutdown(client, SHUT_RDWR);
            return;
          }
          if (::write(to, buffer + forward, static_cast<size_t>(n - forward)) != n - forward) return;
        }
      }
    }
  }

  // Where the first event with a non-empty "content" ends (nlohmann's dump writes no spaces), or npos.
  static std::size_t end_of_first_text(const std::string& bytes) {
    const std::string key = "\"content\":\"";
    for (std::size_t at = bytes.find(key); at != std::string::npos; at = bytes.find(key, at + 1)) {
      if (at + key.size() >= bytes.size() || bytes[at + key.size()] == '"') continue;
      const std::size_t end = bytes.find("\n\n", at);
      if (end != std::string::npos) return end + 2;
    }
    return std::string::npos;
  }

  int listener_ = -1;
  int port_ = 0;
  int target_port_ = 0;
  std::function<void()> on_first_text_;
  bool keep_relaying_ = false;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> cut_{false};
  std::thread thread_;
};

}  // namespace kvchat::test
