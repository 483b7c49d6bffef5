// A request body as kvchat-cli serve reads it (app/server/openai_protocol.h): the input is one JSON body, given
// to both endpoints' parsers. Each either returns a request within the documented ranges or throws
// ApiError (a 400 naming the field); any other exception, a crash, or a value out of range is a bug. An
// accepted request's responses are built and printed, as the server would send them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "app/server/openai_protocol.h"

namespace {

using namespace kvchat::app::openai;

void check_sampling(const SamplingRequest& sampling) {
  if (sampling.max_tokens < 0 || sampling.temperature < 0 || sampling.temperature > 2 || sampling.top_p <= 0 ||
      sampling.top_p > 1 || sampling.top_k < 0 || sampling.min_p < 0 || sampling.min_p > 1 ||
      sampling.repetition_penalty <= 0 || sampling.repetition_penalty > 10 || sampling.repetition_window < 0 ||
      sampling.top_logprobs < -1 || sampling.top_logprobs > 20 || sampling.stop.size() > 4)
    __builtin_trap();
  for (const std::string& stop : sampling.stop)
    if (stop.empty()) __builtin_trap();
}

// The responses of an accepted request, with a reply and logprobs, printed as the server prints them.
void build_responses(const SamplingRequest& sampling) {
  CompletionResult result;
  result.text = sampling.model;
  result.finish_reason = "stop";
  result.has_logprobs = sampling.top_logprobs >= 0;
  if (result.has_logprobs) {
    // Built field by field: GCC 12 misreads the lifetime of a braced temporary here (-Wmaybe-uninitialized).
    LogprobEntry entry;
    entry.chosen = {sampling.model, -0.5f};
    entry.top.push_back(entry.chosen);
    result.logprobs.push_back(std::move(entry));
  }
  const ChunkIdentity identity{"id", 0, sampling.model};
  (void)sse_event(chat_completion_response("id", 0, sampling.model, result));
  (void)sse_event(completion_response("id", 0, sampling.model, result));
  (void)sse_event(chat_chunk(identity, result.text, true, std::nullopt, &result.logprobs));
  (void)sse_event(completion_chunk(identity, result.text, "stop", &result.logprobs));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  try {
    const ChatCompletionRequest chat = parse_chat_completion_request(body);
    check_sampling(chat.sampling);
    if (chat.messages.empty()) __builtin_trap();
    for (const kvchat::ChatMessage& message : chat.messages)
      if (message.role != "system" && message.role != "user" && message.role != "assistant") __builtin_trap();
    build_responses(chat.sampling);
  } catch (const ApiError& error) {
    if (error.status != 400 && error.status != 404) __builtin_trap();
    (void)error_body(error).dump();
  }
  try {
    const CompletionRequest completion = parse_completion_request(body);
    check_sampling(completion.sampling);
    if (completion.prompt.empty() == completion.prompt_token_ids.empty()) __builtin_trap();  // exactly one form
    build_responses(completion.sampling);
  } catch (const ApiError& error) {
    if (error.status != 400 && error.status != 404) __builtin_trap();
    (void)error_body(error).dump();
  }
  return 0;
}
