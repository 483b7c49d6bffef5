#pragma once
// What an OpenAI-compatible server sends back, read as untrusted input: its JSON parsed with a nesting
// limit (a deep document would exhaust the stack wherever it is later copied or printed), and the
// server-sent events of a streamed reply parsed as bytes arrive, within bounds on the line, the text
// and the whole stream, so that a server that never stops, never ends a line or floods the client
// ends the turn instead of the program's memory. Plain C++ (nlohmann-json), also built into the fuzz
// target of server responses.
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "app/remote/remote_client.h"

namespace kvchat::app {

// Deeper than any answer of the servers known (an event is four levels deep) by far.
constexpr int kMaxServerJsonDepth = 64;

// `text` as JSON, or a discarded value when it is not JSON or nested deeper than kMaxServerJsonDepth;
// `problem` (when given) then says which.
nlohmann::json parse_server_json(std::string_view text, std::string* problem = nullptr);

// The human part of an error body: OpenAI's {"error": {"message"}}, {"error": "..."}, {"detail": ...}, or the
// text (cut short).
std::string server_message(const std::string& body);

// How much of a reply the client reads before it ends the turn.
struct ReplyLimits {
  std::size_t max_text_bytes = 0;    // the reply's text
  std::size_t max_line_bytes = 0;    // one line of the event stream
  std::size_t max_stream_bytes = 0;  // everything received (after decompression)
  // From the request's max_tokens: room for max_tokens of the longest tokens of the vocabularies known,
  // and for the JSON around each of them.
  static ReplyLimits for_max_tokens(int max_tokens);
};

// The server-sent events of one streamed reply, fed as bytes arrive.
class ServerEventStream {
 public:
  using Clock = std::chrono::steady_clock;

  ServerEventStream(RemoteReply& reply, const RemoteChunkCallback& on_chunk, ReplyLimits limits);

  // False once the stream broke a limit or sent what cannot be read safely: failure() says what, and
  // nothing more is read (the caller closes the connection).
  bool feed(const char* data, std::size_t length);
  const std::string& failure() const { return failure_; }

  bool done() const { return done_; }  // [DONE] arrived
  bool finished() const { return finish_reason_seen_; }
  int chunks() const { return chunks_; }
  std::size_t received_bytes() const { return received_bytes_; }
  const std::string& stream_error() const { return stream_error_; }
  Clock::time_point first_chunk_at() const { return first_chunk_at_; }
  Clock::time_point last_chunk_at() const { return last_chunk_at_; }

 private:
  bool handle_line(std::string_view line);
  bool handle_data(std::string_view data);
  bool fail(std::string message);

  RemoteReply& reply_;
  const RemoteChunkCallback& on_chunk_;
  ReplyLimits limits_;
  std::string pending_;      // received bytes not yet handled: the start of an unfinished line
  std::size_t scanned_ = 0;  // bytes of pending_ already searched for a line end
  std::size_t received_bytes_ = 0;
  bool done_ = false;
  bool finish_reason_seen_ = false;
  int chunks_ = 0;
  std::string stream_error_;
  std::string failure_;
  Clock::time_point first_chunk_at_, last_chunk_at_;
};

}  // namespace kvchat::app
