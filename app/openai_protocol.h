#pragma once
// The OpenAI HTTP API's JSON, apart from any server: requests parsed and validated into plain structs
// (every wrong type or value is an ApiError naming the field), responses and stream chunks built from
// what a generation produced, and errors in OpenAI's {"error": {...}} shape. No sockets, no Qt, no torch,
// so the desktop app can host the same protocol and the tests can check it without a model.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/stop_text_filter.h"
#include "engine/types.h"

namespace kvchat::app::openai {

// A request the server refuses: the HTTP status and the fields of OpenAI's error object.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = {},
           std::string code = {});
  int status;
  std::string type;
  std::string param;  // the offending field, "" for none (null in the JSON)
  std::string code;   // a machine-readable code, "" for none (null in the JSON)
};

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const ApiError& error);

// What both endpoints share.
struct SamplingRequest {
  std::string model;   // "" when the request names none: the served model
  int max_tokens = 0;  // 0 = until the end of the context
  float temperature = 1.0f;
  float top_p = 1.0f;
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;  // stop texts: the reply ends before the first of them
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

struct ChatCompletionRequest {
  SamplingRequest sampling;
  std::vector<ChatMessage> messages;
};

struct CompletionRequest {
  SamplingRequest sampling;
  std::string prompt;
};

// Throw ApiError (400) for a body that is not a JSON object, a missing or wrong-typed field, or a value
// out of range (n other than 1, a role other than system/user/assistant, ...).
ChatCompletionRequest parse_chat_completion_request(const std::string& body);
CompletionRequest parse_completion_request(const std::string& body);

// What one generation produced, as the responses report it.
struct CompletionResult {
  std::string text;
  std::string finish_reason;  // "stop", "length" or kFinishInterrupted
  GenerationStats stats;
};

// "usage": prompt/completion/total tokens, prompt_tokens_details.cached_tokens (tokens not prefilled
// again), and kvchat's own "timings" beside it (see usage_json's callers).
nlohmann::json usage_json(const GenerationStats& stats);
nlohmann::json timings_json(const GenerationStats& stats);

// A finish reason from the engine's stop reason; `stop_text_matched` wins. A generation stopped from
// outside (the server shutting down, the client gone) is kFinishInterrupted, which is never sent as a
// finish reason: the server answers it with an error, so a cut reply never looks complete.
std::string finish_reason(StopReason reason, bool stop_text_matched);
inline constexpr const char* kFinishInterrupted = "interrupted";

// Whole responses (stream false).
nlohmann::json chat_completion_response(const std::string& id, std::int64_t created, const std::string& model,
                                        const CompletionResult& result);
nlohmann::json completion_response(const std::string& id, std::int64_t created, const std::string& model,
                                   const CompletionResult& result);

// Stream chunks (the JSON after "data: "). `delta_role` starts a chat stream with {"role": "assistant"}.
struct ChunkIdentity {
  std::string id;
  std::int64_t created = 0;
  std::string model;
};
nlohmann::json chat_chunk(const ChunkIdentity& identity, const std::string& text, bool delta_role,
                          const std::optional<std::string>& finish);
nlohmann::json completion_chunk(const ChunkIdentity& identity, const std::string& text,
                                const std::optional<std::string>& finish);
// The last chunk of a stream with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(const ChunkIdentity& identity, const std::string& object, const GenerationStats& stats);

// One server-sent event line: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// The stop texts of a request are cut by the app's StopTextFilter (app/stop_text_filter.h), shared with the
// chat's own stop sequences.
using kvchat::app::StopTextFilter;

}  // namespace kvchat::app::openai
