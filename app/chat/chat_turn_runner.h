#pragma once
// One chat turn, start to finish: render the messages, encode them, fit them into the context window,
// generate on the conversation's Session and stream the reply as text. Shared by the desktop app's
// engine worker and `kvchat-cli chat`, so the render -> encode -> generate -> stream path exists once.
// No Qt widgets, no torch in this header.
#include <atomic>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "app/settings.h"
#include "engine/types.h"

namespace kvchat {
struct LoadedModel;
class Session;
}  // namespace kvchat

namespace kvchat::app {

// The conversation cannot be fitted into the context window (policy Stop, or a single message that is
// longer than the window on its own). The message says how many tokens were needed and the limit.
struct ContextLimitError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TurnOptions {
  GenerationConfig generation;
  int context_limit = 0;  // 0 = the model's max_position_embeddings; never more than it
  ContextOverflowPolicy overflow = ContextOverflowPolicy::Stop;
  // `messages` ends with an assistant reply that was cut short (max tokens, Stop, a crash): the prompt is
  // the conversation up to the end of that reply's text, so the model goes on writing it.
  bool continue_reply = false;
};

// Called for every sampled token. `chunk` is the newly completed reply text (valid UTF-8, may be empty
// while a multi-byte character is incomplete or the token is a special one).
struct ReplyProgress {
  std::string_view chunk;
  int generated_tokens = 0;
  double decode_tokens_per_second = 0.0;  // the engine's DecodeRate: 0 until the second token
};
using ReplyProgressCallback = std::function<void(const ReplyProgress& progress)>;

struct TurnOutcome {
  std::string reply;                   // the whole reply text (concatenation of every chunk)
  std::vector<TokenId> prompt_ids;     // what was given to Session::generate
  std::vector<TokenId> generated_ids;  // sampled ids (a final stop token included)
  // The reply's exact ids (a final end-of-sequence id left out; a continued reply's earlier ids first),
  // to keep with its text as ChatMessage::token_ids; empty when not known. reply_vocabulary is the
  // tokenizer's vocabulary fingerprint.
  std::vector<TokenId> reply_ids;
  std::uint64_t reply_vocabulary = 0;
  GenerationStats stats;     // as the engine reported them
  int context_limit = 0;     // the effective limit this turn ran under
  int dropped_messages = 0;  // leading non-system messages left out to fit the window
  // Wall time of each decode step after the first token, measured here around Session::generate's
  // callbacks: decode_step_ms[i] is the step that produced generated_ids[i + 1], which attended over
  // prompt_ids.size() + i + 1 positions (all of them recomputed when the cache is off).
  std::vector<double> decode_step_ms;
  // decode_step_from_proposal[i]: that token came from a speculative pass's row fed ahead (no pass of its own).
  std::vector<bool> decode_step_from_proposal;
};

class ChatTurnRunner {
 public:
  // Keeps a reference: `model` must outlive the runner.
  explicit ChatTurnRunner(const LoadedModel& model);

  int effective_context_limit(int requested_limit) const;

  // The prompt ids for `messages` (the generation prompt added, or the last reply's text continued): a
  // function of the messages alone, their replies' exact ids included (encode_chat_prompt).
  // `tools_json`: the tool definitions (a JSON array, OpenAI's "tools") the template renders; "" for none.
  std::vector<TokenId> encode_messages(const std::vector<ChatMessage>& messages, bool continue_reply = false,
                                       const std::string& tools_json = {}) const;

  // Runs one turn. `messages` ends with the new user message. Throws ContextLimitError,
  // std::invalid_argument (no tokenizer, empty prompt) and whatever the engine throws.
  TurnOutcome run(Session& session, const std::vector<ChatMessage>& messages, const TurnOptions& options,
                  const std::atomic<bool>* stop, const ReplyProgressCallback& on_progress) const;

 private:
  struct FittedPrompt {
    std::vector<TokenId> ids;
    int dropped_messages = 0;
  };
  FittedPrompt fit_prompt(const std::vector<ChatMessage>& messages, const TurnOptions& options,
                          int context_limit) const;
  FittedPrompt drop_oldest_turns(const std::vector<ChatMessage>& messages, std::size_t target,
                                 bool continue_reply) const;

  const LoadedModel& model_;
};

}  // namespace kvchat::app
