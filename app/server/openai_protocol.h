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

#include "app/chat/stop_text_filter.h"
#include "engine/text/constraint/json_grammar.h"
#include "engine/text/tool_calls.h"
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
  // The sampling extensions llama-server and vLLM take (and kvchat's own remote backend sends); off by
  // default.
  int top_k = 0;                    // 0 (or -1) = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // repetition_penalty (vLLM) or repeat_penalty (llama-server); 1 = off
  int repetition_window = 64;       // repeat_last_n: the recent tokens it looks at (0 = all)
  // Log-probabilities of the reply's tokens: -1 none; else also those of this many most likely tokens
  // (chat: logprobs true with top_logprobs; completions: logprobs N).
  int top_logprobs = -1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Constrained decoding: the reply is a JSON value this grammar allows (response_format json_object or
  // json_schema, or a tool call that tool_choice requires); null for free text.
  std::shared_ptr<const JsonGrammar> grammar;
  // The reply's text exactly as its tokens spell it, without the tokenizer's clean-up of spaces before
  // punctuation (which would change a JSON string's value or a tool call's arguments): set for structured output
  // and whenever tool calls are parsed out of the reply.
  bool exact_text = false;
};

// tool_choice: whether the model may ("auto"), must ("required", or `function` named) or may not ("none")
// call a tool.
enum class ToolChoice { Auto, None, Required, Function };

struct ChatCompletionRequest {
  SamplingRequest sampling;
  std::vector<ChatMessage> messages;
  std::string tools_json;  // the "tools" array as given (each {"type": "function", "function": {...}}); "" none
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_function;  // the function tool_choice names
  bool parallel_tool_calls = true;   // false: a reply's first call only
};

// The grammar a reply must follow when tool_choice requires a call in the template's `format`: the call's
// markup around {"name": one of the tools (or the one named), "arguments": that tool's parameters}. Throws
// ApiError naming "tools" or "tool_choice" when a tool's parameters cannot be a constraint or the format has
// no markup to force.
JsonGrammar required_tool_call_grammar(const ChatCompletionRequest& request, ToolCallFormat format);

struct CompletionRequest {
  SamplingRequest sampling;
  std::string prompt;                     // the prompt as text, encoded by the server
  std::vector<TokenId> prompt_token_ids;  // or as token ids (a prompt given as an array of integers)
};

// Throw ApiError (400) for a body that is not a JSON object, a missing or wrong-typed field, or a value
// out of range (n other than 1, a role other than system/user/assistant, ...). No field is dropped
// unread: a field the server does not implement (tools, response_format, logit_bias, ...) is accepted
// only at the value that asks for nothing (null, false, 0, an empty list), and an unknown one is refused;
// either refusal names the field.
ChatCompletionRequest parse_chat_completion_request(const std::string& body);
CompletionRequest parse_completion_request(const std::string& body);

// One reply token's log-probability (TokenLogprob), with text. A token's text is what it added to the
// reply: a character split over several tokens comes with the last of them (the others have "").
struct LogprobToken {
  std::string text;
  float logprob = 0.0f;
};
struct LogprobEntry {
  LogprobToken chosen;
  std::vector<LogprobToken> top;  // most likely first
  std::size_t text_offset = 0;    // where the token's text starts in the reply
};

// What one generation produced, as the responses report it.
struct CompletionResult {
  std::vector<LogprobEntry> logprobs;  // one per token of `text`, when the request asked for them
  bool has_logprobs = false;
  std::string text;
  std::string finish_reason;  // "stop", "length", "tool_calls" or kFinishInterrupted
  GenerationStats stats;
  std::vector<ToolCall> tool_calls;  // parsed out of `text` (which then holds the content before them)
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
// `logprobs`: the entries of the tokens this chunk's text completes, when the request asked for them.
nlohmann::json chat_chunk(const ChunkIdentity& identity, const std::string& text, bool delta_role,
                          const std::optional<std::string>& finish,
                          const std::vector<LogprobEntry>* logprobs = nullptr);
// A chunk with `calls` as delta.tool_calls (index, id, type, function name and whole arguments), as the SDKs
// assemble them.
nlohmann::json chat_tool_calls_chunk(const ChunkIdentity& identity, const std::vector<ToolCall>& calls);
nlohmann::json completion_chunk(const ChunkIdentity& identity, const std::string& text,
                                const std::optional<std::string>& finish,
                                const std::vector<LogprobEntry>* logprobs = nullptr);
// The "logprobs" object of a chat choice ({"content": [...]}) and of a completion choice (tokens,
// token_logprobs, top_logprobs, text_offset), as OpenAI writes them.
nlohmann::json chat_logprobs_json(const std::vector<LogprobEntry>& entries);
nlohmann::json completion_logprobs_json(const std::vector<LogprobEntry>& entries);
// The last chunk of a stream with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(const ChunkIdentity& identity, const std::string& object, const GenerationStats& stats);

// One server-sent event line: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// The stop texts of a request are cut by the app's StopTextFilter (app/chat/stop_text_filter.h), shared with the
// chat's own stop sequences.
using kvchat::app::StopTextFilter;

}  // namespace kvchat::app::openai
