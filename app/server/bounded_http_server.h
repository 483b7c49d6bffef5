#pragma once
// cpp-httplib's server with bounds on what one client can hold. cpp-httplib 0.11 alone lets a client keep a
// worker thread as long as it sends a byte before each read timeout (slow headers, a slow body), reads a
// chunked body of any size whatever the payload limit, reads on after a Content-Length it cannot parse, and
// queues connections beyond its threads behind the ones that send nothing, so a few idle clients delay
// everyone else. Here every connection is read through a stream of our own (process_and_close_socket is
// httplib's extension point for it) that bounds:
//   - the wait for a request on a new or kept-alive connection (idle timeout);
//   - the time and bytes from a request's first byte to the end of its headers;
//   - the time and bytes of its body, chunked or not (the decoded body through read_body());
//   - the connections served at once: past the limit a new one replaces the connection that has waited
//     longest for its headers, or, when every one is busy with a request, is answered 503 at once.
// The worker threads are started by start_threads(), before listening, so a machine that cannot start them
// is an error its caller reports, never an exception on the listening thread.
#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kvchat::app {

struct HttpLimits {
  std::chrono::milliseconds idle_timeout{5000};          // for the first byte of a request
  std::chrono::milliseconds header_timeout{10000};       // from that byte to the end of the headers
  std::chrono::milliseconds body_timeout{60000};         // from the end of the headers to the end of the body
  std::size_t max_header_bytes = std::size_t(64) << 10;  // request line and headers together
  std::size_t max_body_bytes = std::size_t(8) << 20;     // a body as the handler gets it (decoded)
  std::size_t max_connections = 64;
};

// Why a request is refused before a handler sees it: an HTTP status, a message for the client and a
// machine-readable code.
struct HttpRefusal {
  int status = 400;
  std::string message;
  std::string code;
};

class BoundedHttpServer : public httplib::Server {
 public:
  // `error_body` renders a refusal the server writes by itself (503 past the connection limit, 408 for a
  // request line that never ended) as a JSON body.
  BoundedHttpServer(HttpLimits limits, std::function<std::string(const HttpRefusal&)> error_body);
  ~BoundedHttpServer() override;

  const HttpLimits& limits() const { return limits_; }

  // Starts the worker threads: one per connection allowed, and a few that answer 503 past the limit.
  // Throws std::runtime_error saying how many could not start (out of memory or of threads). Call
  // before listen_after_bind().
  void start_threads();
  std::size_t thread_count() const;
  // httplib's binds, with the kernel queueing as many connections as the system allows until they are accepted.
  // The httplib library listens with a backlog of 5: clients connecting at once beyond that overflow the queue,
  // wait out SYN retransmits (a second each), and can lose the connection. This server answers 503 past its own
  // connection limit instead.
  bool bind_to_port(const std::string& host, int port, int socket_flags = 0);
  int bind_to_any_port(const std::string& host, int socket_flags = 0);

  // After stop(): closes the connections that wait for a request or are still sending its headers, so
  // the server ends without waiting out their timeouts. Requests being handled finish.
  void close_waiting_connections();

  // For a request whose headers are read (a pre-routing handler): a refusal when its framing is not one
  // this server reads (a Content-Length that is not a number of bytes or is over the body limit, chunked
  // together with a length, another transfer coding, a POST with neither, a multipart body).
  std::optional<HttpRefusal> framing_refusal(const httplib::Request& request) const;
  // For httplib's own 400 (the request could not be read): why, when it was this server's bound (headers
  // too slow or too large, a body too slow or too large); nullopt for a malformed request.
  std::optional<HttpRefusal> read_refusal() const;
  // Reads the body of the request being handled on this thread into `body`; a refusal when it is over
  // the body limit (413), too slow (408) or cannot be read (400). After a refusal the connection is
  // closed once the response is out (the rest of the body is never read).
  std::optional<HttpRefusal> read_body(const httplib::ContentReader& reader, std::string& body) const;

  // The connection of the request being handled on this thread closes after its response; for a
  // request refused before its body was read.
  static void close_after_response();
  // Whether it will (a post-routing handler then says so in the response's Connection header).
  static bool closing_after_response();
  // When the request being handled on this thread began (its first byte).
  static std::chrono::steady_clock::time_point request_started();
  // Whether the request being handled on this thread declared a body that nothing has read yet.
  static bool body_unread(const httplib::Request& request);

 private:
  // Where a connection is: waiting for a request, reading its headers, or past them (its body, its
  // handler, its response). Only one waiting or reading headers may be replaced by a new connection.
  enum class Phase { Idle, Headers, Body };
  struct Connection;
  class ConnectionStream;
  class WorkerPool;

  bool process_and_close_socket(socket_t sock) override;
  bool admit(Connection& connection);
  bool set_phase(Connection& connection, Phase phase);  // false once the connection is to close
  void widen_listen_backlog();                          // after a bind
  void release(Connection& connection);
  void write_refusal(int socket, const HttpRefusal& refusal) const;

  static thread_local Connection* current_;  // the connection served on this thread

  HttpLimits limits_;
  std::function<std::string(const HttpRefusal&)> error_body_;
  std::unique_ptr<WorkerPool> pool_;  // until listen_after_bind() takes it
  std::size_t thread_count_ = 0;
  bool listened_ = false;  // listen_after_bind() ran: httplib closes the socket, else the destructor does
  mutable std::mutex connections_mutex_;
  std::vector<Connection*> connections_;
  bool closing_ = false;
  std::size_t replaced_since_warning_ = 0;  // connections replaced since the last log line about it
  std::chrono::steady_clock::time_point last_replacement_warning_{};
};

}  // namespace kvchat::app
