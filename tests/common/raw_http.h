#pragma once
// HTTP over a plain socket to 127.0.0.1, for what a well-behaved client library never sends: a body
// without end, headers a byte at a time, a Content-Length of -1, connections left half-sent. Reads and
// writes block (ctest's timeout is the limit); send_until_answered() says whether the server answered
// while the client was still sending, which is how a bound shows without timing anything.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace kvchat::test {

struct RawResponse {
  int status = 0;                              // 0: the server closed without a response
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
  std::string error_code() const {
    const nlohmann::json parsed = json();
    if (!parsed.is_object() || !parsed.contains("error") || !parsed["error"]["code"].is_string()) return {};
    return parsed["error"]["code"].get<std::string>();
  }
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

class RawHttpConnection {
 public:
  explicit RawHttpConnection(int port) {
    socket_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(socket_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      ::close(socket_);
      socket_ = -1;
    }
  }
  ~RawHttpConnection() {
    if (socket_ >= 0) ::close(socket_);
  }
  RawHttpConnection(const RawHttpConnection&) = delete;
  RawHttpConnection& operator=(const RawHttpConnection&) = delete;

  bool connected() const { return socket_ >= 0; }

  // All of `bytes`; false when the server closed the connection first.
  bool send(const std::string& bytes) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(socket_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }

  // Whether the server has written something or closed (without reading it).
  bool answered() const {
    pollfd descriptor{socket_, POLLIN, 0};
    return ::poll(&descriptor, 1, 0) > 0;
  }

  // Sends `piece` again and again, `pause` apart, until the server answers or closes, or `limit` bytes
  // went out; true when the server answered (or closed) before the client stopped sending.
  bool send_until_answered(const std::string& piece, std::size_t limit, std::chrono::milliseconds pause) {
    std::size_t sent = 0;
    std::size_t offset = 0;  // into `piece`, when a send took part of it
    while (sent < limit) {
      pollfd descriptor{socket_, POLLIN | POLLOUT, 0};
      if (::poll(&descriptor, 1, 1000) < 0) return false;
      if (descriptor.revents & (POLLIN | POLLHUP | POLLERR)) return true;
      if (!(descriptor.revents & POLLOUT)) continue;
      const ssize_t n = ::send(socket_, piece.data() + offset, piece.size() - offset, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) return true;  // the server closed the connection
      sent += static_cast<std::size_t>(n);
      offset = (offset + static_cast<std::size_t>(n)) % piece.size();
      if (offset == 0 && pause.count() > 0) std::this_thread::sleep_for(pause);
    }
    return answered();
  }

  // One response: the status line, the headers, and a body of Content-Length bytes (or up to the close).
  RawResponse read_response() {
    RawResponse response;
    std::string data;
    std::size_t header_end = std::string::npos;
    while ((header_end = data.find("\r\n\r\n")) == std::string::npos)
      if (!receive(data)) return response;
    const std::string head = data.substr(0, header_end);
    std::string body = data.substr(header_end + 4);
    if (head.rfind("HTTP/1.", 0) != 0 || head.size() < 12) return response;
    response.status = std::stoi(head.substr(9, 3));
    std::size_t line_start = head.find("\r\n");
    while (line_start != std::string::npos) {
      const std::size_t next = head.find("\r\n", line_start + 2);
      const std::string line =
          head.substr(line_start + 2, next == std::string::npos ? std::string::npos : next - line_start - 2);
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        response.headers[name] = value;
      }
      line_start = next;
    }
    if (response.headers.count("content-length")) {
      const std::size_t length = std::stoull(response.headers["content-length"]);
      while (body.size() < length && receive(body)) {
      }
      body.resize(std::min(body.size(), length));
    } else {
      while (receive(body)) {
      }
    }
    response.body = body;
    return response;
  }

  // Whether the server has closed the connection: an end of stream (or a reset) is waiting, not data.
  bool closed_by_server() const {
    pollfd descriptor{socket_, POLLIN, 0};
    if (::poll(&descriptor, 1, 0) <= 0) return false;
    char byte;
    return ::recv(socket_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
  }

 private:
  bool receive(std::string& into) {
    char buffer[16384];
    const ssize_t n = ::recv(socket_, buffer, sizeof buffer, 0);
    if (n <= 0) return false;
    into.append(buffer, static_cast<std::size_t>(n));
    return true;
  }

  int socket_ = -1;
};

}  // namespace kvchat::test
