// A server's answers as the remote backend reads them (app/remote/remote_stream.h): the input is one streamed
// reply, cut at NUL bytes into the pieces in which it arrives, fed to ServerEventStream under small
// bounds (so that the fuzzer reaches them), and, whole, one answer to parse_server_json and
// server_message. A crash, a reply over its bounds or text the callback did not see is a bug.
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "app/remote/remote_stream.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The parser warns of each event that is not JSON: noise over millions of inputs.
  [[maybe_unused]] static const bool quiet = (spdlog::set_level(spdlog::level::err), true);
  const std::string_view whole(reinterpret_cast<const char*>(data), size);
  kvchat::app::ReplyLimits limits;
  limits.max_text_bytes = 4096;
  limits.max_line_bytes = 16384;
  limits.max_stream_bytes = 1 << 20;

  kvchat::app::RemoteReply reply;
  std::string seen;
  int last_count = 0;
  const kvchat::app::RemoteChunkCallback on_chunk = [&](std::string_view chunk, int chunks_received) {
    if (chunk.empty() || chunks_received != last_count + 1) __builtin_trap();
    last_count = chunks_received;
    seen.append(chunk);
  };
  kvchat::app::ServerEventStream stream(reply, on_chunk, limits);
  for (const std::string& piece : kvchat::fuzz::split_parts(data, size, 256))
    if (!stream.feed(piece.data(), piece.size())) break;
  if (reply.text != seen || reply.text.size() > limits.max_text_bytes || stream.chunks() != last_count)
    __builtin_trap();
  if (stream.received_bytes() > limits.max_stream_bytes && stream.failure().empty()) __builtin_trap();

  std::string problem;
  const nlohmann::json parsed = kvchat::app::parse_server_json(whole, &problem);
  if (!parsed.is_discarded()) (void)parsed.dump();  // printing a value must be safe once it is accepted
  (void)kvchat::app::server_message(std::string(whole));
  return 0;
}
