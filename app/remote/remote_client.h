#pragma once
// A chat turn on an OpenAI-compatible server (vLLM, llama.cpp's llama-server, Ollama, another
// `kvchat-cli serve`) instead of the local engine. Plain C++ over cpp-httplib (built with OpenSSL on
// Debian, so https works too): the desktop app calls it on its remote worker's thread, kvchat-cli chat
// directly. The API is stateless, so every turn sends the conversation's whole history.
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/types.h"

namespace kvchat::app {

// The server could not be used: unreachable, the key refused, no such model, an unreadable answer. The
// message names the server and says what to do.
struct RemoteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RemoteEndpoint {
  std::string base_url;  // e.g. http://localhost:8000/v1 (the part before /chat/completions)
  std::string api_key;   // sent as Authorization: Bearer KEY when not empty; never logged, shown or stored
  std::string model;     // empty = the first model of /v1/models
  // A reply ends as failed, its text kept, when nothing arrives for idle_timeout_s (the server's first
  // token included: a large model may read a long prompt for minutes) or when it takes longer than
  // total_timeout_s in all.
  int idle_timeout_s = kDefaultIdleTimeoutSeconds;
  int total_timeout_s = kDefaultTotalTimeoutSeconds;
  static constexpr int kDefaultIdleTimeoutSeconds = 300;
  static constexpr int kDefaultTotalTimeoutSeconds = 3600;
};

// Throws RemoteError unless `base_url` is http:// or https:// with a host and without credentials
// (user:password@host would put a secret wherever the address is shown or stored).
void check_base_url(const std::string& base_url);

// `base_url` as it may be shown, logged and stored: any user:password@ replaced by ***@.
std::string displayed_base_url(const std::string& base_url);

// `text` with every occurrence of the endpoint's API key replaced by [API key]: a server that echoes the
// key in an error must not put it on the screen or into the chats.
std::string redact_api_key(std::string text, const RemoteEndpoint& endpoint);

// Seeds go out as signed 64-bit numbers (vLLM's schema refuses anything larger): remote_seed() keeps the
// low 63 bits, so a seed from 1 to kMaxRemoteSeed is sent as it is.
inline constexpr std::uint64_t kMaxRemoteSeed = 0x7fffffffffffffffULL;
std::uint64_t remote_seed(std::uint64_t seed);

// The /chat/completions request for a turn. OpenAI's own fields: model, messages, stream (with usage),
// max_tokens, temperature, top_p (sampled turns, below 1), seed (not 0). With `sampling_extensions`, the
// settings OpenAI's API lacks, as the common servers spell them, each only when it is not "off": top_k and
// min_p (sampled turns; vLLM and llama-server), repetition_penalty (vLLM) and repeat_penalty with
// repeat_last_n, its window (llama-server). Ollama's /v1 ignores them. OpenAI's additive frequency_penalty is
// another kind of penalty and is never derived from the repetition penalty. `response_format`: OpenAI's field as
// JSON text, sent as it is (a schema's properties in their order); "" sends none. Assistant messages carry their
// tool calls and tool results the call they answer.
std::string chat_request_body(const std::string& model, const std::vector<ChatMessage>& messages,
                              const GenerationConfig& generation, bool sampling_extensions = true,
                              const std::string& response_format = {});

// The ids of /v1/models, in the server's order. Throws RemoteError.
std::vector<std::string> list_remote_models(const RemoteEndpoint& endpoint);

// What a remote reply came to. Token counts and timings are the server's where it reported them
// (usage, usage.prompt_tokens_details.cached_tokens, llama.cpp's or kvchat's "timings"), else measured here.
struct RemoteReply {
  std::string model;                 // the model that answered
  std::string text;                  // every chunk received, also when the reply was interrupted
  GenerationStats stats;             // prompt/generated tokens, reused_tokens = cached_tokens, ttft, tok/s
  bool usage_reported = false;       // prompt and generated tokens come from the server's usage
  std::optional<int> cached_tokens;  // the server said how many prompt tokens it had cached
  bool server_timings = false;       // ttft and speeds come from the server's timings, not the client's clock
  // Not empty: the reply was cut short after it had started (the connection broke, a timeout, a limit);
  // `text` is what arrived before.
  std::string interruption;
  bool invalid_utf8 = false;  // some events held bytes that are not UTF-8: `text` has U+FFFD in their place
  int unreadable_events = 0;  // events that were not JSON (their text, if any, is missing from `text`)
  // Not empty: the server's usage or timings held values that are no token counts or durations (the
  // figures are then the client's own); says which.
  std::string rejected_figures;
  // Not empty: the server refused the sampling extensions (chat_request_body; OpenAI's API answers 400 to
  // fields it does not know), so the turn was asked again without them, and these settings did not apply.
  // Such a server is not sent them again while the process runs.
  std::string unsent_settings;
};

// Called for every piece of text as it arrives, with the count of content chunks so far.
using RemoteChunkCallback = std::function<void(std::string_view chunk, int chunks_received)>;

// Streams one reply (stream: true, stream_options.include_usage). `stop` set closes the connection: the
// reply ends with StopReason::Stopped. Throws RemoteError when the server cannot be reached, refuses
// the request (401 key, 404 model, any other error status: its message included) or breaks off before
// sending anything; a break after text arrived returns that text with `interruption` set. So do the
// endpoint's timeouts and the bounds of remote_stream.h (text for max_new_tokens, line length, stream
// size, JSON nesting).
RemoteReply stream_remote_chat(const RemoteEndpoint& endpoint, const std::vector<ChatMessage>& messages,
                               const GenerationConfig& generation, const std::atomic<bool>* stop,
                               const RemoteChunkCallback& on_chunk, const std::string& response_format = {});

}  // namespace kvchat::app
