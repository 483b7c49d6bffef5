#include "app/server/bounded_http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <thread>

namespace kvchat::app {

// Named, not anonymous: the library's sources are compiled in batches (unity build).
namespace bounded_http {

using Clock = std::chrono::steady_clock;

// Threads beyond one per allowed connection: they answer 503 to connections past the limit while every
// allowed one is busy, instead of leaving them queued.
constexpr std::size_t kRefusalThreads = 4;
// After a refusal whose request was not read to its end, the rest is read and dropped for at most this
// long before the socket is closed: closing with unread input sends a reset, and a client still sending
// its body would lose the response along with the connection.
constexpr auto kLingerTime = std::chrono::seconds(2);

// Rounded up: a wait of this many milliseconds ends at the deadline or after it, never before.
int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// poll() for one event; false on timeout or error. EINTR is retried with the time left.
bool wait_for(int socket, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd descriptor{socket, events, 0};
    const int ready = ::poll(&descriptor, 1, milliseconds_until(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool send_all(int socket, const std::string& bytes, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    if (!wait_for(socket, POLLOUT, deadline)) return false;
    const ssize_t n = ::send(socket, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

void ip_and_port(const sockaddr_storage& address, socklen_t length, std::string& ip, int& port) {
  if (address.ss_family == AF_INET)
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  else if (address.ss_family == AF_INET6)
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  else
    return;
  std::array<char, NI_MAXHOST> text{};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, text.data(),
                    static_cast<socklen_t>(text.size()), nullptr, 0, NI_NUMERICHOST) == 0)
    ip = text.data();
}

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string seconds_text(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

bool equals_ignoring_case(const std::string& a, const char* b) {
  const std::size_t length = std::strlen(b);
  if (a.size() != length) return false;
  for (std::size_t i = 0; i < length; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace bounded_http

struct BoundedHttpServer::Connection {
  int socket = -1;
  // Guarded by the server's connections_mutex_ (the admitting thread reads them):
  Phase phase = Phase::Idle;
  bounded_http::Clock::time_point phase_started = bounded_http::Clock::now();
  std::atomic<bool> replaced{false};
  // This connection's own thread only:
  bounded_http::Clock::time_point deadline;
  std::size_t phase_bytes = 0;  // read by httplib in this phase
  bounded_http::Clock::time_point request_started;
  std::size_t request_bytes = 0;  // read since the request began
  std::size_t written = 0;        // written for this request
  bool deadline_passed = false;
  bool bytes_exceeded = false;
  bool close_after = false;
  bool body_read = false;
};

thread_local BoundedHttpServer::Connection* BoundedHttpServer::current_ = nullptr;

// httplib's Stream over one connection, for all of its requests (so bytes read ahead stay with it): each
// read waits at most until its phase's deadline and takes at most its phase's bytes.
class BoundedHttpServer::ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(BoundedHttpServer& server, Connection& connection)
      : server_(server), connection_(connection), buffer_(4096) {}

  // Waits for the first byte of the next request; false when none comes within the idle timeout, the
  // client closed, or the server is stopping.
  bool wait_for_request() {
    if (!server_.set_phase(connection_, Phase::Idle)) return false;
    if (offset_ == size_ &&
        !bounded_http::wait_for(connection_.socket, POLLIN, bounded_http::Clock::now() + server_.limits_.idle_timeout))
      return false;
    if (!server_.set_phase(connection_, Phase::Headers)) return false;
    connection_.request_started = bounded_http::Clock::now();
    connection_.deadline = connection_.request_started + server_.limits_.header_timeout;
    connection_.request_bytes = 0;
    connection_.written = 0;
    connection_.deadline_passed = false;
    connection_.bytes_exceeded = false;
    connection_.body_read = false;
    return true;
  }
  // The headers are read: the body's deadline and byte budget from here.
  void start_body() {
    server_.set_phase(connection_, Phase::Body);
    connection_.deadline = bounded_http::Clock::now() + server_.limits_.body_timeout;
  }

  bool is_readable() const override {
    return offset_ < size_ || bounded_http::wait_for(connection_.socket, POLLIN, connection_.deadline);
  }
  bool is_writable() const override {
    const auto deadline = bounded_http::Clock::now() + std::chrono::seconds(server_.write_timeout_sec_);
    return bounded_http::wait_for(connection_.socket, POLLOUT, deadline) && peer_open();
  }

  ssize_t read(char* data, std::size_t size) override {
    if (offset_ == size_) {
      if (bounded_http::Clock::now() >= connection_.deadline ||
          !bounded_http::wait_for(connection_.socket, POLLIN, connection_.deadline)) {
        connection_.deadline_passed = bounded_http::Clock::now() >= connection_.deadline;
        return -1;
      }
      ssize_t received;
      do {
        received = ::recv(connection_.socket, buffer_.data(), buffer_.size(), 0);
      } while (received < 0 && errno == EINTR);
      if (received <= 0) return received;
      offset_ = 0;
      size_ = static_cast<std::size_t>(received);
    }
    const std::size_t allowed = phase_byte_limit() - std::min(phase_byte_limit(), connection_.phase_bytes);
    if (allowed == 0) {
      connection_.bytes_exceeded = true;
      return -1;
    }
    const std::size_t n = std::min({size, size_ - offset_, allowed});
    std::memcpy(data, buffer_.data() + offset_, n);
    offset_ += n;
    connection_.phase_bytes += n;
    connection_.request_bytes += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* data, std::size_t size) override {
    if (!is_writable()) return -1;
    ssize_t sent;
    do {
      sent = ::send(connection_.socket, data, size, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent > 0) connection_.written += static_cast<std::size_t>(sent);
    return sent;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (::getpeername(connection_.socket, reinterpret_cast<sockaddr*>(&address), &length) == 0)
      bounded_http::ip_and_port(address, length, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (::getsockname(connection_.socket, reinterpret_cast<sockaddr*>(&address), &length) == 0)
      bounded_http::ip_and_port(address, length, ip, port);
  }
  socket_t socket() const override { return connection_.socket; }

 private:
  // The body's raw bytes may be more than its decoded size (chunk sizes and line ends): twice the body
  // limit and a header's worth stops a client sending without end while any sane chunking fits.
  std::size_t phase_byte_limit() const {
    return connection_.phase == Phase::Body ? 2 * server_.limits_.max_body_bytes + server_.limits_.max_header_bytes
                                            : server_.limits_.max_header_bytes;
  }
  // Whether the peer is still there: no end of stream or error pending (bytes of a next request are fine).
  bool peer_open() const {
    pollfd descriptor{connection_.socket, POLLIN, 0};
    if (::poll(&descriptor, 1, 0) <= 0) return true;
    char byte;
    return ::recv(connection_.socket, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }

  BoundedHttpServer& server_;
  Connection& connection_;
  std::vector<char> buffer_;
  std::size_t offset_ = 0;
  std::size_t size_ = 0;
};

// httplib's ThreadPool, except that a thread that cannot start is an exception from the constructor
// after the started ones are joined (httplib's would destroy them joinable, which ends the process).
class BoundedHttpServer::WorkerPool : public httplib::TaskQueue {
 public:
  explicit WorkerPool(std::size_t count) {
    try {
      threads_.reserve(count);
      while (threads_.size() < count) threads_.emplace_back([this] { work(); });
    } catch (const std::exception& error) {
      const std::size_t started = threads_.size();
      shutdown();
      throw std::runtime_error("cannot start the server's " + std::to_string(count) + " threads (" +
                               std::to_string(started) + " started): " + error.what());
    }
  }
  ~WorkerPool() override { shutdown(); }

  void enqueue(std::function<void()> job) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
  }
  // Runs the jobs still queued (each closes its connection at once: the server is no longer listening).
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& thread : threads_)
      if (thread.joinable()) thread.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return !jobs_.empty() || stopping_; });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::vector<std::thread> threads_;
  std::deque<std::function<void()>> jobs_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

BoundedHttpServer::BoundedHttpServer(HttpLimits limits, std::function<std::string(const HttpRefusal&)> error_body)
    : limits_(limits), error_body_(std::move(error_body)) {
  set_payload_max_length(limits_.max_body_bytes);
  new_task_queue = [this]() -> httplib::TaskQueue* {
    listened_ = true;
    if (!pool_) start_threads();
    return pool_.release();
  };
}

BoundedHttpServer::~BoundedHttpServer() {
  // Bound but never served (the caller failed in between): httplib would leave the port held.
  if (!listened_ && svr_sock_ != INVALID_SOCKET) ::close(svr_sock_.exchange(INVALID_SOCKET));
}

void BoundedHttpServer::start_threads() {
  if (pool_) return;
  const std::size_t count = limits_.max_connections + bounded_http::kRefusalThreads;
  pool_ = std::make_unique<WorkerPool>(count);
  thread_count_ = count;
}

std::size_t BoundedHttpServer::thread_count() const { return thread_count_; }

bool BoundedHttpServer::bind_to_port(const std::string& host, int port, int socket_flags) {
  if (!httplib::Server::bind_to_port(host, port, socket_flags)) return false;
  widen_listen_backlog();
  return true;
}

int BoundedHttpServer::bind_to_any_port(const std::string& host, int socket_flags) {
  const int port = httplib::Server::bind_to_any_port(host, socket_flags);
  if (port >= 0) widen_listen_backlog();
  return port;
}

void BoundedHttpServer::widen_listen_backlog() {
  // listen() on a listening socket sets its backlog anew.
  if (::listen(svr_sock_, SOMAXCONN) != 0)
    spdlog::warn("cannot widen the server's listen backlog: {}", std::strerror(errno));
}

bool BoundedHttpServer::set_phase(Connection& connection, Phase phase) {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  connection.phase = phase;
  connection.phase_started = bounded_http::Clock::now();
  connection.phase_bytes = 0;
  return !connection.replaced && !closing_;
}

bool BoundedHttpServer::admit(Connection& connection) {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  if (closing_) return false;
  const auto open = static_cast<std::size_t>(
      std::count_if(connections_.begin(), connections_.end(), [](const Connection* c) { return !c->replaced; }));
  if (open >= limits_.max_connections) {
    // The connection that has waited longest without sending a whole request makes room: a client that
    // holds connections open without sending cannot lock the others out.
    Connection* oldest = nullptr;
    for (Connection* candidate : connections_) {
      if (candidate->replaced || candidate->phase == Phase::Body) continue;
      if (!oldest || candidate->phase_started < oldest->phase_started) oldest = candidate;
    }
    if (!oldest) return false;
    oldest->replaced = true;
    ::shutdown(oldest->socket, SHUT_RDWR);  // its thread wakes, reads the end of the stream and closes it
    // One line now and then, not one per connection: a client opening connections without end would
    // otherwise fill the log.
    ++replaced_since_warning_;
    const auto now = bounded_http::Clock::now();
    if (now - last_replacement_warning_ >= std::chrono::seconds(10)) {
      spdlog::warn("{} connections open, the limit: closed {} that sent no whole request (the last after {} ms)", open,
                   replaced_since_warning_,
                   std::chrono::duration_cast<std::chrono::milliseconds>(now - oldest->phase_started).count());
      replaced_since_warning_ = 0;
      last_replacement_warning_ = now;
    }
  }
  connections_.push_back(&connection);
  return true;
}

void BoundedHttpServer::release(Connection& connection) {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  connections_.erase(std::remove(connections_.begin(), connections_.end(), &connection), connections_.end());
}

void BoundedHttpServer::close_waiting_connections() {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  closing_ = true;
  for (Connection* connection : connections_)
    if (connection->phase != Phase::Body) ::shutdown(connection->socket, SHUT_RDWR);
}

void BoundedHttpServer::write_refusal(int socket, const HttpRefusal& refusal) const {
  const std::string body = error_body_ ? error_body_(refusal) : refusal.message;
  std::string response = "HTTP/1.1 " + std::to_string(refusal.status) + " " +
                         bounded_http::reason_phrase(refusal.status) +
                         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                         "\r\nConnection: close\r\n";
  if (refusal.status == 503) response += "Retry-After: 1\r\n";
  response += "\r\n" + body;
  bounded_http::send_all(socket, response, bounded_http::Clock::now() + std::chrono::seconds(write_timeout_sec_));
}

bool BoundedHttpServer::process_and_close_socket(socket_t sock) {
  Connection connection;
  connection.socket = sock;
  bool result = false;
  if (!admit(connection)) {
    // Never registered, so never replaced: the refusal is this thread's to write.
    std::unique_lock<std::mutex> lock(connections_mutex_);
    const bool closing = closing_;
    lock.unlock();
    if (!closing)
      write_refusal(sock, HttpRefusal{503,
                                      "the server has " + std::to_string(limits_.max_connections) +
                                          " connections busy with requests, its limit: try again shortly",
                                      "too_many_connections"});
    connection.close_after = true;
  } else {
    ConnectionStream stream(*this, connection);
    current_ = &connection;
    for (std::size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
      if (!stream.wait_for_request()) break;
      bool connection_closed = false;
      result =
          process_request(stream, left == 1, connection_closed, [&stream](httplib::Request&) { stream.start_body(); });
      // httplib gives up without a word on a request line that does not end; a client that sent one gets why.
      if (!result && connection.written == 0 && connection.request_bytes > 0 && !connection.replaced) {
        if (const std::optional<HttpRefusal> refusal = read_refusal()) write_refusal(sock, *refusal);
      }
      if (!result || connection_closed || connection.close_after) break;
    }
    current_ = nullptr;
    release(connection);
  }
  if (connection.close_after) {
    ::shutdown(sock, SHUT_WR);
    const auto until = bounded_http::Clock::now() + bounded_http::kLingerTime;
    std::array<char, 16384> scratch;
    while (bounded_http::wait_for(sock, POLLIN, until) && ::recv(sock, scratch.data(), scratch.size(), 0) > 0) {
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return result;
}

std::optional<HttpRefusal> BoundedHttpServer::framing_refusal(const httplib::Request& request) const {
  const bool has_length = request.has_header("Content-Length");
  if (request.get_header_value_count("Content-Length") > 1 || request.get_header_value_count("Transfer-Encoding") > 1)
    return HttpRefusal{400, "the request has more than one Content-Length or Transfer-Encoding header",
                       "invalid_framing"};
  if (request.has_header("Transfer-Encoding")) {
    const std::string coding = bounded_http::trimmed(request.get_header_value("Transfer-Encoding"));
    if (!bounded_http::equals_ignoring_case(coding, "chunked"))
      return HttpRefusal{501, "Transfer-Encoding '" + coding + "' is not supported: send Content-Length or chunked",
                         "unsupported_transfer_encoding"};
    if (has_length)
      return HttpRefusal{400, "the request has both Content-Length and Transfer-Encoding: send one of them",
                         "invalid_framing"};
  }
  if (has_length) {
    const std::string text = bounded_http::trimmed(request.get_header_value("Content-Length"));
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
      return HttpRefusal{400, "Content-Length '" + text.substr(0, 40) + "' is not a number of bytes",
                         "invalid_framing"};
    // Past 19 digits a number may not fit in 64 bits; it is over any body limit anyway.
    if (text.size() > 19 || std::stoull(text) > limits_.max_body_bytes)
      return HttpRefusal{413,
                         "the request body is " + text.substr(0, 40) + " bytes, more than the server accepts (" +
                             std::to_string(limits_.max_body_bytes) + " bytes)",
                         "request_too_large"};
  }
  const bool carries_body = request.method == "POST" || request.method == "PUT" || request.method == "PATCH";
  if (!carries_body) return std::nullopt;
  if (!has_length && !request.has_header("Transfer-Encoding"))
    return HttpRefusal{411,
                       "a " + request.method + " request needs a Content-Length header (or Transfer-Encoding: chunked)",
                       "length_required"};
  const std::string encoding = bounded_http::trimmed(request.get_header_value("Content-Encoding"));
  if (!encoding.empty() && !bounded_http::equals_ignoring_case(encoding, "identity"))
    return HttpRefusal{415, "Content-Encoding '" + encoding + "' is not supported: send the body uncompressed",
                       "unsupported_content_encoding"};
  if (request.is_multipart_form_data())
    return HttpRefusal{415, "a multipart body is not supported: send the body as application/json",
                       "unsupported_media_type"};
  return std::nullopt;
}

std::optional<HttpRefusal> BoundedHttpServer::read_refusal() const {
  Connection* connection = current_;
  if (!connection || (!connection->deadline_passed && !connection->bytes_exceeded)) return std::nullopt;
  connection->close_after = true;
  const bool headers = connection->phase != Phase::Body;
  if (connection->deadline_passed)
    return HttpRefusal{
        408,
        headers ? "the request's headers did not arrive within " + bounded_http::seconds_text(limits_.header_timeout)
                : "the request's body did not arrive within " + bounded_http::seconds_text(limits_.body_timeout),
        "request_timeout"};
  if (headers)
    return HttpRefusal{431,
                       "the request line and headers are over " + std::to_string(limits_.max_header_bytes) + " bytes",
                       "request_headers_too_large"};
  return HttpRefusal{413, "the request body is over " + std::to_string(limits_.max_body_bytes) + " bytes",
                     "request_too_large"};
}

std::optional<HttpRefusal> BoundedHttpServer::read_body(const httplib::ContentReader& reader, std::string& body) const {
  bool too_large = false;
  const std::size_t limit = limits_.max_body_bytes;
  const bool read = reader([&](const char* data, std::size_t length) {
    if (length > limit - std::min(limit, body.size())) {
      too_large = true;
      return false;
    }
    body.append(data, length);
    return true;
  });
  if (current_) current_->body_read = true;
  if (read) return std::nullopt;
  close_after_response();
  body.clear();
  if (too_large)
    return HttpRefusal{413, "the request body is over " + std::to_string(limit) + " bytes, the limit of this server",
                       "request_too_large"};
  if (std::optional<HttpRefusal> refusal = read_refusal()) return refusal;
  return HttpRefusal{400, "the request body could not be read: it ended early or its chunked encoding is malformed",
                     "invalid_body"};
}

void BoundedHttpServer::close_after_response() {
  if (current_) current_->close_after = true;
}

bool BoundedHttpServer::closing_after_response() { return current_ && current_->close_after; }

std::chrono::steady_clock::time_point BoundedHttpServer::request_started() {
  return current_ ? current_->request_started : bounded_http::Clock::now();
}

bool BoundedHttpServer::body_unread(const httplib::Request& request) {
  if (!current_ || current_->body_read) return false;
  if (request.has_header("Transfer-Encoding")) return true;
  const std::string length = bounded_http::trimmed(request.get_header_value("Content-Length"));
  return !length.empty() && length.find_first_not_of('0') != std::string::npos;
}

}  // namespace kvchat::app
